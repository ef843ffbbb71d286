"""The largest batch that fits a memory budget: predicted from two batches, tried for real, backed off."""
import pytest

from gantools import ConfigError
from gantools.core.data import ImageTensorDataset, render_glyphs
from gantools.errors import OutOfMemory
from gantools.speed import batch_fit


@pytest.fixture(scope="module")
def glyphs512():
    return ImageTensorDataset(*render_glyphs(512, 32, 1, seed=0))


def test_the_batch_found_fits_the_budget_and_the_line_predicts_another_batch(tiny, glyphs512):
    small = batch_fit.peak_mb(tiny, 16, glyphs512)
    fit = batch_fit.largest_batch(tiny, budget_mb=small * 3, dataset=glyphs512)
    assert fit.limit == "memory" and fit.batch > 32
    assert fit.peak_mb <= fit.budget_mb, "tried for real, within the budget"
    assert fit.fixed_mb + fit.per_image_mb * (fit.batch + 8) > fit.budget_mb or fit.backed_off
    predicted = fit.fixed_mb + fit.per_image_mb * fit.batch
    assert fit.peak_mb == pytest.approx(predicted, rel=0.1), "memory grows in a line with the batch"
    assert f"batch {fit.batch}:" in fit.describe()


def test_a_batch_that_runs_out_of_memory_backs_off(tiny, glyphs512, monkeypatch):
    measure = batch_fit._measure

    def device_with_room_for_40(cfg, batch, dataset=None):
        if batch > 40:
            raise OutOfMemory("CUDA out of memory (simulated)")
        return measure(cfg, batch, dataset)

    monkeypatch.setattr(batch_fit, "_measure", device_with_room_for_40)
    fit = batch_fit.largest_batch(tiny, budget_mb=10_000, dataset=glyphs512)
    assert fit.batch <= 40 and fit.backed_off and all(b > 40 for b in fit.backed_off)


def test_the_dataset_can_be_the_limit(tiny, glyphs64):
    fit = batch_fit.largest_batch(tiny, budget_mb=10_000, dataset=glyphs64)
    assert (fit.batch, fit.limit) == (64, "the dataset")


def test_a_cpu_needs_a_budget_and_a_budget_below_the_weights_is_refused(tiny, glyphs64):
    with pytest.raises(ConfigError, match="on a CPU give budget_mb"):
        batch_fit.largest_batch(tiny.replace(device="cpu"), dataset=glyphs64)
    with pytest.raises(ConfigError, match="give at least"):
        batch_fit.largest_batch(tiny, budget_mb=0.01, dataset=glyphs64)
