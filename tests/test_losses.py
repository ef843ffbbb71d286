"""losses.py: every loss against its formula, each penalty against a reference computed by hand image by image (fp32,
bf16 within tolerance, the GradScaler path on the CPU exactly and fp16 on CUDA), and the trainer's rules for them:
the penalty's D runs uncompiled, BatchNorm and a final Sigmoid refused."""
import contextlib
import math

import pytest
import torch
from torch import nn

from gantools import ConfigError, Trainer
from gantools.core.losses import LOSSES, R1, GradientPenalty, input_gradients, penalties

from conftest import BatchFreeD, BatchFreeG, HostReads, cuda_only, weights

FP32 = contextlib.nullcontext


def test_each_loss_is_its_formula():
    real, fake = torch.tensor([2.0, -0.5, 0.3]), torch.tensor([-1.0, 0.7, 1.5])
    p_real, p_fake = real.sigmoid(), fake.sigmoid()
    expected = {  # (D's loss, G's loss), written out
        "bce": (-(p_real.log().mean() + (1 - p_fake).log().mean()), -p_fake.log().mean()),
        "bce-sigmoid": (-(p_real.log().mean() + (1 - p_fake).log().mean()), -p_fake.log().mean()),
        "hinge": ((1 - real).clamp(min=0).mean() + (1 + fake).clamp(min=0).mean(), -fake.mean()),
        "lsgan": (0.5 * ((real - 1) ** 2).mean() + 0.5 * (fake ** 2).mean(), 0.5 * ((fake - 1) ** 2).mean()),
        "wgan-gp": (fake.mean() - real.mean(), -fake.mean()),
        "rpgan": (torch.log1p(torch.exp(fake - real)).mean(), torch.log1p(torch.exp(real - fake)).mean()),
    }
    for name, (d, g) in expected.items():
        loss = LOSSES[name]
        args = (p_real, p_fake) if loss.outputs == "probabilities" else (real, fake)
        assert loss.d(*args).item() == pytest.approx(d.item(), rel=1e-6), name
        assert loss.g(args[1], args[0]).item() == pytest.approx(g.item(), rel=1e-6), name
    assert {n: LOSSES[n].outputs for n in LOSSES} == {
        "bce": "logits", "hinge": "scores", "bce-sigmoid": "probabilities", "lsgan": "scores", "wgan-gp": "scores",
        "rpgan": "scores"}
    from gantools.core.losses import d_loss, g_loss
    assert d_loss("hinge", real, fake) == LOSSES["hinge"].d(real, fake) and g_loss("bce", fake) == LOSSES["bce"].g(fake)


def _batch(seed=0, n=4):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    real, fake = (torch.rand(n, 1, 32, 32, generator=gen) * 2 - 1 for _ in range(2))
    return BatchFreeD(), real, fake, torch.rand(n, generator=gen)


def _by_hand(d, points, value):
    """The penalty image by image: each image's gradient from a forward of that image alone, in fp32."""
    terms = []
    for x in points:
        x = x[None].clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(d(x).sum(), x, create_graph=True)
        terms.append(value(grad.flatten()))
    return torch.stack(terms).mean()


def _penalty(penalty, d, real, fake, mix, autocast=FP32, scaler=None):
    scaler = scaler or torch.amp.GradScaler("cpu", enabled=False)
    grads = input_gradients(d, penalty.points(real, fake, mix), autocast, scaler)
    with autocast():
        return penalty(grads).float()


def _param_grads(d, term):
    d.zero_grad()
    term.backward()
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in d.parameters()]  # a bias: none


