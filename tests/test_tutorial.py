"""The plain loop the workbook teaches on (gantools/workbook/tutorial.py), the interleaved race that times its
variants, and
the conclusions computed from their numbers (gantools/workbook/conclusions.py)."""
import time

import pytest
import torch

from gantools.speed.keep import QUALITY_TARGET
from gantools.workbook import tutorial
from gantools.workbook.conclusions import (agreement, estimate_held, keep_or_leave, still_learning,
                                           worth_removing)

TINY = dict(nz=8, ngf=8, ndf=8, batch_size=16)


def endless(images):
    while True:
        yield from images.float().div(127.5).sub(1).split(16)


@pytest.fixture
def gan(glyphs64):
    return tutorial.plain_gan("cpu", batches=endless(glyphs64.images), **TINY)


def test_the_plain_step_trains_both_networks_and_keeps_losses_on_the_device(gan):
    g0 = [p.detach().clone() for p in gan.G.parameters()]
    d0 = [p.detach().clone() for p in gan.D.parameters()]
    loss_d, loss_g = tutorial.train_step(gan, next(gan.batches))
    assert all(not torch.equal(a, b) for a, b in zip(g0, gan.G.parameters(), strict=True))
    assert all(not torch.equal(a, b) for a, b in zip(d0, gan.D.parameters(), strict=True))
    assert loss_d.device == loss_g.device == gan.device and not loss_d.requires_grad
    assert 0 < loss_d.item() < 10 and 0 < loss_g.item() < 10


def test_a_plain_gan_is_reproducible_and_leaves_the_callers_random_numbers_alone(glyphs64):
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    a = tutorial.plain_gan("cpu", seed=3, batches=iter(()), **TINY)
    assert torch.equal(torch.rand(3), expected), "building the networks shifted the global RNG"
    b = tutorial.plain_gan("cpu", seed=3, batches=iter(()), **TINY)
    c = tutorial.plain_gan("cpu", seed=4, batches=iter(()), **TINY)
    assert all(torch.equal(p, q) for p, q in zip(a.G.parameters(), b.G.parameters(), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a.G.parameters(), c.G.parameters(), strict=True))


def test_device_batches_cover_an_epoch_in_range(tmp_path, monkeypatch):
    batches = tutorial.device_batches(1000, "cpu", seed=0)
    first = next(batches)
    assert first.shape == (1000, 1, 32, 32) and first.dtype == torch.float32
    assert first.min() >= -1 and first.max() <= 1 and first.min() < -0.9 and first.max() > 0.9


def test_the_race_takes_turns_and_tells_the_slow_loop_from_the_fast(glyphs64):
    order = []

    def fast(gan, real):
        order.append("fast")
        return tutorial.train_step(gan, real)

    def slow(gan, real):
        order.append("slow")
        time.sleep(0.05)
        return tutorial.train_step(gan, real)

    contenders = {name: (fn, tutorial.plain_gan("cpu", batches=endless(glyphs64.images), **TINY))
                  for name, fn in (("fast", fast), ("slow", slow))}
    result = tutorial.race(contenders, steps=6, chunk_steps=2)
    assert order == ["fast"] * 2 + ["slow"] * 2 + ["fast"] * 2 + ["slow"] * 2 + ["fast"] * 2 + ["slow"] * 2
    # each of slow's timed chunks includes its two sleeps (a bound no busy machine can break, unlike a race)
    assert max(result.measured["slow"].images_per_sec_runs) <= 2 * 16 / (2 * 0.05)
    assert result.images == 6 * 16 and len(result.losses["slow"]) == 3
    assert len(result.measured["fast"].images_per_sec_runs) == 2, "the first chunk is warm-up, not timed"
    assert [step for step, *_ in result.losses["slow"]] == [2, 4, 6]
    low, high = result.spread("fast")
    assert low <= result.images_per_sec["fast"] <= high and result.spread("fast").share_of(high) >= 0
    assert "| fast |" in result._repr_markdown_() and "vs fast" in result._repr_markdown_()
    chunk_ratios = [s / f for s, f in zip(result.measured["slow"].images_per_sec_runs,
                                           result.measured["fast"].images_per_sec_runs, strict=True)]
    assert result.paired("slow", "fast") == (min(chunk_ratios), max(chunk_ratios)), "paired chunk by chunk"


