"""The paper presets: each GAN variant with the settings its paper publishes, so a user gets them by name, and the
discriminator's normalisation as a field of its own (never switched silently)."""
import pytest
from torch import nn

from gantools import ConfigError, Trainer, preset
from gantools.cli import build_parser
from gantools.core.config import PAPERS, PRESETS, discriminator_norm

# What each paper states (the comments in gantools/core/config.py's PRESETS say where).
PAPER_SETTINGS = {
    "dcgan": dict(loss="bce", d_norm="batch", optimizer="adam", lr_g=2e-4, lr_d=2e-4, betas=(0.5, 0.999),
                  batch_size=128, d_steps=1, r1_gamma=0.0),
    "lsgan": dict(loss="lsgan", d_norm="batch", optimizer="adam", lr_g=2e-4, lr_d=2e-4, betas=(0.5, 0.999),
                  batch_size=64, d_steps=1, r1_gamma=0.0),
    "wgan-gp": dict(loss="wgan-gp", gp_weight=10.0, d_steps=5, d_norm="layer", optimizer="adam", lr_g=1e-4,
                    lr_d=1e-4, betas=(0.0, 0.9), batch_size=64, r1_gamma=0.0),
    # R3GAN's CIFAR-10 settings at the start of its schedules, scaled down (the preset's comment says how)
    "r3gan": dict(architecture="r3gan", loss="rpgan", r1_gamma=0.05, r2_gamma=0.05, optimizer="adam", lr_g=2e-4,
                  lr_d=2e-4, betas=(0.0, 0.9), nz=64, d_steps=1),
}


@pytest.mark.parametrize("name", sorted(PAPER_SETTINGS))
def test_each_paper_preset_is_valid_and_holds_its_papers_settings(name):
    cfg = preset(name).validate()
    assert {k: getattr(cfg, k) for k in PAPER_SETTINGS[name]} == PAPER_SETTINGS[name]
    assert name in PAPERS, "every paper preset names its paper"


def test_every_paper_is_a_preset_and_the_cli_offers_them():
    assert set(PAPERS) <= set(PRESETS)
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    choices = next(a.choices for a in train._actions if a.dest == "preset")
    assert set(PRESETS) <= set(choices)


def test_a_preset_takes_overrides_and_refuses_unknown_fields():
    cfg = preset("wgan-gp", batch_size=32, steps=10)
    assert (cfg.batch_size, cfg.steps, cfg.d_steps) == (32, 10, 5)
    with pytest.raises(ConfigError, match="unknown config field"):
        preset("lsgan", n_critic=5)


def test_wgan_gp_reads_five_real_batches_per_generator_step():
    """What a budget in generator steps costs in real images: d_steps batches per G step."""
    assert preset("wgan-gp").images_per_step == 5 * 64
    assert preset("lsgan").images_per_step == 64


@pytest.mark.parametrize("changes, norm", [
    (dict(), "batch"),
    (dict(loss="lsgan"), "batch"),
    (dict(loss="wgan-gp"), "layer"),
    (dict(r1_gamma=1.0), "layer"),
    (dict(d_norm="layer"), "layer"),
    (dict(d_norm="none", loss="wgan-gp"), "none"),
    (dict(r2_gamma=1.0), "layer"),
    (dict(architecture="r3gan"), "none"),
])
def test_auto_normalisation_is_batchnorm_unless_a_penalty_needs_per_image_gradients(changes, norm):
    assert discriminator_norm(preset("default", **changes).validate()) == norm


@pytest.mark.parametrize("changes", [dict(loss="wgan-gp"), dict(r1_gamma=10.0)])
def test_batchnorm_with_a_gradient_penalty_is_refused(changes):
    with pytest.raises(ConfigError, match="d_norm='batch' with a gradient penalty"):
        preset("default", d_norm="batch", **changes).validate()


def test_unknown_normalisation_is_refused():
    with pytest.raises(ConfigError, match="d_norm"):
        preset("default", d_norm="instance").validate()


@pytest.mark.parametrize("d_norm, layer", [("batch", nn.BatchNorm2d), ("layer", nn.GroupNorm), ("none", None)])
def test_the_built_in_discriminator_gets_the_normalisation_asked_for(tiny, tmp_path, d_norm, layer):
    t = Trainer(tiny.replace(loss="lsgan", d_norm=d_norm, out_dir=str(tmp_path)))
    kinds = {type(m) for m in t.discriminator.modules()}
    assert not ({nn.BatchNorm2d, nn.GroupNorm} - {layer}) & kinds
    if layer is not None:
        assert layer in kinds
