import pytest
import torch
from torch import nn

from gantools import Discriminator, Generator, build_dcgan


@pytest.mark.parametrize("size", [28, 32, 64])
@pytest.mark.parametrize("channels", [1, 3])
def test_generator_and_discriminator_shapes(size, channels):
    g, d = build_dcgan(size, channels, nz=16, ngf=8, ndf=8)
    images = g(torch.randn(5, 16))
    assert images.shape == (5, channels, size, size)
    assert images.min() >= -1 and images.max() <= 1
    assert d(images).shape == (5,)


def test_generator_accepts_4d_noise():
    g = Generator(32, 1, nz=10, ngf=8)
    assert g(torch.randn(3, 10, 1, 1)).shape == (3, 1, 32, 32)


def test_discriminator_returns_logits_unless_asked_for_the_tutorials_sigmoid():
    logits_d = Discriminator(32, 1, ndf=8)
    assert not any(isinstance(m, nn.Sigmoid) for m in logits_d.modules())
    torch.manual_seed(0)
    probs = Discriminator(32, 1, ndf=8, sigmoid=True)(torch.randn(8, 1, 32, 32) * 3)
    assert ((probs > 0) & (probs < 1)).all()


def test_widths_and_latent_size_are_arguments():
    small, big = Generator(64, 3, nz=10, ngf=4), Generator(64, 3, nz=10, ngf=16)
    def count(m):
        return sum(p.numel() for p in m.parameters())
    assert count(big) > 8 * count(small)


def test_dcgan_init():
    torch.manual_seed(0)
    g, d = build_dcgan(64, 3, ngf=32, ndf=32)
    convs = [m.weight for m in list(g.modules()) + list(d.modules()) if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d))]
    stds = torch.tensor([w.std().item() for w in convs])
    assert torch.allclose(stds, torch.full_like(stds, 0.02), atol=0.004)
    bn = [m for m in g.modules() if isinstance(m, nn.BatchNorm2d)]
    assert all(abs(m.weight.mean().item() - 1) < 0.01 and m.bias.abs().max() == 0 for m in bn)


def test_unsupported_size_is_refused():
    with pytest.raises(ValueError, match="28, 32 or 64"):
        Generator(48)
