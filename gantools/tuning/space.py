"""tune's search space: every change of the speed knobs worth trying from a config on a device, likeliest gain
first (`techniques.TECHNIQUES`' priors, in its order), each completed to a valid config."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..speed import bench
from ..measuring import hardware
from ..core import techniques
from ..core.config import TrainConfig, optimizer_kernels, scale_batch, speed_knobs

PRIOR = techniques.priors()  # knob: (cpu, cuda), the expected speed-up of each change on its own
OPTIMIZER_ORDER = ("fused", "foreach", "for-loop")  # fused kernels first: fewest launches


@dataclass
class Candidate:
    """One change to try: the fields it sets (what it needs to be valid included), where it came from, and its
    expected gain (`PRIOR`, to order the search space)."""

    change: dict
    source: str
    prior: float = 1.0

    @property
    def label(self) -> str:
        return describe(self.change)


def describe(change: dict) -> str:
    """`precision=bf16, loss=bce`: a change as a reader writes it."""
    return ", ".join(f"{k}={v}" for k, v in change.items()) or "(no change)"


def complete(cfg: TrainConfig, change: dict) -> dict:
    """The change plus what it needs to be a valid config, minus what is already so. 16-bit precision under
    Sigmoid + BCELoss needs BCE with logits (the same loss); the device loader leaves no DataLoader knobs; workers
    kept alive between epochs come with workers."""
    change = dict(change)
    new = cfg.replace(**change)
    if new.precision != "fp32" and new.loss == "bce-sigmoid":
        change["loss"] = "bce"
    if new.loader == "device":
        change.update(transform="on-device", num_workers=0, pin_memory=None, persistent_workers=False,
                      prefetch_factor=None)
    elif new.num_workers == 0:
        change.update(persistent_workers=False, prefetch_factor=None)
    elif "num_workers" in change and cfg.num_workers == 0:
        change.setdefault("persistent_workers", True)
    return {k: v for k, v in change.items() if getattr(cfg, k) != v}


def allowed(change: dict, cfg: TrainConfig, space: tuple, cpu_tensors: bool = True) -> bool:
    """Only speed knobs (and batch_size when in the space) may change, plus bce-sigmoid -> bce; at least one
    field of the change must be in the space. With a dataset whose tensors are not on the CPU (`cpu_tensors`
    False: `data.returns_cpu_tensors`), never workers or pinned memory (`data.make_loader` says why)."""
    fine = set(speed_knobs()) | set(space)
    ok = all(k in fine or (k == "loss" and cfg.loss == "bce-sigmoid" and v == "bce") for k, v in change.items())
    if not cpu_tensors and (change.get("num_workers") or change.get("pin_memory")):
        return False
    return ok and any(k in space for k in change)


def search_space(cfg: TrainConfig, device: torch.device, space=None, own_dataset: bool = False,
                 main_thread: bool = True, cpu_tensors: bool = True) -> tuple[list, list]:
    """(candidates, skipped): every change of the speed knobs in `space` worth trying from `cfg` on `device`,
    likeliest gain first (`PRIOR`; among equals, `techniques.TECHNIQUES`' order), each completed to a valid config
    (`complete`); and the values left out because
    they do not apply here, each with its reason.

    Values per knob: 16-bit precision (`hardware.autocast_precision`: bf16 where the device has it fast, else fp16
    on CUDA; fp16 never on a CPU);
    sync_every_step off; freeze_d on; the device loader; on-device normalisation (not with your own dataset,
    which brings its own transforms); workers doubled (from 0: 2) up to the cores, and halved; workers kept alive;
    prefetch_factor 4; pinned memory (CUDA) (workers and pinning only for a dataset of CPU tensors, `cpu_tensors`:
    `data.make_loader` says why); channels_last either way; compile default, or off (and on CUDA
    max-autotune and reduce-overhead, which both use CUDA graphs, only where `gantools check` validated them and not
    in a background thread, where CUDA graphs are refused); each other optimizer implementation (than the one built:
    'auto' is fused with fp16 on CUDA, `config.optimizer_kernels`); cuDNN benchmark and TF32 (CUDA, TF32 on Ampere+);
    fewer accumulation micro-batches (more never speeds a step up); and, only when `space` names it, batch_size x2
    with the learning rates scaled by sqrt 2 (`config.scale_batch`). batch_size is out of the default space: a
    bigger batch means fewer optimizer steps per image, so it changes what is learned (on glyphs, x2 cost 2.78x the
    reference's FID at an equal image budget for 8% more images/s on the 2-core CPU); the quality check would then
    most likely spend the budget undoing it."""
    from ..speed.check import validated

    space = tuple(space if space is not None else speed_knobs())
    order = [t.knob for t in techniques.TECHNIQUES if t.knob in space]  # the list's order everywhere
    cuda, cores = device.type == "cuda", os.cpu_count() or 1
    c, values, skipped = cfg, [], []

    def offer(name, value, why=None):
        if why:
            skipped.append((f"{name}={value}", why))
        elif getattr(c, name) != value:
            values.append({name: value})

    for name in order:
        if name == "precision" and c.precision == "fp32":
            if not cuda:
                offer("precision", "fp16", "fp16 needs CUDA (GradScaler and fast fp16 kernels)")
            offer("precision", hardware.autocast_precision(device))
        elif name == "sync_every_step":
            offer(name, False)
        elif name == "freeze_d":
            offer(name, True)
        elif name == "loader":
            offer(name, "device")
        elif name == "transform":
            offer(name, "on-device", "your own dataset brings its own transforms" if own_dataset else None)
        elif name == "num_workers" and c.loader == "dataloader":
            n = c.num_workers
            for value in sorted({min(cores, 2 * n if n else 2), n // 2}):
                offer(name, value, None if cpu_tensors or not value else
                      "your dataset's tensors are not on the CPU: a forked worker cannot use CUDA")
        elif name == "persistent_workers" and c.num_workers > 0:
            offer(name, True)
        elif name == "prefetch_factor" and c.num_workers > 0 and c.prefetch_factor is None:
            offer(name, 4)
        elif name == "pin_memory" and c.loader == "dataloader":
            offer(name, True, "pinned memory only helps copies to a GPU" if not cuda else None if cpu_tensors else
                  "your dataset's tensors are not on the CPU: only CPU tensors can be pinned")
        elif name == "channels_last":
            offer(name, not c.channels_last)
        elif name == "compile":
            if not bench.can_compile(device):
                skipped.append(("compile", "torch.compile needs a C++ compiler on the CPU"))
                continue
            for mode in ["default"] if c.compile == "off" else ["off"]:
                offer(name, mode)
            for mode in ("max-autotune", "reduce-overhead") if cuda else ():
                if c.compile == mode:
                    continue
                # CUDA graphs (both modes use them: config.uses_cuda_graphs), measured interleaved with another
                # trainer in this process: CUDA graph trees support "arbitrary trees of CUDA graph operations, not
                # just sequences", and non-graph code between graphs (module docstring of
                # torch/_inductor/cudagraph_trees.py); each step starts its own generation (step.TrainStep).
                why = ("not validated by `python -m gantools check` on this GPU" if not validated(
                    f"compile {mode}", device) else None if main_thread else
                    "CUDA graphs are refused in a background thread")
                offer(name, mode, why)
        elif name == "optimizer_impl":
            built = optimizer_kernels(c.optimizer_impl, c.precision, device)  # 'auto' may already be fused
            for impl in OPTIMIZER_ORDER:
                if impl != built:
                    offer(name, impl)
        elif name == "cudnn_benchmark":
            offer(name, True, None if cuda else "cuDNN is CUDA's")
        elif name == "tf32":
            ampere = cuda and torch.cuda.get_device_capability(device)[0] >= 8
            offer(name, True, None if ampere else "TF32 needs an Ampere or newer GPU")
        elif name == "grad_accum_steps" and c.grad_accum_steps > 1:
            offer(name, c.grad_accum_steps // 2)
        elif name == "batch_size":
            values.append({"batch_size": c.batch_size * 2})
    prior = {name: p[1 if cuda else 0] for name, p in PRIOR.items()}
    candidates = []
    for change in values:
        name = next(iter(change))
        full = complete(c, change)
        if name == "batch_size":
            bigger = scale_batch(c, change["batch_size"])
            full = {"batch_size": bigger.batch_size, "lr_g": bigger.lr_g, "lr_d": bigger.lr_d}
        if full and allowed({k: v for k, v in full.items() if k not in ("lr_g", "lr_d")}, c, space):
            candidates.append(Candidate(full, "search space", prior.get(name, 1.0)))
    candidates.sort(key=lambda cand: -cand.prior)  # stable: the list's order among equals
    return candidates, skipped
