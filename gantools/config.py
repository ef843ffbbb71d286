"""One config object for every run: the notebooks' widgets, the CLI flags and the benchmark all set these fields."""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field, fields
from typing import Optional

import torch

from . import distributed, hardware

DATASETS = ("glyphs", "glyphs-color", "mnist", "fashion-mnist", "cifar10", "folder")
PRECISIONS = ("fp32", "fp16", "bf16")
OPTIMIZERS = ("adam", "adamw")
OPTIMIZER_IMPLS = ("auto", "for-loop", "foreach", "fused")
COMPILE_MODES = ("off", "default", "max-autotune", "reduce-overhead")
LOSSES = ("bce", "hinge", "bce-sigmoid")
LOADERS = ("dataloader", "device")
NONFINITE = ("stop", "skip")
TRANSFORMS = ("on-device", "per-sample")
IMAGE_SIZES = (28, 32, 64)


class ConfigError(ValueError):
    """A config value (or combination) that cannot work; the message lists every problem and its fix."""


def _f(default, help, choices=None, **kw):
    meta = {"help": help}
    if choices is not None:
        meta["choices"] = choices
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: default, metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


@dataclass
class TrainConfig:
    """Every knob of a run. `validate()` checks them all before any work starts."""

    # where and how reproducibly
    device: str = _f("auto", "cpu, cuda, cuda:N, or auto (CUDA when present, else CPU)")
    seed: int = _f(0, "seed for weights, noise and data order")
    # data
    dataset: str = _f("glyphs", "which images to learn", DATASETS)
    data_root: Optional[str] = _f(None, "folder holding datasets (default: $GANTOOLS_DATA, else data/)")
    data_path: Optional[str] = _f(None, "folder of image files, for dataset=folder")
    download: bool = _f(False, "download mnist/fashion-mnist/cifar10 when missing (needs internet)")
    image_size: int = _f(32, "image side in pixels", IMAGE_SIZES)
    channels: int = _f(1, "1 (grey) or 3 (colour)", (1, 3))
    hflip: bool = _f(False, "random horizontal flips (for photos; wrong for digits)")
    loader: str = _f("dataloader", "dataloader: torch DataLoader; device: whole dataset held on the device", LOADERS)
    transform: str = _f("on-device", "on-device: uint8 batches normalised on the device; "
                        "per-sample: PIL + torchvision transforms per image, as the PyTorch tutorial does",
                        TRANSFORMS)
    num_workers: int = _f(0, "DataLoader worker processes (0 loads in the training process)")
    pin_memory: bool = _f(False, "page-locked host batches for async copies to a GPU (CUDA only)")
    persistent_workers: bool = _f(False, "keep DataLoader workers alive between epochs")
    prefetch_factor: Optional[int] = _f(None, "batches each worker loads ahead (needs num_workers > 0)")
    drop_last: bool = _f(True, "drop the last incomplete batch of each epoch")
    # model
    nz: int = _f(100, "latent size")
    ngf: int = _f(64, "generator width (feature maps in its last hidden layer)")
    ndf: int = _f(64, "discriminator width (feature maps in its first layer)")
    sync_batchnorm: bool = _f(False, "under torchrun: BatchNorm statistics over the global batch (SyncBatchNorm, "
                              "CUDA only; costs one extra collective per BatchNorm layer in every forward and "
                              "backward). Off: each process normalises over its own share of the batch")
    # schedule
    batch_size: int = _f(128, "images per optimizer step, over all processes under torchrun (split into "
                         "grad_accum_steps micro-batches)")
    steps: int = _f(200, "optimizer steps to train for (a resumed run continues up to this many)")
    grad_accum_steps: int = _f(1, "micro-batches accumulated per optimizer step")
    # numerics and speed
    precision: str = _f("fp32", "fp32, fp16 (autocast + GradScaler, CUDA only) or bf16 (autocast)", PRECISIONS)
    tf32: Optional[bool] = _f(None, "TF32 matmuls and convs on Ampere+ GPUs (default: PyTorch's own defaults)")
    channels_last: bool = _f(False, "NHWC memory format for convolutions")
    compile: str = _f("off", "torch.compile mode for both networks", COMPILE_MODES)
    cudnn_benchmark: bool = _f(False, "let cuDNN time and pick convolution algorithms")
    freeze_d: bool = _f(True, "stop gradients into D's weights during the generator step")
    sync_every_step: bool = _f(False, "read losses with .item() every step, as the PyTorch tutorial does (slow)")
    # optimisation
    optimizer: str = _f("adam", "adam or adamw", OPTIMIZERS)
    optimizer_impl: str = _f("auto", "optimizer kernels: auto, for-loop, foreach or fused", OPTIMIZER_IMPLS)
    lr_g: float = _f(2e-4, "generator learning rate")
    lr_d: float = _f(2e-4, "discriminator learning rate")
    betas: tuple = _f((0.5, 0.999), "Adam betas (DCGAN: 0.5, 0.999)")
    weight_decay: float = _f(0.0, "weight decay (L2 for adam, decoupled for adamw)")
    loss: str = _f("bce", "bce: non-saturating BCE with logits; hinge; bce-sigmoid: the tutorial's "
                   "Sigmoid + BCELoss (fp32 only)", LOSSES)
    # output
    log_interval: int = _f(25, "steps between loss/speed records (the only host syncs)")
    sample_interval: int = _f(100, "steps between fixed-noise sample grids (0: only at the end)")
    checkpoint_interval: int = _f(200, "steps between checkpoints, so a crash loses at most this many "
                                  "(0: only at the end or on a clean stop)")
    on_nonfinite: str = _f("stop", "a NaN/inf loss: stop (with the step, network and likely cause), or skip: "
                           "restore the last good log interval's weights and go on with the next batches", NONFINITE)
    max_skips: int = _f(3, "with on_nonfinite=skip: non-finite log intervals in a row before the run stops")
    out_dir: str = _f("runs/latest", "where samples, history and checkpoints go")

    # -- presets ----------------------------------------------------------------------------
    def replace(self, **changes) -> "TrainConfig":
        """A copy with some fields changed (unknown names are an error)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"unknown config field(s): {', '.join(sorted(unknown))}. "
                              f"Known fields: {', '.join(f.name for f in fields(self))}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        values = dict(values)
        if "betas" in values and isinstance(values["betas"], list):
            values["betas"] = tuple(values["betas"])
        return cls().replace(**values)

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.grad_accum_steps

    # -- validation -------------------------------------------------------------------------
    def validate(self) -> "TrainConfig":
        """Raise one ConfigError listing every impossible value or combination, before any work starts."""
        problems = _type_problems(self)
        if not problems:  # value checks assume the types are right
            problems = _value_problems(self)
        if problems:
            raise ConfigError("invalid TrainConfig:\n  - " + "\n  - ".join(problems))
        return self


def preset(name: str, **overrides) -> TrainConfig:
    """Named starting points. `reference` is the PyTorch DCGAN tutorial's loop, the baseline for every speed-up."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return PRESETS[name]().replace(**overrides)


