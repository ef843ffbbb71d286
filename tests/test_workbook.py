import json

import pytest

from gantools import TrainConfig, Trainer
from gantools import workbook
from gantools.workbook import QUICK_SIZE, baseline, load_results, save_result, workbook_config


def test_quick_mode_is_on_under_pytest_and_shrinks_runs():
    assert workbook.QUICK
    cfg = workbook_config("reference", run="x")
    assert cfg.steps == QUICK_SIZE["steps"] and cfg.ngf == QUICK_SIZE["ngf"]
    assert cfg.loss == "bce-sigmoid" and cfg.out_dir.endswith("quick/x")
    assert workbook_config(steps=5).steps == 5


def test_real_mode_sizes_are_meaningful():
    size = workbook.real_size()
    assert size["ngf"] == 64 and size["batch_size"] == 128 and size["steps"] >= 300


def test_results_file_round_trip_and_baseline(tmp_path, tiny, glyphs64):
    path = tmp_path / "results.json"
    with pytest.raises(FileNotFoundError, match="00_baseline"):
        baseline(path)
    history = Trainer(tiny, dataset=glyphs64).fit()
    saved = save_result("baseline", history, tiny, path)
    assert baseline(path) == saved["summary"] == json.loads(path.read_text())["baseline"]["summary"]
    save_result("other", history, tiny, path)
    assert set(load_results(path)) == {"baseline", "other"}
    assert TrainConfig.from_dict(load_results(path)["other"]["config"]) == tiny
    assert not list(tmp_path.glob("*.tmp"))
