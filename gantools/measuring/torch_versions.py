"""What differs between the torch versions gantools supports, in one place, each behind its gate: code elsewhere
calls these rather than test a version or an attribute itself.

- TF32 settings: torch >= 2.9 adds per-backend `fp32_precision` strings beside the legacy flags; once a process mixes
  the two, the legacy getters raise (see `core.process.backend_flags` for why gantools writes the legacy ones).
- Dynamo's per-code-object limit is `recompile_limit` from torch 2.6 (pytorch/pytorch#143709), `cache_size_limit`
  before it.
"""
from __future__ import annotations

import contextlib
import warnings

import torch


def precision_settings() -> list:
    """The per-backend TF32 settings objects (`fp32_precision`) of torch >= 2.9; none on older versions."""
    cudnn = torch.backends.cudnn
    objects = [torch.backends.cuda.matmul, getattr(cudnn, "conv", None), getattr(cudnn, "rnn", None)]
    return [o for o in objects if o is not None and hasattr(o, "fp32_precision")]


def precision_string(obj) -> str | None:
    """A backend's `fp32_precision` string, or None where this torch has none (before 2.9)."""
    return getattr(obj, "fp32_precision", None)


def legacy_conv_tf32() -> bool | None:
    """cuDNN's TF32 flag through the legacy API, or None when reading it raises (the process used the new one)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy getters' deprecation notice (torch >= 2.9)
        try:
            return torch.backends.cudnn.allow_tf32
        except RuntimeError:
            return None


def set_conv_tf32(enabled: bool, legacy: bool) -> None:
    """cuDNN's TF32 switch, through the legacy flag or (where the process already uses it) the per-backend string."""
    if legacy:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.backends.cudnn.allow_tf32 = enabled
    else:
        torch.backends.cudnn.conv.fp32_precision = "tf32" if enabled else "ieee"


def matmul_precision() -> str | None:
    """torch.get_float32_matmul_precision(), or None when it raises (legacy and new APIs already mixed)."""
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        return None


@contextlib.contextmanager
def room_to_recompile(at_least: int = 64):
    """Dynamo's limit of compiled versions per code object raised to `at_least` for the block, under the name this
    torch uses."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    with config.patch(**{name: max(at_least, getattr(config, name))}):
        yield
