"""How far apart computations that should agree end up, measured rather than asserted.

Adam's for-loop, foreach and fused kernels compute the same update, but not in the same order of float operations, so
they may round differently in the last bit: `same_gradients` feeds them identical gradients from identical weights
and reports the gap. A GAN run magnifies any such difference, because two players that react to each other are a
chaotic system: `lockstep` trains runs side by side on the same data and noise and reports the gap after every step,
and `nudge` makes the smallest possible difference, one weight moved by one float, to show that it grows just as
much. Gradient accumulation is exact on a network without batch statistics and not with BatchNorm, which normalises
each micro-batch by its own mean and variance: `accumulation_gap` measures both."""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable

import torch

from .display import markdown_table
from ..measuring.hardware import seeded

# What the notebooks call rounding and what they call grown, so a sentence under a measured gap says the same thing
# in every run: float32's eps is its rounding unit, and a few dozen roundings in another order stay within this many.
ROUNDING_EPS = 100
GROWN = 10  # a gap this many times its size after the first step was magnified by the game, not merely carried along
ROUNDING_GAP = 1e-4  # an `accumulation_gap` below this is rounding: orders of magnitude below a statistics difference


def relative_gap(a, b) -> float:
    """The largest |difference| between two lists of tensors, each tensor's difference relative to its largest
    |value|: 0 for identical weights, about 1e-7 (float32's eps) for a difference in the last bit."""
    gap = 0.0
    for x, y in zip(a, b, strict=True):
        scale = x.detach().abs().max().item() or 1.0
        gap = max(gap, (x.detach() - y.detach()).abs().max().item() / scale)
    return gap


def same_gradients(optimizers: dict[str, Callable], module: torch.nn.Module, steps: int = 20, seed: int = 0,
                   scale: float = 1e-2) -> dict[str, float]:
    """Step each optimizer, `{name: make(params)}`, on its own copy of `module`'s parameters (same starting values),
    with the same gradients every step (seeded normal noise of size `scale`, one draw shared by all the copies),
    `steps` times. Returns name -> `relative_gap` of its parameters from the first optimizer's afterwards. The
    module itself is left as it was, and so are the caller's random numbers."""
    copies = {name: [p.detach().clone().requires_grad_() for p in module.parameters()] for name in optimizers}
    opts = {name: make(copies[name]) for name, make in optimizers.items()}
    with seeded(seed):
        for _ in range(steps):
            grads = [torch.randn(p.shape) * scale for p in module.parameters()]
            for name, opt in opts.items():
                for p, g in zip(copies[name], grads, strict=True):
                    p.grad = g.to(p.device)
                opt.step()
    first = next(iter(copies.values()))
    return {name: relative_gap(first, params) for name, params in copies.items()}


def _weights(gan) -> list:
    return [*gan.G.parameters(), *gan.D.parameters()]


@dataclass
class Lockstep:
    """What `lockstep` measured: each run's `relative_gap` from the first run after every step, and its losses
    (loss_d, loss_g) at every step. Shown as a table of the gaps at a few steps and the last losses."""
    gaps: dict
    losses: dict

    def _repr_markdown_(self) -> str:
        steps = len(next(iter(self.gaps.values())))
        at = sorted({s for s in (1, 3, 10, 30, 100, steps) if s <= steps})
        head = ["run", *[f"gap after step {s}" for s in at], f"D loss at step {steps}", f"G loss at step {steps}"]
        rows = [[name, *[f"{gaps[s - 1]:.1e}" if gaps[s - 1] else "0" for s in at],
                 *[f"{v:.4f}" for v in self.losses[name][-1]]] for name, gaps in self.gaps.items()]
        return markdown_table(head, rows)


def lockstep(gans: dict, steps: int, step_fn: Callable | None = None, seed: int = 0) -> Lockstep:
    """Train each of `{name: PlainGAN}` with `step_fn` (default: the tutorial's `train_step`), one step each in turn,
    every one with the same real batch (drawn from the first GAN's batches) and the same noise (the random generators
    seeded alike before each of its steps), and measure after each step the `relative_gap` of its weights (G's and
    D's) from the first GAN's. Copies of one deterministic computation stay at 0 all the way; any difference at all
    shows how the game grows it. The caller's random numbers are left as they were."""
    if step_fn is None:
        from .tutorial import train_step as step_fn
    first = next(iter(gans.values()))
    devices = [first.device] if first.device.type == "cuda" else []
    result = Lockstep({name: [] for name in gans}, {name: [] for name in gans})
    with torch.random.fork_rng(devices=devices):
        for step in range(steps):
            real = next(first.batches)
            for name, gan in gans.items():
                torch.manual_seed(seed + step)
                result.losses[name].append(tuple(float(v) for v in step_fn(gan, real)))
            for name, gan in gans.items():
                result.gaps[name].append(relative_gap(_weights(first), _weights(gan)))
    return result


def nudge(module: torch.nn.Module) -> torch.nn.Module:
    """Move `module`'s first weight to the next float up: the smallest change its weights can have. In place;
    returns the module."""
    with torch.no_grad():
        weight = next(module.parameters()).view(-1)
        weight[0] = torch.nextafter(weight[0], torch.tensor(math.inf, dtype=weight.dtype, device=weight.device))
    return module


def accumulation_gap(module: torch.nn.Module, inputs: torch.Tensor, k: int,
                     loss_fn: Callable = lambda out: out.float().mean()) -> float:
    """How far the gradients of `k` accumulated micro-batches (each loss divided by k, a backward each) are from
    one backward over the whole batch: the relative norm of the difference, over all of a copy of `module`'s
    parameters (in the module's mode: BatchNorm in training mode normalises each micro-batch by its own
    statistics). Rounding gives about 1e-7; the module and its BatchNorm running statistics are left as they were."""
    def gradients(chunks) -> list:
        net = copy.deepcopy(module)
        for chunk in chunks:
            (loss_fn(net(chunk)) / len(chunks)).backward()
        return [p.grad for p in net.parameters() if p.grad is not None]

    whole, accumulated = gradients([inputs]), gradients(inputs.chunk(k))
    difference = sum((a - b).pow(2).sum() for a, b in zip(whole, accumulated, strict=True))
    return (difference.sqrt() / sum(a.pow(2).sum() for a in whole).sqrt()).item()
