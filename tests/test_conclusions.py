"""One rule per kind of claim (gantools/workbook/conclusions.py): speed verdicts from paired ranges, quality only
against a second seed's spread, one data-bottleneck threshold, and the profiler's estimate named as what it computes."""
import copy
from types import SimpleNamespace

import pytest

from gantools import ConfigError, TrainConfig
from gantools.measuring.turns import Paired, Spread
from gantools.speed.keep import QUALITY_TARGET
from gantools.speed.profiling import ProfileReport, diagnose
from gantools.workbook.conclusions import (DATA_BOTTLENECK, FASTER, NO_DIFFERENCE, ONE_MEASUREMENT, SLOWER,
                                           agreement, estimate_held, keep_or_leave, speed_verdict, speed_words,
                                           worth_removing)
from gantools.workbook import conclusions
from gantools.workbook.runs import SideBySide


@pytest.mark.parametrize("paired, verdict", [((1.02, 1.15), FASTER), ((0.95, 1.20), NO_DIFFERENCE),
                                             ((0.80, 1.00), NO_DIFFERENCE), ((0.74, 0.86), SLOWER),
                                             (None, ONE_MEASUREMENT)])
def test_speed_is_judged_on_the_paired_range_alone(paired, verdict):
    assert speed_verdict(paired) == verdict


def test_a_ratio_whose_paired_range_holds_one_reads_no_difference():
    straddles = keep_or_leave("bf16", "fp32", 1.08, paired=(0.95, 1.20))
    assert not straddles.keep and "no difference measured" in straddles.text
    assert "keep it" not in straddles.text and "faster" not in straddles.text
    excludes = keep_or_leave("bf16", "fp32", 1.08, paired=(1.02, 1.15))
    assert excludes.keep and "1.08x as fast as **fp32** (paired 1.02x-1.15x)" in excludes.text


def test_one_measurement_gets_no_verdict():
    single = keep_or_leave("bf16", "fp32", 1.45)
    assert not single.keep and "one measurement, no verdict" in single.text and "faster" not in single.text
    assert speed_words(1.45, "fp32") == "at 1.45x the speed of fp32 (one measurement, no verdict)"


def test_speed_words_show_the_ratio_and_its_paired_range():
    assert speed_words(0.80, "fp32", Spread(0.74, 0.86)) == "slower than fp32 (0.80x, paired 0.74x-0.86x)"
    assert speed_words(1.03, "fp32", (0.91, 1.12)) == ("with no difference measured against fp32 (1.03x, paired "
                                                       "0.91x-1.12x)")


def test_a_paired_range_upside_down_is_refused():
    with pytest.raises(ConfigError, match="low <= high"):
        speed_verdict((1.2, 1.1))


def test_quality_without_a_second_seed_is_not_judged():
    c = keep_or_leave("bf16", "fp32", 1.5, 30.0, 24.0, paired=(1.3, 1.7))  # FID 25% worse
    assert c.keep and "24.0" in c.text and "30.0" in c.text and "quality not judged (no second seed)" in c.text
    assert "fell" not in c.text and "kept" not in c.text


@pytest.mark.parametrize("fid_spread", [6.0, (24.0, 30.0)])
def test_a_rise_within_the_second_seeds_spread_is_kept_and_beyond_it_not(fid_spread):
    within = keep_or_leave("bf16", "fp32", 1.5, 29.0, 24.0, paired=(1.3, 1.7), fid_spread=fid_spread)
    assert within.keep and "quality kept" in within.text and "1.25x" in within.text  # the seeds' 30 / 24
    beyond = keep_or_leave("bf16", "fp32", 1.5, 31.0, 24.0, paired=(1.3, 1.7), fid_spread=fid_spread)
    assert not beyond.keep and "quality fell" in beyond.text


def test_a_second_seed_closer_than_the_quality_target_still_allows_it():
    """tune's rule (`keep.judge_fid`): the limit is the wider of QUALITY_TARGET and the seeds' spread."""
    c = keep_or_leave("bf16", "fp32", 1.5, 24.0 * (QUALITY_TARGET - 0.01), 24.0, paired=(1.3, 1.7), fid_spread=0.5)
    assert c.keep and "quality kept" in c.text


def test_no_difference_and_worse_quality_is_left_off():
    c = keep_or_leave("bf16", "fp32", 1.01, 40.0, 24.0, paired=(0.9, 1.1), fid_spread=1.0)
    assert not c.keep and "no difference measured, and quality fell" in c.text


def test_under_the_data_bottleneck_share_is_no_bottleneck():
    assert DATA_BOTTLENECK == 0.05
    short = worth_removing(0.049)  # 03's 4.9% of a step waiting
    assert not short.keep and "not this machine's bottleneck" in short.text and "**4.9%**" in short.text
    assert worth_removing(DATA_BOTTLENECK).keep and "a bottleneck here" in worth_removing(0.051).text