@pytest.mark.parametrize("kind", ["gradient penalty", "R1"])
def test_each_penalty_and_its_gradient_equal_a_per_image_fp32_reference(kind):
    d, real, fake, mix = _batch()
    if kind == "gradient penalty":
        penalty = GradientPenalty(weight=10.0)
        points = torch.stack([a * r + (1 - a) * f for r, f, a in zip(real, fake, mix, strict=True)])
        value = lambda g: 10.0 * (g.norm() - 1) ** 2  # noqa: E731
    else:
        penalty = R1(gamma=3.0, interval=4)  # lazy: 4 x the every-step term, on the steps it runs
        points = real
        value = lambda g: 4 * 3.0 / 2 * g.pow(2).sum()  # noqa: E731
    term = _penalty(penalty, d, real, fake, mix)
    reference = _by_hand(d, points, value)
    assert term.item() == pytest.approx(reference.item(), rel=1e-5) and term.item() > 0
    # the double backward trains D alike
    for a, b in zip(_param_grads(d, term), _param_grads(d, reference), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_lazy_r1_runs_every_interval_d_steps_and_wgan_gp_every_step():
    assert [d for d in range(10) if R1(1.0, 4).due(d)] == [0, 4, 8]
    assert all(GradientPenalty().due(d) for d in range(10)) and all(R1(1.0).due(d) for d in range(3))


@pytest.mark.parametrize("kind", [GradientPenalty(10.0), R1(10.0)], ids=["gradient penalty", "R1"])
def test_penalties_in_bf16_stay_within_tolerance_of_fp32(kind):
    d, real, fake, mix = _batch(seed=1)
    fp32 = _penalty(kind, d, real, fake, mix)
    bf16 = _penalty(kind, d, real, fake, mix, lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert bf16.dtype == torch.float32 and bf16.item() == pytest.approx(fp32.item(), rel=0.05)


def test_the_grad_scaler_path_unscales_exactly_and_reads_nothing_on_the_host():
    d, real, fake, mix = _batch(seed=2)
    for penalty in (GradientPenalty(10.0), R1(5.0)):
        plain = _penalty(penalty, d, real, fake, mix)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 14)  # a power of two: scaling is exact in fp32
        assert scaler.is_enabled()
        with HostReads() as host:
            scaled = _penalty(penalty, d, real, fake, mix, scaler=scaler)
        assert torch.equal(scaled, plain) and host.reads == []


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda_only)])
@pytest.mark.parametrize("kind", [GradientPenalty(10.0), R1(10.0)], ids=["gradient penalty", "R1"])
def test_fp16_with_a_grad_scaler_matches_fp32_from_the_first_step(kind, device):
    """At the GradScaler's starting scale, 2**16: the scaled mean's gradient fits fp16 (the scaled sum's would not:
    the first penalty of every fp16 run was inf). CPU autocast runs fp16 too, so the recipe is checked here."""
    d, real, fake, mix = (t.to(device) for t in _batch(seed=3))
    fp32 = _penalty(kind, d, real, fake, mix)
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 16)
    fp16 = _penalty(kind, d, real, fake, mix, lambda: torch.autocast(device, dtype=torch.float16), scaler)
    assert math.isfinite(fp16.item()) and fp16.item() == pytest.approx(fp32.item(), rel=0.02)


def test_penalties_follow_the_config(tiny):
    assert penalties(tiny) == []
    both = penalties(tiny.replace(loss="wgan-gp", gp_weight=5.0, r1_gamma=2.0, r1_interval=8))
    assert [type(p) for p in both] == [GradientPenalty, R1] and both[0].weight == 5.0
    assert (both[1].gamma, both[1].interval) == (2.0, 8)