def test_a_race_too_short_to_time_is_refused(gan):
    with pytest.raises(ValueError, match="multiple of chunk_steps"):
        tutorial.race({"a": (tutorial.train_step, gan)}, steps=3, chunk_steps=2)


def test_samples_leave_batchnorm_statistics_alone(gan):
    before = [b.clone() for b in gan.G.buffers()]
    images = tutorial.samples(gan, 40)
    assert images.shape == (40, 1, 32, 32) and images.min() >= -1 and images.max() <= 1
    assert all(torch.equal(a, b) for a, b in zip(before, gan.G.buffers(), strict=True))
    assert torch.equal(images, tutorial.samples(gan, 40)), "seeded noise: the same images twice"


def test_source_shows_the_loop():
    assert "def train_step" in tutorial.source(tutorial.train_step).data


@pytest.mark.parametrize("speedup, paired, fid, keep, words", [
    (1.6, (1.4, 1.8), 25.0, True, "keep it"),
    (1.6, (1.4, 1.8), 24.0 * QUALITY_TARGET * 1.3, False, "quality fell"),
    (1.02, (0.95, 1.1), 24.0, False, "no difference measured"),
    (0.7, (0.6, 0.8), 24.0, False, "slower"),
])
def test_the_verdict_follows_the_numbers(speedup, paired, fid, keep, words):
    c = keep_or_leave("bf16", "fp32", speedup, fid, 24.0, paired=paired, fid_spread=24.0 * 0.2)
    assert c.keep is keep and words in c.text and f"{speedup:.2f}x" in c.text
    shown = c._repr_markdown_()  # one line, the whole sentence behind a fold
    assert str(c) == c.text and shown.startswith(c.short + "\n") and c.text in shown and "<details>" in shown
    assert "\n" not in c.short and f"{speedup:.2f}x" in c.short


def test_a_verdict_without_quality_judges_speed_alone():
    assert keep_or_leave("fused Adam", "for-loop Adam", 1.2, paired=(1.1, 1.3)).keep
    assert "FID" not in keep_or_leave("fused Adam", "for-loop Adam", 1.2, paired=(1.1, 1.3)).text


def test_early_fids_are_shown_but_not_judged():
    short, learned = {"classes_covered": 7, "classes": 10}, {"classes_covered": 8, "classes": 10}
    assert still_learning(short, learned) and not still_learning(learned, learned)
    c = keep_or_leave("bf16", "fp32", 1.5, 900.0, 400.0, early=True, paired=(1.3, 1.7), fid_spread=10.0)
    assert c.keep and "900.0" in c.text and "not judged" in c.text and "fell" not in c.text
    judged = keep_or_leave("bf16", "fp32", 1.5, 900.0, 400.0, paired=(1.3, 1.7), fid_spread=10.0)
    assert not judged.keep, "judged against a second seed, the same FIDs fail"


def test_a_share_inside_the_noise_is_not_judged():
    assert "too small" in worth_removing(0.01, noise=0.11).text and not worth_removing(0.01, noise=0.11).keep
    assert "not this machine's bottleneck" in worth_removing(0.01).text
    assert worth_removing(0.2, noise=0.11).keep, "a share above the noise is judged as before"


def test_agreement_between_the_plain_loop_and_the_switch():
    assert agreement(1.58, 1.62).keep and "agree" in str(agreement(1.58, 1.62))
    far = agreement(1.2, 1.8)
    assert not far.keep and "differ by 33%" in far.text


def test_a_measured_speedup_is_read_against_the_doctors_upper_bound():
    held = estimate_held("autocast", 1.5, 1.25, (1.2, 1.3))
    assert held.keep and "the estimate held" in held.text and "50% of the gain" in held.text
    beyond = estimate_held("autocast", 1.2, 1.6, (1.5, 1.7))
    assert not beyond.keep and "more than the estimate allowed" in beyond.text
    assert estimate_held("autocast", 1.2, 1.6, (1.0, 2.4)).keep, "a range this wide holds the bound within the noise"
    nothing = estimate_held("workers", 1.3, 1.01, (0.97, 1.04))
    assert nothing.keep and "no difference measured" in nothing.text
    unestimated = estimate_held("D frozen", None, 1.3, (1.2, 1.4))
    assert unestimated.keep and "no estimate" in unestimated.text and "**faster**" in unestimated.text