def test_agreement_reads_paired_ranges_where_both_have_one():
    overlap = agreement(1.2, 1.5, plain_paired=(1.0, 1.4), switch_paired=(1.3, 1.7))
    assert overlap.keep and "agree" in overlap.text, "20% apart, but within each other's noise"
    apart = agreement(1.2, 1.28, plain_paired=(1.18, 1.22), switch_paired=(1.25, 1.3))
    assert not apart.keep and "differ" in apart.text


def test_a_fix_measured_above_the_profilers_bound_is_noticed():
    """01's numbers: the verdict's bound 1.69x, the fix measured 1.80x; one measurement decides nothing."""
    one = estimate_held("bf16", 1.69, 1.80, by="the profiler")
    assert one.keep and "one measurement, no verdict" in one.text
    assert "the profiler's estimate of up to 1.69x" in one.text
    beyond = estimate_held("bf16", 1.69, 1.80, (1.72, 1.90), by="the profiler")
    assert not beyond.keep and "more than the estimate allowed" in beyond.text
    assert estimate_held("bf16", 1.69, 1.80, (1.60, 2.00)).keep, "a paired range that reaches below the bound"
    assert not estimate_held("bf16", 1.69, 1.80, (1.72, 1.90)).keep


def test_the_profilers_estimate_is_amdahl_on_the_share_it_removes_and_says_so():
    """Convolutions 82% of a 100 ms step: 16-bit assumed to halve them removes 41% of the step, so 1 / (1 - 0.41)."""
    report = ProfileReport("cpu", 5, 64, 100.0, 100.0, {"data wait": 0.0}, 100.0, 0.0, 0.0,
                           [("aten::convolution", 82.0), ("aten::native_batch_norm", 18.0)])
    v = diagnose(report, TrainConfig())
    assert v.removed_share == pytest.approx(0.41) and v.estimated_speedup == pytest.approx(1 / (1 - 0.41))
    text = str(v)
    assert "upper bound" in text and "half the convolutions' and matmuls' time, 41% of the step" in text
    assert "up to 1.69x" in text and "if this bottleneck were removed" not in text


