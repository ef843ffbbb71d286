import math
import os
import signal

import pytest
import torch
from torch import nn

from gantools import (CheckpointError, ConfigError, ImageTensorDataset, NonFiniteLossError, Trainer,
                      load_checkpoint, preset, save_checkpoint)
from gantools.core.history import METRICS

from conftest import PRECISIONS, BatchFreeD, BatchFreeG, cuda_only, weights


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_available_precision_trains_with_finite_losses(tiny, glyphs64, precision):
    history = Trainer(tiny.replace(precision=precision), dataset=glyphs64).fit()
    assert len(history) == 3 and [r["step"] for r in history] == [2, 4, 6]
    for record in history:
        assert all(math.isfinite(record[m]) for m in METRICS)
        assert record["images_per_sec"] > 0 and record["step_time_ms"] > 0 and record["peak_mem_mb"] > 0


def test_history_summary_reports_speed_after_warm_up(tiny, glyphs64):
    history = Trainer(tiny.replace(steps=8), dataset=glyphs64).fit()
    s = history.summary()
    steady = sorted(r["images_per_sec"] for r in history.records[1:])
    assert s["steps"] == 8 and s["images_per_sec"] == pytest.approx(steady[len(steady) // 2])
    assert s["warmup_step_time_ms"] == history[0]["step_time_ms"]


def test_training_improves_the_discriminator_over_chance(tiny, glyphs64):
    history = Trainer(tiny.replace(steps=30, log_interval=5, lr_d=1e-3), dataset=glyphs64).fit()
    first, last = history[0], history[-1]
    assert last["d_real"] > 0.5 > last["d_fake"], "D should tell real from fake early in training"
    assert last["loss_d"] < first["loss_d"]


def test_accumulating_micro_batches_matches_one_full_batch(tiny, glyphs64):
    results = []
    for k in (1, 4):
        torch.manual_seed(0)
        g, d = BatchFreeG(), BatchFreeD()
        cfg = tiny.replace(steps=3, grad_accum_steps=k, loader="device")
        trainer = Trainer(cfg, generator=g, discriminator=d, dataset=glyphs64)
        trainer.fit()
        results.append((weights(g), weights(d), trainer.history[-1]))
    (g1, d1, h1), (g4, d4, h4) = results
    for a, b in ((g1, g4), (d1, d4)):
        for name in a:
            assert torch.allclose(a[name], b[name], atol=1e-6, rtol=1e-5), name
    for m in METRICS:
        assert h1[m] == pytest.approx(h4[m], rel=1e-5, abs=1e-6)


def test_accumulation_with_the_dcgan_runs(tiny, glyphs64):
    history = Trainer(tiny.replace(grad_accum_steps=2, precision="bf16"), dataset=glyphs64).fit()
    assert all(math.isfinite(r["loss_g"]) for r in history)


def test_same_seed_and_config_give_identical_losses(tiny, glyphs64):
    runs = [Trainer(tiny, dataset=glyphs64).fit().column("loss_d") for _ in range(2)]
    assert runs[0] == runs[1]
    other = Trainer(tiny.replace(seed=1), dataset=glyphs64).fit().column("loss_d")
    assert other != runs[0]


@pytest.mark.parametrize("changes", [dict(loader="device"), dict(hflip=True),
                                     dict(num_workers=2, transform="per-sample")],
                         ids=["device-loader", "hflip", "workers"])
def test_checkpoint_round_trip_resumes_to_identical_results(tiny, glyphs64, tmp_path, changes):
    cfg = tiny.replace(steps=7, log_interval=1, **changes)  # 7 steps: crosses an epoch boundary (4 batches)
    full = Trainer(cfg.replace(out_dir=str(tmp_path / "full")), dataset=glyphs64)
    full.fit()
    half = Trainer(cfg.replace(steps=3, out_dir=str(tmp_path / "half")), dataset=glyphs64)
    half.fit()
    resumed = Trainer.resume(tmp_path / "half" / "checkpoint.pt", dataset=glyphs64, steps=7)
    assert resumed.step == 3
    resumed.fit()
    for a, b in ((full.generator, resumed.generator), (full.discriminator, resumed.discriminator)):
        wa, wb = weights(a), weights(b)
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert full.history.column("loss_g") == resumed.history.column("loss_g")
    assert full.opt_g.state_dict()["state"][0]["step"] == resumed.opt_g.state_dict()["state"][0]["step"]


def test_stop_ends_the_run_between_steps_and_leaves_a_checkpoint(tiny, glyphs64):
    class StopAt3:
        def on_step_end(self, trainer):
            if trainer.step == 3:
                trainer.stop()

    trainer = Trainer(tiny.replace(steps=50), dataset=glyphs64, callbacks=[StopAt3()])
    history = trainer.fit()
    assert trainer.step == 3 and history[-1]["step"] == 3
    assert Trainer.resume(trainer.out_dir / "checkpoint.pt", dataset=glyphs64).step == 3
    assert trainer.latest_grid is not None


def test_ctrl_c_stops_cleanly_after_the_current_step(tiny, glyphs64):
    class Interrupt:
        def on_step_end(self, trainer):
            if trainer.step == 2:
                os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN when run from a background job
    trainer = Trainer(tiny.replace(steps=50), dataset=glyphs64, callbacks=[Interrupt()])
    trainer.fit()  # no KeyboardInterrupt escapes
    assert 2 <= trainer.step < 50
    assert (trainer.out_dir / "checkpoint.pt").is_file()
    assert signal.getsignal(signal.SIGINT) is before


def test_callbacks_see_logs_and_samples(tiny, glyphs64):
    seen = {"log": [], "sample": []}

    class Spy:
        def on_log(self, trainer, record):
            seen["log"].append(record["step"])

        def on_sample(self, trainer, step, grid):
            seen["sample"].append((step, grid.shape))

    Trainer(tiny.replace(sample_interval=3), dataset=glyphs64, callbacks=[Spy()]).fit()
    assert seen["log"] == [2, 4, 6]
    assert seen["sample"] == [(3, (274, 274, 3)), (6, (274, 274, 3))]  # 8 x 8 grid of 32 px + 2 px padding


def test_sampling_saves_png_and_leaves_batchnorm_statistics_alone(tiny, glyphs64):
    trainer = Trainer(tiny, dataset=glyphs64)
    before = [b.clone() for b in trainer.generator.buffers()]
    trainer.sample()
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.generator.buffers(), strict=True))
    assert (trainer.out_dir / "samples" / "step_000000.png").is_file()


