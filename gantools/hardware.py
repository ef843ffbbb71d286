"""The device: picking it, describing it, timing and measuring memory on it honestly."""
from __future__ import annotations

import os
import platform
import resource
import sys
import time

import torch


def resolve_device(name: str = "auto") -> torch.device:
    """`auto` means the first CUDA GPU when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def supports_bf16(device: torch.device) -> bool:
    """bf16 autocast runs on every recent CPU; on CUDA it needs Ampere (sm_80) or newer to be fast."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu"


def synchronize(device: torch.device) -> None:
    """Wait for queued device work: without this, GPU timings measure only the kernel launches."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Wall-clock seconds between `start()` and `stop()`, synchronising the device at both ends."""

    def __init__(self, device: torch.device):
        self.device = device
        self._t0 = None

    def start(self) -> "Timer":
        synchronize(self.device)
        self._t0 = time.perf_counter()
        return self

    def stop(self) -> float:
        synchronize(self.device)
        return time.perf_counter() - self._t0


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> float:
    """Peak tensor memory on a GPU; on the CPU, the process's peak resident set (includes Python and torch)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux, bytes on macOS
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


def set_tf32(enabled: bool | None) -> None:
    """TF32 for fp32 matmuls and convolutions on Ampere+ GPUs; None keeps PyTorch's defaults."""
    if enabled is None or not torch.cuda.is_available():
        return
    mode = "tf32" if enabled else "ieee"
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    if hasattr(matmul, "fp32_precision") and hasattr(conv, "fp32_precision"):
        matmul.fp32_precision = mode
        conv.fp32_precision = mode
    else:  # torch < 2.9
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled


def machine_info(device: torch.device | str = "auto") -> dict:
    """What every measurement was taken on, so numbers are never quoted without their machine."""
    device = resolve_device(device) if isinstance(device, str) else device
    info = {
        "device": str(device),
        "device_name": _cpu_name(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,  # the CUDA torch was built with, whether or not a GPU is present
        "python": platform.python_version(),
        "platform": platform.platform(),
        "bf16": supports_bf16(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device_name=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1),
                    compute_capability=f"{props.major}.{props.minor}", cudnn=torch.backends.cudnn.version())
    return info


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
