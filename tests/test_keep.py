"""gantools.speed.keep: the keep-or-drop rule tune, doctor --try and the notebooks share (speed in two stages, FID
against a second seed's spread, that seed trained only when the decision needs it)."""
import pytest

from gantools.speed.keep import QUALITY_TARGET, decide, decide_in_two, judge_fid, too_noisy
from gantools.measuring.turns import Spread

INC = [100, 90, 110, 100, 100]


def test_the_rule_keeps_a_winner_of_every_repeat_and_measures_a_close_call_again():
    kept, ratio, spread, why = decide(INC, [120, 99, 130, 110, 105], final=False)
    assert kept and ratio == pytest.approx(1.10, abs=0.01) and spread[0] > 1 and "all 5 repeats" in why
    kept, ratio, spread, why = decide(INC, [130, 85, 140, 110, 99], final=False)  # faster on median, lost two
    assert kept is None and ratio > 1 and spread[0] < 1 and "undecided" in why and "3 of 5" in why
    kept, _, _, why = decide(INC, [90, 95, 99, 100, 120], final=False)
    assert kept is False and "not faster" in why
    # measured again: 10 paired repeats, kept with 8 wins, not with 7
    kept, _, _, why = decide(INC * 2, [130, 85, 140, 110, 99, 130, 95, 120, 110, 105])
    assert kept is True and "8 of 10" in why
    kept, _, _, why = decide(INC * 2, [130, 85, 140, 110, 99, 130, 85, 120, 110, 105])
    assert kept is False and "only 7 of 10" in why


def test_a_first_measurement_that_decides_is_not_measured_again():
    asked = []
    kept, _, _, why = decide_in_two(INC, [120, 99, 130, 110, 105], lambda why: asked.append(why))
    assert kept is True and why.startswith("kept: ") and asked == []
    kept, _, _, why = decide_in_two(INC, [90, 95, 99, 100, 120], lambda why: asked.append(why))
    assert kept is False and "not faster" in why and asked == []


def test_a_close_call_is_measured_again_and_decided_on_all_the_repeats():
    asked = []
    incumbent, candidate = list(INC), [130, 85, 140, 110, 99]

    def again(why):
        asked.append(why)
        incumbent.extend(INC)  # a caller may extend its own lists: the first stage's runs count once
        candidate.extend([130, 95, 120, 110, 105])
        return INC, [130, 95, 120, 110, 105]

    kept, _, _, why = decide_in_two(incumbent, candidate, again)
    assert asked and asked[0].startswith("undecided: ") and "3 of 5" in asked[0]
    assert kept is True and "8 of 10" in why
    kept, _, _, why = decide_in_two(INC, [130, 85, 140, 110, 99], lambda why: (INC, [130, 85, 120, 110, 105]))
    assert kept is False and "only 7 of 10" in why


def test_a_close_call_without_time_to_measure_it_again_is_not_kept():
    kept, ratio, _, why = decide_in_two(INC, [130, 85, 140, 110, 99], lambda why: None)
    assert kept is False and ratio > 1
    assert why.startswith("not kept: ") and "undecided" not in why and why.endswith("no time left to measure it again")


WILD = [6, 143, 754, 125, 91]  # over INC: 0.06x to 7.54x, the ratios a loaded machine gave


def test_a_range_wider_than_the_effect_is_measured_again_and_then_neither_kept_nor_dropped():
    asked = []
    kept, ratio, spread, why = decide(INC, WILD, final=False)
    assert kept is None and why.startswith("undecided: ") and "measure again on a quiet machine" in why
    kept, ratio, spread, why = decide_in_two(INC, WILD, lambda why: asked.append(why) or (INC, WILD))
    assert asked and kept is None and why.startswith("too noisy: ") and why.endswith("on a quiet machine")
    kept, _, _, why = decide_in_two(INC, WILD, lambda why: None)  # no time to measure it again: still not a drop
    assert kept is None and why.startswith("too noisy: ")
    # a won range is kept however wide; a change that does nothing on a quiet machine has a range wider than its
    # effect but narrow, and is decided as before
    assert not too_noisy(1.2, Spread(1.05, 1.9)) and not too_noisy(1.0, Spread(0.97, 1.04))
    assert decide(INC, [103, 89, 108, 98, 99])[0] is False


def test_the_second_seed_is_trained_only_when_fid_rose_past_the_target():
    trained = []

    def seed():
        trained.append(1)
        return 20.0

    within = judge_fid(10.5, 10.0, seed)
    assert not within.worse and trained == [] and within.seed_fid is None and within.limit == QUALITY_TARGET
    better = judge_fid(5.0, 10.0, seed)
    assert better.better and trained == [], "a lower FID keeps the change: no seed needed to decide"
    noisy = judge_fid(15.0, 10.0, seed)  # 1.5x worse, but a second seed moves FID 2x: within its noise
    assert trained == [1] and noisy.seed_fid == 20.0 and noisy.spread == 2.0 and noisy.limit == 2.0
    assert not noisy.worse
    assert judge_fid(15.0, 10.0, lambda: 10.5).worse, "past both the target and the seed's spread"


def test_a_known_second_seed_always_widens_the_limit_and_none_leaves_the_target():
    judged = judge_fid(7.0, 10.0, 5.0)  # the seed scored half the start's FID: spread 2x either way
    assert judged.limit == 2.0 and not judged.better and not judged.worse
    assert judge_fid(4.0, 10.0, 5.0).better
    alone = judge_fid(11.5, 10.0)
    assert alone.worse and alone.limit == QUALITY_TARGET and alone.spread is None
    assert not judge_fid(10.9, 10.0).worse