def test_frozen_discriminator_gets_no_gradient_from_the_generator_step(tiny, glyphs64):
    counts = {}
    for freeze in (True, False):
        trainer = Trainer(tiny.replace(steps=2, freeze_d=freeze), dataset=glyphs64)
        calls = []
        next(trainer.discriminator.parameters()).register_hook(lambda grad, calls=calls: calls.append(1))
        trainer.fit()
        counts[freeze] = len(calls)
    assert counts[True] == 2 and counts[False] == 4  # per step: the D backward (+ the G backward if not frozen)


def test_reference_preset_is_the_tutorials_loop(tiny, glyphs64):
    cfg = preset("reference", **{k: getattr(tiny, k) for k in ("nz", "ngf", "ndf", "batch_size", "steps",
                                                               "log_interval", "out_dir")})
    per_sample = ImageTensorDataset(glyphs64.images, glyphs64.labels, transform="per-sample")
    trainer = Trainer(cfg, dataset=per_sample)
    history = trainer.fit()
    assert isinstance(trainer.discriminator.main[-1], nn.Sigmoid)
    assert len(trainer.step_values) == cfg.steps  # .item() every step, as published
    assert history[-1]["loss_d"] == pytest.approx(sum(v[0] for v in trainer.step_values[-2:]) / 2, rel=1e-5)


