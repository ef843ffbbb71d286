"""The device: picking it, describing it, timing and measuring memory on it honestly; reading its TF32 and cuDNN
settings (core.process.backend_flags sets them for a block) and a seeded RNG for a block."""
from __future__ import annotations

import contextlib
import os
import platform
import resource
import sys
import time

import torch
from torch.profiler import record_function

from . import torch_versions

# The profiler range around gantools' own device synchronisations: a profile counts the host syncs of the code it
# profiles, not the ones its measuring makes (measuring.code_syncs).
OWN_SYNC = "gantools: synchronize"
# What torch.cuda's sync debug mode (`torch.cuda.set_sync_debug_mode("warn")`) warns at each synchronizing CUDA
# operation (c10/cuda/CUDAFunctions.cpp, warn_or_error_on_sync): how check and the doctor count syncs torch makes.
SYNC_WARNING = "called a synchronizing CUDA operation"


def resolve_device(name: str = "auto") -> torch.device:
    """The device a name means, so `auto` runs on a GPU where there is one and on any machine otherwise.

    Args:
        name: 'auto' (the first CUDA GPU when there is one, else the CPU), or any torch device name ('cpu',
            'cuda:1').
    Returns:
        The torch.device.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def supports_bf16(device: torch.device) -> bool:
    """bf16 autocast runs on every recent CPU; on CUDA it needs Ampere (sm_80) or newer to be fast. Asked of the
    device itself: `torch.cuda.is_bf16_supported()` reads the current device and, by default, also says True where
    bf16 is only emulated (a T4 or V100: pytorch/pytorch#148322), slowly."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device)[0] >= 8
    return device.type == "cpu"


def fast_bf16(device: torch.device) -> bool:
    """Whether bf16 autocast is faster than fp32 on `device`, not only possible (`supports_bf16`). On CUDA the same
    answer (Ampere and newer). On a CPU only with native bf16 instructions, AVX512-BF16 or AMX tiles (Intel Xeons
    from Cooper Lake on, AMD from Zen 4 on; not Intel's client CPUs, which lack AVX-512, nor ARM here): without them
    bf16 takes non-native code paths, and a GAN step runs many times slower than in fp32 (the evidence:
    docs/profiling.md, "bf16 on a CPU").
    torch.cpu's `_is_avx512_bf16_supported` and `_is_amx_tile_supported` read the CPU's flags through cpuinfo, as
    torch's own CPU autocast tests do; where a torch lacks one, it counts as absent."""
    if device.type == "cuda":
        return supports_bf16(device)
    if device.type != "cpu":
        return False
    return any(getattr(torch.cpu, check, lambda: False)()
               for check in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def autocast_precision(device: torch.device) -> str:
    """The 16-bit precision to train in on `device`: 'bf16' where it runs (`supports_bf16`: every CPU, Ampere and
    newer GPUs), else 'fp16' (a T4, V100 or P100), which the trainer pairs with a GradScaler per network. What the
    benchmark ladder, the profiler's verdict and tune propose where 16-bit is also fast (`fast_16bit`), so none of
    them offers what validation refuses here.

    Args:
        device: the device to train on (`resolve_device`).

    Returns:
        "bf16" or "fp16", a value of `TrainConfig.precision`."""
    return "bf16" if supports_bf16(device) else "fp16"


def fast_16bit(device: torch.device) -> bool:
    """Whether 16-bit autocast runs faster than fp32 on `device`: on CUDA (bf16 from Ampere, else fp16), and on a CPU
    only with native bf16 (`fast_bf16`), since an emulated one runs many times slower."""
    return device.type == "cuda" or fast_bf16(device)


def fast_precision(device: torch.device) -> str:
    """The fastest precision to train in on `device`, for a notebook's fast setting: its 16-bit autocast
    (`autocast_precision`) where 16-bit is fast (`fast_16bit`), else 'fp32'."""
    return autocast_precision(device) if fast_16bit(device) else "fp32"


def synchronize(device: torch.device) -> None:
    """Wait for queued device work: without this, GPU timings measure only the kernel launches. Inside an
    `OWN_SYNC` profiler range, so a profile can tell its cudaDeviceSynchronize from the code's."""
    if device.type == "cuda":
        with record_function(OWN_SYNC):
            torch.cuda.synchronize(device)


def seconds() -> float:
    """The host's monotonic clock, in seconds: what `Timer` and every time budget (tune's minutes, the take-turns
    warm-up) read. Called through this module (`hardware.seconds()`), so a test can put a clock of its own in its place
    and decide, instead of the machine's load, when a budget is spent."""
    return time.perf_counter()


class Timer:
    """The one clock every gantools timing reads: wall-clock seconds between device synchronisations, so GPU work
    queued before a mark counts before it and work queued after it counts after it. `start()`, then `lap()` (seconds
    since the last mark, and a new mark) or `stop()` (seconds since the last mark). The trainer's `clock.StepClock`, the
    doctor's `protocol.IterationClock` and every chunk `turns.take_turns` times read time through one.

    Args:
        device: the device whose queued work each mark waits for (on the CPU nothing is queued).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._t0 = None

    def now(self, sync: bool = True) -> float:
        """The host clock (seconds), after waiting for the device's queued work unless `sync` is False (a mark
        that follows a synchronisation anyway, or one where the caller chose not to wait)."""
        if sync:
            synchronize(self.device)
        return seconds()

    def start(self) -> "Timer":
        self._t0 = self.now()
        return self

    def lap(self) -> float:
        """Seconds since the last mark (`start()` or `lap()`); this one is the next mark."""
        now = self.now()
        seconds, self._t0 = now - self._t0, now
        return seconds

    def stop(self) -> float:
        return self.now() - self._t0


def reset_peak_memory(device: torch.device) -> None:
    """Restart the CUDA allocator's peak (the doctor's profiled window; a training step's own peak is
    `memory.step_peak_bytes`)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> float:
    """The doctor's peak memory of a window of someone else's loop: on a GPU the allocator's peak tensor memory since
    `reset_peak_memory`; on the CPU only the process's peak resident set (Python and torch included, never reset), as
    a CPU has no allocator that counts tensors. A training step's peak tensor memory, on any device, is
    `memory.step_peak_bytes`."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux, bytes on macOS
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


def backend_flags_now() -> dict:
    """The process's TF32 and cuDNN settings as they are now (the per-backend strings never raise)."""
    flags = {"cudnn_benchmark": torch.backends.cudnn.benchmark}
    for name, obj in (("tf32_matmul", torch.backends.cuda.matmul), ("tf32_conv", getattr(torch.backends.cudnn,
                                                                                          "conv", None))):
        flags[name] = torch_versions.precision_string(obj)
    return flags


