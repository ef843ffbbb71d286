"""gantools.measuring.turns: the one take-turns protocol (warm-up apart, order, repeats) and its result, and the one
clock (hardware.Timer) every timing reads."""
import pytest
import torch

from gantools.measuring.clock import logged_seconds
from gantools.measuring.hardware import Timer
from gantools.measuring.protocol import IterationClock
from gantools.measuring.turns import ALTERNATE, SAME, Contender, Measured, Spread, take_turns


def _contenders(order, speeds, warmed=None):
    def contender(name):
        def warm_up():
            order.append(f"warm {name}")
            return name

        def turn(subject):
            order.append(subject)
            return speeds[subject]
        return Contender(warm_up=warm_up, turn=turn) if warmed else Contender(subject=name, turn=turn)
    return {name: contender(name) for name in speeds}


def test_alternate_order_warms_up_first_then_reverses_every_other_round():
    order, lines, rounds = [], [], []
    measured = take_turns(_contenders(order, {"a": 10.0, "b": 20.0}, warmed=True), 3, order=ALTERNATE,
                          after_round=rounds.append, progress=lines.append)
    assert order == ["warm a", "warm b", "a", "b", "b", "a", "a", "b"]
    assert rounds == [0, 1, 2] and lines[-1] == "repeat 3/3 done" and lines[0].startswith("warmed up a in")
    assert measured["a"].images_per_sec_runs == [10.0] * 3 and measured["b"].subject == "b"
    assert measured["b"].ratios(measured["a"]) == [2.0, 2.0, 2.0]


def test_same_order_keeps_the_round_as_given_and_takes_subjects_as_they_are():
    order = []
    measured = take_turns(_contenders(order, {"a": 1.0, "b": 2.0}), 2, order=SAME)
    assert order == ["a", "b", "a", "b"] and measured["a"].warmup_s == 0.0  # nothing warmed up: no time taken


def test_until_ends_the_measurement_at_a_turn_kept_only_in_turns():
    order = []
    measured = take_turns(_contenders(order, {"a": 1.0, "b": -1.0}), 3, until=lambda figure: figure < 0)
    assert order == ["a", "b"] and measured["b"].turns == [-1.0] and measured["b"].images_per_sec_runs == []


def test_warm_up_time_is_kept_apart_from_the_turns(fake_clock):
    measured = take_turns({"slow": Contender(warm_up=lambda: fake_clock.advance(5.0) or "x", turn=lambda s: 1.0)}, 1)
    assert measured["slow"].warmup_s == pytest.approx(5.0 + fake_clock.tick)  # the warm-up's time, read on its clock
    assert measured["slow"].images_per_sec_runs == [1.0]


def test_a_spread_is_low_and_high_saved_as_a_pair_and_a_share_where_needed():
    m = Measured(images_per_sec_runs=[90.0, 100.0, 120.0])
    assert m.images_per_sec == 100.0 and m.spread == Spread(90.0, 120.0) == (90.0, 120.0)
    assert m.spread.share_of(m.images_per_sec) == pytest.approx(0.15) and Spread.of([]) is None
    assert list(Spread(1.0, 2.0)) == [1.0, 2.0], "saves to JSON as [low, high]"


def test_the_one_clock_laps_and_stops_and_the_doctors_clock_keeps_its_laps(fake_clock):
    timer = Timer(torch.device("cpu")).start()
    fake_clock.advance(2.0)
    first = timer.lap()
    assert first == pytest.approx(2.0 + fake_clock.tick) and timer.stop() == pytest.approx(fake_clock.tick)
    clock = IterationClock(torch.device("cpu"))
    clock.start()
    clock.lap()
    clock.lap()
    assert len(clock.times_ms) == 2 and clock.median_ms >= 0


def test_logged_seconds_weights_each_record_by_the_steps_it_covers():
    records = [{"step": 12, "step_time_ms": 100.0}, {"step": 13, "step_time_ms": 400.0}]
    steps, seconds = logged_seconds(records, since_step=10)
    assert steps == 3 and seconds == pytest.approx(0.6)
