"""Sanity of the quality metrics: they must rank what is obviously better as better."""
import pytest
import torch

import gantools.core.metrics as gm
from gantools import Trainer, TrainConfig, make_dataset
from gantools.core.metrics import QualityMeter, class_coverage, load_classifier


@pytest.fixture(scope="module")
def meter():
    return QualityMeter("glyphs", 32, 1, n=1024)


def test_classifier_is_accurate_and_cached(monkeypatch):
    model, accuracy = load_classifier("glyphs", 32, 1)
    assert accuracy >= 0.95
    path = gm._path("glyphs", 32, 1)
    assert path.is_file() and "test_accuracy" in torch.load(path, weights_only=True)
    monkeypatch.setattr(torch.optim, "Adam", lambda *a, **k: pytest.fail("the cached classifier was retrained"))
    assert load_classifier("glyphs", 32, 1)[1] == accuracy


def test_real_against_real_scores_near_zero_and_noise_far_worse(meter):
    other_half = QualityMeter("glyphs", 32, 1, n=1024, offset=1024).real  # disjoint from the meter's real set
    real = meter.score(other_half)
    noise = meter.score(torch.rand(1024, 1, 32, 32) * 2 - 1)
    assert real["fid"] < 0.01 * noise["fid"] and real["kid"] < 0.01 * noise["kid"]
    assert real["classes_covered"] == 10 and real["class_evenness"] > 0.95
    assert real["n_samples"] == 1024 and "1024 samples" in real["note"]


def test_a_generator_of_one_class_scores_far_worse_and_shows_poor_coverage(meter):
    ds = make_dataset("glyphs", 32, 1)
    ones = ds.images[ds.labels == 1][:1024]
    real = meter.score(QualityMeter("glyphs", 32, 1, n=1024, offset=1024).real)
    collapsed = meter.score(ones)
    assert collapsed["fid"] > 20 * real["fid"]
    assert collapsed["classes_covered"] <= 3 and collapsed["class_evenness"] < 0.5


@pytest.mark.slow
def test_a_few_hundred_steps_of_training_improve_the_score(meter, tmp_path):
    cfg = TrainConfig(nz=32, ngf=16, ndf=16, batch_size=64, steps=300, log_interval=50, sample_interval=0,
                      loader="device", out_dir=str(tmp_path))  # fp32: bf16 is emulated, slowly, on some CPUs
    # at this width FID fell from 187 to 118 (0.63x) here; at width 32 to 0.42x, at 2.5x the time
    trainer = Trainer(cfg)
    untrained = meter.score(trainer.generate(1024))
    trainer.fit()
    trained = meter.score(trainer.generate(1024))
    assert trained["fid"] < 0.8 * untrained["fid"], (untrained["fid"], trained["fid"])


def test_coverage_counts_classes_with_a_fair_share():
    preds = torch.tensor([0] * 50 + [1] * 45 + [2] * 5)
    cov = class_coverage(preds, 4)
    assert cov["classes_covered"] == 2 and cov["classes"] == 4 and 0 < cov["class_evenness"] < 1
    assert class_coverage(torch.arange(10).repeat(10), 10)["class_evenness"] == pytest.approx(1.0)


def test_inception_is_offered_only_from_local_files_with_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("GANTOOLS_INCEPTION_WEIGHTS", str(tmp_path / "absent.pth"))
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", lambda *a, **k: pytest.fail("downloaded silently"))
    assert gm.inception_weights(tmp_path) is None
    with pytest.raises(gm.QualityError, match="torch-fidelity|download_inception_weights"):
        QualityMeter("glyphs", 32, 1, root=tmp_path, features="inception")
    (tmp_path / "w.pth").write_bytes(b"x")
    monkeypatch.setenv("GANTOOLS_INCEPTION_WEIGHTS", str(tmp_path / "w.pth"))
    assert gm.inception_weights(tmp_path) == tmp_path / "w.pth"


def test_quality_callback_puts_fid_in_the_summary_and_the_comparison(meter, tmp_path):
    from gantools.workbook.display import comparison_markdown, comparison_rows

    cfg = TrainConfig(nz=16, ngf=8, ndf=8, batch_size=32, steps=4, log_interval=2, sample_interval=0,
                      loader="device", out_dir=str(tmp_path))
    summary = Trainer(cfg, callbacks=[gm.QualityCallback(meter)]).fit().summary()
    assert summary["fid"] > 0 and summary["images_trained"] == 4 * 32 and summary["n_samples"] == 1024
    rows = comparison_rows({"run": summary}, summary)
    assert rows[0]["FID vs baseline"] == 1.0 and "| FID |" in comparison_markdown(rows)


def test_quality_of_an_unlabelled_folder_is_refused_before_training(tmp_path):
    with pytest.raises(gm.QualityError, match="labelled"):
        QualityMeter("folder", 32, 1)


def test_scoring_a_run_does_not_change_its_training(meter, tmp_path):
    cfg = TrainConfig(nz=16, ngf=8, ndf=8, batch_size=32, steps=8, log_interval=2, sample_interval=0,
                      loader="device", out_dir=str(tmp_path))
    runs = []
    for callbacks in ([], [gm.QualityCallback(meter)]):  # one after the other: they share torch's global RNG
        trainer = Trainer(cfg, callbacks=callbacks)
        trainer.fit(4)
        trainer.fit(4)  # the score after the first fit must not shift the second's noise
        runs.append(trainer)
    plain, scored = runs
    assert plain.history.column("loss_g") == scored.history.column("loss_g")
    assert "fid" in scored.history.summary() and "fid" not in plain.history.summary()


def test_quality_callback_on_a_folder_trains_and_says_why_there_is_no_fid(tmp_path):
    import numpy as np
    from PIL import Image

    for i in range(40):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (32, 32), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    cfg = TrainConfig(dataset="folder", data_path=str(tmp_path), nz=8, ngf=8, ndf=8, batch_size=16, steps=2,
                      log_interval=1, sample_interval=0, out_dir=str(tmp_path / "run"))
    callback = gm.QualityCallback()
    with pytest.warns(UserWarning, match="no quality scores.*labelled"):
        summary = Trainer(cfg, callbacks=[callback]).fit().summary()
    assert summary["steps"] == 2 and "fid" not in summary and "labelled" in callback.skip_reason