def _trainer(speeds):
    return SimpleNamespace(history=SimpleNamespace(
        records=[{"images_per_sec": v} for v in speeds],
        summary=lambda: {"images_per_sec": sorted(speeds[1:])[len(speeds[1:]) // 2]}))


def test_side_by_side_runs_give_their_paired_range_and_ratio():
    runs = SideBySide({"start": _trainer([1, 100, 100, 100]), "fix": _trainer([9, 110, 95, 120])})
    assert runs.paired("fix", "start") == (0.95, 1.2), "round by round, the warm-up round left out"
    assert runs.ratio("fix", "start") == pytest.approx(1.1)
    assert speed_verdict(runs.paired("fix", "start")) == NO_DIFFERENCE


def test_one_timed_round_is_one_measurement_not_a_range():
    runs = SideBySide({"start": _trainer([1, 100]), "fix": _trainer([9, 150])})
    assert runs.paired("fix", "start") is None, "one ratio is no range: a verdict cannot read it"
    assert speed_verdict(runs.paired("fix", "start")) == ONE_MEASUREMENT
    paired = Paired.of([1.2, 1.3, 1.25])
    assert paired == (1.2, 1.3) and paired.ratios == (1.2, 1.3, 1.25) and Paired.of([1.2]) is None
    assert paired.scaled(2).ratios == (2.4, 2.6, 2.5) and copy.deepcopy(paired).ratios == paired.ratios


def test_settled_says_whether_two_measurements_reach_one_verdict():
    agree = conclusions.settled({"race": Spread(1.02, 1.10), "runs": Spread(1.05, 1.20)})
    assert agree.keep and "both measurements say **faster**" in agree.text
    split = conclusions.settled({"race": Spread(1.02, 1.10), "runs": Spread(0.95, 1.20)}, "workers")
    assert not split.keep and "race says **faster**" in split.text
    assert "runs says **no difference measured**" in split.text
    assert split.text.startswith("**workers**")


def test_a_fix_measured_slower_is_called_slower_and_one_measurement_decides_nothing():
    assert "one measurement, no verdict" in conclusions.estimate_held("fp16", 1.5, 0.5).text
    paired = conclusions.estimate_held("fp16", 1.5, 0.8, spread=(0.7, 0.9))
    assert "**slower**" in paired.text and "made the step slower" in paired.text
    flat = conclusions.estimate_held("fp16", 1.5, 1.01, spread=Paired([0.98, 1.03, 1.01, 0.99, 1.02]))
    assert "**no difference measured**" in flat.text and "nothing the keep rule keeps" in flat.text


def test_memory_is_less_or_more_only_beyond_the_rounding_band():
    assert conclusions.memory_verdict(98.5, 100) == conclusions.SAME_MEMORY
    assert conclusions.memory_verdict(97.0, 100) == conclusions.LESS
    assert conclusions.memory_verdict(103.0, 100) == conclusions.MORE
    assert "0.62x the 100 MB of fp32: **less memory**" in conclusions.memory_words(62, 100, "fp32")


def test_a_memory_saving_that_costs_speed_is_a_trade_not_a_default():
    trade = conclusions.memory_trade("checkpointing", "off", 60, 100, 0.8, paired=Spread(0.75, 0.85))
    assert not trade.keep and "a trade: use it where memory limits the batch" in trade.text
    free = conclusions.memory_trade("bf16", "fp32", 60, 100, 1.5, paired=Spread(1.4, 1.6))
    assert free.keep and "keep it" in free.text
    nothing = conclusions.memory_trade("set_to_none", "zeros", 99, 100, 1.0, paired=Spread(0.9, 1.1))
    assert not nothing.keep and "no memory saved" in nothing.text
    unjudged = conclusions.memory_trade("checkpointing", "off", 60, 100, 0.8)
    assert not unjudged.keep and "not judged" in unjudged.text
    noisy = conclusions.memory_trade("no_grad fakes", "off", 60, 100, 0.95, paired=Paired([0.6, 1.5, 0.95]))
    assert not noisy.keep and "not judged" in noisy.text, "a speed too noisy to tell is no speed kept"


def _curve(fids, steps=(300, 600, 900, 1200)):
    from gantools.core.history import History

    return History([{"step": s, "images_trained": 64 * s, "fid": f} for s, f in zip(steps, fids, strict=False)])


def test_a_fid_curve_that_rose_on_the_way_says_so_before_how_it_ended():
    """07's LSGAN and 11's R3GAN: FID rose between two quarters, then fell by the end. The last two figures alone read
    'still falling'; the rule names the largest rise above the best score before it first."""
    text = conclusions.fid_trend(_curve([118.0, 68.5, 107.7, 38.0]), x="step")
    assert text.startswith("FID **rose** 1.57x on the way, from 68.5 at step 600 to 107.7 at step 900; then FID 107.7")
    assert text.endswith("then FID 107.7, 38.0 from step 900 to step 1200: **still falling** (2.83x lower over its "
                         "last interval): not settled at this budget")
    images = conclusions.fid_trend(_curve([105.0, 110.0, 682.1, 154.5]))  # measured from the best: 105, not 110
    assert "rose** 6.50x on the way, from 105.0 at 19,200 images to 682.1 at 57,600 images" in images


def test_a_slow_climb_is_a_rise_though_no_step_of_it_passes_the_target():
    climb = conclusions.fid_trend(_curve([50.0, 54.0, 59.0, 64.5]), x="step")
    assert climb == "FID 50.0 at step 300, 64.5 at step 1200: **rose** 1.29x above its best by the end"


def test_a_fid_curve_is_judged_by_the_quality_target_alone():
    falling = conclusions.fid_trend(_curve([53.0, 42.4, 35.1, 18.0]), x="step")
    assert falling == ("FID 42.4, 35.1, 18.0 from step 600 to step 1200: **still falling** (2.36x lower over its last "
                       "two intervals, from its best up to then): not settled at this budget")
    # 07's WGAN-GP: each quarter under the target, the whole stretch past it: still falling, not "settled or stuck"
    wgan = conclusions.fid_trend(_curve([113.0, 106.0, 99.4, 90.4]), x="step")
    assert "**still falling** (1.17x lower over its last two intervals" in wgan
    plateau = conclusions.fid_trend(_curve([300.0, 100.0, 60.0, 58.0, 57.9], steps=range(300, 1800, 300)))
    assert plateau.endswith("settled or stuck at this budget"), "a long fall that has flattened has settled"
    climb_back = conclusions.fid_trend(_curve([40.0, 80.0, 60.0, 45.0]))
    assert "**still falling** (1.33x lower over its last interval)" in climb_back
    wobble = QUALITY_TARGET * 0.99  # rises and falls inside the target are no change
    settled = conclusions.fid_trend(_curve([50.0, 50.0 * wobble, 50.0, 50.0 / wobble]), x="step")
    assert "rose" not in settled and settled.endswith("settled or stuck at this budget")
    assert conclusions.fid_trend(_curve([40.0, 39.0, 30.0, 45.0])).endswith("**rose** 1.50x above its best by the end")


def test_a_fid_curve_too_short_or_not_finite_gets_no_trend():
    assert conclusions.fid_trend(_curve([])) == "no FID scores"
    assert "one score, no trend" in conclusions.fid_trend(_curve([40.0]))
    assert "not a finite score" in conclusions.fid_trend(_curve([40.0, float("nan"), 30.0]))
    assert "**still falling** (2.00x" in conclusions.fid_trend(_curve([40.0, 20.0]))
