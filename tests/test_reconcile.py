"""gantools.workbook.reconcile: several measurements of one speed-up, set side by side with their noise, and tune's
quality
check reusing scores measured in the same kernel."""
from types import SimpleNamespace

import pytest

from gantools.workbook import reconcile
from gantools.core.config import TrainConfig
from gantools.measuring.turns import Spread
from gantools.workbook.reconcile import Figure


def _trainer(speeds, cfg=None, quality=None):
    records = [{"images_per_sec": v} for v in speeds]
    return SimpleNamespace(cfg=cfg or TrainConfig(), history=SimpleNamespace(records=records, quality=quality or {}))


def test_paired_ratios_pair_rounds_and_leave_out_warm_up():
    start, run = _trainer([10, 100, 110, 90]), _trainer([5, 200, 220, 270])
    assert reconcile.paired_ratios(run, start) == pytest.approx([2.0, 2.0, 3.0])
    assert Spread.of([2.0, 2.0, 3.0]) == Spread(2.0, 3.0) == (2.0, 3.0)
    assert Spread.of([]) is None


def test_half_width_is_the_noise_share_of_a_figure():
    assert Figure("a", "m", 2.0, Spread(1.8, 2.2)).half_width == pytest.approx(0.1)
    assert Figure("a", "m", 2.0, (1.8, 2.4)).band == Spread(low=1.8, high=2.4), "a pair read back from JSON"
    assert Figure("a", "m", 2.0).half_width == 0.0


def test_figures_within_the_noise_agree():
    figures = [Figure("all together", "in turns", 2.00, (1.90, 2.10)),
               Figure("all together", "alone", 2.06, sequential=True),
               Figure("all together", "benchmark", 1.98, (1.95, 2.02))]
    c = reconcile.reconcile(figures, drift=-0.03)
    assert c.keep
    assert "3 figures from 1.98x to 2.06x, 4% apart" in c.text
    assert "the farthest from *in turns* is *alone*, +3%" in c.text
    assert "they agree within it" in c.text
    assert "moved -3%" in c.text


def test_a_sequential_figure_outside_the_noise_is_named():
    figures = [Figure("all together", "in turns", 2.0, (1.98, 2.02)),
               Figure("all together", "alone", 1.6, sequential=True)]
    c = reconcile.reconcile(figures, drift=0.02, warmup={"the panel's run": 3.04})
    assert not c.keep
    assert "differ by more than it" in c.text and "The figure *alone* also carries the machine's state" in c.text
    assert "3.0x a steady one in the panel's run" in c.text


def test_interleaved_figures_that_disagree_ask_for_another_measurement():
    figures = [Figure("x", "a", 2.0, (1.99, 2.01)), Figure("x", "b", 1.5, (1.49, 1.51))]
    c = reconcile.reconcile(figures)
    assert not c.keep and "measure again" in c.text
    assert "moved" not in c.text  # no drift given, none claimed


def test_one_figure_is_reported_as_such():
    c = reconcile.reconcile([Figure("tune's final", "final check", 1.5)])
    assert c.keep and "one figure, 1.50x (final check)" in c.text


def test_speedup_table_has_a_row_per_figure():
    table = reconcile.speedup_table([Figure("a", "in turns", 2.0, (1.9, 2.1)), Figure("a", "alone", 1.8)])
    lines = table.splitlines()
    assert len(lines) == 4
    assert "| a | in turns | 2.00x | 1.90x-2.10x |" in lines and "| a | alone | 1.80x | not reported |" in lines


def test_same_training_ignores_only_bookkeeping():
    a = TrainConfig(out_dir="runs/a", steps=10, log_interval=5)
    assert reconcile.same_training(a, TrainConfig(out_dir="runs/b", steps=10**9, log_interval=1, sample_interval=0))
    assert not reconcile.same_training(a, TrainConfig(precision="bf16"))


def test_scores_from_reuses_a_matching_run_and_trains_any_other(monkeypatch):
    scored = {"fid": 12.0, "images_trained": 1024, "classes_covered": 10}
    known = _trainer([1, 2], TrainConfig(steps=10**9, out_dir="runs/x"), scored)
    trained = []

    class FakeTrainer:
        def __init__(self, cfg, callbacks=()):
            self.cfg, self.history = cfg, SimpleNamespace(quality={"fid": 50.0, "images_trained": 1024})
            trained.append(cfg)

        def fit(self):
            return self.history

    monkeypatch.setattr("gantools.core.trainer.Trainer", FakeTrainer)
    monkeypatch.setattr("gantools.core.metrics.QualityCallback", lambda *a, **k: None)
    quality = reconcile.scores_from({"start": known}, images=1024)
    assert quality(TrainConfig(out_dir="runs/tune/start")) == scored and not trained
    assert quality(TrainConfig(batch_size=128, precision="bf16"))["fid"] == 50.0
    assert trained[0].steps == 1024 // 128 and trained[0].precision == "bf16"
    assert reconcile.scores_from({"start": known}, images=2048)(TrainConfig())["fid"] == 50.0  # other budget: trained
    # what tune's time budget reserves for each: nothing for the scores held, the images for any other
    assert quality.train_images(TrainConfig()) == 0 and quality.train_images(TrainConfig(seed=1)) == 1024


def test_a_sequential_figure_has_no_range_to_show():
    table = reconcile.speedup_table([Figure("a", "alone", 1.8, sequential=True)])
    assert "| a | alone | 1.80x | none: one run |" in table.splitlines()


def _score(fid, covered=10, classes=10):
    return {"fid": fid, "classes_covered": covered, "classes": classes}


def test_two_quality_measurements_pointing_opposite_ways_leave_quality_not_settled():
    """02's bf16: the race's FID fell beyond a second seed's spread, the runs' rose beyond theirs."""
    c = reconcile.quality_settled("bf16", "fp32", {
        "the race": (_score(31.2, 9), _score(36.8, 9), _score(33.3, 9)),
        "the runs": (_score(24.6), _score(18.4), _score(17.2))})
    assert not c.keep
    assert "the race says **better**" in c.text and "the runs says **worse**" in c.text
    assert "**quality not settled here**" in c.text


def test_quality_measurements_that_agree_settle_it_and_kept_beside_better_finds_no_loss():
    same = reconcile.quality_settled("bf16", "fp32", {"a": (_score(30), _score(30), _score(31)),
                                                      "b": (_score(20), _score(20.5), _score(20))})
    assert same.keep and "both judged measurements say **kept**" in same.text
    mixed = reconcile.quality_settled("bf16", "fp32", {"a": (_score(20), _score(30), _score(31)),
                                                       "b": (_score(20), _score(20.5), _score(20))})
    assert mixed.keep and "**quality kept**" in mixed.text


def test_a_measurement_whose_generators_draw_too_few_classes_is_not_judged():
    early = (_score(150, 2), _score(160, 2), _score(155, 2))
    alone = reconcile.quality_settled("bf16", "fp32", {"early": early, "later": (_score(25), _score(18), _score(17))})
    assert "early says **not judged**" in alone.text
    assert alone.keep and "the one judged measurement says **worse**" in alone.text
    none = reconcile.quality_settled("bf16", "fp32", {"early": early})
    assert not none.keep and "**quality not judged**" in none.text