PRESETS = {
    "default": TrainConfig,
    # https://pytorch.org/tutorials/beginner/dcgan_faces_tutorial.html as published: Sigmoid + BCELoss,
    # DataLoader with 2 workers and per-sample PIL transforms, fp32, .item() every step, D not frozen.
    "reference": lambda: TrainConfig(
        loss="bce-sigmoid", loader="dataloader", transform="per-sample", num_workers=2,
        precision="fp32", sync_every_step=True, freeze_d=False, optimizer="adam",
        optimizer_impl="auto", betas=(0.5, 0.999), lr_g=2e-4, lr_d=2e-4),
}


def _type_problems(cfg: TrainConfig) -> list[str]:
    out = []
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        optional = default is None or f.name in ("tf32", "prefetch_factor", "data_root", "data_path")
        if v is None and optional:
            continue
        if f.name == "betas":
            ok = (isinstance(v, (tuple, list)) and len(v) == 2
                  and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in v))
            want = "two numbers, e.g. (0.5, 0.999)"
        elif f.name == "tf32" or isinstance(default, bool):
            ok, want = isinstance(v, bool), "True or False"
        elif f.name == "prefetch_factor" or isinstance(default, int):
            ok, want = isinstance(v, int) and not isinstance(v, bool), "a whole number"
        elif isinstance(default, float):
            ok, want = isinstance(v, (int, float)) and not isinstance(v, bool), "a number"
        else:
            ok, want = isinstance(v, str), "a string"
        if not ok:
            out.append(f"{f.name}={v!r} ({type(v).__name__}): must be {want}")
    return out


