"""The plain PyTorch GAN loop the workbook teaches on. It is written out once, here, the way the PyTorch DCGAN tutorial
writes it (but with logits, so 16-bit autocast is safe), so that each notebook can print it, show the few lines its
technique adds as a cell of its own, and time the two against each other in the same kernel with `race`."""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from ..core.config import ARCHITECTURES
from ..core.data import make_dataset
from ..measuring.hardware import Timer, resolve_device, seeded
from ..measuring.turns import SAME, Contender, Paired, Spread, take_turns
from ..core.models import build_dcgan
from ..core.r3gan import build_r3gan
from ..core.sampling import generate


@dataclass
class PlainGAN:
    """Everything the tutorial's loop keeps between steps: two networks, their optimizers, and its real images."""
    G: torch.nn.Module
    D: torch.nn.Module
    opt_g: torch.optim.Optimizer
    opt_d: torch.optim.Optimizer
    batches: Iterator[torch.Tensor]
    nz: int
    device: torch.device


def adam(params) -> torch.optim.Optimizer:
    """DCGAN's optimizer: Adam, lr 2e-4, betas (0.5, 0.999)."""
    return torch.optim.Adam(params, lr=2e-4, betas=(0.5, 0.999))


def tutorial_size() -> dict:
    """The workbook's model and batch size for the mode: tiny in quick mode (tests), DCGAN's standard otherwise."""
    from ..quick import QUICK
    from .runs import QUICK_SIZE, real_size

    size = QUICK_SIZE if QUICK else real_size()
    return {k: size[k] for k in ("nz", "ngf", "ndf", "batch_size")}


def plain_gan(device="auto", seed: int = 0, optimizer: Callable = adam, batches: Iterator | None = None,
              d_norm: str | None = None, architecture: str = "dcgan", **size) -> PlainGAN:
    """A fresh pair of networks (initialised from `seed`, without touching the caller's random numbers), an
    optimizer for each built by `optimizer(params)`, and `batches` (default: `device_batches`). `architecture`:
    'dcgan' or 'r3gan' (R3GAN's residual networks, which have no normalisation). `d_norm`: DCGAN's D
    normalisation, its BatchNorm (None, the default) or 'layer' (per image, for a gradient penalty) or 'none'.
    `size` overrides nz, ngf, ndf, batch_size."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"architecture={architecture!r}: choose {' or '.join(map(repr, ARCHITECTURES))}")
    if architecture == "r3gan" and d_norm is not None:
        raise ValueError(f"d_norm={d_norm!r} with architecture='r3gan': its D has no normalisation layers")
    size = {**tutorial_size(), **size}
    device = resolve_device(device) if isinstance(device, str) else device
    with seeded(seed):
        if architecture == "r3gan":
            G, D = build_r3gan(32, 1, size["nz"], size["ngf"], size["ndf"])
        else:
            G, D = build_dcgan(32, 1, size["nz"], size["ngf"], size["ndf"], d_norm=d_norm or "batch")
    G, D = G.to(device), D.to(device)
    batches = batches if batches is not None else device_batches(size["batch_size"], device, seed)
    return PlainGAN(G, D, optimizer(G.parameters()), optimizer(D.parameters()), batches, size["nz"], device)


def device_batches(batch_size: int, device, seed: int = 0) -> Iterator[torch.Tensor]:
    """Real glyphs without end: the whole set normalised to [-1, 1] once and kept on the device, a new random
    order each epoch (drawn from a generator of its own)."""
    images = make_dataset("glyphs", 32, 1).images.to(device).float().div_(127.5).sub_(1)
    order_rng = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(images), generator=order_rng).to(device)
        for i in range(0, len(images) - batch_size + 1, batch_size):
            yield images[order[i:i + batch_size]]


def train_step(gan: PlainGAN, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One iteration of the tutorial's loop: D learns real -> 1 and fake -> 0, then G learns to make D say 1."""
    G, D, opt_g, opt_d = gan.G, gan.D, gan.opt_g, gan.opt_d
    ones = torch.ones(real.size(0), device=real.device)
    zeros = torch.zeros_like(ones)
    fake = G(torch.randn(real.size(0), gan.nz, device=real.device))

    opt_d.zero_grad(set_to_none=True)                     # (1) the discriminator
    loss_d = (F.binary_cross_entropy_with_logits(D(real), ones)
              + F.binary_cross_entropy_with_logits(D(fake.detach()), zeros))
    loss_d.backward()
    opt_d.step()

    opt_g.zero_grad(set_to_none=True)                     # (2) the generator, through D
    loss_g = F.binary_cross_entropy_with_logits(D(fake), ones)
    loss_g.backward()
    opt_g.step()
    return loss_d.detach(), loss_g.detach()               # on the device: .item() here would wait for it


