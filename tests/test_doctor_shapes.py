"""gantools doctor on the loops people write (tests/scripts/): PyTorch-GAN's conditional GAN (G's step first, Variable
and FloatTensor-era code, numpy noise) and WGAN-GP (five critic steps, a gradient penalty, fakes not detached in D's
step), the tutorials' vanilla MLP GAN on flattened images inside main(), a DCGAN written as a trainer class
(`self.G`, `self.opt_d`), a DCGAN under Hugging Face Accelerate, a GAN LightningModule run by Lightning's Trainer, and
a loop of your own under Lightning Fabric."""
import dataclasses
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.nn.modules import module as torch_module
from torch.optim import optimizer as torch_optimizer

from gantools import doctor
from gantools.doctor.trying import trial
from gantools.doctor.diagnosis.analysis import machine_facts
from gantools.doctor.fixes.catalogue import AUTOCAST, DETACH, FREEZE_D, LOGITS, Applied, candidates, context
from gantools.doctor.fixes.lazy_penalty import LAZY
from gantools.doctor.patching.patch import make_patch
from gantools.doctor.findings.penalties import lazy_adam
from gantools.doctor.fixes.trainer import PRECISION
from gantools.doctor.fixes.pipeline import DECODE_ONCE
from gantools.doctor.trying.try_fixes import pacer_index, try_fixes
from test_doctor_snippets import foreign, script_names

SCRIPTS = Path(__file__).parent / "scripts"
CGAN, WGAN_GP, ACCELERATE = SCRIPTS / "cgan_mlp.py", SCRIPTS / "wgan_gp_mlp.py", SCRIPTS / "accelerate_dcgan.py"
VANILLA, TRAINER_CLASS = SCRIPTS / "vanilla_gan_main.py", SCRIPTS / "trainer_class_dcgan.py"
LIGHTNING = SCRIPTS / "lightning_gan.py"
R1 = SCRIPTS / "r1_dcgan.py"
BEGAN = SCRIPTS / "began.py"
TEMPLATE_NAMES = ("netD", "netG", "criterion", "optimizerD", "optimizerG")  # the tutorial's, not these scripts'
PRINTED = "% (epoch, opt.n_epochs, i, len(dataloader), d_loss.item(), g_loss.item())"  # PyTorch-GAN's .item() line
LOSSES = re.compile(r"\[D loss: (\S+)\] \[G loss: (\S+)\]")
pytestmark = pytest.mark.usefixtures("one_thread", "steady_doctor")


def flags(script, pngs, epochs=50) -> list:
    common = ["--dataroot", str(pngs)]
    if script == ACCELERATE:
        return common + ["--cpu", "--batch_size", "16", "--nz", "16", "--ngf", "8", "--ndf", "8",
                         "--num_epochs", str(epochs)]
    if script == TRAINER_CLASS:
        return common + ["--batch-size", "16", "--nz", "16", "--width", "8", "--epochs", str(epochs)]
    if script == LIGHTNING:
        return common + ["--accelerator", "cpu", "--batch_size", "16", "--img_size", "32", "--latent_dim", "16",
                         "--hidden", "256", "--max_epochs", str(epochs)]
    if script == BEGAN:
        return common + ["--batch_size", "16", "--latent_dim", "16", "--width", "8", "--sample_interval", "0",
                         "--n_epochs", str(epochs)]
    if script == R1:
        return common + ["--batch-size", "16", "--nz", "16", "--ngf", "8", "--ndf", "8", "--epochs", str(epochs)]
    if script == VANILLA:
        return common + ["--batch-size", "16", "--img-size", "16", "--nz", "16", "--hidden", "32",
                         "--epochs", str(epochs)]
    return common + ["--batch_size", "16" if script == CGAN else "8", "--latent_dim", "16", "--hidden", "16",
                     "--sample_interval", "0", "--n_epochs", str(epochs)]


@pytest.fixture(scope="module")
def diagnose(small_pngs, tmp_path_factory, steady_doctor):
    """The diagnosis of a script, run once per module (the --try and --patch tests start from it)."""
    traces, reports = tmp_path_factory.mktemp("traces"), {}

    def get(script):
        if script not in reports:
            torch.set_num_threads(1)
            reports[script] = doctor.run_script(script, flags(script, small_pngs), steps=3, warmup=1,
                                                trace=traces / f"{script.stem}.json")
        return reports[script]
    return get


def lines_of(script: Path, code: str) -> list:
    """The line numbers of the lines that are `code` (stripped)."""
    return [i for i, line in enumerate(script.read_text().splitlines(), 1) if line.strip() == code]


def facts():
    return machine_facts(torch.device("cpu"))


