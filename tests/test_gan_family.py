"""The GAN family in the trainer: n_critic (`d_steps`), the EMA generator, conditional GANs, and what holds for all of
them together: exact resume, no host sync in the step, one clear error per bad combination."""
import math

import pytest
import torch

from gantools import ConfigError, Trainer, TrainConfig
from gantools.cli import main
from gantools.core.batches import BatchStream

from conftest import BatchFreeD, BatchFreeG, CondBatchFreeD, CondBatchFreeG, HostReads, weights


def test_d_steps_makes_that_many_d_steps_per_g_step_each_on_its_own_batch(tiny, glyphs64):
    trainer = Trainer(tiny.replace(steps=2, d_steps=5, log_interval=2), dataset=glyphs64)
    counts = {"d": 0, "g": 0}
    trainer.opt_d.register_step_post_hook(lambda *a: counts.__setitem__("d", counts["d"] + 1))
    trainer.opt_g.register_step_post_hook(lambda *a: counts.__setitem__("g", counts["g"] + 1))
    seen, step = [], trainer.train_step

    def watch(*batches):
        seen.append([b.clone() for b in batches])
        return step(*batches)

    trainer.train_step = watch
    history = trainer.fit()
    assert counts == {"d": 10, "g": 2} and [len(s) for s in seen] == [5, 5] and trainer.batches_seen == 10
    expected = BatchStream(Trainer(tiny.replace(out_dir=tiny.out_dir + "-1"), dataset=glyphs64).loader, 0)
    for batch in (b for s in seen for b in s):  # the loader's own batches, in order, 5 per step: none skipped
        assert torch.equal(batch, next(expected))
    assert history[-1]["step"] == 2 and trainer.history[-1]["images_per_sec"] > 0  # a step is a G step
    # real images: 5 batches of 16 per step, so images/s is 5 x the steps per second times the batch
    record = history[-1]
    assert record["images_per_sec"] == pytest.approx(5 * 16 * 1e3 / record["step_time_ms"], rel=1e-6)
    # the benchmark's chunks (tune's and the ladder's measurements) count real images the same way
    from gantools.speed.bench import _chunk

    speed = _chunk(trainer, 2, lambda: False)
    assert speed == pytest.approx(5 * 16 * 1e3 / trainer.history[-1]["step_time_ms"], rel=1e-6)