def test_hinge_loss_trains(tiny, glyphs64):
    history = Trainer(tiny.replace(loss="hinge"), dataset=glyphs64).fit()
    assert all(math.isfinite(r["loss_d"]) for r in history)


@pytest.mark.parametrize("changes", [dict(optimizer="adamw", weight_decay=0.01, optimizer_impl="fused"),
                                     dict(optimizer_impl="foreach"), dict(optimizer_impl="for-loop"),
                                     dict(channels_last=True, loader="device")])
def test_optimizer_and_layout_knobs_take_effect(tiny, glyphs64, changes):
    trainer = Trainer(tiny.replace(**changes), dataset=glyphs64)
    trainer.fit()
    group = trainer.opt_d.param_groups[0]
    if "optimizer" in changes:
        assert isinstance(trainer.opt_d, torch.optim.AdamW) and group["fused"] and group["weight_decay"] == 0.01
    if changes.get("optimizer_impl") == "foreach":
        assert group["foreach"]
    if changes.get("optimizer_impl") == "for-loop":
        assert group["foreach"] is False
    if "channels_last" in changes:
        conv = trainer.discriminator.main[0].weight
        assert conv.is_contiguous(memory_format=torch.channels_last)


def test_a_compiled_generator_on_cuda_keeps_its_layout():
    """channels_last for G everywhere but compiled on CUDA, where inductor's stride prediction for a ConvTranspose2d's
    weight gradient disagrees with cuDNN's (builders.generator_format says why); D keeps channels_last there."""
    from gantools.core.builders import generator_format
    from gantools.core.config import TrainConfig

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    last = TrainConfig(channels_last=True)
    assert generator_format(last, cpu) is torch.channels_last
    assert generator_format(last, cuda) is torch.channels_last
    assert generator_format(last.replace(compile="default"), cpu) is torch.channels_last
    assert generator_format(last.replace(compile="default"), cuda) is torch.preserve_format
    assert generator_format(TrainConfig(), cpu) is torch.preserve_format


def test_own_modules_with_wrong_shapes_fail_before_training(tiny, glyphs64):
    with pytest.raises(ConfigError, match="generator makes images of shape"):
        Trainer(tiny, generator=BatchFreeG(size=28), discriminator=BatchFreeD(), dataset=glyphs64)
    with pytest.raises(ConfigError, match="one logit per image"):
        Trainer(tiny, generator=BatchFreeG(), discriminator=nn.Flatten(), dataset=glyphs64)
    with pytest.raises(ConfigError, match="both generator and discriminator"):
        Trainer(tiny, generator=BatchFreeG(), dataset=glyphs64)


def test_non_finite_loss_names_the_step_and_network(tiny, glyphs64):
    class NaND(BatchFreeD):
        def forward(self, x):
            return super().forward(x) * float("nan")

    trainer = Trainer(tiny, generator=BatchFreeG(), discriminator=NaND(), dataset=glyphs64)
    with pytest.raises(NonFiniteLossError, match="step 2: the discriminator and generator loss"):
        trainer.fit()


def test_checkpoint_errors_are_clear(tiny, glyphs64, tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint"):
        Trainer.resume(tmp_path / "missing.pt")
    trainer = Trainer(tiny.replace(steps=1), dataset=glyphs64)
    trainer.fit()
    path = trainer.out_dir / "checkpoint.pt"
    with pytest.raises(ConfigError, match="do not match"):
        Trainer.resume(path, dataset=glyphs64, ngf=16)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="damaged or truncated"):
        Trainer.resume(truncated)
    tampered = tmp_path / "tampered.pt"
    torch.save({"payload": Exploit()}, tampered)
    with pytest.raises(CheckpointError, match="weights-only"):
        Trainer.resume(tampered)
    not_ours = tmp_path / "other.pt"
    save_checkpoint({"weights": torch.zeros(2)}, not_ours)
    with pytest.raises(CheckpointError, match="not a gantools checkpoint"):
        Trainer.resume(not_ours)


class Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_compile_trains_on_cpu_and_counts_its_graphs(tiny, glyphs64):
    class OwnG(BatchFreeG):  # code no other test compiles: dynamo reuses graphs compiled for the same code
        def forward(self, z):
            return self.net(z.flatten(1)).view(-1, 1, self.size, self.size)

    class OwnD(BatchFreeD):
        def forward(self, x):
            return self.net(x).view(-1)

    trainer = Trainer(tiny.replace(steps=4, compile="default", loader="device"), generator=OwnG(),
                      discriminator=OwnD(), dataset=glyphs64)
    history = trainer.fit()
    assert math.isfinite(history[-1]["loss_g"])
    # G once; D on images without gradients (D's step) and with them (G's step, D frozen); nothing after warm-up
    assert history.column("compiled_graphs") == [3, 3]
    again = Trainer(tiny.replace(steps=2, compile="default", loader="device", out_dir=tiny.out_dir + "2"),
                    generator=OwnG(), discriminator=OwnD(), dataset=glyphs64)
    assert again.fit().column("compiled_graphs") == [0]  # the same code and shapes: dynamo's graphs are reused


@cuda_only
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_cuda_mixed_precision_with_fused_optimizer_and_device_loader(tiny, glyphs64, precision):
    cfg = tiny.replace(device="cuda", precision=precision, optimizer_impl="fused", loader="device",
                       channels_last=True, tf32=True, cudnn_benchmark=True, steps=10)
    trainer = Trainer(cfg, dataset=glyphs64)
    history = trainer.fit()
    assert all(math.isfinite(r["loss_g"]) for r in history)
    assert (precision == "fp16") == trainer.scaler_g.is_enabled()
    assert history[-1]["peak_mem_mb"] > 0


@cuda_only
def test_cuda_compile_and_pinned_dataloader(tiny, glyphs64):
    cfg = tiny.replace(device="cuda", compile="default", num_workers=2, pin_memory=True, steps=4)
    history = Trainer(cfg, dataset=glyphs64).fit()
    assert math.isfinite(history[-1]["loss_d"])


def test_building_fitting_and_sampling_leave_the_global_rng_alone(tiny, glyphs64):
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    trainer = Trainer(tiny.replace(hflip=True, steps=3), dataset=glyphs64)
    trainer.fit()
    trainer.sample()
    trainer.generate(4)
    assert torch.equal(torch.get_rng_state(), before)
    again = Trainer(tiny.replace(hflip=True, steps=3, out_dir=str(trainer.out_dir) + "2"), dataset=glyphs64)
    assert again.fit().column("loss_g") == trainer.history.column("loss_g")  # whatever the caller drew between


def test_two_trainers_interleaved_each_run_with_their_own_backend_flags(tiny, glyphs64):
    from gantools.measuring.hardware import backend_flags_now, tf32_matmuls

    class Watch:
        def __init__(self):
            self.seen = []

        def on_step_end(self, trainer):
            self.seen.append({**backend_flags_now(), "tf32_read": tf32_matmuls()})  # what the doctor reads

    process = backend_flags_now()
    fast, exact = Watch(), Watch()
    a = Trainer(tiny.replace(tf32=True, cudnn_benchmark=True, out_dir=tiny.out_dir + "a"), dataset=glyphs64,
                callbacks=[fast])
    b = Trainer(tiny.replace(tf32=False, cudnn_benchmark=False, out_dir=tiny.out_dir + "b"), dataset=glyphs64,
                callbacks=[exact])
    assert backend_flags_now() == process  # building set nothing
    for _ in range(2):  # interleaved, as the benchmark runs its variants
        a.fit(2)
        assert backend_flags_now() == process
        b.fit(2)
        assert backend_flags_now() == process
    assert len(fast.seen) == len(exact.seen) == 4
    assert all(f["tf32_matmul"] == "tf32" and f["cudnn_benchmark"] and f["tf32_read"] for f in fast.seen)
    assert all(f["tf32_matmul"] == "ieee" and not f["cudnn_benchmark"] and not f["tf32_read"] for f in exact.seen)


