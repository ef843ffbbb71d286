"""One config object for every run: the notebooks' widgets, the CLI flags and the benchmark all set these fields.

Each field is described once, by the `Knob` in its metadata: its type, its choices, whether None ("auto") is allowed,
whether it is a speed knob. Validation, the CLI flags of `train`/`profile`, the command lines the benchmark builds and
the widget panel all read that description (`knobs()`), so a new field is added in one place.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Optional

import torch

from ..errors import ConfigError
from .activation_checkpointing import NETWORKS as CHECKPOINTED
from .lr_schedule import SCHEDULES
from .validation import penalised, value_problems

__all__ = ["ConfigError", "Knob", "PAPERS", "PRESETS", "TrainConfig", "cli_flags", "differences",
           "discriminator_norm", "knobs", "preset", "scale_batch", "speed_knobs"]

DATASETS = ("glyphs", "glyphs-color", "mnist", "fashion-mnist", "cifar10", "folder")
PRECISIONS = ("fp32", "fp16", "bf16")
OPTIMIZERS = ("adam", "adamw")
OPTIMIZER_IMPLS = ("auto", "pytorch", "for-loop", "foreach", "fused")
COMPILE_MODES = ("off", "default", "max-autotune", "reduce-overhead")


def optimizer_kernels(impl: str, device: torch.device) -> str:
    """The optimizer implementation a run builds: `impl` as asked, but 'auto' on CUDA is 'fused', in every precision.
    PyTorch's own default there is foreach (torch/optim/optimizer.py, `_fused_doc`: fused is "theoretically
    fastest", left off by default only for "bake-in time"), which keeps Adam's `step` counters on the host and reads
    each back with `.item()` for its bias corrections: two host reads per parameter per step. Fused Adam and AdamW
    keep the counters on the device, take float64, float32, float16 and bfloat16 parameters (the same note), and
    set `_step_supports_amp_scaling`, so under fp16 GradScaler hands them the scale and found_inf as device tensors
    instead of reading found_inf back (`_maybe_opt_step` in torch/amp/grad_scaler.py, pytorch/pytorch#80167).
    Elsewhere 'auto' stays PyTorch's default (returned as 'auto': the for-loop on a CPU), so CPU runs build what
    they always did; 'pytorch' is PyTorch's default everywhere (what the tutorial's loop, the `reference` preset,
    builds: foreach on CUDA)."""
    if impl == "auto" and device.type == "cuda":
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


LOSSES = ("bce", "hinge", "bce-sigmoid", "lsgan", "wgan-gp", "rpgan")
ARCHITECTURES = ("dcgan", "r3gan")
LOADERS = ("dataloader", "device", "memmap", "auto")
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
    """Every knob of a run, in one place, so a run is its config. `validate()` checks them all before any work
    starts. Build it with keywords (`TrainConfig(batch_size=256, precision="bf16")`), change it with `replace()`.

    Each field is described once, by its Knob (its help, type and choices): read them with
    `gantools.core.config.knobs()` (`knobs()["precision"].help`), or as the flags of `python -m gantools train --help`,
    which are made from them.
    """

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
    loader: str = _f("dataloader", "dataloader: torch DataLoader; device: whole dataset held on the device; memmap: "
                     "uint8 images in host memory (a folder's cache) read a batch at a time into pinned buffers; "
                     "auto: device when the images fit data_budget_mb, else memmap (docs/datasets.md)", LOADERS,
                     speed=True)
    data_budget_mb: Optional[float] = _f(None, "loader='auto': the most device memory the images may take (default: "
                                         "what is free beside the networks, less a quarter of the device)", kind=float)
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
    architecture: str = _f("dcgan", "the built-in networks: dcgan (Radford et al. 2015: 28, 32 or 64 px), or r3gan "
                           "(Huang et al. 2024: residual blocks with grouped convs, no normalisation, 32 or 64 px, "
                           "unconditional)", ARCHITECTURES)
    nz: int = _f(100, "latent size")
    ngf: int = _f(64, "generator width (dcgan: feature maps in its last hidden layer; r3gan: each stage's width)")
    ndf: int = _f(64, "discriminator width (dcgan: feature maps in its first layer; r3gan: each stage's width)")
    d_norm: str = _f("auto", "the built-in DCGAN D's normalisation: batch (DCGAN's BatchNorm), layer (per image, as "
                     "a gradient penalty needs; WGAN-GP's recommendation), none, or auto: layer when loss='wgan-gp' "
                     "or r1_gamma or r2_gamma > 0, else batch (r3gan has none)", D_NORMS)
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
    fp32_stages: int = _f(0, "architecture='r3gan' with precision bf16 or fp16: how many of its stages, from 4 x 4 up, "
                          "run in fp32, the rest in 16-bit (0: every stage in 16-bit; StyleGAN2-ADA's split, 16-bit "
                          "never at 4 x 4, is fp32_stages=1; nothing changes in fp32 or with networks of your own)")
    tf32: Optional[bool] = _f(None, "TF32 matmuls and convs on Ampere+ GPUs, during this run's fit() only (default: "
                              "the process's setting)", kind=bool, speed=True)
    channels_last: bool = _f(False, "NHWC memory format for convolutions", speed=True)
    compile: str = _f("off", "torch.compile mode for both networks (reduce-overhead: CUDA graphs, CUDA only)",
                      COMPILE_MODES, speed=True)
    cuda_graphs: bool = _f(False, "capture each whole training step (D's and G's, the batch's gather and the noise "
                           "included) in one CUDA graph and replay it: one launch a step instead of hundreds (CUDA, "
                           "loader='device', one process; docs/cuda-graphs.md)", speed=True)
    cudnn_benchmark: bool = _f(False, "let cuDNN time and pick convolution algorithms (during this run's fit() "
                               "only)", speed=True)
    activation_checkpointing: str = _f("off", "recompute the built-in networks' activations in backward instead of "
                                       "keeping them, block by block: off, g, d or both (less memory, more compute)",
                                       CHECKPOINTED)
    freeze_d: bool = _f(True, "stop gradients into D's weights during the generator step", speed=True)
    sync_every_step: bool = _f(False, "read losses with .item() every step, as the PyTorch tutorial does (slow)",
                               speed=True)
    # optimisation
    optimizer: str = _f("adam", "adam or adamw", OPTIMIZERS)
    optimizer_impl: str = _f("auto", "optimizer kernels: auto (fused on CUDA, which reads nothing back to the host; "
                             "else PyTorch's default), pytorch (PyTorch's default everywhere: foreach on CUDA), "
                             "for-loop, foreach or fused",
                             OPTIMIZER_IMPLS, speed=True)
    lr_g: float = _f(2e-4, "generator learning rate")
    lr_d: float = _f(2e-4, "discriminator learning rate")
    betas: tuple = _f((0.5, 0.999), "Adam betas (DCGAN: 0.5, 0.999)", metavar=("BETA1", "BETA2"))
    weight_decay: float = _f(0.0, "weight decay (L2 for adam, decoupled for adamw)")
    lr_schedule: str = _f("constant", "both learning rates over the run, after any warm-up: constant, or cosine "
                          "(decaying to 0 at `steps`)", SCHEDULES)
    warmup_steps: int = _f(0, "steps over which both learning rates rise linearly to lr_g and lr_d (0: none)")
    loss: str = _f("bce", "bce: non-saturating BCE with logits; hinge; bce-sigmoid: the tutorial's "
                   "Sigmoid + BCELoss (fp32 only); lsgan: least squares; wgan-gp: Wasserstein with a gradient "
                   "penalty (with d_norm='auto' the built-in D then uses layer norm, not BatchNorm); rpgan: "
                   "relativistic pairing (R3GAN's loss), each real image scored against a fake one", LOSSES)
    gp_weight: float = _f(10.0, "loss=wgan-gp: weight of the gradient penalty (10 in the WGAN-GP paper)")
    r1_gamma: float = _f(0.0, "R1 penalty on D's gradient at real images, gamma/2 * E||grad D||^2 (0: off; with "
                         "d_norm='auto' the built-in D then uses layer norm, not BatchNorm)")
    r1_interval: int = _f(1, "lazy R1: every N discriminator steps, weighted by N (StyleGAN2 uses 16)")
    r2_gamma: float = _f(0.0, "R2 penalty on D's gradient at G's images, gamma/2 * E||grad D||^2 (0: off; R3GAN uses "
                         "r1_gamma = r2_gamma; with d_norm='auto' the built-in D then uses layer norm)")
    r2_interval: int = _f(1, "lazy R2: every N discriminator steps, weighted by N")
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
            problems = value_problems(self)
        if problems:
            raise ConfigError("invalid TrainConfig:\n  - " + "\n  - ".join(problems))
        return self


def preset(name: str, **overrides) -> TrainConfig:
    """Named starting points: `reference` is the PyTorch DCGAN tutorial's loop, the baseline for every speed-up;
    `dcgan`, `lsgan`, `wgan-gp` and `r3gan` are each GAN's paper settings (see `PRESETS`; `r3gan` scaled down for
    small images and short runs), so a user gets them without reading the papers; `default` is TrainConfig().

    Args:
        name: one of `PRESETS`.
        **overrides: TrainConfig fields that win over the preset's (e.g. a size for quick runs).
    Returns:
        The TrainConfig (not yet validated).
    Raises:
        ConfigError: an unknown name, or an override that is not a TrainConfig field.
    """
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
        optimizer_impl="pytorch", betas=(0.5, 0.999), lr_g=2e-4, lr_d=2e-4),
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
    # Huang et al. 2024, "The GAN is dead; long live the GAN! A modern GAN baseline", config E (section 3), as the
    # authors' train.py sets it for CIFAR-10, the paper's 32 px run (github.com/brownvc/R3GAN): R3GAN's networks,
    # the RpGAN loss with R1 and R2 at one gamma, Adam with beta1 0, noise of 64, an EMA of G. Its schedules run
    # cosines over 20M images (lr 2e-4 -> 5e-5, gamma 0.05 -> 0.005, beta2 0.9 -> 0.99, the EMA's half-life from 0 up
    # to 5M images); a run on a CPU sees a small share of that, where they have barely left their start, so the
    # start is kept, constant: lr 2e-4, gamma 0.05, beta2 0.9 (gantools schedules no gamma or beta2, and its cosine
    # decays lr to 0 at `steps`, not to a quarter over 20M images). Scaled down: width 32 per stage (the paper's
    # 768), batch 64 (its 512) at the paper's rate (the square-root rule's lower rate, and a larger gamma, measured no
    # better beyond a second seed's spread: docs/gan-family.md), and an EMA decay of 0.99 per step, a half-life of
    # about 70 steps. At 64 px the paper's FFHQ-64 run uses gamma 2 (r1_gamma = r2_gamma = 2.0).
    "r3gan": lambda: TrainConfig(
        architecture="r3gan", ngf=32, ndf=32, nz=64, loss="rpgan", r1_gamma=0.05, r2_gamma=0.05, optimizer="adam",
        lr_g=2e-4, lr_d=2e-4, betas=(0.0, 0.9), ema_decay=0.99, batch_size=64),
}

# Where each paper preset's settings come from, for tables and the notebook (preset name -> citation).
PAPERS = {
    "dcgan": "Radford et al. 2015",
    "lsgan": "Mao et al. 2017",
    "wgan-gp": "Gulrajani et al. 2017",
    "r3gan": "Huang et al. 2024",
}


def discriminator_norm(cfg: TrainConfig) -> str:
    """The normalisation the built-in D gets: none in R3GAN's; in DCGAN's `d_norm` as set, or for 'auto' layer norm
    when D's input gradient is penalised (wgan-gp, R1, R2: each image's gradient must be its own, which BatchNorm's
    batch statistics break) and DCGAN's BatchNorm otherwise."""
    if cfg.architecture == "r3gan":
        return "none"
    if cfg.d_norm != "auto":
        return cfg.d_norm
    return "layer" if penalised(cfg) else "batch"


def knobs() -> dict[str, Knob]:
    """Every TrainConfig field's description, in declaration order."""
    return {f.name: f.metadata["knob"] for f in fields(TrainConfig)}


def speed_knobs() -> tuple[str, ...]:
    """The fields that change speed or memory, not what is learned: what a tuner searches."""
    return tuple(name for name, knob in knobs().items() if knob.speed)


def scale_batch(cfg: TrainConfig, batch_size: int) -> TrainConfig:
    """`cfg` with another batch size and both learning rates scaled by the square root of the batch ratio, the usual
    rule for Adam (linear is SGD's). A bigger batch means fewer optimizer steps for the same images, so this changes
    what a run learns per image, and the square-root rule does not make up for it (evidence: docs/benchmark.md, the
    max-throughput row). Compare quality before keeping it."""
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


def _type_problems(cfg: TrainConfig) -> list[str]:
    return [p for name, knob in knobs().items() if (p := knob.type_problem(name, getattr(cfg, name)))]
