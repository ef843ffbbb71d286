"""An exponential moving average of the generator's weights, for sampling: G's weights jitter from step to step as
G and D chase each other; their average over the last ~1 / (1 - decay) steps makes steadier, usually better images
(Yazici et al. 2019; ProGAN, StyleGAN and BigGAN all sample from one).

The copy is a `torch.optim.swa_utils.AveragedModel` and the update is `get_ema_multi_avg_fn` (one fused
`torch._foreach_lerp_` over all weights): PyTorch's own EMA, no new dependency. `AveragedModel.update_parameters`
itself is not called: it tests `self.n_averaged == 0` and `self.n_averaged > 0` on every call (torch 2.11 and 2.14
alike), and `n_averaged` is a buffer, which moves to the GPU with the model, so each test is a host sync on CUDA,
every step. Instead the copy starts equal to G (`AveragedModel` deep-copies it: W_0^EMA = W_0, the first line of
`get_ema_multi_avg_fn`'s formula) and every update is the formula's second line,
W_t+1^EMA = decay * W_t^EMA + (1 - decay) * W_t+1, on the device. Buffers (BatchNorm's running statistics) are copied
from G, as `AveragedModel` does without `use_buffers`.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn


class EMAGenerator:
    """`module` is the averaged generator (call it like G); `update()` after each G step; `state_dict()` and
    `load_state_dict()` for checkpoints (the weights, and `n_averaged`: the updates so far)."""

    def __init__(self, generator: nn.Module, decay: float):
        self.decay = decay
        self.averaged = AveragedModel(generator, multi_avg_fn=get_ema_multi_avg_fn(decay))
        self.averaged.requires_grad_(False)
        self.module = self.averaged.module
        self._lerp = get_ema_multi_avg_fn(decay)
        self._pairs(generator)

    def _pairs(self, generator: nn.Module) -> None:
        self._ema_params, self._params = list(self.module.parameters()), list(generator.parameters())
        self._ema_buffers, self._buffers = list(self.module.buffers()), list(generator.buffers())

    @torch.no_grad()
    def update(self) -> None:
        """One EMA step from G's current weights: fused, on the device, no host sync."""
        self._lerp(self._ema_params, self._params, None)
        if self._buffers:
            torch._foreach_copy_(self._ema_buffers, self._buffers)
        self.averaged.n_averaged += 1

    @torch.no_grad()
    def reset(self) -> None:
        """Start the average afresh from G's current weights (a checkpoint without one, resumed with EMA on)."""
        for ema, current in zip(self._ema_params + self._ema_buffers, self._params + self._buffers, strict=True):
            ema.copy_(current)
        self.averaged.n_averaged.zero_()

    def state_dict(self) -> dict:
        return self.averaged.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.averaged.load_state_dict(state)