def assert_in_script_terms(report, script: Path):
    """Each finding's evidence and diff speak of the script's own lines and names, not the tutorial's."""
    for f in report.findings:
        for text in (f.seen, f.patch):
            assert not any(re.search(rf"\b{name}\b", text) for name in TEMPLATE_NAMES), (f.kind, text)
        if f.patch:
            assert f.patch.startswith("--- a/") and f.patch.splitlines()[0].endswith(f"/{script.name}"), f.patch


def test_cgan_g_step_first_is_told_apart_in_its_own_names(diagnose):
    """PyTorch-GAN's cgan steps G before D in each batch, and calls D on G's output in both steps (detached in D's)."""
    report = diagnose(CGAN)
    assert report.complete, report.note
    assert (report.models["G"]["name"], report.models["G"]["class"]) == ("generator", "Generator")
    assert (report.models["D"]["name"], report.models["D"]["class"]) == ("discriminator", "Discriminator")
    assert report.optimizers["G"]["name"] == "optimizer_G" and report.optimizers["D"]["name"] == "optimizer_D"
    assert report.optimizers["G"]["steps_per_iteration"] == report.optimizers["D"]["steps_per_iteration"] == 1
    assert report.images_per_step == report.batch_size == 16
    assert {"G forward", "D forward", "D forward (G step)", "D backward (G step)"} <= set(report.phases_ms)
    ctx = context(report, facts())
    (g_step,) = lines_of(CGAN, "validity = discriminator(gen_imgs, gen_labels)")
    assert ctx.g_step_sites == {(str(CGAN.resolve()), g_step)}
    assert ctx.g == ("Generator", report.models["G"]["parameters"]) and not ctx.bce and ctx.d_sigmoid is None
    fixes, skipped = candidates(report, facts())  # no Trainer: the plain autocast fix, no word of the Trainer's
    assert AUTOCAST in {f.name for f in fixes} and PRECISION not in {f.name for f in fixes} | dict(skipped).keys()

    by_kind = {f.kind: f for f in report.findings}
    (printed,) = lines_of(CGAN, PRINTED)
    assert f"cgan_mlp.py:{printed}" in by_kind["host-sync"].seen
    assert "optimizer_G = torch.optim.Adam(" in by_kind["optimizer-for-loop"].patch
    seen = by_kind["optimizer-for-loop"].seen
    assert "optimizer_G built at " in seen and "optimizer_D built at " in seen and "cgan_mlp.py:" in seen
    assert_in_script_terms(report, CGAN)


def test_began_control_variable_is_kept_on_the_device_and_never_batched(diagnose):
    """PyTorch-GAN's BEGAN updates `k` from `diff.item()` every step and weights D's loss with it: that read feeds
    training (its own finding, the rewrite that keeps `k` a tensor), while `M`'s and the print's reads are batched;
    every change shown in the script's words speaks only of names the script has (issue 50, items 2 and 6)."""
    report = diagnose(BEGAN)
    assert report.complete, report.note
    by_kind = {f.kind: f for f in report.findings}
    (update,) = lines_of(BEGAN, "k = k + lambda_k * diff.item()")
    (m,) = lines_of(BEGAN, "M = (d_loss_real + torch.abs(diff)).item()")
    fed, batched = by_kind["read-feeds-training"], by_kind["host-sync"]
    assert f"began.py:{update} `k = k + lambda_k * diff.item()`" in fed.seen and "d_loss.backward()" in fed.seen
    assert "k = (k + lambda_k * diff.detach()).clamp(0, 1)" in fed.change.splitlines()
    assert f"began.py:{update}" not in batched.seen and f"began.py:{m}" in batched.seen
    assert "(d_loss_real + torch.abs(diff)).detach()" in batched.change and "diff.detach()," not in batched.change
    names = report.settings["names"]
    assert (names["loader"], names["batch"], names["device"]) == ("dataloader", "imgs", '"cuda" if cuda else "cpu"')
    assert names["workers_flag"] == {"flag": "--n_cpu", "read_as": "opt.n_cpu", "used": False}
    has = script_names(BEGAN.read_text())
    assert all(not foreign(f.change, has) for f in report.findings if not f.patch), [f.change for f in report.findings]
    assert_in_script_terms(report, BEGAN)


