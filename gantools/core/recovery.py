"""When training goes wrong, and what to do about it: non-finite losses (stop, or roll back to the last healthy
interval's weights and go on), running out of device memory (one error saying what to change), and the warnings a
log record can call for (an fp16 GradScaler scale that collapsed, torch.compile recompiling or skipping CUDA
graphs)."""
from __future__ import annotations

import copy
import gc
import math
from pathlib import Path

import torch

from ..measuring import hardware
from .config import uses_cuda_graphs
from ..errors import GantoolsError, NonFiniteLossError, OutOfMemory

SCALE_COLLAPSE = 1.0  # an fp16 GradScaler scale below this means gradients overflow fp16 even unscaled
# How the CUDA libraries say "no memory" in the RuntimeError (torch.AcceleratorError on newer torch) that torch raises
# for them, where it is not a torch.OutOfMemoryError (which only the caching allocator raises): cuBLAS
# ("CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), cuDNN, cuFFT and cuSOLVER (..._ALLOC_FAILED);
# cuDNN 9 (CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED); and cuDNN's CUDNN_STATUS_NOT_INITIALIZED, which is
# what creating its handle reports when the GPU is full (pytorch/pytorch#12256: raised only above a batch size;
# JuliaGPU/CUDA.jl#264: "Library handle creation close to OOM fails with ERROR_NOT_INITIALIZED", and CUDA.jl retries
# it after freeing memory). A raw cudaErrorMemoryAllocation reads "CUDA error: out of memory", matched apart.
LIBRARY_ALLOCATION_FAILURES = ("ALLOC_FAILED", "ALLOCATION_FAILED", "CUDNN_STATUS_NOT_INITIALIZED")


def _instead_of_fp16(device: torch.device) -> str:
    """Where fp16 overflows: bf16 (fp32's range) where the device has it fast, else fp32 (validation refuses bf16 on
    a GPU before Ampere)."""
    return "precision='bf16'" if hardware.supports_bf16(device) else "precision='fp32' (no fast bf16 on this GPU)"


class Rollback:
    """on_nonfinite='skip': a copy of the last healthy interval's state, put back when an interval's losses are not
    finite, and how many intervals were skipped in a row. `parts()` names what is copied: objects with state_dict()
    and load_state_dict() (networks, optimizers, scalers)."""

    def __init__(self, parts):
        self.parts = parts
        self.skips, self.good = 0, None

    def snapshot(self, step: int) -> dict:
        """A copy of the parts (on their device) to roll back to."""
        return {"step": step, **copy.deepcopy({k: part.state_dict() for k, part in self.parts().items()})}

    def restore(self, snapshot: dict) -> None:
        for key, part in self.parts().items():  # a copy: optimizers keep the tensors they are given, and would
            part.load_state_dict(copy.deepcopy(snapshot[key]))  # alter these

    def keep(self, step: int) -> None:
        """This interval was healthy: it is the one to roll back to."""
        self.skips, self.good = 0, self.snapshot(step)

    def forget(self) -> None:
        """A rollback point belongs to the run it was taken in."""
        self.skips, self.good = 0, None

    def non_finite(self, record: dict, bad: list, cfg, step: int, steps: int, warn) -> None:
        """The losses of `bad` networks are not finite in the `steps` steps logged in `record`: raise
        NonFiniteLossError (on_nonfinite='stop', or too many skips in a row), else restore the last healthy
        interval's state, mark the record skipped and warn; the step count and the data go on."""
        scaled = [n for n in ("d", "g") if record.get(f"scale_{n}", math.inf) < SCALE_COLLAPSE]
        fp16 = bool(scaled) or cfg.precision == "fp16"  # on CUDA: validation refuses fp16 elsewhere
        instead = _instead_of_fp16(hardware.resolve_device(cfg.device)) if fp16 else ""
        cause = (f"fp16 overflow: the GradScaler scale collapsed (try {instead})" if scaled else
                 f"fp16 overflow (try {instead})" if fp16 else
                 "a learning rate too high for this model and batch")
        message = (f"step {step}: the {' and '.join(bad)} loss is not finite (loss_d={record['loss_d']}, "
                   f"loss_g={record['loss_g']}) in the {steps} steps since the last log. "
                   f"Likely cause: {cause}; lr_d={cfg.lr_d}, lr_g={cfg.lr_g}.")
        if cfg.on_nonfinite == "stop":
            raise NonFiniteLossError(message + " Resume from the last checkpoint with a lower learning rate, "
                                               "or set on_nonfinite='skip'.")
        self.skips += 1
        self.restore(self.good)
        if self.skips > cfg.max_skips:
            raise NonFiniteLossError(message + f" Skipping did not help: {self.skips} non-finite intervals in a "
                                     f"row (max_skips={cfg.max_skips}); the weights of step "
                                     f"{self.good['step']} were restored. Lower the learning rate and resume "
                                     f"from the last checkpoint.")
        record["skipped"] = True
        warn(message + f" Skipped: restored the weights of step {self.good['step']} and went on "
             f"with the next batches ({self.skips} of {cfg.max_skips} skips in a row).", stacklevel=3)


