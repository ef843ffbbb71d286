"""R3GAN (r3gan.py, the rpgan loss, R1 and R2, the `r3gan` preset): the networks' shapes at 32 and 64 px, logits out,
fix-up's initialisation (every residual block the identity at the start, the branch's convs scaled), interpolating
resamplers, the relativistic loss and both zero-centred penalties against hand computations, the preset training
through the Trainer, and one clear error per impossible combination."""
import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gantools import ConfigError, R3GANDiscriminator, R3GANGenerator, Trainer, build_r3gan, preset
from gantools.core.config import PAPERS, discriminator_norm
from gantools.core.losses import LOSSES, R1, R2, ZeroCentredPenalty, input_gradients, penalties
from gantools.core.network_checks import comes_from_sigmoid
from gantools.core.r3gan import ACTIVATION_GAIN, Resample, ResidualBlock, stage_widths
from gantools.core.validation import penalised

from conftest import TINY, HostReads, weights


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny networks: one thread, and a busy neighbour does not slow them."""


@pytest.mark.parametrize("size", [32, 64])
@pytest.mark.parametrize("channels", [1, 3])
def test_the_networks_make_images_of_the_size_asked_and_one_logit_each(size, channels):
    torch.manual_seed(0)
    g, d = build_r3gan(size, channels, nz=8, ngf=16, ndf=16)
    images = g(torch.randn(3, 8))
    assert images.shape == (3, channels, size, size)
    out = d(images.detach().requires_grad_())
    assert out.shape == (3,)
    assert not comes_from_sigmoid(out), "D's output is a logit, never squashed"
    assert not any(isinstance(m, (nn.Sigmoid, nn.Tanh)) for net in (g, d) for m in net.modules())
    assert not any(isinstance(m, (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm))
                   for net in (g, d) for m in net.modules()), "R3GAN has no normalisation layers"


def test_a_stage_per_resolution_from_4_px_with_the_last_halved_at_64_px():
    assert stage_widths(32, 16) == [16, 16, 16, 16]  # 4, 8, 16, 32 px
    assert stage_widths(64, 16) == [16, 16, 16, 16, 8]  # ... and 64 px at half the width
    with pytest.raises(ValueError, match="image_size=28: R3GAN here supports 32 or 64 px"):
        R3GANGenerator(28)


@pytest.mark.parametrize("fp32", [0, 1, 4])
def test_fp32_stages_keep_the_lowest_resolutions_in_fp32_under_a_16_bit_autocast(fp32):
    """Stages from 4 x 4 up run in fp32 (G's first, D's last, with z's projection and the logit's map), the rest in
    bf16; the weights are the same tensors at every setting, and without autocast the networks compute the same."""
    torch.manual_seed(0)
    g, d = build_r3gan(32, 1, nz=8, ngf=16, ndf=16, fp32_stages=fp32)
    g0, d0 = build_r3gan(32, 1, nz=8, ngf=16, ndf=16)
    assert g.state_dict().keys() == g0.state_dict().keys() and d.state_dict().keys() == d0.state_dict().keys()
    g0.load_state_dict(g.state_dict()), d0.load_state_dict(d.state_dict())
    seen = {}
    for name, module in [("G start", g.project), *((f"G{i}", m) for i, m in enumerate(g.stages)),
                         ("G image", g.to_image),
                         ("D image", d.from_image), *((f"D{i}", m) for i, m in enumerate(d.stages)),
                         ("D logit", d.to_logit)]:
        module.register_forward_hook(lambda m, i, out, name=name: seen.__setitem__(name, out.dtype))
    z = torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        d(g(z))
    fp32_names = {*(f"G{i}" for i in range(fp32)), *(f"D{3 - i}" for i in range(fp32)),
                  *(["G start", "D logit"] if fp32 else []), *(["G image", "D image"] if fp32 == 4 else [])}
    assert {n for n, dtype in seen.items() if dtype == torch.float32} == fp32_names
    assert all(dtype == torch.bfloat16 for n, dtype in seen.items() if n not in fp32_names)
    assert torch.equal(g(z), g0(z)) and torch.equal(d(g(z)), d0(g0(z)))
    with pytest.raises(ValueError, match="fp32_stages=5: these networks have 4 stages, so 0 to 4"):
        R3GANGenerator(32, fp32_stages=5)


@pytest.mark.slow
def test_torch_compile_traces_the_fp32_stages_in_one_graph_and_keeps_their_dtypes():
    """Dynamo takes the fp32 regions (autocast contexts) into the graph with no break (fullgraph), and the traced
    networks compute what the eager ones do; AOTAutograd's eager backend: the tracing is checked, not a compiler.
    With every stage in fp32 G's images come out fp32, so a region Dynamo dropped would show in their dtype."""
    torch.manual_seed(0)
    g, d = build_r3gan(32, 1, nz=8, ngf=16, ndf=16, fp32_stages=4)
    z = torch.randn(3, 8)
    torch._dynamo.reset()
    traced_g, traced_d = (torch.compile(net, backend="aot_eager", fullgraph=True) for net in (g, d))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager_images, images = g(z), traced_g(z)
        eager, traced = d(eager_images), traced_d(images)
    assert eager_images.dtype == images.dtype == eager.dtype == traced.dtype == torch.float32
    torch.testing.assert_close(images, eager_images)
    torch.testing.assert_close(traced, eager)


