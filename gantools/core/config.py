"""One config object for every run: the notebooks' widgets, the CLI flags and the benchmark all set these fields.

Each field is described once, by the `Knob` in its metadata: its type, its choices, whether None ("auto") is allowed,
whether it is a speed knob. Validation, the CLI flags of `train`/`profile`, the command lines the benchmark builds and
the widget panel all read that description (`knobs()`), so a new field is added in one place.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
from dataclasses import dataclass, field, fields
from typing import Optional

import torch

from . import distributed
from ..measuring import hardware
from ..errors import ConfigError

__all__ = ["ConfigError", "Knob", "PAPERS", "PRESETS", "TrainConfig", "cli_flags", "differences",
           "discriminator_norm", "knobs", "preset", "scale_batch", "speed_knobs"]

DATASETS = ("glyphs", "glyphs-color", "mnist", "fashion-mnist", "cifar10", "folder")
PRECISIONS = ("fp32", "fp16", "bf16")
OPTIMIZERS = ("adam", "adamw")
OPTIMIZER_IMPLS = ("auto", "for-loop", "foreach", "fused")
COMPILE_MODES = ("off", "default", "max-autotune", "reduce-overhead")


def optimizer_kernels(impl: str, precision: str, device: torch.device) -> str:
    """The optimizer implementation a run builds: `impl` as asked, but 'auto' with fp16 on CUDA is 'fused'. For any
    optimizer that does not take the loss scale itself, GradScaler.step reads found_inf back with `.item()`
    (`_maybe_opt_step` in torch/amp/grad_scaler.py), a host sync per optimizer step (pytorch/pytorch#80167); fused
    Adam and AdamW set `_step_supports_amp_scaling` and get the scale and found_inf as device tensors instead, for
    float parameters on CUDA (and on the CPU). Every other 'auto' stays PyTorch's own default (returned as 'auto':
    foreach for CUDA tensors, the for-loop on a CPU), so bf16, fp32 and CPU runs build what they always did."""
    if impl == "auto" and precision == "fp16" and device.type == "cuda":
        return "fused"
    return impl


def uses_cuda_graphs(mode: str) -> bool:
    """Whether a torch.compile mode turns CUDA graphs on (on a CUDA device; inductor applies none on a CPU): the one
    place that decides it, from the mode's own inductor options (`torch._inductor.list_mode_options`, which
    torch.compile's documentation names for this), so max-autotune, which "enables CUDA graphs by default on GPU",
    gets the step mark, the background-thread refusal and the skipped-graphs warning as reduce-overhead does."""
    if mode in ("off", "default"):
        return False
    import torch._inductor  # loaded by torch.compile anyway; not at import, so gantools imports light

    return bool(torch._inductor.list_mode_options(mode).get("triton.cudagraphs", False))


LOSSES = ("bce", "hinge", "bce-sigmoid", "lsgan", "wgan-gp")
LOADERS = ("dataloader", "device")
NONFINITE = ("stop", "skip")
TRANSFORMS = ("on-device", "per-sample")
IMAGE_SIZES = (28, 32, 64)
D_NORMS = ("auto", "batch", "layer", "none")

_KIND_WORDS = {bool: "True or False", int: "a whole number", float: "a number", str: "a string"}


@dataclass(frozen=True)
class Knob:
    """The one description of a TrainConfig field.

    `kind` is the type of the value (of each of the two values when `pair`); `choices` the allowed values, if
    limited; `optional` allows None (auto, or PyTorch's default); `speed` marks a knob that changes how fast a run
    trains or how much memory it needs, not what it learns (up to rounding, and BatchNorm's micro-batch statistics
    for grad_accum_steps): what a tuner may change freely. The CLI flag is `--name-with-dashes` (`--x/--no-x` for
    booleans)."""

    help: str
    kind: type
    choices: tuple | None = None
    optional: bool = False
    pair: bool = False
    speed: bool = False
    metavar: tuple | str | None = None

    def _item_ok(self, v) -> bool:
        if self.kind is bool:
            return isinstance(v, bool)
        if self.kind is int:
            return isinstance(v, int) and not isinstance(v, bool)
        if self.kind is float:
            return isinstance(v, (int, float)) and not isinstance(v, bool)
        return isinstance(v, self.kind)

    def type_problem(self, name: str, value) -> str | None:
        """Why `value` has the wrong type for this field (None when it is fine). Ranges and choices are checked
        by `TrainConfig.validate()`, once the types are right."""
        if value is None and self.optional:
            return None
        if self.pair:
            if isinstance(value, (tuple, list)) and len(value) == 2 and all(map(self._item_ok, value)):
                return None
            want = f"two {'numbers' if self.kind is float else _KIND_WORDS[self.kind] + 's'}, e.g. (0.5, 0.999)"
        elif self._item_ok(value):
            return None
        else:
            want = _KIND_WORDS[self.kind]
        return f"{name}={value!r} ({type(value).__name__}): must be {want}" + (" or None" if self.optional else "")

    def parse(self, text: str):
        """One value from a command-line string (argparse's `type=`): a clear message when it is not one."""
        if self.kind is str:
            return text
        try:
            return self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {_KIND_WORDS[self.kind]}") from None

    def cli_tokens(self, name: str, value) -> list[str]:
        """The command-line tokens that set this field to `value` (what the benchmark passes to a subprocess)."""
        flag = "--" + name.replace("_", "-")
        if value is None:
            raise ValueError(f"{name}=None has no command-line form: leave the flag out to get the default")
        if self.kind is bool:
            return [flag if value else "--no-" + flag[2:]]
        if self.pair:
            return [flag, *map(str, value)]
        return [flag, str(value)]


def _f(default, help, choices=None, *, kind=None, optional=False, speed=False, metavar=None):
    """A dataclass field described by its Knob (kind inferred from the default unless given)."""
    pair = isinstance(default, (list, tuple))
    kind = kind or (type(default[0]) if pair else type(default))
    knob = Knob(help, kind, choices, optional or default is None, pair, speed, metavar)
    meta = {"knob": knob, "help": help, **({"choices": choices} if choices is not None else {})}
    if pair:
        return field(default_factory=lambda: tuple(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class TrainConfig:
    """Every knob of a run. `validate()` checks them all before any work starts."""

    # where and how reproducibly
    device: str = _f("auto", "cpu, cuda, cuda:N, or auto (CUDA when present, else CPU)")
    seed: int = _f(0, "seed for weights, noise and data order")
    # data
    dataset: str = _f("glyphs", "which images to learn", DATASETS)
    data_root: Optional[str] = _f(None, "folder holding datasets (default: $GANTOOLS_DATA, else data/)", kind=str)
    data_path: Optional[str] = _f(None, "folder of image files, for dataset=folder", kind=str)
    download: bool = _f(False, "download mnist/fashion-mnist/cifar10 when missing (needs internet)")
    image_size: int = _f(32, "image side in pixels", IMAGE_SIZES)
    channels: int = _f(1, "1 (grey) or 3 (colour)", (1, 3))
    hflip: bool = _f(False, "random horizontal flips (for photos; wrong for digits)")
    loader: str = _f("dataloader", "dataloader: torch DataLoader; device: whole dataset held on the device", LOADERS,
                     speed=True)
    transform: str = _f("on-device", "on-device: uint8 batches normalised on the device; "
                        "per-sample: PIL + torchvision transforms per image, as the PyTorch tutorial does",
                        TRANSFORMS, speed=True)
    num_workers: int = _f(0, "DataLoader worker processes (0 loads in the training process)", speed=True)
    pin_memory: Optional[bool] = _f(None, "page-locked host batches for async copies to a GPU (default: on for a "
                                    "DataLoader feeding CUDA, off otherwise; CUDA only)", kind=bool, speed=True)
    persistent_workers: bool = _f(False, "keep DataLoader workers alive between epochs", speed=True)
    prefetch_factor: Optional[int] = _f(None, "batches each worker loads ahead (needs num_workers > 0)", kind=int,
                                        speed=True)
    drop_last: bool = _f(True, "drop the last incomplete batch of each epoch")
    # model
    nz: int = _f(100, "latent size")
    ngf: int = _f(64, "generator width (feature maps in its last hidden layer)")
    ndf: int = _f(64, "discriminator width (feature maps in its first layer)")
    d_norm: str = _f("auto", "the built-in D's normalisation: batch (DCGAN's BatchNorm), layer (per image, as a "
                     "gradient penalty needs; WGAN-GP's recommendation), none, or auto: layer when loss='wgan-gp' "
                     "or r1_gamma > 0, else batch", D_NORMS)
    sync_batchnorm: bool = _f(False, "under torchrun: BatchNorm statistics over the global batch (SyncBatchNorm, "
                              "CUDA only; costs one extra collective per BatchNorm layer in every forward and "
                              "backward). Off: each process normalises over its own share of the batch")
    # schedule
    batch_size: int = _f(128, "images per optimizer step, over all processes under torchrun (split into "
                         "grad_accum_steps micro-batches)")
    steps: int = _f(200, "generator steps to train for (a resumed run continues up to this many)")
    d_steps: int = _f(1, "discriminator steps per generator step (n_critic; WGAN-GP uses 5), each on its own real "
                      "batch")
    grad_accum_steps: int = _f(1, "micro-batches accumulated per optimizer step", speed=True)
    # numerics and speed
    precision: str = _f("fp32", "fp32, fp16 (autocast + GradScaler, CUDA only) or bf16 (autocast)", PRECISIONS,
                        speed=True)
    tf32: Optional[bool] = _f(None, "TF32 matmuls and convs on Ampere+ GPUs, during this run's fit() only (default: "
                              "the process's setting)", kind=bool, speed=True)
    channels_last: bool = _f(False, "NHWC memory format for convolutions", speed=True)
    compile: str = _f("off", "torch.compile mode for both networks (reduce-overhead: CUDA graphs, CUDA only)",
                      COMPILE_MODES, speed=True)
    cudnn_benchmark: bool = _f(False, "let cuDNN time and pick convolution algorithms (during this run's fit() "
                               "only)", speed=True)
    freeze_d: bool = _f(True, "stop gradients into D's weights during the generator step", speed=True)
    sync_every_step: bool = _f(False, "read losses with .item() every step, as the PyTorch tutorial does (slow)",
                               speed=True)
    # optimisation
    optimizer: str = _f("adam", "adam or adamw", OPTIMIZERS)
    optimizer_impl: str = _f("auto", "optimizer kernels: auto (fused with fp16 on CUDA, whose GradScaler step then "
                             "reads nothing back; else PyTorch's default), for-loop, foreach or fused",
                             OPTIMIZER_IMPLS, speed=True)
    lr_g: float = _f(2e-4, "generator learning rate")
    lr_d: float = _f(2e-4, "discriminator learning rate")
    betas: tuple = _f((0.5, 0.999), "Adam betas (DCGAN: 0.5, 0.999)", metavar=("BETA1", "BETA2"))
    weight_decay: float = _f(0.0, "weight decay (L2 for adam, decoupled for adamw)")
    loss: str = _f("bce", "bce: non-saturating BCE with logits; hinge; bce-sigmoid: the tutorial's "
                   "Sigmoid + BCELoss (fp32 only); lsgan: least squares; wgan-gp: Wasserstein with a gradient "
                   "penalty (with d_norm='auto' the built-in D then uses layer norm, not BatchNorm)", LOSSES)
    gp_weight: float = _f(10.0, "loss=wgan-gp: weight of the gradient penalty (10 in the WGAN-GP paper)")
    r1_gamma: float = _f(0.0, "R1 penalty on D's gradient at real images, gamma/2 * E||grad D||^2 (0: off; with "
                         "d_norm='auto' the built-in D then uses layer norm, not BatchNorm)")
    r1_interval: int = _f(1, "lazy R1: every N discriminator steps, weighted by N (StyleGAN2 uses 16)")
    ema_decay: float = _f(0.0, "exponential moving average of G's weights, used for samples, quality scores and "
                          "checkpoints (0: off; it averages over about 1/(1-decay) steps, e.g. 0.999)")
    conditional: bool = _f(False, "class-conditional: the dataset's labels go to G (an embedding joined to z) and "
                           "D (a projection head); samples show one row per class")
    # output
    log_interval: int = _f(25, "steps between loss/speed records (the only host syncs, but with fp16 and "
                           "optimizer_impl for-loop or foreach GradScaler reads back once per optimizer step)")
    sample_interval: int = _f(100, "steps between fixed-noise sample grids (0: only at the end)")
    checkpoint_interval: int = _f(200, "steps between checkpoints, so a crash loses at most this many "
                                  "(0: only at the end or on a clean stop)")
    on_nonfinite: str = _f("stop", "a NaN/inf loss: stop (with the step, network and likely cause), or skip: "
                           "restore the last good log interval's weights and go on with the next batches", NONFINITE)
    max_skips: int = _f(3, "with on_nonfinite=skip: non-finite log intervals in a row before the run stops")
    out_dir: str = _f("runs/latest", "where samples, history and checkpoints go")

    def __post_init__(self):
        for name, knob in knobs().items():  # a pair given as a list (JSON, argparse) is stored as a tuple
            value = getattr(self, name)
            if knob.pair and isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

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
        return cls().replace(**values)

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.grad_accum_steps

    @property
    def images_per_step(self) -> int:
        """Real images one training step reads: a batch per D step (`d_steps`). Images/s and "images trained"
        count these, so runs with different d_steps compare at equal data."""
        return self.batch_size * self.d_steps

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
    """Named starting points: `reference` is the PyTorch DCGAN tutorial's loop, the baseline for every speed-up;
    `dcgan`, `lsgan` and `wgan-gp` are each GAN's paper settings (see `PRESETS`), so a user gets them without
    reading the papers. Overrides win (e.g. a size for quick runs)."""
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
    # Radford et al. 2015, "Unsupervised representation learning with deep convolutional GANs", section 4: batch
    # 128, Adam with lr 0.0002 and beta1 0.5 (beta2 Adam's 0.999), BatchNorm in both networks; the non-saturating
    # loss of Goodfellow et al. 2014, on D's logits.
    "dcgan": lambda: TrainConfig(
        loss="bce", d_norm="batch", optimizer="adam", lr_g=2e-4, lr_d=2e-4, betas=(0.5, 0.999), batch_size=128),
    # Mao et al. 2017, "Least squares generative adversarial networks": the 0-1 coding a=0, b=1, c=1 (D regresses
    # real to 1 and fake to 0, G pulls fakes to 1), DCGAN's BatchNorm D, Adam with beta1 0.5; lr 0.0002 and batch 64
    # as the authors' code trains its 28 px handwritten characters (github.com/xudonmao/LSGAN, train_chn.py; its
    # 112 px scenes use lr 0.001).
    "lsgan": lambda: TrainConfig(
        loss="lsgan", d_norm="batch", optimizer="adam", lr_g=2e-4, lr_d=2e-4, betas=(0.5, 0.999), batch_size=64),
    # Gulrajani et al. 2017, "Improved training of Wasserstein GANs", Algorithm 1's defaults: lambda = 10,
    # n_critic = 5, Adam with alpha = 0.0001, beta1 = 0, beta2 = 0.9, batch 64; and no BatchNorm in the critic
    # (section 4: "we recommend layer normalization as a drop-in replacement").
    "wgan-gp": lambda: TrainConfig(
        loss="wgan-gp", gp_weight=10.0, d_steps=5, d_norm="layer", optimizer="adam", lr_g=1e-4, lr_d=1e-4,
        betas=(0.0, 0.9), batch_size=64),
}

# Where each paper preset's settings come from, for tables and the notebook (preset name -> citation).
PAPERS = {
    "dcgan": "Radford et al. 2015",
    "lsgan": "Mao et al. 2017",
    "wgan-gp": "Gulrajani et al. 2017",
}


def discriminator_norm(cfg: TrainConfig) -> str:
    """The normalisation the built-in D gets: `d_norm` as set, or for 'auto' layer norm when D's input gradient is
    penalised (wgan-gp, R1: each image's gradient must be its own, which BatchNorm's batch statistics break) and
    DCGAN's BatchNorm otherwise."""
    if cfg.d_norm != "auto":
        return cfg.d_norm
    return "layer" if cfg.loss == "wgan-gp" or cfg.r1_gamma > 0 else "batch"


def knobs() -> dict[str, Knob]:
    """Every TrainConfig field's description, in declaration order."""
    return {f.name: f.metadata["knob"] for f in fields(TrainConfig)}


def speed_knobs() -> tuple[str, ...]:
    """The fields that change speed or memory, not what is learned: what a tuner searches."""
    return tuple(name for name, knob in knobs().items() if knob.speed)


def scale_batch(cfg: TrainConfig, batch_size: int) -> TrainConfig:
    """`cfg` with another batch size and both learning rates scaled by the square root of the batch ratio, the usual
    rule for Adam (linear is SGD's). A bigger batch means fewer optimizer steps for the same images, so this changes
    what a run learns per image: on glyphs, batch x2 with lr x sqrt 2 had 2.78x the reference's FID at an equal
    image budget (README, the benchmark's max-throughput row). Compare quality before keeping it."""
    ratio = batch_size / cfg.batch_size
    return cfg.replace(batch_size=batch_size, lr_g=cfg.lr_g * math.sqrt(ratio), lr_d=cfg.lr_d * math.sqrt(ratio))


def cli_flags(cfg: TrainConfig, start: TrainConfig | None = None) -> list[str]:
    """The `train` flags that turn config `start` (default: TrainConfig()) into `cfg`: how the benchmark and the
    check start runs in other processes."""
    every = knobs()
    return [token for name, (_, value) in differences(cfg, start).items()
            for token in every[name].cli_tokens(name, value)]


def differences(cfg: TrainConfig, base: TrainConfig | None = None) -> dict[str, tuple]:
    """name -> (base's value, cfg's value) for every field where `cfg` differs from `base` (default: TrainConfig()),
    in declaration order: the one comparison behind CLI flags, tune's changes and the panel's run names."""
    base = base or TrainConfig()
    return {name: (getattr(base, name), getattr(cfg, name)) for name in knobs()
            if getattr(cfg, name) != getattr(base, name)}


def _default(name: str):
    """A field's default value (what leaving it out gives)."""
    return getattr(TrainConfig(), name)


def _type_problems(cfg: TrainConfig) -> list[str]:
    return [p for name, knob in knobs().items() if (p := knob.type_problem(name, getattr(cfg, name)))]


def _value_problems(c: TrainConfig) -> list[str]:
    p = []

    def choice(name):
        allowed = knobs()[name].choices
        if getattr(c, name) not in allowed:
            p.append(f"{name}={getattr(c, name)!r}: choose one of {', '.join(map(str, allowed))}")
            return False
        return True

    def at_least(name, low):
        if getattr(c, name) < low:
            p.append(f"{name}={getattr(c, name)}: must be >= {low}")
            return False
        return True

    def finite_at_least(name, low):
        if not math.isfinite(getattr(c, name)):
            p.append(f"{name}={getattr(c, name)}: must be a finite number")
            return False
        return at_least(name, low)

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
    if choice("d_norm") and c.d_norm == "batch" and (c.loss == "wgan-gp" or c.r1_gamma > 0):
        p.append("d_norm='batch' with a gradient penalty (loss='wgan-gp' or r1_gamma > 0): BatchNorm mixes the "
                 "images of a batch, so no image's input gradient is its own; use d_norm='layer' (or 'none', or "
                 "'auto')")
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
    # the GAN family
    if finite_at_least("gp_weight", 0):
        if c.loss == "wgan-gp" and c.gp_weight == 0:
            p.append("loss='wgan-gp' with gp_weight=0 has nothing keeping the critic 1-Lipschitz, so its loss is no "
                     "distance and training diverges: use gp_weight > 0 (10 in the paper)")
        elif c.loss != "wgan-gp" and c.gp_weight != _default("gp_weight"):
            p.append(f"gp_weight is only used with loss='wgan-gp' (loss={c.loss!r}); remove it")
    if finite_at_least("r1_gamma", 0) and at_least("r1_interval", 1):
        if c.r1_gamma == 0 and c.r1_interval != 1:
            p.append("r1_interval sets how often R1 runs, but R1 is off (r1_gamma=0): set r1_gamma > 0, or remove "
                     "r1_interval")
        if c.r1_gamma > 0 and c.loss == "bce-sigmoid":
            p.append("r1_gamma penalises the gradient of D's raw output, but loss='bce-sigmoid' squashes it through a "
                     "Sigmoid: use loss='bce' (BCE with logits)")
    at_least("d_steps", 1)
    if not (math.isfinite(c.ema_decay) and 0 <= c.ema_decay < 1):
        p.append(f"ema_decay={c.ema_decay}: must be in [0, 1) (0: off; 0.999 averages over about the last 1000 "
                 "steps)")
    if c.conditional and c.loss == "bce-sigmoid":
        p.append("conditional=True adds a projection of the label to D's logit, but loss='bce-sigmoid' puts a "
                 "Sigmoid after it: use loss='bce' (BCE with logits)")
    # output
    at_least("log_interval", 1)
    at_least("sample_interval", 0)
    at_least("checkpoint_interval", 0)
    at_least("max_skips", 1)
    if not c.out_dir:
        p.append("out_dir is empty: give a folder for samples and checkpoints")
    return p
