"""The pieces a `Trainer` is built from, each from the config alone: the networks on their device, the precision
(GradScalers and autocast) and the compiler the step calls the networks through."""
from __future__ import annotations

import contextlib
import logging
import types

import torch
from torch import nn

from ..measuring import hardware
from ..errors import ConfigError
from .activation_checkpointing import switch_on
from .config import TrainConfig, discriminator_norm
from .models import build_dcgan
from .r3gan import build_r3gan


def _import_cpp_extension_quietly() -> None:
    """Inductor on a CPU imports torch.utils.cpp_extension, which logs "No CUDA runtime is found, using CUDA_HOME=..."
    on a machine with a CUDA toolkit and no GPU: true, and nothing to do with CPU code, yet it shows in every
    notebook that compiles. The import happens once per process, so doing it here with that logger quiet silences only
    that line, and the logger's level is given back."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import torch.utils.cpp_extension  # noqa: F401
    finally:
        logger.setLevel(level)


def build_networks(cfg: TrainConfig, generator: nn.Module | None, discriminator: nn.Module | None, classes: int,
                   device: torch.device) -> tuple[nn.Module, nn.Module]:
    """G and D on the device, in the config's memory format: the caller's, or the built-in pair (`architecture`:
    DCGAN or R3GAN) when both are None.

    Args:
        cfg: the run's config (architecture, sizes, loss, seed, sync_batchnorm, channels_last).
        generator, discriminator: the caller's networks, or None for the built-in pair.
        classes: the dataset's class count for a conditional run, else 0.
        device: where the networks train.

    Returns:
        (generator, discriminator)
    """
    if generator is None:  # the same weights on every rank; the caller's RNG is not touched
        with hardware.seeded(cfg.seed):
            generator, discriminator = built_in_networks(cfg, classes)
    try:
        switch_on(generator, discriminator, cfg.activation_checkpointing)
    except ValueError as e:
        raise ConfigError(f"activation_checkpointing={cfg.activation_checkpointing!r}: {e}. It cuts the built-in "
                          "DCGAN into blocks; in your own network's forward, wrap each block as "
                          "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)") from None
    if cfg.sync_batchnorm:  # same parameters and buffers, so checkpoints stay interchangeable
        generator = nn.SyncBatchNorm.convert_sync_batchnorm(generator)
        discriminator = nn.SyncBatchNorm.convert_sync_batchnorm(discriminator)
    fmt = torch.channels_last if cfg.channels_last else torch.preserve_format
    return generator.to(device, memory_format=generator_format(cfg, device)), \
        discriminator.to(device, memory_format=fmt)


def built_in_networks(cfg: TrainConfig, classes: int) -> tuple[nn.Module, nn.Module]:
    """The built-in pair the config's `architecture` names, initialised as its paper does (seed first).

    Args:
        cfg: the run's config (architecture, sizes, loss, d_norm).
        classes: the dataset's class count for a conditional run, else 0 (DCGAN only; validation refuses labels
            for R3GAN).
    Returns:
        (generator, discriminator)
    """
    if cfg.architecture == "r3gan":
        return build_r3gan(cfg.image_size, cfg.channels, cfg.nz, cfg.ngf, cfg.ndf, cfg.fp32_stages)
    # a penalty is per image: d_norm 'auto' gives D layer norm then, not BatchNorm
    return build_dcgan(cfg.image_size, cfg.channels, cfg.nz, cfg.ngf, cfg.ndf, sigmoid=(cfg.loss == "bce-sigmoid"),
                       d_norm=discriminator_norm(cfg), classes=classes)


def generator_format(cfg: TrainConfig, device: torch.device) -> torch.memory_format:
    """G's memory format: channels_last when asked, except compiled on CUDA. There inductor's fake kernel for
    convolution_backward predicts channels_last strides for a ConvTranspose2d's weight gradient that cuDNN returns
    contiguous, and the compiled backward fails its own stride assertion (pytorch/pytorch#171622, open; the GPU run
    in docs/gpu/ that met it). Compiled graphs need no hint: inductor lays
    out convolutions itself (`torch._inductor.config.layout_optimization`, on by default)."""
    if not cfg.channels_last or (cfg.compile != "off" and device.type == "cuda"):
        return torch.preserve_format
    return torch.channels_last


def build_precision(cfg: TrainConfig, device: torch.device):
    """The config's precision: one GradScaler per network (enabled for fp16 only; step.py says why two) and the
    autocast context the step runs its forwards in.

    Returns:
        (scaler_g, scaler_d, autocast), autocast a callable that returns a context manager.
    """
    scaler_g = torch.amp.GradScaler(device.type, enabled=(cfg.precision == "fp16"))
    scaler_d = torch.amp.GradScaler(device.type, enabled=(cfg.precision == "fp16"))
    if cfg.precision == "fp32":
        return scaler_g, scaler_d, contextlib.nullcontext
    dtype = torch.float16 if cfg.precision == "fp16" else torch.bfloat16
    return scaler_g, scaler_d, lambda: torch.autocast(device.type, dtype=dtype)


def build_compiler(cfg: TrainConfig, device: torch.device):
    """(module, call site) -> the module as that call site of the step calls it: torch.compile'd in the config's
    mode, or the module itself. Each call site compiles a function of its own (`own_call`), with `dynamic=False`:
    dynamo keeps its compiled graphs per code object, and a module's forward is one code object for every call and
    every trainer, so D called with inputs that need no gradient (D's step) and with inputs that do (G's step), or
    trainers at other batch sizes or precisions (the benchmark's rows, in one process), would each fail the last
    one's guards and recompile, and a second batch size would turn the graphs dynamic ("automatic dynamic shapes",
    torch.compile's docs). A trainer with the same call site, shapes and precision as an earlier one shares its code
    object, and so reuses its graphs."""
    if cfg.compile == "off":
        return lambda m, site: m
    if device.type == "cpu":
        _import_cpp_extension_quietly()
    mode = None if cfg.compile == "default" else cfg.compile
    # what a graph's guards see: the inputs' shapes, dtypes and layouts, the networks' structure, requires_grad
    seen = tuple(getattr(cfg, name) for name in _GUARDED)
    return lambda m, site: torch.compile(own_call(m, (site, type(m).__qualname__, mode, *seen)), mode=mode,
                                         dynamic=False)


# the config fields a compiled call site's graphs depend on: configs that agree on all of them share its graphs
_GUARDED = ("batch_size", "grad_accum_steps", "precision", "channels_last", "image_size", "channels", "nz", "ngf",
            "ndf", "architecture", "d_norm", "loss", "conditional", "fp32_stages", "freeze_d", "sync_batchnorm",
            "activation_checkpointing", "d_steps")


_CODES: dict = {}  # call site key -> its code object


def own_call(module: nn.Module, site: tuple):
    """A function that calls `module`, with the code object of call site `site` (a copy of this function's,
    renamed `call_N`, made once per site): what torch.compile compiles for one call site (`build_compiler`).
    `__wrapped__` is the module."""
    def call(*args, **kwargs):
        return module(*args, **kwargs)

    code = _CODES.setdefault(site, call.__code__.replace(co_name=f"call_{len(_CODES)}"))
    fn = types.FunctionType(code, call.__globals__, code.co_name, None, call.__closure__)
    fn.__wrapped__ = module
    return fn