def test_a_checkpoint_holds_the_trainers_own_generator_and_old_ones_still_resume_exactly(tiny, glyphs64, tmp_path):
    cfg = tiny.replace(steps=4, log_interval=1, hflip=True)
    full = Trainer(cfg.replace(out_dir=str(tmp_path / "full")), dataset=glyphs64)
    full.fit()
    half = Trainer(cfg.replace(steps=2, out_dir=str(tmp_path / "half")), dataset=glyphs64)
    half.fit()
    state = load_checkpoint(tmp_path / "half" / "checkpoint.pt")
    assert state["format"] == 2 and torch.equal(state["rng"]["noise"], half.rng.get_state())
    # format 1 (before the trainer had its own generator): noise and flips came from the global CPU RNG, saved
    # as rng["cpu"]; its state is a CPU generator's state, so the same stream goes on
    old = {**state, "format": 1, "rng": {"cpu": state["rng"]["noise"]}}
    save_checkpoint(old, tmp_path / "old.pt")
    resumed = Trainer.resume(tmp_path / "old.pt", dataset=glyphs64, steps=4, out_dir=str(tmp_path / "old"))
    resumed.fit()
    assert full.history.column("loss_g") == resumed.history.column("loss_g")
    assert all(torch.equal(a, b) for a, b in zip(full.generator.state_dict().values(),
                                                 resumed.generator.state_dict().values(), strict=True))
    save_checkpoint({**state, "format": 3}, tmp_path / "new.pt")
    with pytest.raises(CheckpointError, match="format 3, written by a newer gantools"):
        Trainer.resume(tmp_path / "new.pt", dataset=glyphs64)


class DropoutD(BatchFreeD):
    """A discriminator that draws random numbers itself (dropout), from the global RNG."""

    def forward(self, x):
        return super().forward(nn.functional.dropout(x, 0.3, self.training))


def test_a_module_drawing_from_the_global_rng_resumes_exactly(tiny, glyphs64, tmp_path):
    def run(steps, out, resume=None):
        torch.manual_seed(0)
        g, d = BatchFreeG(), DropoutD()
        if resume:
            return Trainer.resume(resume, generator=g, discriminator=d, dataset=glyphs64, steps=steps,
                                  out_dir=str(tmp_path / out))
        return Trainer(tiny.replace(steps=steps, log_interval=1, out_dir=str(tmp_path / out)), generator=g,
                       discriminator=d, dataset=glyphs64)

    full = run(4, "full")
    full.fit()
    run(2, "half").fit()
    torch.manual_seed(99)  # the caller's RNG in another state: the run's own stream is in the checkpoint
    resumed = run(4, "resumed", resume=tmp_path / "half" / "checkpoint.pt")
    resumed.fit()
    assert full.history.column("loss_d") == resumed.history.column("loss_d")


def test_the_module_stream_continues_across_fit_calls(tiny, glyphs64, tmp_path):
    def losses(*chunks):
        torch.manual_seed(0)
        trainer = Trainer(tiny.replace(steps=4, log_interval=1, out_dir=str(tmp_path / str(chunks))),
                          generator=BatchFreeG(), discriminator=DropoutD(), dataset=glyphs64)
        for n in chunks:
            trainer.fit(n)
        return trainer.history.column("loss_d")

    assert losses(2, 2) == losses(4)  # two fits are one run: dropout's masks do not start over


def test_the_process_matmul_precision_is_kept_readable_and_restored(tiny, glyphs64):
    seen = []

    class Read:
        def on_step_end(self, trainer):
            seen.append(torch.get_float32_matmul_precision())  # raises if legacy and new TF32 APIs were mixed

    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")  # what many scripts do first
        Trainer(tiny.replace(tf32=False, steps=2), dataset=glyphs64, callbacks=[Read()]).fit()
        assert seen == ["highest", "highest"] and torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