@pytest.mark.parametrize("fp32", [0, 1])
def test_r1_through_r3gans_d_under_bf16_stays_within_tolerance_of_fp32_with_or_without_fp32_stages(fp32):
    """R1 (its input gradients, then the penalty) through R3GAN's D under bf16 autocast, the 4 x 4 stage in bf16 or
    in fp32, against the same D in fp32: within 5%, as test_losses holds the penalties on a DCGAN's D."""
    torch.manual_seed(0)
    d = R3GANDiscriminator(32, 1, width=16, fp32_stages=fp32)
    with torch.no_grad():  # every branch's last conv starts at zero: wake the branches up, as training does
        for p in d.parameters():
            p.add_(0.05 * torch.randn_like(p))
    real, r1, off = torch.randn(8, 1, 32, 32), R1(10.0), torch.amp.GradScaler("cpu", enabled=False)
    fp32_value = r1(input_gradients(d, real, contextlib.nullcontext, off))
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    bf16_value = r1(input_gradients(d, real, bf16, off).float())
    assert fp32_value.item() > 0 and bf16_value.item() == pytest.approx(fp32_value.item(), rel=0.05)


def _blocks(*networks):
    return [m for net in networks for m in net.modules() if isinstance(m, ResidualBlock)]


def test_every_residual_block_is_the_identity_at_the_start_and_learns_from_there():
    torch.manual_seed(0)
    g, d = R3GANGenerator(64, 1, nz=8, width=16), R3GANDiscriminator(64, 1, width=16)
    blocks = _blocks(g, d)
    assert len(blocks) == 2 * 2 * 5  # two networks, two blocks in each of five stages
    for block in blocks:
        x = torch.randn(2, block.branch[0].in_channels, 8, 8)
        assert torch.equal(block(x), x)
        first, _, grouped, _, last = block.branch
        assert not last.weight.any() and first.weight.any() and grouped.weight.any()
        assert grouped.groups == max(1, grouped.in_channels // 16)  # the paper's 16 channels per group
    # zero at the start, yet not stuck there: the last conv gets a gradient
    out = g(torch.randn(4, 8))
    d(out).sum().backward()
    assert all(block.branch[-1].weight.grad.abs().sum() > 0 for block in _blocks(g, d))


def test_the_branch_convs_are_scaled_by_fix_ups_factor_for_the_number_of_blocks():
    torch.manual_seed(0)
    g = R3GANGenerator(32, 1, nz=8, width=64)  # 4 stages x 2 blocks = 8 blocks: a gain of 8^(-1/4)
    first = _blocks(g)[0].branch[0].weight  # 1x1, 64 -> 128: fan-in 64
    expected = ACTIVATION_GAIN * 8 ** (-1 / 4) / math.sqrt(64)
    assert first.std().item() == pytest.approx(expected, rel=0.05)
    assert g.project.weight.std().item() == pytest.approx(1 / math.sqrt(8), rel=0.1)  # plain He, gain 1


def test_the_resamplers_interpolate_bilinearly():
    x = torch.randn(2, 3, 8, 8)
    up = Resample(up=True)(x)
    assert up.shape == (2, 3, 16, 16)
    bilinear = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
    torch.testing.assert_close(up[..., 1:-1, 1:-1], bilinear[..., 1:-1, 1:-1])  # the border: zero padding
    down = Resample(up=False)(up)
    assert down.shape == (2, 3, 8, 8)
    smooth = F.interpolate(up, scale_factor=0.5, mode="bilinear", antialias=True)
    torch.testing.assert_close(down[..., 1:-1, 1:-1], smooth[..., 1:-1, 1:-1])


def _softplus(v: float) -> float:
    return math.log(1 + math.exp(v))


def test_the_relativistic_pairing_loss_by_hand():
    real, fake = torch.tensor([2.0, -0.5, 0.3]), torch.tensor([-1.0, 0.7, 1.5])
    rp = LOSSES["rpgan"]
    d_by_hand = sum(_softplus(-(r - f)) for r, f in zip(real.tolist(), fake.tolist(), strict=True)) / 3
    g_by_hand = sum(_softplus(-(f - r)) for r, f in zip(real.tolist(), fake.tolist(), strict=True)) / 3
    assert rp.d(real, fake).item() == pytest.approx(d_by_hand, rel=1e-6)
    assert rp.g(fake, real).item() == pytest.approx(g_by_hand, rel=1e-6)
    # only differences count: the same shift of every score changes neither loss
    assert rp.d(real + 5, fake + 5).item() == pytest.approx(d_by_hand, rel=1e-5)
    assert (rp.name, rp.outputs, rp.paired) == ("rpgan", "scores", True)
    with pytest.raises(ValueError, match="pairs each fake with a real image"):
        rp.g(fake)


class Quadratic(nn.Module):
    """D(x) = <a, x> + b/2 ||x||^2 per image: its input gradient is a + b x, known in closed form."""

    def __init__(self, a: torch.Tensor, b: float):
        super().__init__()
        self.a, self.b = nn.Parameter(a.clone()), nn.Parameter(torch.tensor(b))

    def forward(self, x):
        return (self.a * x).flatten(1).sum(1) + self.b / 2 * x.flatten(1).pow(2).sum(1)


@pytest.mark.parametrize("kind, interval", [(R1, 1), (R2, 1), (R1, 4), (R2, 3)])
def test_r1_and_r2_are_gamma_over_two_times_the_mean_squared_gradient_norm_where_each_looks(kind, interval):
    gen = torch.Generator().manual_seed(0)
    a, real, fake = (torch.randn(*shape, generator=gen) for shape in ((1, 1, 4, 4), (3, 1, 4, 4), (3, 1, 4, 4)))
    fake = fake.requires_grad_()  # as G's images are: R2 must not send gradient into G
    d, gamma, b = Quadratic(a, 0.5), 0.7, 0.5
    penalty = kind(gamma, interval)
    points = penalty.points(real, fake, None)
    term = penalty(input_gradients(d, points, contextlib.nullcontext, torch.amp.GradScaler("cpu", enabled=False)))
    where = real if kind is R1 else fake.detach()
    by_hand = interval * gamma / 2 * torch.stack([(a + b * x).pow(2).sum() for x in where]).mean()
    assert term.item() == pytest.approx(by_hand.item(), rel=1e-5) and term.item() > 0
    term.backward()  # the double backward reaches D's weights: d/db of gamma/2 E||a + b x||^2
    d_db = interval * gamma * torch.stack([((a + b * x) * x).sum() for x in where]).mean()
    assert d.b.grad.item() == pytest.approx(d_db.item(), rel=1e-5)
    assert fake.grad is None
    assert [s for s in range(7) if penalty.due(s)] == list(range(0, 7, interval))


def test_r1_and_r2_are_one_penalty_told_where_to_look():
    assert issubclass(R1, ZeroCentredPenalty) and issubclass(R2, ZeroCentredPenalty)
    assert R1.__call__ is R2.__call__ is ZeroCentredPenalty.__call__
    found = penalties(preset("r3gan"))
    assert [(type(p), p.gamma, p.interval) for p in found] == [(R1, 0.05, 1), (R2, 0.05, 1)]


def test_validation_and_the_trainer_agree_on_which_configs_penalise_d(tiny):
    for changes in (dict(), dict(loss="wgan-gp"), dict(r1_gamma=1.0), dict(r2_gamma=1.0), dict(loss="rpgan")):
        cfg = tiny.replace(**changes)
        assert penalised(cfg) == bool(penalties(cfg)), changes


def test_the_preset_holds_r3gans_settings_scaled_down():
    cfg = preset("r3gan").validate()
    assert (cfg.architecture, cfg.loss, cfg.r1_gamma, cfg.r2_gamma) == ("r3gan", "rpgan", 0.05, 0.05)
    assert (cfg.optimizer, cfg.lr_g, cfg.lr_d, cfg.betas, cfg.nz) == ("adam", 2e-4, 2e-4, (0.0, 0.9), 64)
    assert cfg.ema_decay > 0 and cfg.lr_schedule == "constant" and PAPERS["r3gan"] == "Huang et al. 2024"
    assert discriminator_norm(cfg) == "none"


@pytest.mark.parametrize("accumulate", [1, 2])
def test_the_preset_trains_through_the_trainer(tmp_path, glyphs64, accumulate):
    """Each G micro-batch is paired with its own real micro-batch (accumulation splits both alike), and the step,
    R1, R2 and the relativistic loss included, reads nothing back to the host (with fused Adam, which keeps its step
    count on the device)."""
    sizes = {k: TINY[k] for k in ("nz", "ngf", "ndf", "batch_size", "log_interval", "sample_interval")}
    cfg = preset("r3gan", **sizes, steps=2, grad_accum_steps=accumulate, optimizer_impl="fused",
                 out_dir=str(tmp_path))
    trainer = Trainer(cfg, dataset=glyphs64)
    assert isinstance(trainer.generator, R3GANGenerator) and isinstance(trainer.discriminator, R3GANDiscriminator)
    assert [p.name for p in trainer.penalties] == ["R1", "R2"] and trainer.ema is not None
    seen = []

    class Watched(type(trainer.loss)):
        def g(self, fake, real=None):
            seen.append(real)
            return super().g(fake, real)

    trainer.stepper.parts.loss = Watched()
    step, reads = trainer.train_step, []

    def watched(*batches):
        with HostReads() as host:
            step(*batches)
        reads.append(host.reads)

    trainer.train_step = watched
    g_before, d_before = weights(trainer.generator), weights(trainer.discriminator)
    history = trainer.fit()
    assert reads == [[], []]  # two steps, nothing read in either
    # G's loss got D's scores on a real micro-batch each time, as constants (no graph back into D or the data)
    assert [tuple(r.shape) for r in seen] == [(TINY["batch_size"] // accumulate,)] * (2 * accumulate)
    assert not any(r.requires_grad for r in seen)
    record = history[-1]
    assert all(math.isfinite(record[k]) for k in ("loss_d", "loss_g", "d_real", "d_fake"))
    assert record["penalty"] > 0
    assert any(not torch.equal(v, weights(trainer.generator)[k]) for k, v in g_before.items())
    assert any(not torch.equal(v, weights(trainer.discriminator)[k]) for k, v in d_before.items())


@pytest.mark.parametrize("changes, penalised", [
    (dict(), 2), (dict(r1_interval=2, r2_interval=2), 1), (dict(grad_accum_steps=2), 4), (dict(d_steps=2), 4),
    (dict(precision="bf16"), 2), (dict(precision="bf16", fp32_stages=1), 2)])
def test_r1_and_r2_reuse_the_loss_forward_and_give_d_the_gradients_of_a_forward_of_their_own(tmp_path, glyphs64,
                                                                                             changes, penalised):
    """Where D is called as it is (no compile, no DDP), R1 and R2 differentiate the outputs of D's loss forward
    instead of running D again: two D forwards fewer for each penalised D micro-batch (`penalised` in 2 steps), and
    the same gradients at every D step as with their own forward. gamma is large, so a penalty gradient lost on
    either path would show far beyond the tolerance (gamma 0 is the check)."""
    sizes = {k: TINY[k] for k in ("nz", "ngf", "ndf", "batch_size", "log_interval", "sample_interval")}
    cfg = preset("r3gan", **sizes, steps=2, r1_gamma=10.0, r2_gamma=10.0, ema_decay=0.0, **changes)
    grads, calls = {}, {}
    for name, reuse, gamma in (("shared", True, 10.0), ("own", False, 10.0), ("none", True, 0.0)):
        run = cfg.replace(r1_gamma=gamma, r2_gamma=gamma, out_dir=str(tmp_path / name))
        if gamma == 0:
            run = run.replace(r1_interval=1, r2_interval=1)
        trainer = Trainer(run, dataset=glyphs64)
        assert trainer.stepper.reuses_d_forward
        assert trainer.generator.fp32_stages == trainer.discriminator.fp32_stages == changes.get("fp32_stages", 0)
        trainer.stepper.reuses_d_forward = reuse
        seen, counted = [], []
        d = trainer.discriminator
        trainer.stepper.parts.opt_d.register_step_pre_hook(
            lambda *_, seen=seen, d=d: seen.append(torch.cat([q.grad.flatten() for q in d.parameters()])))
        d.register_forward_hook(lambda *_, counted=counted: counted.append(1))
        trainer.fit()
        grads[name], calls[name] = torch.stack(seen), len(counted)
    assert calls["own"] - calls["shared"] == 2 * penalised  # R1's forward on the reals, R2's on the fakes
    tol = dict(rtol=2e-2, atol=1e-3) if changes.get("precision") == "bf16" else dict(rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(grads["shared"], grads["own"], **tol)
    # the first D step (same weights on every path, penalised in every setting): the penalty moves D's gradient
    # more than the two paths differ (bf16 rounds each path's sums differently, by CPU: emulated or native bf16),
    # and a path that lost it would fail the same tolerance
    penalty_part = (grads["none"][0] - grads["own"][0]).abs().max()
    assert penalty_part > 4 * (grads["shared"][0] - grads["own"][0]).abs().max()
    assert not torch.allclose(grads["none"][0], grads["own"][0], **tol)


def test_a_compiled_d_keeps_the_penalty_on_its_own_plain_forward(tmp_path, glyphs64):
    sizes = {k: TINY[k] for k in ("nz", "ngf", "ndf", "batch_size", "log_interval", "sample_interval")}
    trainer = Trainer(preset("r3gan", **sizes, steps=1, compile="default", out_dir=str(tmp_path)), dataset=glyphs64)
    assert not trainer.stepper.reuses_d_forward  # compiled code has no double backward (losses.input_gradients)


@pytest.mark.parametrize("changes, message", [
    (dict(architecture="stylegan"), "architecture='stylegan': choose one of dcgan, r3gan"),
    (dict(architecture="r3gan", image_size=28), "architecture='r3gan' is built for 32 or 64 px, not image_size=28"),
    (dict(architecture="r3gan", d_norm="layer"), "d_norm='layer' with architecture='r3gan': its D has no "
                                                 "normalisation layers"),
    (dict(architecture="r3gan", conditional=True), "conditional=True with architecture='r3gan'"),
    (dict(architecture="r3gan", activation_checkpointing="d"), "architecture='r3gan' has none to cut"),
    (dict(architecture="r3gan", loss="bce-sigmoid"), "loss='bce-sigmoid' needs D to end in a Sigmoid"),
    (dict(fp32_stages=1), "architecture='dcgan' has no such stages"),
    (dict(architecture="r3gan", precision="bf16", fp32_stages=5), "R3GAN at 32 px has 4 stages (4 x 4 up to 32 x 32), "
                                                                  "so at most fp32_stages=4"),
    (dict(architecture="r3gan", precision="bf16", fp32_stages=-1), "fp32_stages=-1: must be >= 0"),
    (dict(r2_gamma=float("nan")), "r2_gamma=nan: must be a finite number"),
    (dict(r2_gamma=-1.0), "r2_gamma=-1.0: must be >= 0"),
    (dict(r2_interval=4), "r2_interval sets how often R2 runs, but R2 is off (r2_gamma=0)"),
    (dict(r2_gamma=1.0, r2_interval=0), "r2_interval=0: must be >= 1"),
    (dict(r2_gamma=1.0, loss="bce-sigmoid"), "r2_gamma penalises the gradient of D's raw output"),
    (dict(r2_gamma=1.0, d_norm="batch"), "d_norm='batch' with a gradient penalty"),
])
def test_each_impossible_r3gan_setting_is_one_clear_error(tiny, changes, message):
    with pytest.raises(ConfigError) as e:
        tiny.replace(**changes).validate()
    assert message in str(e.value) and str(e.value).count("\n  - ") == 1


def test_the_plain_loop_can_hold_r3gans_networks():
    from gantools.workbook import tutorial

    gan = tutorial.plain_gan("cpu", architecture="r3gan", nz=8, ngf=16, ndf=16, batch_size=4)
    assert isinstance(gan.G, R3GANGenerator) and isinstance(gan.D, R3GANDiscriminator)
    assert gan.D(gan.G(torch.randn(4, 8))).shape == (4,)
    with pytest.raises(ValueError, match="its D has no normalisation layers"):
        tutorial.plain_gan("cpu", architecture="r3gan", d_norm="layer")
    with pytest.raises(ValueError, match="choose 'dcgan' or 'r3gan'"):
        tutorial.plain_gan("cpu", architecture="stylegan")
