"""Images from a run's generator: the fixed noise of its sample grid, the grid itself (shown and saved as a PNG),
and seeded images for quality metrics. Generating never moves the generator's BatchNorm statistics."""
from __future__ import annotations

import torch

from ..errors import ConfigError
from .checkpoint import atomic_write
from .network_checks import forward

GRID_CLASSES = 16  # a conditional run's sample grid: one row of 8 per class, for at most this many classes


def fixed_noise(cfg, classes: int, device: torch.device) -> tuple:
    """The noise (and labels, or None) of a run's sample grid: 64 images; a conditional run, one row per class,
    the same 8 noise vectors in every row. From a generator of its own: sampling never shifts training's RNG."""
    noise = torch.Generator().manual_seed(cfg.seed + 1)
    if cfg.conditional:
        rows = min(classes, GRID_CLASSES)
        return (torch.randn(8, cfg.nz, generator=noise).repeat(rows, 1).to(device),
                torch.arange(rows).repeat_interleave(8).to(device))
    return torch.randn(64, cfg.nz, generator=noise).to(device), None


def generate(g, noise: torch.Tensor, labels: torch.Tensor | None, autocast) -> torch.Tensor:
    """G's images for `noise` (and `labels`), as float."""
    saved = [b.clone() for b in g.buffers()]  # train-mode BatchNorm, as in training, but
    with autocast():                          # without moving its running statistics
        images = forward(g, noise, labels).float()
    for buffer, value in zip(g.buffers(), saved, strict=True):
        buffer.copy_(value)
    return images


def grid(images: torch.Tensor):
    """Images in [-1, 1] as one picture (H, W, 3 uint8 numpy), 8 per row."""
    from torchvision.utils import make_grid

    picture = make_grid(images.cpu(), nrow=8, normalize=True, value_range=(-1, 1))
    return picture.mul(255).round().to(torch.uint8).permute(1, 2, 0).numpy()


def save_png(picture, path) -> None:
    from PIL import Image

    atomic_write(path, lambda f: Image.fromarray(picture).save(f, format="PNG"))


def seeded_noise(n: int, nz: int, seed: int, batch_size: int, labels: torch.Tensor | None) -> list:
    """n noise vectors from `seed`, in batches of `batch_size`, each with its labels (or None)."""
    if labels is not None and len(labels) != n:  # else the noise and the labels would pair up short
        raise ConfigError(f"generate(n={n}, labels=...) got {len(labels)} labels: give one label per image")
    noise = torch.randn(n, nz, generator=torch.Generator().manual_seed(seed))
    ys = labels.split(batch_size) if labels is not None else [None] * len(noise.split(batch_size))
    return list(zip(noise.split(batch_size), ys, strict=True))  # one label per noise vector (Trainer.generate)
