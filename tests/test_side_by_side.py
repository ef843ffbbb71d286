"""Runs trained side by side to one budget: the same real images, or the same generator steps (for runs that read
different numbers of real images per generator step, as WGAN-GP's five critic batches), scored over the run."""
import pytest

from gantools import ConfigError, preset
from gantools.workbook import quality_curve, train_side_by_side
from conftest import TINY


def _configs(tmp_path):
    size = {**TINY, "batch_size": 8, "loader": "device"}
    return {"dcgan": preset("dcgan", **size, out_dir=str(tmp_path / "a")),
            "wgan-gp": preset("wgan-gp", **size, out_dir=str(tmp_path / "b"))}


def test_equal_generator_steps_let_each_run_read_its_own_real_images(tmp_path):
    runs = train_side_by_side(_configs(tmp_path), steps=4, chunk_steps=2, plot=False, quality_points=2)
    assert [t.step for t in runs.values()] == [4, 4]
    assert runs["wgan-gp"].batches_seen == 5 * runs["dcgan"].batches_seen == 5 * 4
    summary = runs["wgan-gp"].history.summary()
    assert summary["images_trained"] == 4 * 5 * 8 and summary["steps"] == 4
    curve = quality_curve(runs["dcgan"])
    assert curve.column("step") == [2, 4] and curve.column("images_trained") == [16, 32]
    assert curve[-1]["fid"] == runs["dcgan"].history.summary()["fid"], "the last point is the run's summary"


def test_equal_real_images_give_wgan_gp_a_fifth_of_the_generator_steps(tmp_path):
    runs = train_side_by_side(_configs(tmp_path), images=80, chunk_images=40, plot=False, quality=False)
    assert runs["dcgan"].step == 10 and runs["wgan-gp"].step == 2
    assert quality_curve(runs["dcgan"]).records == [] and "fid" not in runs["dcgan"].history.summary()


def test_the_budget_is_images_or_steps_never_both(tmp_path):
    with pytest.raises(ConfigError, match="not both"):
        train_side_by_side(_configs(tmp_path), images=80, chunk_images=40, steps=4, chunk_steps=2, plot=False)
    with pytest.raises(ConfigError, match="multiple of chunk_steps"):
        train_side_by_side(_configs(tmp_path), steps=5, chunk_steps=2, plot=False)
