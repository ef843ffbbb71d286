import json
import subprocess
import sys
from dataclasses import fields

import pytest

from gantools import TrainConfig
from gantools.cli import build_parser, main

TINY = ["--nz", "8", "--ngf", "8", "--ndf", "8", "--batch-size", "16", "--log-interval", "2", "--quiet"]


def test_train_prints_a_summary_and_writes_samples_and_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--steps", "4", "--out-dir", str(out), "--loader", "device", *TINY]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("4 steps on cpu:") and "images/s" in line and str(out / "checkpoint.pt") in line
    assert (out / "checkpoint.pt").is_file() and list((out / "samples").glob("*.png"))
    assert len(json.loads((out / "history.json").read_text())) == 2


def test_resume_continues_from_the_checkpoint(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", "--steps", "2", "--out-dir", out, *TINY]) == 0
    assert main(["train", "--resume", "--out-dir", out, "--steps", "4", "--quiet"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("4 steps")


def test_reference_preset_from_the_cli(tmp_path, capsys):
    args = ["train", "--preset", "reference", "--steps", "2", "--num-workers", "0", "--out-dir", str(tmp_path), *TINY]
    assert main(args) == 0


def test_config_errors_are_one_message_and_exit_code_2(tmp_path, capsys):
    assert main(["train", "--precision", "fp16", "--device", "cpu", "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gantools: error: invalid TrainConfig") and "Traceback" not in err and "bf16" in err


def test_missing_dataset_is_a_clear_error(tmp_path, capsys):
    assert main(["train", "--dataset", "mnist", "--data-root", str(tmp_path), "--out-dir", str(tmp_path)]) == 2
    assert "--download" in capsys.readouterr().err


def test_bad_flag_values_are_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["train", "--precision", "fp8"])
    assert e.value.code == 2 and "invalid choice: 'fp8'" in capsys.readouterr().err


def test_every_config_field_is_a_documented_flag():
    help_text = " ".join(build_parser()._subparsers._group_actions[0].choices["train"].format_help().split())
    for f in fields(TrainConfig):
        assert "--" + f.name.replace("_", "-") in help_text
        assert " ".join(f.metadata["help"].split())[:30] in help_text


def test_python_dash_m_entry_point(tmp_path):
    result = subprocess.run([sys.executable, "-m", "gantools", "train", "--steps", "2", "--out-dir", str(tmp_path),
                             "--loader", "device", *TINY], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "2 steps on" in result.stdout
    info = subprocess.run([sys.executable, "-m", "gantools", "info"], capture_output=True, text=True, timeout=60)
    assert json.loads(info.stdout)["torch"]


def test_profile_prints_verdict_evidence_table_and_trace(tmp_path, capsys):
    args = ["profile", "--profile-steps", "2", "--warmup", "1", "--out-dir", str(tmp_path), "--loader", "device",
            *[a for a in TINY if a != "--quiet"]]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "verdict: compute-bound" in out and "evidence:" in out and "try next:" in out
    assert "Self CPU" in out and (tmp_path / "trace.json").is_file()


def test_profile_refuses_bad_step_counts(capsys):
    with pytest.raises(SystemExit) as e:
        main(["profile", "--profile-steps", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--profile-steps: 0 is too small: it must be >= 1" in err and len(err.splitlines()) == 2
