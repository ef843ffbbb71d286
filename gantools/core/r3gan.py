"""R3GAN's networks (Huang, Gokaslan, Kuleshov & Tompkin, NeurIPS 2024, "The GAN is dead; long live the GAN! A modern
GAN baseline", section 3, config E; the authors' code: github.com/brownvc/R3GAN, `R3GAN/Networks.py`) at 32 and 64 px.

A stage per resolution (4 x 4 up to the image's side), each of residual blocks x + f(x), f a bottleneck:
1x1 conv (widening by `expansion`) -> leaky ReLU -> grouped k x k conv -> leaky ReLU -> 1x1 conv back to the width.
No normalisation layer anywhere: the paper finds none is needed once the loss is well behaved (RpGAN with R1 and R2,
losses.py), and a penalty needs each image's gradient to be its own. Stability comes from the initialisation instead
(fix-up, Zhang et al. 2019, as the paper uses it): the last conv of every branch starts at zero, so every block starts
as the identity, and the branch's other convs are drawn with variance scaled by L^(-1/2) for L blocks in the network
(a gain of L^(-1/4) per conv: L^(-1/(2m - 2)) for m = 3 convs per branch), so the sum of L branches keeps its variance
as they wake up. Every other layer is He-initialised for its activation (weights ~ N(0, gain^2 / fan_in)); biases sit
in the activations and start at zero. Resolution changes by interpolation through a fixed low-pass filter, never by a
strided or transposed learned conv.

Scaled down from the paper's: the paper's CIFAR-10 networks have 768 channels at every stage (384 at 64 px in its
FFHQ-64 ones), two blocks per stage and 96 groups (16 channels per group). Here the width is `ngf`/`ndf`, the
same at every stage and halved at 64 px as the paper halves it (the `r3gan` preset's 32 is 1/24 of the paper's, so a
32 px run fits a CPU), with the paper's two blocks per stage, its expansion of 2, 3 x 3 kernels and 16 channels per
group (fewer groups, as the width is smaller). G ends in a 1x1 conv with no tanh, as the paper's does
(its images are clamped to [-1, 1] only for showing and scoring). Class conditioning is not built here.

Under a 16-bit autocast, `fp32_stages` keeps the lowest-resolution stages in fp32, as StyleGAN2-ADA keeps 16-bit to
its highest resolutions (its `num_fp16_res`, never at 4 x 4): there the maps are smallest, so 16-bit saves least.
Only the split is taken, not StyleGAN2-ADA's clamp of its fp16 layers' outputs (`conv_clamp`). Each such region is
torch.autocast's documented `enabled=False` subregion (autocast off for the input's device, the input cast to fp32
by hand), which torch.compile traces as a context manager; the state dict is the same at every setting.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

LEAK = 0.2  # leaky ReLU's negative slope, the paper's
ACTIVATION_GAIN = math.sqrt(2 / (1 + LEAK ** 2))  # He's gain for it: keeps the activations' variance layer to layer
GROUP_CHANNELS = 16  # channels per group of the grouped conv: the paper's 1536 expanded channels over 96 groups
IMAGE_SIZES = (32, 64)


def _he(layer: nn.Module, gain: float = 1.0) -> nn.Module:
    """`layer`'s weights ~ N(0, gain^2 / fan_in) (fan_in: the inputs one output sees), its bias (if any) zero."""
    fan_in = layer.weight[0].numel()
    nn.init.normal_(layer.weight, 0.0, gain / math.sqrt(fan_in))
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