def test_the_ema_generator_is_the_exponential_average_of_g_computed_by_hand(tiny, glyphs64):
    decay = 0.8
    after = []

    class Record:
        def on_step_end(self, trainer):
            after.append(weights(trainer.generator))

    trainer = Trainer(tiny.replace(steps=4, ema_decay=decay), dataset=glyphs64, callbacks=[Record()])
    start = weights(trainer.generator)
    trainer.fit()
    params = [name for name, _ in trainer.generator.named_parameters()]
    expected = {name: start[name].clone() for name in params}  # W_0^EMA = W_0, then one update per G step
    for w in after:
        for name in params:
            expected[name] = decay * expected[name] + (1 - decay) * w[name]
    ema = weights(trainer.ema.module)
    for name in params:
        torch.testing.assert_close(ema[name], expected[name], rtol=1e-5, atol=1e-7)
        assert not torch.equal(ema[name], after[-1][name])
    for name, buffer in trainer.generator.named_buffers():  # BatchNorm's statistics: copied from G
        assert torch.equal(ema[name], buffer)
    assert int(trainer.ema.averaged.n_averaged) == 4
    # samples and quality scores come from the EMA generator
    noise = torch.randn(8, tiny.nz, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(trainer.generate(8), trainer.ema.module(noise))


def test_a_conditional_trainer_feeds_labels_and_draws_one_row_per_class(tiny, glyphs64):
    torch.manual_seed(0)
    g, d = CondBatchFreeG(), CondBatchFreeD()
    calls = []
    d.register_forward_pre_hook(lambda m, args: calls.append(args[1].clone()))
    for loader in ("device", "dataloader"):
        calls.clear()
        trainer = Trainer(tiny.replace(steps=2, conditional=True, loader=loader, out_dir=f"{tiny.out_dir}-{loader}"),
                          generator=g, discriminator=d, dataset=glyphs64)
        batches = list(zip(range(2), BatchStream(trainer.loader, 0), strict=False))
        trainer.fit()
        # D sees each real batch's labels (real, fake, G step)
        for (_, (_, labels)), step in zip(batches, (0, 1), strict=True):
            assert torch.equal(calls[1 + 3 * step], labels) and torch.equal(calls[2 + 3 * step], labels)
    assert trainer.latest_grid.shape == (10 * 34 + 2, 8 * 34 + 2, 3)  # 10 classes x 8 columns of 32 px
    assert torch.equal(trainer.fixed_labels, torch.arange(10).repeat_interleave(8))


@pytest.mark.slow
def test_a_short_conditional_training_draws_each_class_when_asked(tmp_path):
    """500 steps of a small conditional DCGAN on glyphs (about 10 s here): the glyph classifier puts 28-38% of the
    samples drawn for class k in class k (measured over seeds 0-3; chance: 10%, and exactly 10% for a generator that
    ignores its labels, since every class is asked for equally). 400 steps gave 20-29%."""
    from gantools.core.metrics import load_classifier

    classifier, _ = load_classifier("glyphs", 32, 1, device="cpu")
    cfg = TrainConfig(image_size=32, channels=1, nz=32, ngf=32, ndf=32, batch_size=32, steps=500, lr_g=5e-4,
                      lr_d=5e-4, log_interval=100, sample_interval=0, checkpoint_interval=0, conditional=True,
                      loader="device", out_dir=str(tmp_path))
    trainer = Trainer(cfg)
    trainer.fit()
    labels = torch.arange(500) % 10
    with torch.no_grad():
        predicted = classifier(trainer.generate(500, labels=labels)).argmax(1)
    match = (predicted == labels).float().mean().item()
    assert match > 0.2, f"only {match:.0%} of the samples drawn for class k were classified as k (chance: 10%)"


def family(tiny, **changes) -> TrainConfig:
    """Every new field on at once: WGAN-GP and lazy R1, 2 D steps per G step, EMA, conditional, accumulation."""
    return tiny.replace(loss="wgan-gp", r1_gamma=1.0, r1_interval=3, d_steps=2, ema_decay=0.9, conditional=True,
                        grad_accum_steps=2, hflip=True, loader="device", **changes)


def test_resume_is_bit_exact_with_every_new_field_on(tiny, glyphs64, tmp_path):
    cfg = family(tiny, steps=5, log_interval=1)  # 10 D steps: R1 at 0, 3, 6, 9; 2.5 epochs of 4 batches
    full = Trainer(cfg.replace(out_dir=str(tmp_path / "full")), dataset=glyphs64)
    full.fit()
    Trainer(cfg.replace(steps=2, out_dir=str(tmp_path / "half")), dataset=glyphs64).fit()
    resumed = Trainer.resume(tmp_path / "half" / "checkpoint.pt", dataset=glyphs64, steps=5)
    assert resumed.step == 2 and resumed.batches_seen == 4
    resumed.fit()
    for a, b in ((full.generator, resumed.generator), (full.discriminator, resumed.discriminator),
                 (full.ema.module, resumed.ema.module)):
        wa, wb = weights(a), weights(b)
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert full.history.column("loss_d") == resumed.history.column("loss_d")
    assert full.history.column("penalty") == resumed.history.column("penalty") and full.history[-1]["penalty"] > 0


def test_no_host_sync_in_the_step_with_every_new_field_on(tiny, glyphs64):
    def reads(cfg):
        trainer = Trainer(cfg, dataset=glyphs64)
        trainer.fit(1)  # optimizer state created
        step = trainer.train_step

        def watched(*batches):
            with HostReads() as host:
                step(*batches)
            found.extend(host.reads)

        found = []
        trainer.train_step = watched
        trainer.fit(2)
        return trainer, found

    # fused Adam keeps its step count on the device and reads nothing: the step reads no value at all
    trainer, found = reads(family(tiny, optimizer_impl="fused"))
    assert found == []
    # for-loop Adam reads its step count (`.item()`), which it keeps on the CPU even when training on a GPU
    # (torch.optim.Adam: state["step"] is a CPU tensor unless capturable or fused): not a device sync
    trainer, found = reads(family(tiny, out_dir=tiny.out_dir + "2"))
    steps = [s["step"] for opt in (trainer.opt_d, trainer.opt_g) for s in opt.state.values()]
    assert found and all(any(r is s for s in steps) for r in found)
    # and the watch does see a sync: the tutorial's per-step .item() calls
    trainer, found = reads(family(tiny, optimizer_impl="fused", sync_every_step=True, out_dir=tiny.out_dir + "3"))
    assert len(found) == 2 * 4


@pytest.mark.parametrize("changes, message", [
    (dict(loss="wgan-gp", gp_weight=0.0), "loss='wgan-gp' with gp_weight=0 has nothing keeping the critic 1-Lipschitz"),
    (dict(gp_weight=5.0), "gp_weight is only used with loss='wgan-gp' (loss='bce'); remove it"),
    (dict(gp_weight=-1.0), "gp_weight=-1.0: must be >= 0"),
    (dict(r1_gamma=float("nan")), "r1_gamma=nan: must be a finite number"),
    (dict(r1_interval=16), "r1_interval sets how often R1 runs, but R1 is off (r1_gamma=0)"),
    (dict(r1_gamma=1.0, r1_interval=0), "r1_interval=0: must be >= 1"),
    (dict(r1_gamma=1.0, loss="bce-sigmoid"), "r1_gamma penalises the gradient of D's raw output"),
    (dict(d_steps=0), "d_steps=0: must be >= 1"),
    (dict(ema_decay=1.0), "ema_decay=1.0: must be in [0, 1)"),
    (dict(ema_decay=-0.5), "ema_decay=-0.5: must be in [0, 1)"),
    (dict(conditional=True, loss="bce-sigmoid"), "conditional=True adds a projection of the label to D's logit"),
    (dict(d_steps=2.5), "d_steps=2.5 (float): must be a whole number"),
])
def test_every_bad_combination_is_its_own_clear_error(tiny, changes, message):
    with pytest.raises(ConfigError) as e:
        tiny.replace(**changes).validate()
    assert message in str(e.value) and str(e.value).count("\n  - ") == 1


def test_conditional_runs_need_labels_and_networks_that_take_them(tiny, glyphs64, tmp_path):
    from PIL import Image

    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(20):
        Image.fromarray(glyphs64.images[i, 0].numpy()).save(flat / f"{i}.png")
    with pytest.raises(ConfigError, match=f"{flat} has no class sub-folders .its images are one class.: put each "
                                          "class's images in a sub-folder"):
        Trainer(tiny.replace(conditional=True, dataset="folder", data_path=str(flat)))

    class BareImages(torch.utils.data.Dataset):
        classes = list(range(10))

        def __len__(self):
            return 64

        def __getitem__(self, i):
            return glyphs64.images[i]

    with pytest.raises(ConfigError, match="conditional=True needs labels, but the dataset yields bare images"):
        Trainer(tiny.replace(conditional=True), dataset=BareImages())
    cond = tiny.replace(conditional=True)
    with pytest.raises(ConfigError, match=r"conditional=True gives the generator labels, forward\(z, y\), but its "
                                          r"forward\(z\) takes none"):
        Trainer(cond, generator=BatchFreeG(), discriminator=CondBatchFreeD(), dataset=glyphs64)
    with pytest.raises(ConfigError, match=r"conditional=True gives the discriminator labels, forward\(x, y\), but "
                                          r"its forward\(x\) takes none"):
        Trainer(cond, generator=CondBatchFreeG(), discriminator=BatchFreeD(), dataset=glyphs64)
    with pytest.raises(ConfigError, match=r"the generator's forward\(z, y\) needs labels .a conditional generator"):
        Trainer(tiny, generator=CondBatchFreeG(), discriminator=BatchFreeD(), dataset=glyphs64)

    class ThreeArgs(BatchFreeD):
        def forward(self, x, y, extra):
            return super().forward(x)

    with pytest.raises(ConfigError, match=r"forward\(x, y, extra\) fits neither contract: forward\(x\) "
                                          r"\(unconditional\) or forward\(x, y\) \(conditional=True\)"):
        Trainer(cond, generator=CondBatchFreeG(), discriminator=ThreeArgs(), dataset=glyphs64)

    class WrongLabels(CondBatchFreeG):  # takes labels, fails on them: said as a failure on (z, y)
        def forward(self, z, y):
            return super().forward(z, y.float())

    with pytest.raises(ConfigError, match=r"the generator fails on noise of shape \(2, 8\) \(nz=8\) and labels"):
        Trainer(cond, generator=WrongLabels(), discriminator=CondBatchFreeD(), dataset=glyphs64)
    Trainer(cond.replace(steps=1), generator=CondBatchFreeG(), discriminator=CondBatchFreeD(), dataset=glyphs64).fit()


@pytest.mark.parametrize("flags", [["--loss", "wgan-gp", "--d-steps", "2", "--precision", "bf16"],
                                   ["--r1-gamma", "10", "--r1-interval", "2", "--ema-decay", "0.9", "--conditional"]],
                         ids=["wgan-gp", "r1-ema-conditional"])
def test_the_new_flags_train_from_the_cli(tmp_path, capsys, flags):
    out = tmp_path / "run"
    args = ["train", "--steps", "2", "--log-interval", "1", "--nz", "8", "--ngf", "8", "--ndf", "8", "--batch-size",
            "16", "--loader", "device", "--out-dir", str(out), "--quiet", *flags]
    assert main(args) == 0
    import json

    records = json.loads((out / "history.json").read_text())
    assert len(records) == 2 and all(math.isfinite(r[m]) for r in records for m in ("loss_d", "loss_g", "penalty"))
    assert max(r["penalty"] for r in records) > 0  # lazy R1 (every 2nd D step) runs in the first
    assert "2 steps on cpu" in capsys.readouterr().out


def test_generate_wants_one_label_per_image(tiny):
    """Fewer or more labels than images would pair noise and labels short: refused, saying what to give."""
    trainer = Trainer(tiny.replace(conditional=True))
    assert trainer.generate(4, labels=torch.arange(4) % 10).shape[0] == 4
    with pytest.raises(ConfigError, match=r"generate\(n=8, labels=...\) got 5 labels: give one label per image"):
        trainer.generate(8, labels=torch.arange(5))