@pytest.mark.slow
def test_the_penalty_runs_through_the_uncompiled_d_and_trains_d_as_eager_does(tiny, glyphs64):
    class PenaltyG(BatchFreeG):  # a forward no other test compiles: dynamo reuses graphs made for the same code
        def forward(self, z):
            return super().forward(z)

    class PenaltyD(BatchFreeD):
        def forward(self, x):
            return super().forward(x)

    runs = {}
    for mode in ("off", "default"):
        torch.manual_seed(0)
        cfg = tiny.replace(steps=3, log_interval=3, loss="wgan-gp", compile=mode, loader="device",
                           out_dir=f"{tiny.out_dir}-{mode}")
        trainer = Trainer(cfg, generator=PenaltyG(), discriminator=PenaltyD(), dataset=glyphs64)
        runs[mode] = trainer.fit(), weights(trainer.discriminator)
    (eager, d_eager), (compiled, d_compiled) = runs["off"], runs["default"]
    # G, and D without and with input gradients: the penalty's own D forward is not among the compiled graphs
    assert compiled.column("compiled_graphs") == [3]
    assert compiled[-1]["penalty"] == pytest.approx(eager[-1]["penalty"], rel=1e-3) and eager[-1]["penalty"] > 0
    for name in d_eager:  # the penalty's gradient reached D's weights in the compiled run as in the eager one
        torch.testing.assert_close(d_compiled[name], d_eager[name], rtol=1e-3, atol=1e-5)


def test_a_penalty_builds_its_d_without_batchnorm_and_refuses_yours_with_it(tiny, glyphs64):
    for cfg in (tiny.replace(loss="wgan-gp"), tiny.replace(r1_gamma=1.0)):
        d = Trainer(cfg, dataset=glyphs64).discriminator
        assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in d.modules())
        assert any(isinstance(m, nn.GroupNorm) and m.num_groups == 1 for m in d.modules())  # layer norm
    assert any(isinstance(m, nn.BatchNorm2d) for m in Trainer(tiny, dataset=glyphs64).discriminator.modules())

    class BatchNormD(BatchFreeD):
        def __init__(self):
            super().__init__()
            self.net.insert(1, nn.BatchNorm2d(4))

    for cfg, what in ((tiny.replace(loss="wgan-gp"), "gradient penalty"), (tiny.replace(r1_gamma=1.0), "R1")):
        with pytest.raises(ConfigError, match=f"the {what} penalises D's gradient image by image, but the "
                                              r"discriminator has BatchNorm \(net.1\).*nn.GroupNorm\(1, C\)"):
            Trainer(cfg, generator=BatchFreeG(), discriminator=BatchNormD(), dataset=glyphs64)


@pytest.mark.parametrize("loss", ["lsgan", "wgan-gp"])
def test_the_raw_score_losses_refuse_a_sigmoid_d(tiny, glyphs64, loss):
    class SigmoidD(BatchFreeD):
        def forward(self, x):
            return torch.sigmoid(super().forward(x))

    with pytest.raises(ConfigError, match=f"ends in a Sigmoid, but loss='{loss}' expects logits .raw scores.: "
                                          "squashed into .0, 1. they train silently wrong"):
        Trainer(tiny.replace(loss=loss), generator=BatchFreeG(), discriminator=SigmoidD(), dataset=glyphs64)
    Trainer(tiny.replace(loss=loss, steps=1), generator=BatchFreeG(), discriminator=BatchFreeD(),
            dataset=glyphs64).fit()  # its raw scores train


def test_an_fp16_style_overflow_of_the_scaled_penalty_skips_that_d_step_instead_of_stopping_the_run(tiny, glyphs64):
    class LoudD(BatchFreeD):  # input gradients of about 1e2: scaled by 2**127 they overflow, as fp16's would at 2**16
        def forward(self, x):
            return super().forward(x) * 1e3

    trainer = Trainer(tiny.replace(steps=2, loss="wgan-gp"), generator=BatchFreeG(), discriminator=LoudD(),
                      dataset=glyphs64)
    huge = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127)  # fp16 needs CUDA: the same scaler here
    trainer.scaler_d = trainer.stepper.parts.scaler_d = huge
    before = weights(trainer.discriminator)
    history = trainer.fit()  # no NonFiniteLossError: the inf penalty is the scaler's business
    assert all(torch.equal(before[k], v) for k, v in weights(trainer.discriminator).items())  # both steps skipped
    assert trainer.scaler_d.get_scale() == 2.0 ** 125 and math.isfinite(history[-1]["loss_d"])
    assert history[-1]["penalty"] == 0.0  # the overflowed steps' penalties are left out of the log
