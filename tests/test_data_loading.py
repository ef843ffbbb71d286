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
