import json
import re
import subprocess
import sys
from dataclasses import fields

import pytest
import torch

from gantools import TrainConfig
from gantools.cli import build_parser, main
from gantools.speed.profiling import DATA_BOUND

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


def test_every_config_field_is_a_documented_flag():
    help_text = " ".join(build_parser()._subparsers._group_actions[0].choices["train"].format_help().split())
    for f in fields(TrainConfig):
        assert "--" + f.name.replace("_", "-") in help_text
        assert " ".join(f.metadata["help"].split())[:30] in help_text


@pytest.mark.slow
def test_python_dash_m_entry_point(tmp_path):
    result = subprocess.run([sys.executable, "-m", "gantools", "train", "--steps", "2", "--out-dir", str(tmp_path),
                             "--loader", "device", *TINY], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "2 steps on" in result.stdout
    info = subprocess.run([sys.executable, "-m", "gantools", "info"], capture_output=True, text=True, timeout=300)
    assert json.loads(info.stdout)["torch"]


def test_profile_prints_verdict_evidence_table_and_trace(tmp_path, capsys):
    args = ["profile", "--profile-steps", "2", "--warmup", "1", "--out-dir", str(tmp_path), "--loader", "device",
            *[a for a in TINY if a != "--quiet"]]
    assert main(args) == 0
    out = capsys.readouterr().out
    share = float(re.search(r"^  data wait +[\d.]+ ms +([\d.]+)%$", out, flags=re.M).group(1)) / 100
    # the rule, on the share it printed (to 0.1%: at the line itself, either side)
    verdicts = {"data-bound" if s >= DATA_BOUND else "compute-bound" for s in (share - 0.0005, share + 0.0005)}
    assert re.search(r"^verdict: (\S+)$", out, flags=re.M).group(1) in verdicts, out
    assert "evidence:" in out and "try next:" in out
    assert "Self CPU" in out and (tmp_path / "trace.json").is_file()
    # under the verdict, the config's host budget: gantools' step with its data on the device makes no sync
    budget = re.search(r"^host budget: \d+ launches, 0 syncs, 0 host reads an iteration \(counted as a GPU runs "
                       r"it\)$", out, flags=re.M)
    assert budget and out.index("try next:") < budget.start() < out.index("Self CPU"), out


def test_profile_refuses_bad_step_counts(capsys):
    with pytest.raises(SystemExit) as e:
        main(["profile", "--profile-steps", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--profile-steps: 0 is too small: it must be >= 1" in err
    assert len(err.splitlines()) == 2


@pytest.mark.parametrize("args, expected", [
    (["train", "--image-size", "48"], "argument --image-size: invalid choice: 48 (choose from 28, 32, 64)"),
    (["train", "--steps", "abc"], "argument --steps: 'abc' is not a whole number"),
    (["train", "--precision", "fp8"], "argument --precision: invalid choice: 'fp8'"),
    (["train", "--lr-g", "fast"], "argument --lr-g: 'fast' is not a number"),
    (["bench", "--repeats", "0"], "argument --repeats: 0 is too small: it must be >= 1"),
    (["train", "--stpes", "5"], "unrecognized arguments: --stpes 5"),
], ids=["image-size", "steps", "precision", "lr", "repeats", "unknown-flag"])
def test_a_bad_flag_value_is_one_line_and_a_pointer_to_help(args, expected, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"gantools: error: {expected}")
    assert err.count("\n") == 2 and f"python -m gantools {args[0]} --help" in err and "usage:" not in err


def test_every_error_of_every_subcommand_is_one_message_not_a_traceback(tmp_path, monkeypatch, capsys):
    from gantools import Trainer
    from gantools.core import losses

    monkeypatch.setattr(Trainer, "train_step", lambda self, real: (_ for _ in ()).throw(
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")))
    args = ["--loader", "device", "--out-dir", str(tmp_path / "p"), *[a for a in TINY if a != "--quiet"]]
    assert main(["profile", "--profile-steps", "1", "--warmup", "1", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gantools: error: out of cpu memory at step 1") and "Traceback" not in err
    monkeypatch.undo()
    monkeypatch.setattr(losses.BCE, "d", lambda self, real, fake: real.mean() * float("nan"))  # NaN from step 1
    monkeypatch.setattr(losses.BCE, "g", lambda self, fake, real: fake.mean() * float("nan"))
    assert main(["bench", "--device", "cpu", "--variants", "bf16 autocast", "--no-compile",
                 "--json", str(tmp_path / "b.json"), "--png", str(tmp_path / "b.png")]) == 2
    err = capsys.readouterr().err
    assert "gantools: error: step 1: the discriminator and generator loss is not finite" in err  # quick plan: 1 step
    assert "Traceback" not in err
    assert main(["check", "--device", "tpu"]) == 2
    assert "gantools: error: invalid TrainConfig" in capsys.readouterr().err


def test_an_unwritable_out_dir_is_refused_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert main(["train", "--out-dir", str(blocker / "run"), *TINY]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gantools: error: cannot write to {blocker / 'run'}: {blocker} is a file, not a folder")
    assert main(["bench", "--json", str(blocker / "bench.json")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_scaling_tells_a_childs_own_error_from_a_crash(monkeypatch, capsys, tmp_path):
    import subprocess

    from gantools.speed import bench

    def child(stderr, code):
        return lambda *a, **k: subprocess.CompletedProcess(a[0], code, "", stderr)

    args = ["bench", "--scaling", "--device", "cpu", "--json", str(tmp_path / "s.json")]
    monkeypatch.setattr(bench.subprocess, "run", child("gantools: error: no space left for the dataset cache\n", 2))
    assert main(args) == 2
    assert capsys.readouterr().err.strip().endswith(
        "gantools: error: the 1-process run stopped: no space left for the dataset cache")
    crash = "Traceback (most recent call last):\n  ...\nRuntimeError: CUDA error: an illegal memory access\n"
    monkeypatch.setattr(bench.subprocess, "run", child(crash, 1))
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "gantools: FAILED: the 1-process run crashed (exit status 1)" in err and "illegal memory access" in err
    assert "gantools: error" not in err