def tf32_matmuls() -> bool:
    """Whether fp32 matmuls may run in TF32 now (cuDNN's convolutions do by PyTorch's default; matmuls do not).
    Read through the documented switch that `core.process.backend_flags` sets,
    `torch.get_float32_matmul_precision()`; when that raises (legacy and new APIs mixed), through the per-backend
    string."""
    precision = torch_versions.matmul_precision()
    if precision is not None:
        return precision != "highest"
    return torch_versions.precision_string(torch.backends.cuda.matmul) == "tf32"


@contextlib.contextmanager
def seeded(seed: int):
    """The global CPU RNG seeded for the block (e.g. to initialise weights reproducibly) and restored after, so
    building a model never shifts the caller's random numbers. Only the CPU generator is touched: modules are
    built on the CPU, and torch.manual_seed would also seed CUDA (lazily, after the block, if CUDA is not yet
    initialised), which fork_rng(devices=[]) would not undo."""
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        yield


def machine_info(device: torch.device | str = "auto") -> dict:
    """What every measurement was taken on, so numbers are never quoted without their machine.

    Args:
        device: the device measured, or its name ('auto' as for `resolve_device`).
    Returns:
        A JSON-ready dict: the device and its name, CPU cores and torch threads, torch, CUDA and Python versions,
        the platform, whether bf16 is supported there; on a GPU also its memory, compute capability and cuDNN.
    """
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
        "fast_bf16": fast_bf16(device),
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