def test_a_second_thread_cannot_train_while_a_trainer_holds_the_process(tiny, glyphs64):
    import threading

    inside, release = threading.Event(), threading.Event()

    class Hold:
        def on_step_end(self, trainer):
            inside.set()
            release.wait(30)

    def background():
        Trainer(tiny.replace(steps=1, out_dir=tiny.out_dir + "bg"), dataset=glyphs64, callbacks=[Hold()]).fit()

    thread = threading.Thread(target=background)
    thread.start()
    try:
        assert inside.wait(30)
        with pytest.raises(ConfigError, match="another Trainer is training in this process"):
            Trainer(tiny, dataset=glyphs64).fit()
    finally:
        release.set()
        thread.join(300)
    Trainer(tiny, dataset=glyphs64).fit()  # free again once the other run ended


def dcgan_example_discriminator(nc=1, ndf=8):
    """The discriminator of pytorch/examples dcgan/main.py, as a new user would bring it: a Sequential of strided
    convolutions for 64 px images, ending in nn.Sigmoid, its output viewed to one value per image."""

    class NetD(nn.Module):
        def __init__(self):
            super().__init__()
            self.main = nn.Sequential(
                nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 4),
                nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(ndf * 4, ndf * 8, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 8),
                nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(ndf * 8, 1, 4, 1, 0, bias=False), nn.Sigmoid())

        def forward(self, input):
            return self.main(input).view(-1, 1).squeeze(1)

    return NetD()


class FunctionalSigmoidD(BatchFreeD):
    def forward(self, x):
        return torch.sigmoid(super().forward(x)).view(-1)


def test_a_discriminator_ending_in_sigmoid_with_a_logit_loss_is_refused(tiny, tmp_path):
    from gantools import Generator, render_glyphs

    data64 = ImageTensorDataset(*render_glyphs(16, 64, 1, seed=0))
    cfg = tiny.replace(image_size=64, out_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"ends in a Sigmoid, but loss='bce' expects logits.*Remove the final "
                                          r"Sigmoid.*loss='bce-sigmoid'.*precision='fp32'"):
        Trainer(cfg, generator=Generator(64, 1, 8, 8), discriminator=dcgan_example_discriminator(), dataset=data64)
    # the same D with the loss made for probabilities, in fp32, trains
    Trainer(cfg.replace(loss="bce-sigmoid", steps=2), generator=Generator(64, 1, 8, 8),
            discriminator=dcgan_example_discriminator(), dataset=data64).fit()


def test_sigmoid_inside_forward_and_logits_for_bce_sigmoid_are_caught_too(tiny, glyphs64):
    with pytest.raises(ConfigError, match="ends in a Sigmoid, but loss='hinge'"):
        Trainer(tiny.replace(loss="hinge"), generator=BatchFreeG(), discriminator=FunctionalSigmoidD(),
                dataset=glyphs64)
    for seed in range(5):  # decided by structure: whatever values an untrained logit D happens to return
        torch.manual_seed(seed)
        with pytest.raises(ConfigError, match="loss='bce-sigmoid' \\(BCELoss\\) needs probabilities"):
            Trainer(tiny.replace(loss="bce-sigmoid"), generator=BatchFreeG(),
                    discriminator=BatchFreeD(), dataset=glyphs64)


def test_a_sigmoid_registered_but_not_applied_last_is_not_refused(tiny, glyphs64):
    class PredictingD(BatchFreeD):
        def __init__(self):
            super().__init__()
            self.to_probability = nn.Sigmoid()  # used by predict() only; forward returns logits

        def predict(self, x):
            return self.to_probability(self(x))

    history = Trainer(tiny.replace(loss="bce", steps=2), generator=BatchFreeG(), discriminator=PredictingD(),
                      dataset=glyphs64).fit()
    assert history[-1]["step"] == 2 and all(math.isfinite(r["loss_d"]) for r in history)  # built, and it trains


