"""DCGAN (Radford et al., 2015) at 28, 32 and 64 px: the model every notebook speeds up."""
from __future__ import annotations

import math

import torch
from torch import nn


def _layout(image_size: int) -> tuple[int, int]:
    """(first feature-map side, number of 2x up/down-samplings) for a supported image size."""
    start = 7 if image_size == 28 else 4
    doublings = int(round(math.log2(image_size / start)))
    if image_size not in (28, 32, 64) or start * 2**doublings != image_size:
        raise ValueError(f"image_size={image_size}: DCGAN here supports 28, 32 or 64 px")
    return start, doublings


class Generator(nn.Module):
    """z (B, nz) or (B, nz, 1, 1) -> images in [-1, 1] of shape (B, channels, image_size, image_size)."""

    def __init__(self, image_size: int = 32, channels: int = 1, nz: int = 100, ngf: int = 64):
        super().__init__()
        start, n = _layout(image_size)
        self.nz = nz
        width = ngf * 2 ** (n - 1)
        layers = [nn.ConvTranspose2d(nz, width, start, 1, 0, bias=False), nn.BatchNorm2d(width), nn.ReLU(True)]
        for _ in range(n - 1):
            layers += [nn.ConvTranspose2d(width, width // 2, 4, 2, 1, bias=False),
                       nn.BatchNorm2d(width // 2), nn.ReLU(True)]
            width //= 2
        layers += [nn.ConvTranspose2d(width, channels, 4, 2, 1, bias=False), nn.Tanh()]
        self.main = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.main(z.view(z.shape[0], -1, 1, 1))


class Discriminator(nn.Module):
    """Images -> one logit per image, shape (B,). `sigmoid=True` is the tutorial's probability output (BCELoss)."""

    def __init__(self, image_size: int = 32, channels: int = 1, ndf: int = 64, sigmoid: bool = False):
        super().__init__()
        start, n = _layout(image_size)
        layers = [nn.Conv2d(channels, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True)]
        width = ndf
        for _ in range(n - 1):
            layers += [nn.Conv2d(width, width * 2, 4, 2, 1, bias=False),
                       nn.BatchNorm2d(width * 2), nn.LeakyReLU(0.2, inplace=True)]
            width *= 2
        layers += [nn.Conv2d(width, 1, start, 1, 0, bias=False)]
        if sigmoid:
            layers.append(nn.Sigmoid())
        self.main = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x).view(-1)


def dcgan_init(module: nn.Module) -> None:
    """DCGAN's init: conv weights ~ N(0, 0.02), BatchNorm scale ~ N(1, 0.02) and shift 0. Use with .apply()."""
    name = type(module).__name__
    if "Conv" in name:
        nn.init.normal_(module.weight, 0.0, 0.02)
    elif "BatchNorm" in name:
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)


def build_dcgan(image_size: int = 32, channels: int = 1, nz: int = 100, ngf: int = 64, ndf: int = 64,
                sigmoid: bool = False) -> tuple[Generator, Discriminator]:
    """Both networks, DCGAN-initialised (call torch.manual_seed first for reproducible weights)."""
    g = Generator(image_size, channels, nz, ngf)
    d = Discriminator(image_size, channels, ndf, sigmoid)
    g.apply(dcgan_init)
    d.apply(dcgan_init)
    return g, d