def weights_finite(*modules) -> bool:
    params = [p for m in modules for p in m.parameters()]
    return bool(torch.stack([torch.isfinite(p).all() for p in params]).all())  # one sync


def is_out_of_memory(e: BaseException) -> bool:
    """Whether `e` says the device ran out of memory: torch.OutOfMemoryError, gantools' own OutOfMemory, or a
    RuntimeError whose text says "out of memory" or names a CUDA library's allocation failure
    (`LIBRARY_ALLOCATION_FAILURES`). The one test fit(), tune, the device loader and check use. Other GantoolsErrors
    already say what to do; the host's MemoryError is not the device's."""
    if isinstance(e, (torch.OutOfMemoryError, OutOfMemory)):
        return True
    if isinstance(e, GantoolsError) or not isinstance(e, RuntimeError):
        return False
    text = str(e)
    return "out of memory" in text.lower() or any(marker in text for marker in LIBRARY_ALLOCATION_FAILURES)


def out_of_memory(detail: str, cfg, device: torch.device, step: int, checkpoint: Path) -> OutOfMemory:
    """The error for a step that ran out of device memory, saying what to change; the memory the failed step held
    (its gradients already dropped by the caller) goes back first."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()  # so the notebook can run again with a smaller batch
    tips = [f"a smaller batch_size (now {cfg.batch_size})"]
    if cfg.batch_size % (cfg.grad_accum_steps * 2) == 0:
        tips.append(f"the same batch in micro-batches: grad_accum_steps={cfg.grad_accum_steps * 2}")
    if cfg.precision == "fp32":
        tips.append(f"precision='{hardware.autocast_precision(device)}': about half the activation memory")
    where = f"the last checkpoint is {checkpoint}" if checkpoint.is_file() else "no checkpoint was written yet"
    handle = (" (cuDNN says a full GPU this way; if a much smaller batch fails alike, suspect the cuDNN install)"
              if "CUDNN_STATUS_NOT_INITIALIZED" in detail else "")
    return OutOfMemory(f"out of {device.type} memory at step {step + 1} (micro-batch "
                       f"{cfg.batch_size // cfg.grad_accum_steps}, {cfg.image_size} px, precision {cfg.precision}). "
                       f"Try {'; or '.join(tips)}. This step was not completed; {where}. "
                       f"Detail: {detail}{handle}")


def check_scales(record: dict, step: int, warn, device: torch.device) -> None:
    """An fp16 GradScaler scale that fell below SCALE_COLLAPSE (a run on `device`): that network's steps are being
    skipped."""
    for name in ("d", "g"):
        scale = record.get(f"scale_{name}")
        if scale is not None and scale < SCALE_COLLAPSE:
            record["scale_collapsed"] = True
            net = "discriminator" if name == "d" else "generator"
            warn(f"step {step}: the {net}'s fp16 GradScaler scale fell to {scale:.3g}: its "
                 f"gradients overflow fp16 even unscaled, so its steps are being skipped. Lower lr_{name} "
                 f"or use {_instead_of_fp16(device)}.", stacklevel=4)


def check_compiles(records: list, step: int, compile_mode: str, warn) -> None:
    """torch.compile's surprises, said out loud: graphs compiled after the first log interval (a guard failed:
    the step is recompiled, which costs seconds each time) and CUDA graphs skipped (the step then runs
    without them, silently in torch's default logging). `records`: the run's log records, the new one last."""
    if len(records) < 2:
        return
    previous, record = records[-2], records[-1]
    new_graphs = record["compiled_graphs"] - previous.get("compiled_graphs", 0)
    if new_graphs > 0:
        warn(f"step {step}: torch.compile compiled {new_graphs} more graph(s) after warm-up "
             f"({record['compiled_graphs']} in all): a guard failed (a new shape, dtype or grad mode), and "
             f"each recompile costs time. TORCH_LOGS=recompiles says which guard.", stacklevel=4)
    skipped = record.get("cudagraph_skips", 0) - previous.get("cudagraph_skips", 0)
    if skipped > 0 and uses_cuda_graphs(compile_mode):
        warn(f"step {step}: torch.compile skipped CUDA graphs for {skipped} graph(s), which then run "
             f"without them (no launch-overhead saving). TORCH_LOGS=cudagraphs says why (e.g. a mutated "
             f"input, a CPU tensor, dynamic shapes).", stacklevel=4)