def _conv(c_in: int, c_out: int, kernel: int = 1, groups: int = 1, gain: float = 1.0) -> nn.Conv2d:
    return _he(nn.Conv2d(c_in, c_out, kernel, padding=kernel // 2, groups=groups, bias=False), gain)


def _groups(channels: int) -> int:
    """Groups for a grouped conv over `channels`: as many as keep at least GROUP_CHANNELS channels in each."""
    return max(g for g in range(1, max(1, channels // GROUP_CHANNELS) + 1) if channels % g == 0)


def _in_fp32(module: nn.Module, x: torch.Tensor, fp32: bool) -> torch.Tensor:
    """module(x), in fp32 where `fp32` even inside a 16-bit autocast (a no-op outside one)."""
    if not fp32:
        return module(x)
    with torch.autocast(x.device.type, enabled=False):
        return module(x.float())


class BiasedLeakyReLU(nn.Module):
    """A learned bias per channel, then leaky ReLU: the convs have no bias of their own, as in the paper."""

    def __init__(self, channels: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x + self.bias.to(x.dtype).view(1, -1, 1, 1), LEAK)


class ResidualBlock(nn.Module):
    """x + f(x), f: 1x1 conv -> act -> grouped k x k conv -> act -> 1x1 conv, its last conv zero at the start.

    Args:
        width: channels in and out.
        expansion: f's inner width is `width * expansion`.
        kernel: the grouped conv's side.
        blocks: residual blocks in the whole network (fix-up scales f's first two convs by blocks^(-1/4)).
    """

    def __init__(self, width: int, expansion: int, kernel: int, blocks: int):
        super().__init__()
        inner, gain = width * expansion, ACTIVATION_GAIN * blocks ** (-1 / 4)
        self.branch = nn.Sequential(
            _conv(width, inner, gain=gain), BiasedLeakyReLU(inner),
            _conv(inner, inner, kernel, groups=_groups(inner), gain=gain), BiasedLeakyReLU(inner),
            _conv(inner, width, gain=0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.branch(x)


class Resample(nn.Module):
    """2x up- or down-sampling by interpolation: one depthwise conv with the fixed separable filter [1, 3, 3, 1]
    (the paper's [1, 2, 1] convolved with [1, 1]: bilinear interpolation at half-pixel offsets, StyleGAN2's
    `upfirdn2d` filter), zero-padded at the border. A plain conv, so R1 and R2 can differentiate through it twice.

    Args:
        up: True doubles the side (transposed, the filter scaled by 4 so a flat image stays flat); False halves it.
    """

    def __init__(self, up: bool):
        super().__init__()
        taps = torch.tensor([1.0, 3.0, 3.0, 1.0])
        kernel = torch.outer(taps, taps) / taps.sum() ** 2
        self.up = up
        self.register_buffer("kernel", kernel * (4 if up else 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channels = x.shape[1]
        kernel = self.kernel.to(x.dtype).expand(channels, 1, 4, 4)
        if self.up:
            return F.conv_transpose2d(x, kernel, stride=2, padding=1, groups=channels)
        return F.conv2d(x, kernel, stride=2, padding=1, groups=channels)


def stage_widths(image_size: int, width: int) -> list[int]:
    """Each stage's width, from 4 x 4 up to the image's side: `width` throughout, halved at 64 px (the paper's
    FFHQ-64 networks halve their last stage).

    Args:
        image_size: 32 or 64.
        width: ngf or ndf.
    Returns:
        One width per stage, lowest resolution first.
    Raises:
        ValueError: another image_size.
    """
    if image_size not in IMAGE_SIZES:
        raise ValueError(f"image_size={image_size}: R3GAN here supports {' or '.join(map(str, IMAGE_SIZES))} px")
    stages = int(math.log2(image_size // 4)) + 1
    return [width] * (stages - 1) + [max(1, width // 2) if image_size == 64 else width]


def stage_count(image_size: int) -> int:
    """The networks' stages at `image_size` px: one per resolution from 4 x 4 up."""
    return len(stage_widths(image_size, 1))


def _fp32_stages(n: int, stages: int) -> int:
    if not 0 <= n <= stages:
        raise ValueError(f"fp32_stages={n}: these networks have {stages} stages, so 0 to {stages}")
    return n


class R3GANGenerator(nn.Module):
    """R3GAN's generator: z (B, nz) -> images (B, channels, image_size, image_size), unbounded (no tanh).

    A learned 4 x 4 basis per channel, scaled by a linear map of z, then per stage: (1x1 conv where the width
    changes, 2x interpolation, except in the first) and `blocks` residual blocks; a 1x1 conv to the image's channels.

    Args:
        image_size: 32 or 64 px.
        channels: 1 (grey) or 3 (colour).
        nz: the noise's length.
        width: each stage's width (`stage_widths`).
        blocks: residual blocks per stage.
        expansion: the blocks' inner width over their width.
        kernel: the grouped conv's side.
        fp32_stages: under a 16-bit autocast, the stages from 4 x 4 up that run in fp32 (with z's projection;
            all of them: the last 1x1 conv too).
    Raises:
        ValueError: another image_size, or more fp32 stages than stages.
    """

    def __init__(self, image_size: int = 32, channels: int = 1, nz: int = 100, width: int = 64, blocks: int = 2,
                 expansion: int = 2, kernel: int = 3, fp32_stages: int = 0):
        super().__init__()
        widths = stage_widths(image_size, width)
        total = blocks * len(widths)
        self.nz, self.fp32_stages = nz, _fp32_stages(fp32_stages, len(widths))
        self.project = _he(nn.Linear(nz, widths[0], bias=False))  # z -> one scale per basis channel
        self.basis = nn.Parameter(torch.randn(widths[0], 4, 4))  # (w0, 4, 4): the 4 x 4 starting maps
        stages = []
        for i, w in enumerate(widths):  # stage i: (w, 4 * 2^i, 4 * 2^i)
            transition = [] if i == 0 else [*([_conv(widths[i - 1], w)] if widths[i - 1] != w else []),
                                            Resample(up=True)]
            stages.append(nn.Sequential(*transition, *(ResidualBlock(w, expansion, kernel, total)
                                                        for _ in range(blocks))))
        self.stages = nn.Sequential(*stages)
        self.to_image = _conv(widths[-1], channels)  # (w_last, size, size) -> (channels, size, size)

    def start(self, z: torch.Tensor) -> torch.Tensor:
        """z (B, nz) -> the 4 x 4 maps (B, w0, 4, 4): the basis scaled per channel by a linear map of z."""
        scales = self.project(z.view(z.shape[0], -1))
        return self.basis.to(scales.dtype) * scales.view(z.shape[0], -1, 1, 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        fp32 = self.fp32_stages
        x = _in_fp32(self.start, z, fp32 > 0)
        for i, stage in enumerate(self.stages):  # lowest resolution first
            x = _in_fp32(stage, x, i < fp32)
        return _in_fp32(self.to_image, x, fp32 == len(self.stages))


class R3GANDiscriminator(nn.Module):
    """R3GAN's discriminator: images (B, channels, image_size, image_size) -> one logit per image, shape (B,).

    A 1x1 conv from the image's channels, then per stage, highest resolution first: `blocks` residual blocks, then
    2x interpolation down (and a 1x1 conv where the width changes), except in the last (4 x 4) stage, which ends in
    a learned 4 x 4 filter per channel (a depthwise conv) and a linear map to the logit. No sigmoid.

    Args:
        image_size: 32 or 64 px.
        channels: 1 (grey) or 3 (colour).
        width: each stage's width (`stage_widths`).
        blocks: residual blocks per stage.
        expansion: the blocks' inner width over their width.
        kernel: the grouped conv's side.
        fp32_stages: under a 16-bit autocast, the stages from 4 x 4 up that run in fp32 (with the logit's linear
            map; all of them: the first 1x1 conv too).
    Raises:
        ValueError: another image_size, or more fp32 stages than stages.
    """

    def __init__(self, image_size: int = 32, channels: int = 1, width: int = 64, blocks: int = 2,
                 expansion: int = 2, kernel: int = 3, fp32_stages: int = 0):
        super().__init__()
        widths = stage_widths(image_size, width)[::-1]  # highest resolution first
        total = blocks * len(widths)
        self.fp32_stages = _fp32_stages(fp32_stages, len(widths))
        self.from_image = _conv(channels, widths[0])  # (channels, size, size) -> (w, size, size)
        stages = []
        for i, w in enumerate(widths):
            if i < len(widths) - 1:  # (w, s, s) -> (w_next, s / 2, s / 2)
                transition = [Resample(up=False), *([_conv(w, widths[i + 1])] if widths[i + 1] != w else [])]
            else:  # (w, 4, 4) -> (w, 1, 1)
                transition = [_he(nn.Conv2d(w, w, 4, groups=w, bias=False))]
            stages.append(nn.Sequential(*(ResidualBlock(w, expansion, kernel, total) for _ in range(blocks)),
                                        *transition))
        self.stages = nn.Sequential(*stages)
        self.to_logit = _he(nn.Linear(widths[-1], 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fp32, n = self.fp32_stages, len(self.stages)
        x = _in_fp32(self.from_image, x, fp32 == n)
        for i, stage in enumerate(self.stages):  # highest resolution first: the last `fp32` in fp32
            x = _in_fp32(stage, x, i >= n - fp32)
        return _in_fp32(self.to_logit, x.flatten(1), fp32 > 0).view(-1)


def build_r3gan(image_size: int = 32, channels: int = 1, nz: int = 100, ngf: int = 64, ndf: int = 64,
                fp32_stages: int = 0) -> tuple[R3GANGenerator, R3GANDiscriminator]:
    """Both R3GAN networks, initialised as the paper does (call torch.manual_seed first for reproducible weights).

    Args:
        image_size: 32 or 64 px.
        channels: 1 (grey) or 3 (colour).
        nz: the noise's length.
        ngf: the generator's width per stage.
        ndf: the discriminator's width per stage.
        fp32_stages: in both, the stages from 4 x 4 up that stay fp32 under a 16-bit autocast.
    Returns:
        (generator, discriminator).
    Raises:
        ValueError: another image_size, or more fp32 stages than stages.
    """
    return (R3GANGenerator(image_size, channels, nz, ngf, fp32_stages=fp32_stages),
            R3GANDiscriminator(image_size, channels, ndf, fp32_stages=fp32_stages))