def _value_problems(c: TrainConfig) -> list[str]:
    p = []

    def choice(name):
        allowed = TrainConfig.__dataclass_fields__[name].metadata["choices"]
        if getattr(c, name) not in allowed:
            p.append(f"{name}={getattr(c, name)!r}: choose one of {', '.join(map(str, allowed))}")
            return False
        return True

    def at_least(name, low):
        if getattr(c, name) < low:
            p.append(f"{name}={getattr(c, name)}: must be >= {low}")
            return False
        return True

    # device
    device = None
    world = distributed.world()
    try:
        device = distributed.device(c.device, world)
        if device.type not in ("cpu", "cuda"):
            p.append(f"device={c.device!r}: gantools runs on cpu or cuda")
            device = None
        elif device.type == "cuda" and not torch.cuda.is_available():
            p.append(f"device={c.device!r}: no CUDA GPU is visible to PyTorch; use device='cpu' (or 'auto')")
            device = None
        elif device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
            p.append(f"device={c.device!r}: only {torch.cuda.device_count()} GPU(s) visible" +
                     (f" on this machine, but torchrun started process LOCAL_RANK={world.local_rank} here: "
                      f"--nproc_per_node must not exceed the GPUs per machine" if c.device in ("auto", "cuda") else ""))
            device = None
        elif world.distributed and device.type == "cuda" and c.device not in ("auto", "cuda"):
            p.append(f"device={c.device!r} would put every torchrun process on one GPU: use device='cuda' (or "
                     f"'auto'), and each process takes its own, cuda:LOCAL_RANK")
            device = None
    except RuntimeError:
        p.append(f"device={c.device!r}: not a device name; use auto, cpu, cuda or cuda:N")

    # data
    if choice("dataset") and c.dataset == "folder":
        if not c.data_path:
            p.append("dataset='folder' needs data_path (a folder of image files)")
        elif not os.path.isdir(c.data_path):
            p.append(f"data_path={c.data_path!r}: no such folder")
    elif c.data_path:
        p.append(f"data_path is only used with dataset='folder' (dataset={c.dataset!r}); remove it")
    if c.dataset == "glyphs-color" and c.channels != 3:
        p.append("dataset='glyphs-color' is 3-channel: set channels=3")
    choice("image_size")
    choice("channels")
    if choice("loader") and c.loader == "device":
        if c.transform == "per-sample":
            p.append("loader='device' keeps uint8 images on the device: use transform='on-device'")
        if c.num_workers or c.pin_memory or c.persistent_workers or c.prefetch_factor is not None:
            p.append("num_workers, pin_memory, persistent_workers and prefetch_factor are DataLoader knobs; "
                     "with loader='device' set them to 0/False/None")
        if c.dataset == "folder":
            p.append("loader='device' needs the whole dataset decoded in memory; dataset='folder' streams "
                     "files: use loader='dataloader'")
    choice("transform")
    if at_least("num_workers", 0) and c.num_workers == 0:
        if c.persistent_workers:
            p.append("persistent_workers=True needs num_workers > 0")
        if c.prefetch_factor is not None:
            p.append("prefetch_factor needs num_workers > 0 (or leave it None)")
    if c.prefetch_factor is not None:
        at_least("prefetch_factor", 1)
    if c.pin_memory and device is not None and device.type != "cuda":
        p.append("pin_memory=True only helps copies to a GPU; set it False on the CPU")
    # model
    at_least("nz", 1)
    at_least("ngf", 1)
    at_least("ndf", 1)
    # schedule
    ok_b = at_least("batch_size", 1)
    ok_k = at_least("grad_accum_steps", 1)
    parts = world.size * c.grad_accum_steps if ok_k else 1
    if ok_b and ok_k and c.batch_size % parts:
        fix = f"try batch_size={parts * max(1, c.batch_size // parts)}"
        if world.distributed:
            micro = f", each in grad_accum_steps={c.grad_accum_steps} micro-batches" if c.grad_accum_steps > 1 else ""
            p.append(f"batch_size={c.batch_size} is the global batch, shared by the {world.size} processes torchrun "
                     f"started{micro}: it must be divisible by {parts} so every process gets an equal share ({fix}, "
                     f"or a --nproc_per_node that divides it)")
        else:
            p.append(f"batch_size={c.batch_size} is not divisible by grad_accum_steps={c.grad_accum_steps}: "
                     f"each micro-batch must have the same size ({fix})")
    if ok_b and ok_k and parts > 1 and not c.drop_last:
        p.append("grad_accum_steps > 1 and torchrun need drop_last=True so every batch splits into equal parts")
    at_least("steps", 1)
    # numerics
    if choice("precision") and device is not None:
        if c.precision == "fp16" and device.type == "cpu":
            p.append("precision='fp16' needs a CUDA GPU (GradScaler and fast fp16 kernels); on the CPU use 'bf16'")
        if c.precision == "bf16" and not hardware.supports_bf16(device):
            p.append("precision='bf16' is not supported on this GPU (needs Ampere or newer); use 'fp16'")
    if c.sync_batchnorm and device is not None and device.type != "cuda":
        p.append("sync_batchnorm=True needs CUDA GPUs (PyTorch's SyncBatchNorm runs on NCCL, not on the CPU): "
                 "set it False (each process then normalises over its own share of the batch)")
    if choice("compile") and c.compile == "reduce-overhead" and device is not None and device.type != "cuda":
        p.append("compile='reduce-overhead' uses CUDA graphs: on the CPU use compile='default'")
    # optimisation
    choice("optimizer")
    choice("optimizer_impl")
    for name in ("lr_g", "lr_d"):
        v = getattr(c, name)
        if not (math.isfinite(v) and v > 0):
            p.append(f"{name}={v}: must be a positive number (DCGAN uses 2e-4)")
    if not all(0 <= b < 1 for b in c.betas):
        p.append(f"betas={tuple(c.betas)}: each beta must be in [0, 1)")
    if not (math.isfinite(c.weight_decay) and c.weight_decay >= 0):
        p.append(f"weight_decay={c.weight_decay}: must be >= 0")
    if choice("loss") and c.loss == "bce-sigmoid" and c.precision != "fp32":
        p.append("loss='bce-sigmoid' (Sigmoid + BCELoss) is unsafe under autocast: use loss='bce' "
                 "(BCE with logits) with fp16/bf16")
    # output
    at_least("log_interval", 1)
    at_least("sample_interval", 0)
    at_least("checkpoint_interval", 0)
    at_least("max_skips", 1)
    if not c.out_dir:
        p.append("out_dir is empty: give a folder for samples and checkpoints")
    return p