@dataclass
class Race:
    """What `race` measured: each contender's `turns.Measured` (its timed chunks, each chunk's images/s and the
    losses read at its end), what its first chunk, the warm-up, returned, and the images each trained."""
    measured: dict
    warm_up: dict
    images: int = 0

    @property
    def images_per_sec(self) -> dict:
        """Each contender's median images/s over its timed chunks."""
        return {name: m.images_per_sec for name, m in self.measured.items()}

    @property
    def losses(self) -> dict:
        """Each contender's (step, losses ...) read at each chunk's end, the warm-up chunk's included."""
        return {name: [self.warm_up[name][1], *(losses for _, losses in m.turns)]
                for name, m in self.measured.items()}

    def ratio(self, name: str, against: str) -> float:
        """How many times as fast `name` ran as `against` (images/s over images/s)."""
        return self.images_per_sec[name] / self.images_per_sec[against]

    def paired(self, name: str, against: str) -> Paired | None:
        """`name`'s chunk-by-chunk images/s over `against`'s (`Measured.ratios`, a `Paired`: its range too): each pair
        ran back to back, so noise common to both cancels; `conclusions.speed_verdict` reads the verdict from it.
        None where fewer than two rounds were timed."""
        return Paired.of(self.measured[name].ratios(self.measured[against]))

    def spread(self, name: str) -> Spread:
        """The lowest and highest of a contender's timed chunks (`.share_of(median)`: the noise in its figure)."""
        return self.measured[name].spread

    def _repr_markdown_(self) -> str:
        first = next(iter(self.images_per_sec))
        rows = [f"| {n} | {v:.0f} | ±{100 * self.spread(n).share_of(v):.0f}% | "
                f"{v / self.images_per_sec[first]:.2f}x |" for n, v in self.images_per_sec.items()]
        return "\n".join([f"| loop | images/s | chunk spread | vs {first} |", "|---|---:|---:|---:|", *rows])


def race(contenders: dict, steps: int, chunk_steps: int) -> Race:
    """Train each contender, `{name: (step_fn, gan)}` with `step_fn(gan, real)`, for `steps` steps, taking turns
    `chunk_steps` at a time (A B A B ...: `turns.take_turns`, the first chunk of each its warm-up), so machine noise
    hits all of them alike, as the benchmark does. Each chunk is timed with the device synchronised at both ends
    (`hardware.Timer`), fetching its batches included."""
    if steps < 2 * chunk_steps or steps % chunk_steps:
        raise ValueError(f"steps={steps} must be a multiple of chunk_steps={chunk_steps}, at least two chunks")
    done, last_images = dict.fromkeys(contenders, 0), {}

    def chunk(name: str) -> tuple:
        step_fn, gan = contenders[name]
        images, timer = 0, Timer(gan.device).start()
        for _ in range(chunk_steps):
            real = next(gan.batches)
            losses = step_fn(gan, real)
            images += real.size(0)
        seconds = timer.stop()
        done[name], last_images[name] = done[name] + chunk_steps, images
        return images / seconds, (done[name], *(float(v) for v in losses))  # losses read after timing

    warm = {}

    def warm_up(name: str):
        warm[name] = chunk(name)
        return name

    measured = take_turns({name: Contender(warm_up=lambda name=name: warm_up(name), turn=chunk) for name in contenders},
                          steps // chunk_steps - 1, order=SAME, figure=lambda result: result[0])
    return Race(measured, warm, steps // chunk_steps * last_images[list(contenders)[-1]])


def samples(gan: PlainGAN, n: int, seed: int = 0) -> torch.Tensor:
    """n images in [-1, 1] (CPU float) from seeded noise, without moving G's BatchNorm statistics."""
    noise = torch.randn(n, gan.nz, generator=torch.Generator().manual_seed(seed)).to(gan.device)
    with torch.no_grad():
        return torch.cat([generate(gan.G, z, None, contextlib.nullcontext) for z in noise.split(256)]).cpu()


def score(gan: PlainGAN, n: int | None = None) -> dict:
    """FID, KID and classes covered of `n` of the loop's images (2048, or 256 in quick mode), as the trainer's
    runs are scored, so a plain loop and a gantools run compare."""
    from ..core.metrics import MIN_SAMPLES, quality_meter
    from ..quick import QUICK

    n = n or (256 if QUICK else MIN_SAMPLES)
    with torch.random.fork_rng(devices=[gan.device] if gan.device.type == "cuda" else []):
        return quality_meter("glyphs", 32, 1, device=gan.device, n=n).score(samples(gan, n))


def source(fn: Callable):
    """A function's source as a Markdown code block, so a notebook can show the loop it builds on."""
    from IPython.display import Markdown

    return Markdown(f"```python\n{inspect.getsource(fn)}```")
