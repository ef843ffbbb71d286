"""What 03_data_loading rests on: timing a reader's own DataLoader alone, and the conclusion drawn from the share of a
step spent waiting for data."""
import pytest
from torch.utils.data import DataLoader

from gantools.workbook.conclusions import DATA_BOTTLENECK, worth_removing
from gantools.core.loaders import DeviceLoader, loader_images_per_sec


def test_a_plain_generator_over_a_dataloader_is_timed_when_told_its_device(glyphs64):
    def endless(loader):
        while True:
            for real, _ in loader:
                yield real.to("cpu", non_blocking=True)

    loader = DataLoader(glyphs64, 16, shuffle=True, drop_last=True)
    assert loader_images_per_sec(endless(loader), batches=6, device="cpu") > 0  # more batches than one epoch holds


def test_a_plain_dataloader_s_image_label_batches_are_counted(glyphs64):
    assert loader_images_per_sec(DataLoader(glyphs64, 16), batches=2, device="cpu") > 0


def test_gantools_loaders_still_name_their_own_device(glyphs64):
    assert loader_images_per_sec(DeviceLoader(glyphs64, 16, "cpu"), batches=3) > 0


def test_a_plain_dataloader_without_a_device_is_asked_for_one(glyphs64):
    with pytest.raises(TypeError, match="pass device="):
        loader_images_per_sec(DataLoader(glyphs64, 16), batches=2)


@pytest.mark.parametrize("share", [0.0, 0.01, 0.04])
def test_a_small_share_of_waiting_is_not_the_bottleneck(share):
    found = worth_removing(share)
    assert not found.keep
    assert "not this machine's bottleneck" in found.text and f"{100 * share:.1f}%" in found.text


@pytest.mark.parametrize("share", [0.06, 0.3, 0.9])
def test_a_large_share_of_waiting_is_a_bottleneck_and_names_the_bound(share):
    found = worth_removing(share, fix="add workers")
    assert found.keep and "add workers" in found.text
    assert f"{1 / (1 - share):.3f}x" in found.text


def test_the_line_between_the_two_is_the_data_bottleneck_share():
    assert not worth_removing(DATA_BOTTLENECK * 0.99).keep and worth_removing(DATA_BOTTLENECK).keep


def test_a_share_measured_below_zero_is_noise_and_read_as_none():
    found = worth_removing(-0.03)
    assert not found.keep and "**0.0%**" in found.text


def test_a_step_that_only_waits_is_the_bottleneck():
    found = worth_removing(1.0)
    assert found.keep and "inf" not in found.text  # no bound divided by zero


# ------------------------------------------------------------------------ the wait for data, answered once (03)
START = {"data_wait_ms": 18.0, "step_time_ms": 330.0}  # 5.5%: a bottleneck by the share alone


def _fix(wait, step, paired, name="data on the device"):
    from gantools.measuring.turns import Spread
    from gantools.workbook.waiting import Fix

    return Fix(name, {"data_wait_ms": wait, "step_time_ms": step}, step and START["step_time_ms"] / step,
               Spread(*paired) if paired else None)


def test_the_timed_share_gets_the_verdict_and_a_fix_too_small_to_see_is_said_to_be_so():
    """03's stored run once called a 5.5% wait 'a bottleneck: feed the device faster' while both fixes measured
    'nothing to keep': both true, and the answer says why in one place."""
    from gantools.workbook.waiting import one_answer

    found = one_answer(START, [_fix(0.2, 320.0, (0.95, 1.12))])
    assert found.keep and "a bottleneck here" in found.text and "18.00 ms of a 330.0 ms step" in found.text
    assert "cut the wait to 0.20 ms" in found.text and "cannot tell that gain from nothing" in found.text
    assert "the wait it removed shows that it works" in found.text


def test_a_race_that_implies_the_timed_share_agrees_and_one_that_misses_it_defers_to_the_timing():
    from gantools.workbook.waiting import implied_share, one_answer

    assert implied_share(1 / (1 - 0.055)) == pytest.approx(0.055)
    held = one_answer(START, implied=("data on the device", 1.09, (1.04, 1.13)), predicted=0.04)
    assert "they agree within the race's noise" in held.text and "loader timed alone predicts 4.0%" in held.text
    missed = one_answer(START, implied=("data on the device", 1.30, (1.25, 1.35)))
    assert "misses the timed share" in missed.text and "the timed wait is the one to go by" in missed.text


@pytest.mark.parametrize("paired, said", [((1.20, 1.30), "the rest of its step ran faster too"),
                                          ((0.97, 1.03), "the rest of its step ran slower"),
                                          ((1.03, 1.08), "and ran faster")])
def test_a_fix_is_read_against_the_gain_the_wait_it_removed_can_give(paired, said):
    from gantools.workbook.waiting import one_answer

    found = one_answer(START, [_fix(0.2, 320.0, paired)])  # removing 17.8 ms of 330: at most 1.057x
    assert said in found.text


def test_a_fix_measured_once_gets_no_verdict():
    from gantools.workbook.waiting import one_answer

    assert "one measurement, no verdict" in one_answer(START, [_fix(0.2, 320.0, None)]).text


def test_the_answer_shows_one_line_and_folds_the_reading():
    from gantools.workbook.waiting import one_answer

    found = one_answer(START, [_fix(0.2, 320.0, (0.95, 1.12))], implied=("data on the device", 1.09, (1.04, 1.13)))
    shown = found._repr_markdown_()
    line, folded = shown.split("<details>")
    assert "a bottleneck here" in line and "cut it to 0.20 ms" in line and "cannot tell from nothing" in line
    assert "implies" not in line and "implies" in folded, "the indirect readings behind the fold"