def test_an_unwritable_out_dir_is_a_config_error_naming_the_path_and_the_reason(tiny, glyphs64, tmp_path,
                                                                             monkeypatch):
    import errno
    import tempfile

    (tmp_path / "file").write_text("x")
    for out, reason in ((tmp_path / "file", "is a file, not a folder"),
                        (tmp_path / "file" / "run", "is a file, not a folder")):
        with pytest.raises(ConfigError, match=f"cannot write to {out}: .*{reason}"):
            Trainer(tiny.replace(out_dir=str(out)), dataset=glyphs64)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() == 0:  # root writes anywhere: let the OS's answer for a locked folder come from mkstemp
        def refuse(code):
            def mkstemp(*a, **k):
                raise OSError(code, os.strerror(code))
            return mkstemp
        monkeypatch.setattr(tempfile, "mkstemp", refuse(errno.EACCES))
    with pytest.raises(ConfigError, match=f"cannot write to {locked}: permission denied"):
        Trainer(tiny.replace(out_dir=str(locked)), dataset=glyphs64)
    monkeypatch.setattr(tempfile, "mkstemp", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EROFS, "ro")))
    with pytest.raises(ConfigError, match="read-only file system"):
        Trainer(tiny.replace(out_dir=str(tmp_path / "ro")), dataset=glyphs64)


def test_reduce_overhead_marks_each_step_and_refuses_a_background_thread(tiny, glyphs64, monkeypatch):
    import threading

    trainer = Trainer(tiny.replace(grad_accum_steps=2), dataset=glyphs64)
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(trainer.step))
    trainer.stepper.cuda_graphs = True  # as on a GPU with compile='reduce-overhead' (CUDA graphs cannot run on a CPU)
    trainer.fit(3)
    assert marks == [0, 1, 2]  # one generation per step, accumulation's micro-batches included
    errors = []
    thread = threading.Thread(target=lambda: errors.append(pytest.raises(ConfigError, trainer.fit, 1)))
    thread.start()
    thread.join()
    assert "cannot train in a background thread" in str(errors[0].value) and trainer.step == 3


def test_graphs_compiled_after_warm_up_and_skipped_cuda_graphs_are_recorded_and_said(tiny, glyphs64,
                                                                                     monkeypatch):
    from gantools.measuring.compile_counts import CompileStats

    counts = iter([(0, 0), (3, 0), (3, 0), (4, 0), (4, 2)])  # counters read at fit start and each log
    monkeypatch.setattr(CompileStats, "_now", staticmethod(lambda: dict(zip(("compiled_graphs", "cudagraph_skips"),
                                                                          next(counts), strict=True))))
    trainer = Trainer(tiny.replace(steps=8), dataset=glyphs64)
    trainer._compile_stats = CompileStats()
    trainer.cfg = trainer.cfg.replace(compile="reduce-overhead")
    with pytest.warns(UserWarning) as caught:
        history = trainer.fit()
    assert history.column("compiled_graphs") == [3, 3, 4, 4] and history.column("cudagraph_skips") == [0, 0, 0, 2]
    said = [str(w.message) for w in caught]
    assert any("step 6: torch.compile compiled 1 more graph(s) after warm-up (4 in all)" in m for m in said)
    assert any("step 8: torch.compile skipped CUDA graphs for 2 graph(s)" in m for m in said)


def test_on_cuda_the_data_wait_is_timed_between_synchronisations(tiny, glyphs64, monkeypatch):
    from gantools.measuring import hardware

    trainer = Trainer(tiny, dataset=glyphs64)
    syncs = []
    monkeypatch.setattr(hardware, "synchronize", lambda device: syncs.append(device.type))
    clock = trainer.clock
    clock.device = torch.device("cuda")  # only the timing logic runs: the batches come from a list
    trainer.step, clock.interval_step, clock.interval_wait, clock.waits = 5, 5, 0.0, 0
    batches = iter([torch.zeros(1)] * 4)
    trainer._next_batches(batches)  # first step of a log interval: sampled, between two syncs
    assert syncs == ["cuda", "cuda"] and clock.waits == 1
    trainer.step = 6
    trainer._next_batches(batches)  # the others: no sync, not counted (queued GPU work would be counted as waiting)
    assert len(syncs) == 2 and clock.waits == 1
    with trainer.instrument(sync_data_wait=True):  # profiling: every step, synchronised
        trainer._next_batches(batches)
    assert len(syncs) == 4 and clock.waits == 2