@pytest.mark.slow
def test_an_mlp_g_of_flat_images_is_told_apart_and_its_patch_uses_the_device_main_binds(diagnose, small_pngs, tmp_path):
    """The vanilla GAN's G returns (B, 256) rows, not an image batch: G is the model feeding the one that returns one
    value per image. Its loop lives in main(), whose `device = torch.device(...)` the autocast lines name."""
    report = diagnose(VANILLA)
    assert report.complete, report.note
    assert (report.models["G"]["name"], report.models["D"]["name"]) == ("G", "D")
    assert report.optimizers["G"]["name"] == "g_opt" and report.optimizers["D"]["name"] == "d_opt"
    assert "sigmoid-bce" in report.kinds()
    ctx = context(report, facts())
    (g_step,) = lines_of(VANILLA, "g_loss = loss_fn(D(fake), ones)")
    assert ctx.g_step_sites == {(str(VANILLA.resolve()), g_step)}
    patch = make_patch(("logits", "autocast", FREEZE_D), report, ctx, root=SCRIPTS)
    assert not patch.by_hand, patch.by_hand
    added = [line[1:].strip() for line in patch.diff.splitlines() if line.startswith("+")]
    assert added.count("with torch.autocast(device.type, dtype=torch.bfloat16):") == 3, patch.diff
    assert "fake = G(torch.randn(real.size(0), args.nz, device=device)).float()" in added  # G's line, under autocast
    assert "D.requires_grad_(False)  # no weight gradients for D in G's step" in added
    shutil.copy(VANILLA, tmp_path)
    applied = subprocess.run(["patch", "-p1"], input=patch.diff, cwd=tmp_path, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert all(math.isfinite(v) for v in run_copy(VANILLA, tmp_path, small_pngs))


@pytest.mark.slow
def test_a_trainer_class_loop_is_named_and_patched_in_its_self_attributes(diagnose, small_pngs, tmp_path):
    """Models, optimizers and the device as attributes of a trainer object: the report and the patch name them as the
    code does (`self.D`, `self.opt_g`, `self.device.type`), not by their classes."""
    report = diagnose(TRAINER_CLASS)
    assert report.complete, report.note
    assert (report.models["G"]["name"], report.models["D"]["name"]) == ("self.G", "self.D")
    assert (report.optimizers["G"]["name"], report.optimizers["D"]["name"]) == ("self.opt_g", "self.opt_d")
    for f in report.findings:  # this script has a `self.criterion` of its own: no tutorial names to look for
        assert not re.search(r"\b(netD|netG|optimizerD|optimizerG|Adam|Discriminator)\.", f.change + f.patch), f.kind
    ctx = context(report, facts())
    patch = make_patch(("logits", "autocast", FREEZE_D), report, ctx, root=SCRIPTS)
    assert not patch.by_hand, patch.by_hand
    added = [line[1:].strip() for line in patch.diff.splitlines() if line.startswith("+")]
    assert added.count("with torch.autocast(self.device.type, dtype=torch.bfloat16):") == 3, patch.diff
    assert "self.D.requires_grad_(False)  # no weight gradients for self.D in G's step" in added
    assert "self.criterion = nn.BCEWithLogitsLoss()" in added
    shutil.copy(TRAINER_CLASS, tmp_path)
    applied = subprocess.run(["patch", "-p1"], input=patch.diff, cwd=tmp_path, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert all(math.isfinite(v) for v in run_copy(TRAINER_CLASS, tmp_path, small_pngs))


def test_models_and_optimizers_are_named_as_the_code_reaches_them():
    """A plain name first; else `self.X` in a method; else an attribute of a module or of an object of your class
    (`gan.generator`, `pair.opt`), never the class's name (the report's and the patch's names are the code's)."""
    from gantools.doctor.watching.frames import name_in_frames

    class Pair:
        def __init__(self):
            self.G = torch.nn.Linear(1, 1)
            self.opt = torch.optim.SGD(self.G.parameters(), lr=0.1)

        def name_of_g(self):
            return name_in_frames(self.G, sys._getframe())

    pair, gan = Pair(), torch.nn.Module()
    gan.generator = torch.nn.Linear(1, 1)
    here = sys._getframe()
    assert (name_in_frames(pair.G, here), name_in_frames(pair.opt, here)) == ("pair.G", "pair.opt")
    assert name_in_frames(gan.generator, here) == "gan.generator" and pair.name_of_g() == "self.G"
    d = gan.generator
    assert name_in_frames(d, sys._getframe()) == "d"
    del d

    class Config(dict):  # a config object whose attributes are its keys: reading `_modules` raises KeyError
        def __getattr__(self, key):
            return self[key]
        run = lambda self: None  # noqa: E731 (a method defined here, so it counts as one of your classes)

    cfg, nets = Config(), torch.nn.ModuleList([torch.nn.Linear(1, 1)])
    assert cfg is not None and name_in_frames(nets[0], sys._getframe()) is None  # never `nets.0`, never a KeyError


@pytest.mark.slow
def test_wgan_gp_counts_five_critic_steps_and_freezes_only_g_steps_call(diagnose):
    """D's step calls D on fakes that carry G's gradients (not detached), on the same line text as G's step: only
    the call that G's optimizer step follows is G's step, the one place freezing D is right."""
    report = diagnose(WGAN_GP)
    assert report.complete, report.note
    assert report.models["G"]["name"] == "generator" and report.models["D"]["name"] == "discriminator"
    assert report.optimizers["D"]["name"] == "optimizer_D" and report.optimizers["D"]["steps_per_iteration"] == 5
    assert report.optimizers["G"]["name"] == "optimizer_G" and report.optimizers["G"]["steps_per_iteration"] == 1
    assert report.settings["iteration"].startswith("one step of optimizer_G")
    assert report.images_per_step == 5 * 8 and report.batch_size == 8
    d_step, g_step = lines_of(WGAN_GP, "fake_validity = discriminator(fake_imgs)")
    (penalty,) = lines_of(WGAN_GP, "d_interpolates = D(interpolates)")
    script = str(WGAN_GP.resolve())
    assert {(script, line) for line in (d_step, g_step, penalty)} <= {tuple(s) for s in
                                                                        report.models["D"]["call_sites"]}
    assert context(report, facts()).g_step_sites == {(script, g_step)}
    (printed,) = lines_of(WGAN_GP, PRINTED)
    assert f"wgan_gp_mlp.py:{printed}" in next(f.seen for f in report.findings if f.kind == "host-sync")
    assert_in_script_terms(report, WGAN_GP)


def test_wgan_gp_d_is_frozen_at_run_time_in_g_steps_call_only(diagnose, small_pngs, monkeypatch):
    """--try's freeze-d on the WGAN-GP: D's parameters are frozen in the one call per iteration that G's step makes,
    never in the five critic steps, whose fakes carry G's gradients just the same."""
    report = diagnose(WGAN_GP)
    seen = []

    class Recorded(trial.Applied):
        def __exit__(self, *exc):
            seen.append(self.frozen_calls)
            return super().__exit__(*exc)
    monkeypatch.setattr(trial, "Applied", Recorded)
    run = trial.run_trial(WGAN_GP, flags(WGAN_GP, small_pngs), (FREEZE_D,), context(report, facts()),
                          pacer_index(report), report.images_per_step, warmup=1, steps=3, timeout=300)
    assert run.measured and run.finite, run.traceback
    assert seen == [1 + 1 + 3]  # one frozen call per G step: the warm-up's, the clock's start and three timed


R1_LINE = "grad = torch.autograd.grad(d_real.sum(), real, create_graph=True)[0]"


def test_r1_at_every_d_step_is_found_at_its_line_timed_and_its_lazy_form_given_in_its_names(diagnose, steady_doctor):
    """R1 on the real batch at every D step, in one backward with D's loss: the doctor places the autograd.grad call
    on its line, times the gradient and its double backward as the "D penalty" phase (not counted twice: the phases
    fit in the iteration), and gives StyleGAN2's lazy form with D's Adam corrected, its gain from that share."""
    report = diagnose(R1)
    assert report.complete, report.note
    (line,) = lines_of(R1, R1_LINE)
    script = str(R1.resolve())
    gp = report.settings["gradient_penalty"]
    assert gp["calls_per_iteration"] == 1 and [x["at"] for x in gp["sites"]] == [[script, line]]
    phases, step = steady_doctor[id(report)]  # as measured: the penalty's time is not counted twice
    assert 0 < phases["D penalty"] and sum(ms for k, ms in phases.items() if k != doctor.OTHER) <= step
    penalty = report.phases_ms["D penalty"]
    found = next(f for f in report.findings if f.kind == "gradient-penalty-every-step")
    assert f"r1_dcgan.py:{line} `{R1_LINE}` (1/it)" in found.seen
    assert found.estimated_speedup == pytest.approx(report.step_time_ms / (report.step_time_ms - penalty * 15 / 16))
    (built,) = lines_of(R1, "opt_d = torch.optim.Adam(D.parameters(), lr=args.lr, betas=(0.0, 0.99))")
    lr, (_, beta2) = lazy_adam(2e-4, (0.0, 0.99))
    assert f"opt_d = torch.optim.Adam(..., lr={lr:.3g}, betas=(0, {beta2:.4g}))  # at " in found.change
    assert f"r1_dcgan.py:{built}: lr * c, betas ** c" in found.change and "changes what your loop computes" in found.why
    assert not found.patch and f"r1_dcgan.py:{line}" in found.by_hand  # lazy regularisation is written by hand
    assert context(report, facts()).penalty_sites == {(script, line)}
    assert LAZY in {f.name for f in candidates(report, facts())[0]}
    assert not hasattr(torch.autograd.grad, "__wrapped__")  # the doctor's watch is off again
    assert_in_script_terms(report, R1)


def test_r1_taken_lazily_at_run_time_computes_one_gradient_in_sixteen_d_steps(diagnose, small_pngs, monkeypatch):
    """--try's lazy penalty on the R1 script: of the five D steps a run makes (one warm-up, one to start the clock,
    three timed), only the first takes the gradient; the run trains with finite losses."""
    report = diagnose(R1)
    computed, grad = [], torch.autograd.grad

    def counted(*args, **kwargs):
        computed.append(kwargs.get("create_graph"))
        return grad(*args, **kwargs)
    monkeypatch.setattr(torch.autograd, "grad", counted)
    run = trial.run_trial(R1, flags(R1, small_pngs), (LAZY,), context(report, facts()), pacer_index(report),
                          report.images_per_step, warmup=1, steps=3, timeout=300)
    assert run.measured and run.finite, run.traceback
    assert len(run.losses) == 3 and computed == [True]


def test_try_measures_r1_taken_lazily_against_every_step(diagnose, small_pngs, monkeypatch):
    """--try measures the lazy penalty against the loop as written (the other fixes left out here, for time), kept or
    not as this CPU decides, its losses held to be finite only, since it changes D's loss by design."""
    from gantools.doctor.trying import try_fixes as trying

    report = diagnose(R1)

    def lazy_only(*args):
        fixes, skipped = candidates(*args)
        return [f for f in fixes if f.name == LAZY], skipped
    monkeypatch.setattr(trying, "candidates", lazy_only)
    result = try_fixes(R1, flags(R1, small_pngs), report, facts(), warmup=1, steps=3, repeats=2)
    print(result)
    (tried,) = result.tried
    assert tried.outcome in ("kept", "not faster"), str(result)
    assert "losses held to be finite only (lazy regularisation changes D's loss by design" in tried.why


def run_copy(script: Path, folder: Path, pngs: Path) -> list:
    """Run a script (a patched copy) for one epoch, as its user would; the losses it printed."""
    return run_copies({script.name: (script, folder)}, pngs)[script.name]


def run_copies(copies: dict, pngs: Path, extra: tuple = ()) -> dict:
    """name -> (script, folder): each copy run as `run_copy` does (with the flags `extra` added), on one thread, as
    many at a time as there are cores; name -> its losses."""
    losses, waiting, running = {}, list(copies.items()), {}
    while waiting or running:
        while waiting and len(running) < (os.cpu_count() or 1):
            name, (script, folder) = waiting.pop(0)
            out = open(folder / f"{script.stem}.out", "w+")
            running[name] = out, subprocess.Popen(
                [sys.executable, str(folder / script.name), *flags(script, pngs, epochs=1), *extra], cwd=folder,
                stdout=out, stderr=subprocess.STDOUT, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        name = next(iter(running))
        out, run = running.pop(name)
        try:
            run.wait(timeout=120)
        finally:
            if run.poll() is None:
                run.kill()
        out.seek(0)
        printed = out.read()
        out.close()
        assert run.returncode == 0, (name, printed[-3000:])
        losses[name] = [float(v) for pair in LOSSES.findall(printed) for v in pair]
        assert losses[name], (name, printed[-3000:])
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("script", [CGAN, WGAN_GP], ids=["cgan", "wgan-gp"])
def test_each_fix_as_a_patch_applies_and_the_patched_script_runs(diagnose, script, small_pngs, tmp_path):
    """Every fix the diagnosis has a candidate for (and freezing D, for the WGAN-GP's two look-alike calls), as a
    diff of the script: `patch -p1` applies it to a copy, which then trains an epoch with finite losses."""
    report = diagnose(script)
    ctx = context(report, facts())
    fixes, _ = candidates(report, facts())
    assert {"autocast", "fused-optimizers", "loader-workers"} <= {f.name for f in fixes}
    parts = {fix.name: fix.parts for fix in fixes}
    if script == WGAN_GP:
        parts.setdefault(FREEZE_D, (FREEZE_D,))
    copies = {}
    if LAZY in parts:  # the WGAN-GP's penalty every D step: lazy regularisation is the user's to write, said so
        lazy = make_patch(parts.pop(LAZY), report, ctx, root=SCRIPTS)
        assert not lazy.diff and [name for name, _ in lazy.by_hand] == ["lazy-penalty"] and script == WGAN_GP
    if DECODE_ONCE in parts:  # its ImageFolder decoded once: lines that build the data, shown, never a patch
        decoded = make_patch(parts.pop(DECODE_ONCE), report, ctx, root=SCRIPTS)
        assert not decoded.diff and [name for name, _ in decoded.by_hand] == [DECODE_ONCE]
    for name, fix_parts in parts.items():
        patch = make_patch(fix_parts, report, ctx, root=SCRIPTS)
        assert patch and not patch.by_hand and patch.files == [script.name], (name, patch.by_hand)
        if name == FREEZE_D:  # around the call in G's step alone (the WGAN-GP's indented under its n_critic test;
            # the cGAN's is proposed only where its profile finds D's backward in G's step worth freezing)
            diff = patch.diff.splitlines()
            frozen = [i for i, line in enumerate(diff) if line.startswith("+") and "requires_grad_(False)" in line]
            g_step_call = {WGAN_GP: " " * 13 + "fake_validity = discriminator(fake_imgs)",
                           CGAN: " " * 9 + "validity = discriminator(gen_imgs, gen_labels)"}[script]
            assert len(frozen) == 1 and diff[frozen[0] + 1] == g_step_call
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(script, folder)
        applied = subprocess.run(["patch", "-p1"], input=patch.diff, cwd=folder, capture_output=True, text=True)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert (folder / script.name).read_text() != script.read_text()
        copies[name] = script, folder
    for name, losses in run_copies(copies, small_pngs).items():
        assert all(math.isfinite(v) for v in losses), (name, losses)


@pytest.mark.slow
def test_wgan_gp_fakes_not_detached_in_ds_step_are_found_and_detached_by_a_patch_that_trains_the_same(
        diagnose, small_pngs, tmp_path):
    """The critic step feeds `generator(z)` to D without `.detach()`: G's weight gradients are computed at each of
    the five critic steps and thrown away. The finding says so with its time, D's step line alone is the place to
    detach (the same text in G's step keeps its graph), and the patched script, seeded, prints the same losses."""
    report = diagnose(WGAN_GP)
    (found,) = [f for f in report.findings if f.kind == "g-grads-in-d-step"]
    assert report.settings["g_grads_in_d_step"] > 0 and report.phases_ms["G backward (D step)"] > 0
    assert "generator" in found.title and "optimizer_D" in found.seen and found.estimated_speedup > 1
    d_step, g_step = lines_of(WGAN_GP, "fake_validity = discriminator(fake_imgs)")
    ctx = context(report, facts())
    assert (str(WGAN_GP.resolve()), d_step) in ctx.d_step_sites and (str(WGAN_GP.resolve()), g_step) not in \
        ctx.d_step_sites
    assert found.patch and DETACH in {f.name for f in candidates(report, facts())[0]}
    patch = make_patch((DETACH,), report, ctx, root=SCRIPTS)
    added = [line[1:] for line in patch.diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert added == [" " * 8 + "fake_validity = discriminator(fake_imgs.detach())"] and not patch.by_hand, patch
    copies = {}
    for name, diff in (("as-written", ""), ("detached", patch.diff)):
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(WGAN_GP, folder)
        if diff:
            applied = subprocess.run(["patch", "-p1"], input=diff, cwd=folder, capture_output=True, text=True)
            assert applied.returncode == 0, applied.stdout + applied.stderr
        copies[name] = WGAN_GP, folder
    losses = run_copies(copies, small_pngs, extra=("--seed", "0"))
    assert losses["detached"] == pytest.approx(losses["as-written"], rel=1e-5), losses


@pytest.mark.slow
@pytest.mark.parametrize("script", [CGAN, WGAN_GP, VANILLA, TRAINER_CLASS, ACCELERATE],
                         ids=["cgan", "wgan-gp", "vanilla", "trainer-class", "accelerate"])
def test_try_runs_every_fix_without_breaking_the_script(diagnose, script, small_pngs):
    """Each fix, applied at run time, leaves the script running with finite losses, under Accelerate's wrappers too."""
    report = diagnose(script)
    result = try_fixes(script, flags(script, small_pngs), report, facts(), warmup=1, steps=3, repeats=2)
    print(result)
    assert result.tried and not result.interrupted
    assert not [t.name for t in result.tried if t.outcome == "broke the script"], str(result)
    assert all(t.outcome in ("kept", "not faster", "too noisy", "failed the guard") for t in result.tried)
    assert not [t.name for t in result.tried if "non-finite" in t.why], str(result)


def test_accelerate_loop_is_seen_through_accelerates_wrappers(diagnose):
    """Accelerate's prepare wraps each optimizer (AcceleratedOptimizer, holding yours) and rebuilds the DataLoader
    around your dataset; the doctor names them as your code does and places the DataLoader at your line (accelerate
    is in the dev extras: a missing one fails here, not skips)."""
    report = diagnose(ACCELERATE)
    assert report.complete, report.note
    assert report.models["G"]["name"] == "netG" and report.models["D"]["name"] == "netD"
    assert report.optimizers["G"]["name"] == "optimizerG" and report.optimizers["G"]["model"] == "netG"
    assert report.optimizers["D"]["name"] == "optimizerD" and report.optimizers["D"]["model"] == "netD"
    assert report.images_per_step == report.batch_size == 16
    script = str(ACCELERATE.resolve())
    assert context(report, facts()).g_step_sites == {(script, lines_of(ACCELERATE, "output = netD(fake)")[0])}
    (loader,) = report.settings["dataloaders"]
    (built,) = lines_of(ACCELERATE, "dataloader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, "
                                    "shuffle=True,")
    assert loader["built_at"] == [script, built] and loader["batch_size"] == 16
    patch = make_patch(("loader-workers",), report, context(report, facts()))
    assert not patch.by_hand and re.search(r"^-.*num_workers=args\.num_workers", patch.diff, re.M)
    assert re.search(r"^\+.*num_workers=\d+, drop_last=True, persistent_workers=True\)$", patch.diff, re.M), patch.diff
    for f in report.findings:
        assert not re.search(r"\bAdam (stepped|zeroes)", f.seen + f.why), f


FABRIC_SCRIPT = '''
import torch
from torch import nn
from lightning.fabric import Fabric

data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 1, 8, 8)), batch_size=8)
fabric = Fabric(accelerator="cpu", devices=1)
G = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Unflatten(1, (1, 8, 8)))
D = nn.Sequential(nn.Flatten(), nn.Linear(64, 1))
G, opt_g = fabric.setup(G, torch.optim.Adam(G.parameters()))
D, opt_d = fabric.setup(D, torch.optim.Adam(D.parameters()))
for epoch in range(5):
    for (real,) in data:
        fake = G(torch.randn(real.size(0), 8))
        loss_d = D(fake.detach()).mean() - D(real).mean()
        opt_d.zero_grad()
        fabric.backward(loss_d)
        opt_d.step()
        loss_g = -D(fake).mean()
        opt_g.zero_grad()
        fabric.backward(loss_g)
        opt_g.step()
'''


def line_starting(script: Path, start: str) -> int:
    (line,) = [i for i, text in enumerate(script.read_text().splitlines(), 1) if text.strip().startswith(start)]
    return line


def test_a_loop_run_by_lightnings_trainer_is_diagnosed_in_its_own_terms(diagnose):
    """Lightning's Trainer.fit runs the LightningModule's training_step (manual optimization, LightningOptimizers,
    `self(z)` through the module's forward): G and D are named by the module's attributes, the optimizers as
    training_step names them, the DataLoader at the DataModule's line; the 16-bit fix is the Trainer's own
    precision argument edited into the script's Trainer(...) call, never the doctor's autocast wrapper (--try tries
    the argument instead, with the logits loss the BCE needs; not on fp16, whose GradScaler would be Lightning's);
    Lightning's per-step reads of prog_bar values are placed at the self.log lines; every wrapper of Lightning's
    classes is gone after the run (lightning is in the dev extras: a missing one fails here)."""
    import lightning.pytorch as pl
    from gantools.doctor.watching.lightning import TrainerWatch

    report = diagnose(LIGHTNING)
    assert report.complete, report.note
    assert report.models["G"]["name"] == "self.generator" and report.models["D"]["name"] == "self.discriminator"
    assert report.optimizers["G"]["name"] == "opt_g" and report.optimizers["D"]["name"] == "opt_d"
    assert report.images_per_step == 16 and 0 < report.images_per_sec < math.inf
    script = str(LIGHTNING.resolve())
    trainer = report.settings["lightning"]
    assert trainer["built_at"] == [script, line_starting(LIGHTNING, "trainer = L.Trainer(")]
    assert trainer["fit_at"] == [script, line_starting(LIGHTNING, "trainer.fit(")] and trainer["precision"] == "32-true"
    (loader,) = report.settings["dataloaders"]
    assert loader["built_at"] == [script, line_starting(LIGHTNING, "return torch.utils.data.DataLoader(")]
    text = str(report)
    assert "self.generator (Generator" in text and "images/s" in text

    precision = next(f for f in report.findings if f.kind == "fp32-convolutions")
    assert re.search(r'^\+ +enable_checkpointing=False, enable_progress_bar=False, precision="bf16-mixed"\)$',
                     precision.patch, re.M), precision.patch
    assert "torch.autocast" not in precision.patch and 'Trainer(..., precision="bf16-mixed")' in precision.change
    fixes, skipped = candidates(report, facts())
    assert AUTOCAST not in {p for f in fixes for p in f.parts}
    assert {f.name: f.parts for f in fixes}[PRECISION] == (LOGITS, PRECISION)
    assert 'its fix is Trainer(..., precision="bf16-mixed")' in dict(skipped)[AUTOCAST]
    fixes, skipped = candidates(report, dataclasses.replace(facts(), bf16=False))  # fp16: the plugin's GradScaler
    assert PRECISION not in {f.name for f in fixes} and 'precision="16-mixed") by hand' in dict(skipped)[PRECISION]
    no_final_sigmoid = dataclasses.replace(report, settings={**report.settings, "d_final_sigmoid": None})
    fixes, skipped = candidates(no_final_sigmoid, facts())  # the BCE it feeds cannot take logits at run time
    assert PRECISION not in {f.name for f in fixes} and "not a final nn.Sigmoid" in dict(skipped)[PRECISION]
    reads = next(f for f in report.findings if f.kind == "host-sync")
    for name in ("g_loss", "d_loss"):
        logged_at = line_starting(LIGHTNING, 'self.log("' + name)
        assert f"lightning_gan.py:{logged_at} ('{name}')" in reads.seen, reads.seen

    assert not any(isinstance(f, TrainerWatch) for f in sys.meta_path)
    package = str(Path(doctor.__file__).resolve().parents[1])  # the package: its checkout may be named gantools too
    assert not any(str(Path(fn.__code__.co_filename).resolve()).startswith(package + os.sep)
                   for fn in (pl.Trainer.__init__, pl.Trainer.fit, pl.LightningModule.log))


def test_try_measures_the_trainers_precision_argument_on_a_lightning_loop(diagnose, small_pngs, monkeypatch):
    """--try gives the Trainer the script builds precision="bf16-mixed" for the run, undone after it, and measures
    that against the loop as written (the other fixes left out here, for time); kept or not, as this CPU decides, and
    when kept, --patch's diff holds the Trainer's argument."""
    import lightning as L
    from gantools.doctor.trying import try_fixes as trying

    report = diagnose(LIGHTNING)
    ctx = context(report, facts())
    with Applied((PRECISION,), ctx):
        assert L.Trainer(accelerator="cpu", devices=1, logger=False).precision == "bf16-mixed"
    assert L.Trainer(accelerator="cpu", devices=1, logger=False).precision == "32-true"  # undone

    def precision_only(*args):
        fixes, skipped = candidates(*args)
        return [f for f in fixes if f.name == PRECISION], skipped
    monkeypatch.setattr(trying, "candidates", precision_only)
    result = try_fixes(LIGHTNING, flags(LIGHTNING, small_pngs), report, facts(), warmup=1, steps=3, repeats=2)
    print(result)
    (tried,) = result.tried
    assert tried.name == PRECISION and tried.outcome in ("kept", "not faster"), str(result)
    assert tried.speedup > 0 and len(tried.spread) == 2
    assert re.search(r'(kept|not faster): Trainer\(\.\.\., precision="bf16-mixed"\), with logits and '
                     r"BCEWithLogitsLoss: \d+\.\d\dx \(", str(result)), str(result)
    if result.kept:
        patch = make_patch(result.kept_parts, report, ctx)
        assert re.search(r'^\+ .*, precision="bf16-mixed"\)$', patch.diff, re.M), patch.diff


@pytest.mark.slow
def test_the_trainers_precision_argument_as_a_patch_applies_and_the_patched_script_runs(diagnose, small_pngs,
                                                                                         tmp_path):
    """The precision fix's edit (with the logits loss it brings): `patch -p1` applies it to a copy of the script,
    which then trains an epoch with finite losses."""
    report = diagnose(LIGHTNING)
    fixes, _ = candidates(report, facts())
    (fix,) = [f for f in fixes if f.name == PRECISION]
    patch = make_patch(fix.parts, report, context(report, facts()), root=SCRIPTS)
    assert patch and not patch.by_hand and patch.files == [LIGHTNING.name], patch.by_hand
    assert re.search(r'^\+ +enable_checkpointing=False, enable_progress_bar=False, precision="bf16-mixed"\)$',
                     patch.diff, re.M), patch.diff
    assert "+        return F.binary_cross_entropy_with_logits(y_hat, y)" in patch.diff
    shutil.copy(LIGHTNING, tmp_path)
    applied = subprocess.run(["patch", "-p1"], input=patch.diff, cwd=tmp_path, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    losses = run_copy(LIGHTNING, tmp_path, small_pngs)
    assert all(math.isfinite(v) for v in losses), losses


def test_a_loop_of_your_own_under_lightning_fabric_is_diagnosed(tmp_path):
    """Lightning Fabric leaves the loop in your code: its wrapped optimizers are named as your code names them."""
    (tmp_path / "train_fabric.py").write_text(FABRIC_SCRIPT)
    fabric = doctor.run_script(tmp_path / "train_fabric.py", steps=1, warmup=0, timeout=300, trace=tmp_path / "f.json")
    assert fabric.complete and fabric.models["G"]["name"] == "G" and fabric.optimizers["D"]["name"] == "opt_d"
    assert not torch_optimizer._global_optimizer_post_hooks and not torch_module._global_forward_hooks


def test_packages_installed_outside_site_packages_are_not_your_code(tmp_path, monkeypatch):
    """A `pip install --target` folder on PYTHONPATH (how `make gpu-evidence` installs what a GPU machine lacks), or
    Debian's dist-packages, holds libraries: their frames are never named as yours; a folder of scripts is yours."""
    from gantools.doctor.watching.frames import yours
    target, scripts = tmp_path / "site", tmp_path / "project"
    (target / "somelib-1.0.dist-info").mkdir(parents=True)
    (target / "somelib").mkdir()
    scripts.mkdir()
    monkeypatch.setattr(sys, "path", [str(scripts), str(target), *sys.path])
    assert not yours(str(target / "somelib" / "loader.py"))
    assert yours(str(scripts / "train.py"))
