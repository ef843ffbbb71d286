"""The same trainer under torchrun: 2 CPU processes (gloo) with half the batch each train the weights one process
trains, and only rank 0 writes. The 2-process runs happen in one torchrun launch (tests/ddp_worker.py), shared by the
tests below, because each launch costs seconds of process start-up on a 2-core machine."""
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

import ddp_worker
from gantools import ConfigError, Trainer, TrainConfig, load_checkpoint
from gantools.core import distributed
from gantools.cli import main

from conftest import BatchFreeD, BatchFreeG, weights

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}  # 2 processes on 2 cores: 1 thread each


def _close(a: dict, b: dict) -> None:
    """Same weights up to float rounding: 2 processes sum the batch's gradients in another order than one."""
    for net in ("generator", "discriminator"):
        for name in a[net]:
            torch.testing.assert_close(a[net][name], b[net][name], rtol=1e-4, atol=1e-6, msg=f"{net} {name}")


def _one_process(cfg, data) -> dict:
    trainer = ddp_worker.batch_free(cfg, data)
    trainer.fit()
    return ddp_worker.summary(trainer)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Every scenario of ddp_worker.py trained by 2 processes; returns (configs, rank 0's and rank 1's results)."""
    out = tmp_path_factory.mktemp("ddp").resolve()
    data, cfgs = ddp_worker.dataset(), ddp_worker.configs(out)
    one_half = tmp_path_factory.mktemp("one-half")  # a 1-process checkpoint at step 2, for 2 processes to resume
    ddp_worker.batch_free(cfgs["half"].replace(out_dir=str(one_half)), data).fit()
    command = distributed.launch_command(2, str(ROOT / "tests" / "ddp_worker.py"), str(out),
                                         str(one_half / "checkpoint.pt"))
    run = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]
    return cfgs, data, ranks


@pytest.mark.slow
def test_two_processes_with_half_the_batch_each_train_the_weights_of_one_process(two_ranks, tmp_path):
    cfgs, data, ranks = two_ranks
    one = _one_process(cfgs["plain"].replace(out_dir=str(tmp_path)), data)
    two = ranks[0]["results"]["plain"]
    assert two["step"] == one["step"] == 4
    _close(one, two)
    for a, b in zip(one["history"], two["history"], strict=True):  # losses averaged over ranks: the one-process losses
        assert a["step"] == b["step"] and a["loss_d"] == pytest.approx(b["loss_d"], rel=1e-5)
        assert a["loss_g"] == pytest.approx(b["loss_g"], rel=1e-5)
    assert a["images_per_sec"] > 0 and b["images_per_sec"] > 0
    _close(two, ranks[1]["results"]["plain"])  # and DDP keeps both ranks' weights in step


@pytest.mark.slow
def test_accumulating_micro_batches_all_reduces_once_per_step_and_matches_one_process(two_ranks, tmp_path):
    cfgs, data, ranks = two_ranks
    two = ranks[0]["results"]["accum"]
    _close(_one_process(cfgs["accum"].replace(out_dir=str(tmp_path)), data), two)
    # no_sync on the first of the 2 micro-batches: one all-reduce per network per step (2 without it)
    assert two["all_reduces"] == {"generator": 3, "discriminator": 3} and two["step"] == 3


@pytest.mark.slow
def test_penalties_d_steps_ema_and_labels_under_two_processes_train_the_weights_of_one(two_ranks, tmp_path):
    cfgs, data, ranks = two_ranks
    trainer = ddp_worker.family(cfgs["family"].replace(out_dir=str(tmp_path)), data)
    trainer.fit()
    one, two = {**ddp_worker.summary(trainer), "ema": weights(trainer.ema.module)}, ranks[0]["results"]["family"]
    # the penalty's D runs unwrapped and joins D's loss in the one backward DDP all-reduces: the same gradients
    _close(one, two)
    for name in one["ema"]:
        torch.testing.assert_close(one["ema"][name], two["ema"][name], rtol=1e-4, atol=1e-6, msg=f"ema {name}")
    for a, b in zip(one["history"], two["history"], strict=True):
        assert a["penalty"] == pytest.approx(b["penalty"], rel=1e-4) and a["loss_d"] == pytest.approx(b["loss_d"],
                                                                                                      rel=1e-4)
    assert one["history"][-1]["penalty"] > 0 and two["step"] == 3
    _close(two, ranks[1]["results"]["family"])


@pytest.mark.slow
def test_only_rank_0_writes_files(two_ranks):
    cfgs, _, ranks = two_ranks
    assert ranks[1]["writes"] == []
    written = " ".join(ranks[0]["writes"])
    for path in ("plain/checkpoint.pt", "plain/history.json", "plain/samples/step_000002.png",
                 "resumed-2-2/checkpoint.pt", "dcgan/checkpoint.pt"):
        assert path in written, path


@pytest.mark.slow
def test_a_checkpoint_resumes_across_process_counts_to_the_uninterrupted_weights(two_ranks, tmp_path):
    cfgs, data, ranks = two_ranks
    uninterrupted = ranks[0]["results"]["plain"]
    _close(uninterrupted, ranks[0]["results"]["resumed 2 -> 2"])
    _close(uninterrupted, ranks[0]["results"]["resumed 1 -> 2"])
    half = Path(cfgs["half"].out_dir) / "checkpoint.pt"  # written by 2 processes: plain names, no "module."
    state = load_checkpoint(half)
    assert state["step"] == 2 and not any(k.startswith("module.") for k in state["generator"])
    resumed = ddp_worker.resume(half, data, steps=4, out_dir=str(tmp_path))  # 2 processes -> 1
    resumed.fit()
    _close(uninterrupted, ddp_worker.summary(resumed))
    assert [r["step"] for r in resumed.history] == [2, 4]


@pytest.mark.slow
def test_a_stop_asked_on_one_rank_stops_every_rank_at_the_next_log_interval(two_ranks):
    cfgs, _, ranks = two_ranks
    assert [rank["results"]["stop"]["step"] for rank in ranks] == [4, 4]  # asked at 3 on rank 0; logs every 2
    assert load_checkpoint(Path(cfgs["stop"].out_dir) / "checkpoint.pt")["step"] == 4


@pytest.mark.slow
def test_a_non_finite_loss_on_one_rank_is_skipped_by_every_rank(two_ranks):
    _, _, ranks = two_ranks
    runs = [rank["results"]["skip"] for rank in ranks]
    for run in runs:  # NaN only in rank 1's D: the all-reduced loss is NaN on both, and both roll back
        assert run["step"] == 8 and [r.get("skipped", False) for r in run["history"]] == [False, True, False, False]
        assert all(torch.isfinite(v).all() for net in ("generator", "discriminator") for v in run[net].values())
    _close(runs[0], runs[1])
    assert len(runs[0]["warnings"]) == 1 and "Skipped" in runs[0]["warnings"][0] and runs[1]["warnings"] == []


@pytest.mark.slow
def test_batchnorm_models_keep_identical_weights_on_every_rank(two_ranks):
    _, _, ranks = two_ranks
    a, b = (rank["results"]["dcgan"] for rank in ranks)
    assert a["step"] == b["step"] == 3
    assert a["buffer_sync"] is b["buffer_sync"] is False  # D runs twice before a backward (see distributed.wrap)
    for net in ("generator", "discriminator"):
        params = [k for k in a[net] if "running" not in k and "num_batches" not in k]
        assert params and all(torch.equal(a[net][k], b[net][k]) for k in params), net
    # running statistics are each rank's own (no buffer sync in the forward: see distributed.wrap)
    assert any(not torch.equal(a["discriminator"][k], b["discriminator"][k]) for k in a["discriminator"]
               if "running_mean" in k)


@pytest.mark.slow
def test_torchrun_cli_prints_once_and_a_forwarded_ctrl_c_stops_every_rank_with_a_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    command = distributed.launch_command(
        2, "-m", "gantools", "train", "--steps", "100000", "--loader", "device", "--nz", "8", "--ngf", "8",
        "--ndf", "8", "--batch-size", "16", "--log-interval", "5", "--checkpoint-interval", "10",
        "--sample-interval", "0", "--quiet", "--out-dir", str(out))
    run = subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    checkpoint = out / "checkpoint.pt"
    deadline = time.time() + 180
    while not checkpoint.is_file() and time.time() < deadline and run.poll() is None:
        time.sleep(0.05)
    assert checkpoint.is_file() and run.poll() is None, run.communicate()[1][-3000:]
    run.send_signal(signal.SIGINT)  # what Ctrl-C in torchrun's terminal does: torchrun forwards it to each worker
    stdout, stderr = run.communicate(timeout=120)
    summaries = [line for line in stdout.splitlines() if "images/s" in line]
    assert len(summaries) == 1 and "stopped early" in summaries[0] and "on 2 processes (cpu)" in summaries[0], \
        stdout + stderr[-3000:]
    state = load_checkpoint(checkpoint)
    assert state["step"] % 5 == 0 and state["history"][-1]["step"] == state["step"] < 100000
    assert not any(k.startswith("module.") for k in state["discriminator"])
    # the 2-process run goes on in one process
    assert main(["train", "--resume", str(checkpoint), "--steps", str(state["step"] + 5), "--quiet"]) == 0
    assert load_checkpoint(checkpoint)["step"] == state["step"] + 5
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"{state['step'] + 5} steps on cpu")


def test_a_batch_that_does_not_split_over_the_processes_is_one_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match=r"batch_size=15 is the global batch, shared by the 2 processes torchrun "
                                          r"started: it must be divisible by 2 .*try batch_size=14"):
        TrainConfig(batch_size=15).validate()
    with pytest.raises(ConfigError, match=r"grad_accum_steps=4 micro-batches: it must be divisible by 8"):
        TrainConfig(batch_size=12, grad_accum_steps=4).validate()
    TrainConfig(batch_size=16, grad_accum_steps=4).validate()  # 2 processes x 4 micro-batches of 2
    args = ["train", "--batch-size", "15", "--device", "cpu", "--out-dir", str(tmp_path)]
    assert main(args) == 2  # before any process group or data: every rank stops, rank 0 says why
    err = capsys.readouterr().err
    assert err.count("gantools: error: invalid TrainConfig") == 1 and "divisible by 2" in err
    monkeypatch.setenv("RANK", "1")
    assert main(args) == 2 and capsys.readouterr().err == ""
    assert not list(tmp_path.iterdir())


def test_sync_batchnorm_on_the_cpu_is_refused_before_work_starts():
    with pytest.raises(ConfigError, match="sync_batchnorm=True needs CUDA GPUs"):
        TrainConfig(device="cpu", sync_batchnorm=True).validate()


def test_without_torchrun_nothing_is_wrapped_or_initialised(tiny, glyphs64):
    assert "WORLD_SIZE" not in os.environ
    trainer = Trainer(tiny, generator=BatchFreeG(), discriminator=BatchFreeD(), dataset=glyphs64)
    assert trainer.world == distributed.World() and not trainer.world.distributed
    step = trainer.stepper
    assert step.g is trainer.generator and step.d is trainer.discriminator is step.d_in_g_step
    assert not torch.distributed.is_initialized()
