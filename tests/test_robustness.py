"""Nothing lost, clear errors: interruptions at many points, non-finite losses, out of memory, bad files,
two processes sharing a cache."""
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import gantools.core.checkpoint as ck
from gantools import (DataError, ImageFolderDataset, NonFiniteLossError, OutOfMemory, Trainer, TrainConfig,
                      load_checkpoint, load_glyphs)
from gantools.cli import main

from conftest import BatchFreeG, FlakyD, weights

ROOT = Path(__file__).resolve().parents[1]


def _same_run(a: Trainer, b: Trainer) -> None:
    for x, y in ((a.generator, b.generator), (a.discriminator, b.discriminator)):
        wx, wy = weights(x), weights(y)
        assert all(torch.equal(wx[k], wy[k]) for k in wx)
    assert a.history.column("loss_g") == b.history.column("loss_g")
    assert a.history.column("loss_d") == b.history.column("loss_d")


class _Boom(KeyboardInterrupt):
    """A hard interrupt (a second Ctrl-C, a dying kernel) at an exact point."""


def _raise_on_call(n):
    calls = {"n": 0}

    def hook(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise _Boom()
    return hook


@pytest.mark.parametrize("where", ["between D and G step", "inside G's optimizer step", "while writing a checkpoint",
                                   "while loading a batch", "while saving samples"])
def test_a_hard_interrupt_anywhere_resumes_to_the_uninterrupted_run(tiny, glyphs64, tmp_path, where, monkeypatch):
    cfg = tiny.replace(steps=9, log_interval=1, checkpoint_interval=2, sample_interval=3)
    full = Trainer(cfg.replace(out_dir=str(tmp_path / "full")), dataset=glyphs64)
    full.fit()
    run = Trainer(cfg.replace(out_dir=str(tmp_path / "cut")), dataset=glyphs64)
    if where == "between D and G step":
        original = run.scaler_d.update
        hook = _raise_on_call(5)
        monkeypatch.setattr(run.scaler_d, "update", lambda *a: (original(*a), hook()))
    elif where == "inside G's optimizer step":
        original_step = run.opt_g.step
        hook = _raise_on_call(6)
        monkeypatch.setattr(run.opt_g, "step", lambda *a, **k: (hook(), original_step(*a, **k)))
    elif where == "while writing a checkpoint":  # the second checkpoint (step 4) dies before its rename
        original_replace = os.replace
        hook = _raise_on_call(2)
        monkeypatch.setattr(ck.os, "replace", lambda a, b: (hook(), original_replace(a, b)) if
                            str(b).endswith("checkpoint.pt") else original_replace(a, b))
    elif where == "while loading a batch":
        original_iter = type(run.loader).__iter__
        hook = _raise_on_call(2)

        def interrupted_iter(loader):
            for i, batch in enumerate(original_iter(loader)):
                if i == 1:
                    hook()  # second pass over the loader (second epoch): step 5
                yield batch
        monkeypatch.setattr(type(run.loader), "__iter__", interrupted_iter)
    else:
        original_sample = run.sample
        hook = _raise_on_call(2)
        monkeypatch.setattr(run, "sample", lambda *a: (hook(), original_sample(*a))[1])
    with pytest.raises(_Boom):
        run.fit()
    monkeypatch.undo()
    cut_at = run.step
    checkpoint = tmp_path / "cut" / "checkpoint.pt"
    assert not list(checkpoint.parent.glob("*.tmp")), "a half-written file was left behind"
    state = load_checkpoint(checkpoint)  # the last complete checkpoint, never a torn one
    assert state["step"] % 2 == 0 and state["step"] <= cut_at
    resumed = Trainer.resume(checkpoint, dataset=glyphs64)
    resumed.fit()
    _same_run(full, resumed)


def _cli(args, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "gantools", "train", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


CLI_RUN = ["--steps", "150", "--loader", "device", "--nz", "8", "--ngf", "8", "--ndf", "8", "--batch-size", "16",
           "--log-interval", "5", "--checkpoint-interval", "10", "--sample-interval", "0", "--quiet"]


@pytest.fixture(scope="module")
def uninterrupted_cli_run(tmp_path_factory):
    """The CLI run both interruptions are compared with, trained once: its checkpoint."""
    out = tmp_path_factory.mktemp("full")
    full = _cli([*CLI_RUN, "--out-dir", str(out)])
    assert full.wait(timeout=300) == 0, full.stderr.read()
    return out / "checkpoint.pt"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["kill -9", "ctrl-c"])
def test_a_killed_cli_run_resumes_to_the_same_weights(tmp_path, sig, uninterrupted_cli_run):
    cut = _cli([*CLI_RUN, "--out-dir", str(tmp_path / "cut")])
    checkpoint = tmp_path / "cut" / "checkpoint.pt"
    deadline = time.time() + 120
    while not checkpoint.is_file() and time.time() < deadline and cut.poll() is None:
        time.sleep(0.01)
    time.sleep(0.05)
    assert checkpoint.is_file() and cut.poll() is None, "the run ended or wrote no checkpoint before the interrupt"
    cut.send_signal(sig)
    code = cut.wait(timeout=60)
    stopped_at = load_checkpoint(checkpoint)["step"]
    assert stopped_at < 150, "the run finished before it could be interrupted: make it longer"
    assert code == (-signal.SIGKILL if sig == signal.SIGKILL else 0)
    resumed = _cli(["--resume", str(checkpoint), "--steps", "150", "--out-dir", str(tmp_path / "cut"), "--quiet"])
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    a, b = load_checkpoint(uninterrupted_cli_run), load_checkpoint(checkpoint)
    assert b["step"] == 150
    for net in ("generator", "discriminator"):
        assert all(torch.equal(a[net][k], b[net][k]) for k in a[net])
    losses = [{r["step"]: r["loss_g"] for r in run["history"]} for run in (a, b)]
    boundary = stopped_at - stopped_at % 5  # a clean stop logs a short interval at the step it stopped
    kept = [s for s in losses[0] if s <= boundary or s >= boundary + 10]
    assert [losses[0][s] for s in kept] == [losses[1][s] for s in kept] and len(kept) >= len(losses[0]) - 1


def _flaky(cfg, glyphs64, bad_steps):
    trainer = Trainer(cfg, generator=BatchFreeG(), discriminator=FlakyD(bad_steps), dataset=glyphs64)
    trainer.discriminator.calls = 0
    return trainer


def _finite(trainer):
    tensors = [*trainer.generator.parameters(), *trainer.discriminator.parameters()]
    tensors += [v for opt in (trainer.opt_g, trainer.opt_d) for st in opt.state.values() for v in st.values()
                if torch.is_tensor(v)]
    return all(torch.isfinite(t).all() for t in tensors)


def test_skip_restores_the_last_good_weights_and_goes_on(tiny, glyphs64):
    trainer = _flaky(tiny.replace(steps=8, log_interval=2, on_nonfinite="skip"), glyphs64, bad_steps=[4])
    with pytest.warns(UserWarning, match=r"step 4: the discriminator and generator loss is not finite.*Skipped: "
                                         r"restored the weights of step 2"):
        history = trainer.fit()
    assert trainer.step == 8 and [r.get("skipped", False) for r in history] == [False, True, False, False]
    assert _finite(trainer) and math.isfinite(history[-1]["loss_d"])


def test_several_skips_in_a_row_still_recover(tiny, glyphs64):
    trainer = _flaky(tiny.replace(steps=14, log_interval=2, on_nonfinite="skip", max_skips=3), glyphs64,
                     bad_steps=[3, 4, 5, 6, 7, 8])  # three bad intervals in a row, then healthy again
    with pytest.warns(UserWarning, match="3 of 3 skips in a row"):
        history = trainer.fit()
    assert [r.get("skipped", False) for r in history] == [False, True, True, True, False, False, False]
    assert _finite(trainer) and math.isfinite(history[-1]["loss_g"])


def test_skip_gives_up_after_max_skips_and_stop_is_the_default(tiny, glyphs64):
    trainer = _flaky(tiny.replace(steps=20, log_interval=2, on_nonfinite="skip", max_skips=2), glyphs64,
                     bad_steps=range(3, 100))
    with pytest.warns(UserWarning), pytest.raises(NonFiniteLossError, match="Skipping did not help: 3 .*step 2 "
                                                                          "were restored"):
        trainer.fit()
    assert _finite(trainer)  # left holding the last good weights
    default = _flaky(tiny, glyphs64, bad_steps=[1])
    with pytest.raises(NonFiniteLossError, match="step 2: .*learning rate.*on_nonfinite='skip'"):
        default.fit()


def test_a_nan_update_never_replaces_a_good_checkpoint(tiny, glyphs64):
    trainer = _flaky(tiny.replace(steps=8, log_interval=4, checkpoint_interval=2), glyphs64, bad_steps=[3])
    with pytest.raises(NonFiniteLossError, match="step 4"):
        trainer.fit()
    state = load_checkpoint(trainer.out_dir / "checkpoint.pt")  # step 4's weights were NaN: step 2's stays
    assert state["step"] == 2 and all(torch.isfinite(v).all() for v in state["discriminator"].values())


def test_a_collapsing_grad_scaler_is_reported(tiny, glyphs64):
    trainer = Trainer(tiny.replace(steps=2, log_interval=2), dataset=glyphs64)
    collapsed = torch.amp.GradScaler("cpu", init_scale=2.0 ** -6)  # what fp16 overflows drive it to
    trainer.scaler_g = trainer.stepper.parts.scaler_g = collapsed
    with pytest.warns(UserWarning, match="generator's fp16 GradScaler scale fell to 0.0156.*bf16"):
        history = trainer.fit()
    assert history[-1]["scale_g"] < 1 and history[-1]["scale_collapsed"] and "scale_d" not in history[-1]


def test_out_of_memory_is_one_clear_error_with_what_to_change(tiny, glyphs64, monkeypatch, capsys, tmp_path):
    def oom(self, real):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    real_step = Trainer.train_step

    def oom_in_g_step(self, real):  # D has stepped and is frozen for G's step when memory runs out
        original = self.scaler_g.scale
        self.scaler_g.scale = lambda *a: (_ for _ in ()).throw(torch.OutOfMemoryError("CUDA out of memory."))
        try:
            real_step(self, real)
        finally:
            self.scaler_g.scale = original

    monkeypatch.setattr(Trainer, "train_step", oom_in_g_step)
    trainer = Trainer(tiny, dataset=glyphs64)
    with pytest.raises(OutOfMemory, match=r"at step 1 .*batch_size \(now 16\).*grad_accum_steps=2.*bf16"):
        trainer.fit()
    assert all(p.requires_grad for p in trainer.discriminator.parameters())  # D trains again after the error
    assert all(p.grad is None for p in trainer.generator.parameters())  # the half step's gradients are freed
    monkeypatch.setattr(Trainer, "train_step", oom)
    assert main(["train", "--steps", "2", "--loader", "device", "--nz", "8", "--ngf", "8", "--ndf", "8",
                 "--batch-size", "16", "--out-dir", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gantools: error: out of cpu memory") and "Traceback" not in err


@pytest.mark.parametrize("error, oom", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (RuntimeError("CUDA error: out of memory"), True),  # a raw cudaErrorMemoryAllocation (a context, a handle)
    (RuntimeError("cuDNN error: CUDNN_STATUS_NOT_INITIALIZED"), True),  # cuDNN's handle or workspace, memory full
    (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), True),
    (RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"), True),  # cuDNN 9
    (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), True),
    (OutOfMemory("out of cuda memory at step 3"), True),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied (16x8 and 9x64)"), False),
    (RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"), False),
    (DataError("cannot read image a.png: out of memory decoding it"), False),  # ours: already says what to do
    (MemoryError(), False),  # the host's memory: nothing a smaller batch on the device fixes
])
def test_one_classifier_tells_out_of_device_memory(error, oom):
    from gantools.core.recovery import is_out_of_memory

    assert is_out_of_memory(error) is oom


def test_an_allocation_failure_torch_raises_as_a_plain_error_is_out_of_memory_in_fit(tiny, glyphs64, monkeypatch):
    def fails(message):
        def step(self, *reals):
            raise RuntimeError(message)
        return step

    trainer = Trainer(tiny, dataset=glyphs64)
    monkeypatch.setattr(Trainer, "train_step", fails("cuDNN error: CUDNN_STATUS_NOT_INITIALIZED"))
    with pytest.raises(OutOfMemory, match=r"at step 1 .*batch_size \(now 16\).*Detail: cuDNN error: "
                                          r"CUDNN_STATUS_NOT_INITIALIZED"):
        trainer.fit()
    monkeypatch.setattr(Trainer, "train_step", fails("mat1 and mat2 shapes cannot be multiplied"))
    with pytest.raises(RuntimeError, match="mat1") as raised:  # any other error is left as it is
        trainer.fit()
    assert not isinstance(raised.value, OutOfMemory)


@pytest.mark.parametrize("loader", ["dataloader", "device"])
def test_out_of_memory_copying_a_batch_leaves_the_next_fit_a_fresh_batch_stream(tiny, glyphs64, monkeypatch, loader,
                                                                               tmp_path):
    import gantools.core.loaders as loaders

    cfg = tiny.replace(loader=loader, steps=4, log_interval=1)
    full = Trainer(cfg.replace(out_dir=str(tmp_path / "full")), dataset=glyphs64)
    full.fit()
    real, calls = loaders.prepare_batch, []

    def copy_runs_out_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # the third batch's copy to the device
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(loaders, "prepare_batch", copy_runs_out_once)
    run = Trainer(cfg.replace(out_dir=str(tmp_path / "cut")), dataset=glyphs64)
    with pytest.raises(OutOfMemory, match="at step 3"):
        run.fit()
    assert run.step == run.batches_seen == 2
    run.fit()  # the batch stream that raised is finished: a fresh one starts at the failed step's batch
    assert run.step == run.batches_seen == 4
    _same_run(full, run)


def _png(path, size=(40, 30)):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path)


def test_bad_files_anywhere_in_a_folder_are_all_named_before_training(tmp_path):
    for i in range(4):
        _png(tmp_path / f"ok{i}.png")
    _png(tmp_path / "cut.png")
    (tmp_path / "cut.png").write_bytes((tmp_path / "cut.png").read_bytes()[:300])  # truncated mid-file
    _png(tmp_path / "photo.jpg")
    (tmp_path / "photo.jpg").write_bytes((tmp_path / "photo.jpg").read_bytes()[:-40])  # truncated JPEG
    (tmp_path / "readme.png").write_text("not an image at all")
    with pytest.raises(DataError) as e:
        ImageFolderDataset(tmp_path)
    message = str(e.value)
    assert message.startswith("3 of 7 files") and all(n in message for n in ("cut.png", "photo.jpg", "readme.png"))
    assert "ok0.png" not in message and "Remove or replace" in message


@pytest.mark.slow
def test_two_processes_filling_the_same_cache_at_once_do_not_corrupt_it(tmp_path):
    code = ("import sys, hashlib; from gantools import load_glyphs; "
            "x, y = load_glyphs(32, 1, 'test', root=sys.argv[1]); "
            "print(hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest())")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    digests = {o[0].strip() for o in outs}
    assert len(digests) == 1
    x, y = load_glyphs(32, 1, "test", root=tmp_path)  # the cache left behind is whole and the same
    import hashlib
    assert hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest() in digests
    assert not list(tmp_path.rglob("*.tmp"))


def test_fp16_trouble_on_a_gpu_without_fast_bf16_is_not_told_to_use_bf16(monkeypatch, tmp_path):
    """An fp16 overflow or an out-of-memory step suggests the device's own way out: bf16 where it is fast, on a T4
    (no fast bf16, refused by validation) fp32 after an overflow and fp16 to save memory."""
    from gantools.core import recovery

    for capability, way_out, smaller in (((7, 5), "precision='fp32'", "precision='fp16'"),
                                         ((8, 0), "precision='bf16'", "precision='bf16'")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        cuda, seen = torch.device("cuda"), []
        cfg = TrainConfig(device="cuda", precision="fp16", lr_d=1e-3, lr_g=1e-3)
        record = {"loss_d": 0.5, "loss_g": math.nan, "scale_g": 0.01}
        with pytest.raises(NonFiniteLossError) as stopped:
            recovery.Rollback(dict).non_finite(record, ["generator"], cfg, 10, 10, None)
        assert way_out in str(stopped.value) and str(stopped.value).count("precision=") == 1
        oom = recovery.out_of_memory("CUDA out of memory", cfg.replace(precision="fp32"), cuda, 3, tmp_path / "c.pt")
        assert smaller in str(oom) and str(oom).count("precision=") == 1
        recovery.check_scales({"scale_g": 0.01}, 10, lambda message, stacklevel, seen=seen: seen.append(message), cuda)
        assert way_out in seen[0] and seen[0].count("precision=") == 1
