"""The learning-rate schedule: warm-up and cosine decay as trainer switches, on schedule after a resume."""
import math
import re

import pytest

from gantools import ConfigError, Trainer
from gantools.core.lr_schedule import Schedule
from gantools.workbook.runs import train_side_by_side


def test_warm_up_rises_linearly_from_above_zero_to_the_full_rate():
    s = Schedule("constant", warmup=3, steps=10)
    assert [s.factor(i) for i in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0], "step 0 trains at a quarter, not at 0"


def test_cosine_falls_from_the_full_rate_to_zero_at_the_runs_end_and_stays_there():
    s = Schedule("cosine", warmup=2, steps=12)
    assert s.factor(2) == 1.0, "the decay starts where the warm-up ends"
    assert s.factor(7) == pytest.approx(0.5), "halfway through the decay: cos(pi/2)"
    assert s.factor(4) == pytest.approx(0.5 * (1 + math.cos(math.pi * 2 / 10)))
    assert s.factor(12) == pytest.approx(0.0) and s.factor(20) == pytest.approx(0.0)
    factors = [s.factor(i) for i in range(2, 13)]
    assert factors == sorted(factors, reverse=True)


class Rates:
    """Each step's learning rates, read at its end: the rates that step trained with."""

    def __init__(self):
        self.seen = []

    def on_step_end(self, trainer):
        self.seen.append((trainer.opt_g.param_groups[0]["lr"], trainer.opt_d.param_groups[0]["lr"]))


def test_the_trainer_sets_both_rates_every_step_and_keeps_their_ratio(tiny, glyphs64):
    cfg = tiny.replace(lr_schedule="cosine", warmup_steps=2, lr_g=1e-4, lr_d=4e-4)  # TTUR's two rates
    rates = Rates()
    Trainer(cfg, dataset=glyphs64, callbacks=[rates]).fit()
    factor = Schedule("cosine", 2, cfg.steps).factor
    assert rates.seen == [pytest.approx((1e-4 * factor(i), 4e-4 * factor(i))) for i in range(cfg.steps)]


def test_constant_rates_are_left_alone(tiny, glyphs64):
    rates = Rates()
    Trainer(tiny, dataset=glyphs64, callbacks=[rates]).fit()
    assert set(rates.seen) == {(tiny.lr_g, tiny.lr_d)}


def test_a_resumed_run_is_on_schedule(tiny, glyphs64):
    cfg = tiny.replace(lr_schedule="cosine", warmup_steps=1, checkpoint_interval=3)
    whole = Rates()
    Trainer(cfg, dataset=glyphs64, callbacks=[whole]).fit()
    first = Trainer(cfg.replace(out_dir=cfg.out_dir + "-cut"), dataset=glyphs64)
    first.fit(3)
    rest = Rates()
    Trainer.resume(first.out_dir / "checkpoint.pt", dataset=glyphs64, callbacks=[rest]).fit()
    assert rest.seen == whole.seen[3:]


@pytest.mark.parametrize("change, says", [
    (dict(warmup_steps=6), "warmup_steps=6 is as long as the run (steps=6)"),
    (dict(warmup_steps=-1), "warmup_steps=-1: must be >= 0"),
    (dict(lr_schedule="linear"), "lr_schedule='linear': choose one of constant, cosine"),
])
def test_a_schedule_the_run_cannot_follow_is_refused_before_training(tiny, change, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        tiny.replace(**change).validate()


def test_side_by_side_runs_decay_over_their_own_budget(tiny, glyphs64, monkeypatch):
    made = []
    monkeypatch.setattr("gantools.workbook.runs.Trainer",
                        lambda cfg, **kw: made.append(cfg) or Trainer(cfg, dataset=glyphs64, **kw))
    train_side_by_side({"cosine": tiny.replace(lr_schedule="cosine")}, steps=4, chunk_steps=2, quality=False,
                       plot=False)
    assert made[0].steps == 4, "the schedule ends where the run does, not at a placeholder length"
