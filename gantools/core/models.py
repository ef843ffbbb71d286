"""DCGAN (Radford et al., 2015) at 28, 32 and 64 px: the model every notebook speeds up.

Conditional on a class label (`classes` > 0): G joins a learned code of the label (one number per class: the one-hot
code of the first conditional GANs, Mirza & Osindero 2014, made learnable) to its noise before its first layer; D
adds a projection of its last feature map onto an embedding of the label to its logit,
D(x, y) = psi(phi(x)) + <embed(y), sum over positions of phi(x)> (Miyato & Koyama 2018, "cGANs with projection
discriminator"): the label asks D "is this a real image *of class y*?" at the cost of one dot product.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .activation_checkpointing import run


def _layout(image_size: int) -> tuple[int, int]:
    """(first feature-map side, number of 2x up/down-samplings) for a supported image size."""
    start = 7 if image_size == 28 else 4
    doublings = int(round(math.log2(image_size / start)))
    if image_size not in (28, 32, 64) or start * 2**doublings != image_size:
        raise ValueError(f"image_size={image_size}: DCGAN here supports 28, 32 or 64 px")
    return start, doublings


class Generator(nn.Module):
    """DCGAN's generator: z (B, nz) or (B, nz, 1, 1), and with `classes` labels y (B,) -> images in [-1, 1] of
    shape (B, channels, image_size, image_size).

    Args:
        image_size: the images' side: 28, 32 or 64 px.
        channels: 1 (grey) or 3 (colour).
        nz: the noise's length.
        ngf: the width of the last feature map; each earlier layer doubles it.
        classes: labels to condition on; 0: unconditional.
    Raises:
        ValueError: another image_size.
    """

    def __init__(self, image_size: int = 32, channels: int = 1, nz: int = 100, ngf: int = 64, classes: int = 0):
        super().__init__()
        start, n = _layout(image_size)
        self.nz = nz
        # The label's code, joined to z. Short (classes numbers) beside z: a code as long as z lets G ignore z in
        # short runs (every sample of a class the same image), as conditional GANs are prone to.
        self.embed = nn.Embedding(classes, classes) if classes else None
        width = ngf * 2 ** (n - 1)
        layers = [nn.ConvTranspose2d(nz + classes, width, start, 1, 0, bias=False),  # -> start x start
                  nn.BatchNorm2d(width), nn.ReLU(True)]
        for _ in range(n - 1):
            layers += [nn.ConvTranspose2d(width, width // 2, 4, 2, 1, bias=False),
                       nn.BatchNorm2d(width // 2), nn.ReLU(True)]
            width //= 2
        layers += [nn.ConvTranspose2d(width, channels, 4, 2, 1, bias=False), nn.Tanh()]
        self.main = nn.Sequential(*layers)
        self.checkpointed = False  # activation checkpointing of its blocks (activation_checkpointing.py)

    def forward(self, z: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        z = z.view(z.shape[0], -1)
        if self.embed is not None:
            z = torch.cat([z, self.embed(y).to(z.dtype)], 1)
        return run(self.main, z.view(z.shape[0], -1, 1, 1), self.checkpointed)


NORMS = ("batch", "layer", "none")


def _norm(kind: str, width: int) -> list[nn.Module]:
    """D's normalisation layer: BatchNorm (DCGAN's), layer norm over (C, H, W) with a scale and shift per channel
    (GroupNorm with one group: per image, as a gradient penalty needs; WGAN-GP's recommendation), or none."""
    return {"batch": [nn.BatchNorm2d(width)], "layer": [nn.GroupNorm(1, width)], "none": []}[kind]


class Discriminator(nn.Module):
    """DCGAN's discriminator: images (and with `classes` labels y (B,)) -> one logit per image, shape (B,).

    Args:
        image_size: the images' side: 28, 32 or 64 px.
        channels: 1 (grey) or 3 (colour).
        ndf: the width of the first feature map; each later layer doubles it.
        sigmoid: end in a Sigmoid, the tutorial's probability output (for BCELoss); False: a logit.
        norm: 'batch' (DCGAN's), 'layer' (per image, as gradient penalties need) or 'none'.
        classes: labels to condition on (a projection head); 0: unconditional.
    Raises:
        ValueError: another image_size or norm.
    """

    def __init__(self, image_size: int = 32, channels: int = 1, ndf: int = 64, sigmoid: bool = False,
                 norm: str = "batch", classes: int = 0):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm={norm!r}: choose one of {', '.join(NORMS)}")
        start, n = _layout(image_size)
        layers = [nn.Conv2d(channels, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True)]
        width = ndf
        for _ in range(n - 1):  # each halves the side: image_size / 2 ... down to start x start
            layers += [nn.Conv2d(width, width * 2, 4, 2, 1, bias=False),
                       *_norm(norm, width * 2), nn.LeakyReLU(0.2, inplace=True)]
            width *= 2
        layers += [nn.Conv2d(width, 1, start, 1, 0, bias=False)]  # (width, start, start) features -> one logit
        if sigmoid:
            layers.append(nn.Sigmoid())
        self.main = nn.Sequential(*layers)
        self.checkpointed = False  # activation checkpointing of its blocks (activation_checkpointing.py)
        self.embed = nn.Embedding(classes, width) if classes else None  # the projection head
        if self.embed is not None:  # as small as the convolutions' weights: a projection of N(0, 1) embeddings
            nn.init.normal_(self.embed.weight, 0.0, 0.02)  # onto summed features would swamp the logit at first

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        if self.embed is None:
            return run(self.main, x, self.checkpointed).view(-1)
        features = run(self.main[:-1], x, self.checkpointed)  # phi(x); no final Sigmoid here (validation refuses it)
        projection = (self.embed(y).to(features.dtype) * features.sum((2, 3))).sum(1)
        return self.main[-1](features).view(-1) + projection


def dcgan_init(module: nn.Module) -> None:
    """DCGAN's init, the one its paper trains from: conv weights ~ N(0, 0.02), BatchNorm scale ~ N(1, 0.02) and
    shift 0.

    Args:
        module: one layer (`network.apply(dcgan_init)` visits each); layers other than convolutions and
            BatchNorm are left as they are.
    """
    name = type(module).__name__
    if "Conv" in name:
        nn.init.normal_(module.weight, 0.0, 0.02)
    elif "BatchNorm" in name:
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)


def build_dcgan(image_size: int = 32, channels: int = 1, nz: int = 100, ngf: int = 64, ndf: int = 64,
                sigmoid: bool = False, d_norm: str = "batch", classes: int = 0) -> tuple[Generator, Discriminator]:
    """Both networks, DCGAN-initialised (call torch.manual_seed first for reproducible weights).

    Args:
        image_size: the images' side: 28, 32 or 64 px.
        channels: 1 (grey) or 3 (colour).
        nz: the noise's length.
        ngf: the generator's width (as for `Generator`).
        ndf: the discriminator's width (as for `Discriminator`).
        sigmoid: end D in a Sigmoid (for BCELoss); False: a logit.
        d_norm: the discriminator's `norm`: 'batch', 'layer' or 'none'.
        classes: labels both networks condition on; 0: unconditional.
    Returns:
        (generator, discriminator).
    Raises:
        ValueError: an unsupported image_size or d_norm.
    """
    g = Generator(image_size, channels, nz, ngf, classes)
    d = Discriminator(image_size, channels, ndf, sigmoid, d_norm, classes)
    g.apply(dcgan_init)
    d.apply(dcgan_init)
    return g, d