def test_cuda_gets_fused_adam_in_every_precision_whose_step_reads_nothing_back(monkeypatch):
    """GradScaler.step on an optimizer that does not take the scale itself calls `_maybe_opt_step`, which reads
    found_inf with `.item()`: on a GPU a host sync per optimizer step (torch/amp/grad_scaler.py;
    pytorch/pytorch#80167). Fused Adam (`_step_supports_amp_scaling`) takes the scale and found_inf as tensors.
    optimizer_impl='auto' builds it on CUDA in every precision (foreach, PyTorch's default there, reads Adam's step
    counters back from the host); an explicit choice is kept, and 'auto' on a CPU stays PyTorch's default. The CUDA
    configs build optimizers over CPU parameters here (fused Adam runs on both), and a CPU GradScaler takes the same
    path through `step` as a CUDA one."""
    from gantools import TrainConfig
    from gantools.core.trainer import make_optimizer

    net = nn.Linear(4, 1)

    def optimizer(**changes):
        return make_optimizer(net.parameters(), TrainConfig(**changes), 1e-3)

    assert optimizer(device="cuda", precision="fp16").defaults["fused"] is True
    assert optimizer(device="cuda:1", precision="fp16").defaults["fused"] is True
    assert optimizer(device="cuda", precision="fp16", optimizer_impl="foreach").defaults["foreach"] is True
    assert optimizer(device="cuda", precision="bf16").defaults["fused"] is True
    assert optimizer(device="cuda").defaults["fused"] is True
    for changes in (dict(device="cpu"), dict(device="cpu", precision="bf16")):
        defaults = optimizer(**changes).defaults
        assert defaults["fused"] is None and defaults["foreach"] is None, changes  # PyTorch's own choice

    reads, opt_step = [], torch.amp.GradScaler._maybe_opt_step  # the would-be syncs: one .item() per call
    monkeypatch.setattr(torch.amp.GradScaler, "_maybe_opt_step",
                        lambda self, *a, **k: reads.append(1) or opt_step(self, *a, **k))
    for impl, syncs in (("auto", 0), ("fused", 0), ("foreach", 3), ("for-loop", 3)):
        reads.clear()
        opt, scaler = optimizer(device="cuda", precision="fp16", optimizer_impl=impl), torch.amp.GradScaler("cpu")
        for _ in range(3):
            opt.zero_grad()
            scaler.scale(net(torch.randn(8, 4)).sum()).backward()
            scaler.step(opt)
            scaler.update()
        assert len(reads) == syncs, impl


def test_the_step_s_metric_sums_are_added_by_name_in_one_launch_each_time():
    from gantools.core.step import MetricSums
    from gantools.measuring.host_budget import counting

    sums = MetricSums(torch.device("cpu"))
    with counting(torch.device("cpu")) as budget:
        sums.add(0.5, loss_d=torch.tensor(2.0), d_real=torch.tensor(4.0), d_fake=torch.tensor(6.0),
                 penalty=torch.tensor(8.0))
        sums.add(2.0, loss_g=torch.tensor(3.0))
        sums.add(1.0, loss_g=torch.tensor(1.0), loss_d=torch.tensor(1.0))  # any names, in any order
    assert budget.totals["launches"] == 3  # one foreach add a call; a weight of 1 multiplies nothing
    assert dict(zip(METRICS, sums.sums.tolist(), strict=True)) == {"loss_d": 2.0, "d_real": 2.0, "d_fake": 3.0,
                                                                    "penalty": 4.0, "loss_g": 7.0}
    sums.zero()
    assert sums.sums.tolist() == [0.0] * len(METRICS)
