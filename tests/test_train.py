import math
import os
import signal

import pytest
import torch
from torch import nn

from gantools import (CheckpointError, ConfigError, ImageTensorDataset, NonFiniteLossError, Trainer, preset,
                      save_checkpoint)
from gantools.train import METRICS

from conftest import CUDA, PRECISIONS, BatchFreeD, BatchFreeG, cuda_only, weights


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
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.generator.buffers()))
    assert (trainer.out_dir / "samples" / "step_000000.png").is_file()


def test_frozen_discriminator_gets_no_gradient_from_the_generator_step(tiny, glyphs64):
    counts = {}
    for freeze in (True, False):
        trainer = Trainer(tiny.replace(steps=2, freeze_d=freeze), dataset=glyphs64)
        calls = []
        next(trainer.discriminator.parameters()).register_hook(lambda grad: calls.append(1))
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


def test_compile_trains_on_cpu(tiny, glyphs64):
    history = Trainer(tiny.replace(steps=2, compile="default", loader="device"), dataset=glyphs64).fit()
    assert math.isfinite(history[-1]["loss_g"])


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
