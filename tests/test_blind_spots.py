"""FID in the glyph classifier's feature space judges the glyphs, not their ground: real glyphs on a grey ground
score as real glyphs do (the check 07_gan_variants makes), while noise and one class still score far worse; the
ground is measured on its own. And what a BatchNorm D cannot see: a ground every image of a batch shares."""
import pytest
import torch
from torch import nn

from gantools import make_dataset
from gantools.core.losses import ground_sensitivity
from gantools.core.metrics import (MAX_GROUND_STRETCH, QualityMeter, background_check, background_level, set_ground,
                                     with_background)


@pytest.fixture(scope="module")
def meter():
    return QualityMeter("glyphs", 32, 1, n=512)


def test_with_background_moves_the_ground_and_keeps_white_white():
    x = torch.full((4, 1, 8, 8), -1.0)
    x[:, :, 3, :] = 1.0  # a white stroke on black
    grey = with_background(x, -0.4)
    assert background_level(grey) == pytest.approx(-0.4)
    assert grey.max().item() == pytest.approx(1.0)
    assert torch.allclose(with_background(grey, -1.0), x, atol=1e-6), "the map is undone exactly"
    assert background_level(torch.zeros(2, 1, 4, 4, dtype=torch.uint8)) == -1.0  # uint8 black


def test_set_ground_puts_each_images_own_ground_at_black_and_leaves_a_black_ground_alone():
    x = torch.full((2, 1, 8, 8), -1.0)
    x[:, :, 3, 2:6] = 1.0  # a white stroke on black
    assert torch.equal(set_ground(x), x)
    lifted = torch.stack([with_background(x[:1], -0.5)[0], with_background(x[1:], 0.2)[0]])  # two greys
    assert torch.allclose(set_ground(lifted), x, atol=1e-6), "each image's own ground, white kept white"
    pale = torch.full((1, 1, 8, 8), 0.9)
    pale[:, :, 3, 2:6] = 1.0  # a white stroke on a nearly white ground: no ground to speak of
    assert set_ground(pale).max().item() == pytest.approx(-1 + 0.1 * MAX_GROUND_STRETCH), "stretched a bounded amount"


@pytest.mark.slow
def test_real_glyphs_on_a_grey_ground_score_as_real_glyphs_and_noise_and_one_class_still_far_worse(meter):
    other = QualityMeter("glyphs", 32, 1, n=512, offset=512).real  # real glyphs the meter did not see
    clean = meter.score(other)
    check = background_check(meter, with_background(other, -0.5))  # as 07_gan_variants lifts them
    assert check["real_background"] == pytest.approx(-1.0, abs=0.05)
    assert check["background"] == pytest.approx(-0.5, abs=0.01), "the ground is measured in the pixels"
    assert check["mean_pixel"] > check["real_mean_pixel"] + 0.2
    assert check["fid"] < 1.5 * clean["fid"] + 0.5, "a grey ground alone moves real glyphs hardly at all"
    assert check["fid_background_matched"] < 1.5 * clean["fid"] + 0.5
    assert check["classes_covered"] == clean["classes_covered"] == 10
    glyphs = make_dataset("glyphs", 32, 1)
    noise = meter.score(torch.rand(512, 1, 32, 32) * 2 - 1)
    one_class = meter.score(glyphs.images[glyphs.labels == 1][:512])
    assert noise["fid"] > 100 * max(check["fid"], clean["fid"]) and one_class["fid"] > 20 * max(check["fid"],
                                                                                                 clean["fid"])
    assert one_class["classes_covered"] <= 3


def _linear_d(norm: nn.Module) -> nn.Module:
    """Conv (no padding, no nonlinearity) then a norm then a linear head: a uniform shift of the input shifts
    each channel by a constant before the norm."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 4, 2, 0), norm, nn.Flatten(), nn.Linear(4 * 15 * 15, 1))


def test_a_batchnorm_d_cannot_see_a_ground_every_image_shares_and_a_layer_norm_d_can():
    glyphs = make_dataset("glyphs", 32, 1).images[:32]
    fakes = torch.rand(32, 1, 32, 32) * 2 - 1
    batch_d = _linear_d(nn.BatchNorm2d(4))
    stats = batch_d[1].running_mean.clone()
    blind = ground_sensitivity(batch_d, glyphs, fakes)
    assert set(blind) == {"real", "real_on_grey", "fake", "share"}
    assert blind["real_on_grey"] == pytest.approx(blind["real"], abs=1e-4) and abs(blind["share"]) < 1e-3
    assert torch.equal(batch_d[1].running_mean, stats), "the run's D is untouched"
    seeing = ground_sensitivity(_linear_d(nn.GroupNorm(1, 4)), glyphs, fakes)
    assert abs(seeing["real_on_grey"] - seeing["real"]) > 1e-3 and abs(seeing["share"]) > 100 * abs(blind["share"])
