"""Activation checkpointing: keep only each block's input for backward and compute the block's activations again
when backward needs them, trading compute for memory (Chen et al. 2016, "Training Deep Nets with Sublinear Memory
Cost"). A block of the built-in DCGAN is one convolution with the normalisation and activation after it; the last
block runs as usual (backward needs its output at once, so keeping it costs nothing extra), as
`torch.utils.checkpoint.checkpoint_sequential` leaves its last segment.

Two details make it exact, not just close:
- `use_reentrant=False`, the variant PyTorch recommends: it supports `torch.autograd.grad` (a gradient penalty's
  input gradient) and inputs that do not require grad (G's noise).
- BatchNorm's running statistics. The recomputation runs the block's forward again in training mode, so each
  BatchNorm would fold the batch's statistics into its running mean and variance twice (pytorch/pytorch#96136,
  open). `context_fn` gives the recomputation its own context; `_KeepNormBuffers` saves those buffers as the
  recomputation starts and puts them back when it ends, so a checkpointed run's buffers (and its samples in eval
  mode) equal an uncheckpointed run's. The activations and gradients are the same either way."""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

NETWORKS = ("off", "g", "d", "both")
_CONVS = (nn.Conv2d, nn.ConvTranspose2d)


def blocks(layers: nn.Sequential) -> list[nn.Sequential]:
    """`layers` cut before each convolution: [conv, norm, activation], ... (the first cut holds whatever comes
    before the first convolution, when anything does)."""
    cuts = [i for i, layer in enumerate(layers) if isinstance(layer, _CONVS) and i > 0]
    bounds = [0, *cuts, len(layers)]
    return [layers[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


class _KeepNormBuffers:
    """The block's normalisation buffers (running mean and variance, batches counted) as they were when entered.
    A class, not a generator: a double backward (a penalty's) recomputes a block more than once, in one context."""

    def __init__(self, block: nn.Module):
        self.buffers = [b for m in block.modules() if isinstance(m, nn.modules.batchnorm._NormBase)
                        for b in m.buffers()]

    def __enter__(self):
        self.saved = [b.clone() for b in self.buffers]

    def __exit__(self, *exc):
        with torch.no_grad():
            for buffer, value in zip(self.buffers, self.saved, strict=True):
                buffer.copy_(value)


def run(layers: nn.Sequential, x: torch.Tensor, checkpointed: bool) -> torch.Tensor:
    """`layers(x)`; with `checkpointed` (and autograd recording), every block but the last checkpointed."""
    if not checkpointed or not torch.is_grad_enabled():
        return layers(x)
    parts = blocks(layers)
    for block in parts[:-1]:
        x = checkpoint(block, x, use_reentrant=False,
                       context_fn=lambda b=block: (contextlib.nullcontext(), _KeepNormBuffers(b)))
    return parts[-1](x)


def switch_on(generator: nn.Module, discriminator: nn.Module, which: str) -> None:
    """Checkpoint the built-in networks' blocks: G's (`which` 'g'), D's ('d'), both or neither ('off'). Networks
    without the built-in's `checkpointed` switch are refused (validation says so first, before anything is built)."""
    for network, on in ((generator, which in ("g", "both")), (discriminator, which in ("d", "both"))):
        if on and not hasattr(network, "checkpointed"):
            raise ValueError(f"{type(network).__name__} has no blocks gantools can checkpoint")
        if hasattr(network, "checkpointed"):
            network.checkpointed = on
