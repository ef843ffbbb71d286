"""`gantools doctor --try` and `--patch` on scripts written the way people write them: the fixes applied at run time
do what they say, the patch is an edit of the user's own lines that applies and runs, and bad input (a fix that breaks
the script, a construct that cannot be edited, Ctrl-C, an unwritable path) gets one clear answer."""
import dataclasses
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from gantools import doctor
from gantools.cli import main
from gantools.doctor.fixes import catalogue as fixes
from gantools.doctor.patching import patch as patching
from gantools.doctor.trying import try_fixes as trying
from gantools.doctor.diagnosis.analysis import machine_facts
from gantools.doctor.editing.logits_file import FileEdit
from gantools.doctor.fixes.freeze import FreezeEdit
from gantools.doctor.fixes.lazy_penalty import LAZY
from gantools.doctor.trying.trial import Trial

SCRIPTS = Path(__file__).parent / "scripts"
PLAIN = SCRIPTS / "dcgan_plain.py"
TUTORIAL = SCRIPTS / "dcgan_tutorial.py"
CPU = machine_facts(torch.device("cpu"))
pytestmark = pytest.mark.usefixtures("one_thread", "steady_doctor")


def tiny(pngs, *flags):
    return ["--dataroot", str(pngs), "--batch-size", "16", "--ngf", "8", "--ndf", "8", "--nz", "16",
            "--epochs", "50", "--workers", "0", *flags]


@pytest.fixture
def plain_copy(tmp_path):
    """The plain tutorial script copied where a patch may be applied to it."""
    folder = tmp_path / "project"
    folder.mkdir()
    shutil.copy(PLAIN, folder / "train.py")
    return folder


def diagnose(script, args, tmp_path):
    return doctor.run_script(script, args, steps=3, warmup=1, trace=tmp_path / "trace.json")


# -- advice in the user's own lines -----------------------------------------------------------------------------------
def test_findings_show_the_change_as_an_edit_of_your_own_lines(pngs, tmp_path, plain_copy):
    report = diagnose(plain_copy / "train.py", tiny(pngs), tmp_path)
    by_kind = {f.kind: f for f in report.findings}
    assert {"fp32-convolutions", "sigmoid-bce", "d-grads-in-g-step"} <= set(by_kind), str(report)
    amp = by_kind["fp32-convolutions"].patch
    assert "-        output = netD(real_cpu).view(-1)" in amp  # their line, their names, removed ...
    assert "+        with torch.autocast(device.type, dtype=torch.bfloat16):" in amp
    assert "+            output = netD(real_cpu).float().view(-1)" in amp  # ... under autocast, D's output in fp32
    assert "-            nn.Sigmoid()" in amp and "+criterion = nn.BCEWithLogitsLoss()" in amp  # BCE needs logits
    assert "+        D_x = output.sigmoid().mean().item()" in by_kind["sigmoid-bce"].patch  # D(x) as it was logged
    freeze = by_kind["d-grads-in-g-step"].patch
    assert freeze.index("+        netD.requires_grad_(False)") < freeze.index("output = netD(fake).view(-1)")
    assert "netD(fake.detach())" not in "".join(x for x in freeze.splitlines() if x.startswith("+"))  # D's step kept
    assert "your lines, before (-) and after (+)" in str(report)
    # the diagnosis located where things were built, for the edits
    assert report.optimizers["D"]["built_at"][1] == _line_of(PLAIN, "optimizerD = optim.Adam(")
    assert report.settings["dataloaders"][0]["built_at"][1] == _line_of(PLAIN, "dataloader = torch.utils.data")


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.mark.slow
def test_the_patch_applies_keeps_comments_and_the_patched_script_runs_without_the_findings(pngs, tmp_path,
                                                                                          plain_copy, monkeypatch):
    script = plain_copy / "train.py"
    report = diagnose(script, tiny(pngs), tmp_path)
    ctx = fixes.context(report, CPU)
    parts = (fixes.LOGITS, fixes.AUTOCAST, fixes.FREEZE_D, fixes.FUSED, fixes.WORKERS)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the script is not below here: the patch is the script's folder's
    patch = patching.make_patch(parts, report, ctx)
    assert patch.root == str(plain_copy.resolve()) and patch.files == ["train.py"], patch.files
    assert not patch.by_hand, patch.by_hand
    assert script.read_text() == PLAIN.read_text()  # never edited in place
    (tmp_path / "fix.patch").write_text(patch.diff)
    done = subprocess.run(["patch", "-p1", "-i", str(tmp_path / "fix.patch")], cwd=plain_copy, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    patched = script.read_text()
    assert "# state size. (ndf*4) x 4 x 4" in patched and "# Initialize the BCELoss function" in patched
    assert "fused=True" in patched and "num_workers=2, persistent_workers=True" in patched
    after = diagnose(script, tiny(pngs), tmp_path)
    assert after.complete and after.settings["autocast"], str(after)
    assert not {"fp32-convolutions", "sigmoid-bce", "d-grads-in-g-step", "optimizer-for-loop"} & set(after.kinds())
    runner = trying._Runner(script, tiny(pngs), fixes.context(after, CPU), trying.pacer_index(after),
                            after.images_per_step, 1, 3, 120)
    trial = runner.run(())
    assert trial.measured and trial.finite and trial.losses, trial.traceback


def test_a_patch_applies_from_here_when_its_files_are_below_else_from_the_folder_they_share(tmp_path, monkeypatch):
    files = [str(tmp_path / "project" / "train.py"), str(tmp_path / "project" / "models" / "nets.py")]
    for folder in ("project", "elsewhere"):
        (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path)
    assert patching._root_for(files) == str(tmp_path)
    monkeypatch.chdir(tmp_path / "elsewhere")  # `git apply` would refuse the ../project paths
    assert patching._root_for(files) == str(tmp_path / "project")


# -- the fixes at run time ------------------------------------------------------------------------------------------
class G(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, z):
        return self.net(z)


class D(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1), nn.Sigmoid())

    def forward(self, x):
        return self.net(x)


def _ctx(g, d, sites=frozenset(), bf16=True):
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    return fixes.Context("cpu", bf16, 0, ("G", count(g)), ("D", count(d)), "net.3", sites, ("Adam",), True)


def test_fakes_are_detached_at_run_time_in_ds_step_lines_only():
    """G's images enter D's step with their graph back to G (not detached): at the D-step line the diagnosis saw,
    D gets them detached, so D's loss trains D as before and no gradient reaches G; the same call in G's step, and
    D's calls on anything but G's output, keep their graph."""
    torch.manual_seed(0)
    g, d = G(), D()
    z, real = torch.randn(5, 8), torch.randn(5, 4, requires_grad=True)
    d_step_line = sys._getframe().f_lineno + 5
    ctx = dataclasses.replace(_ctx(g, d), d_step_sites=frozenset({(os.path.abspath(__file__), d_step_line)}))
    with fixes.Applied((fixes.DETACH,), ctx) as applied:
        d(g(z))  # first calls run as written (the fixes take hold from the second)
        fake = g(z)
        d_loss, on_real = d(fake).mean(), d(real).mean()  # D's step: the fakes, and an input of its own
        d_loss.backward()
        assert all(p.grad is None for p in g.parameters()) and all(p.grad is not None for p in d.parameters())
        on_real.backward()
        assert real.grad is not None  # not G's output: kept as it was
        d(fake).mean().backward()  # G's step, at another line: through D to G
    assert applied.state[fixes.DETACH + ":calls"] == 1
    assert all(p.grad is not None for p in g.parameters())
    assert "forward" not in d.__dict__ and "forward" not in g.__dict__


def test_the_detach_edit_goes_where_gs_images_enter_ds_step(tmp_path):
    """The source edit: `.detach()` on the argument of D's D-step call that holds G's output (bound by `fake =
    G(z)` or G's call itself), at the D-step lines only; D's call on real images and G's step are left as written."""
    script = tmp_path / "train.py"
    script.write_text("fake = generator(z)\nreal_out = netD(real)\nfake_out = netD(fake)\nboth = netD(generator(z))\n"
                      "loss = -netD(fake).mean()\n")
    r = doctor.DoctorReport(str(script), "cpu", complete=True)
    r.models = {"G": {"name": "generator"}, "D": {"name": "netD"}}
    ctx = dataclasses.replace(fixes.Context("cpu", True, 0, None, None, None),
                              d_step_sites=frozenset({(str(script), 2), (str(script), 3), (str(script), 4)}))
    patch = patching.make_patch((fixes.DETACH,), r, ctx, root=tmp_path)
    assert not patch.by_hand, patch.by_hand
    added = [line[1:] for line in patch.diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert added == ["fake_out = netD(fake.detach())", "both = netD(generator(z).detach())"], patch.diff
    ctx = dataclasses.replace(ctx, d_step_sites=frozenset({(str(script), 2)}))  # D's step on real images alone
    patch = patching.make_patch((fixes.DETACH,), r, ctx, root=tmp_path)
    assert not patch.diff and [name for name, _ in patch.by_hand] == [fixes.DETACH]


def test_freezing_d_applies_to_the_g_step_lines_only():
    """A call whose input carries G's gradients can be D's own step (WGAN-GP scripts that do not detach): only the
    line the diagnosis saw before G's optimizer step is frozen."""
    torch.manual_seed(0)
    g, d = G(), D()
    z = torch.randn(5, 8)
    g_step_line = sys._getframe().f_lineno + 5
    ctx = _ctx(g, d, frozenset({(os.path.abspath(__file__), g_step_line)}))
    with fixes.Applied((fixes.FREEZE_D,), ctx) as applied:
        fake, _ = g(z), d(z[:, :4])  # first calls run as written (the fixes take hold from the second)
        d_out = d(fake)  # D's step, not detached: must still train D
        g_out = d(fake)  # G's step
        torch.autograd.grad(d_out.sum(), list(d.parameters()))  # D's step has gradients for D
        g_out.sum().backward()
    assert applied.frozen_calls == 1
    assert all(p.grad is None for p in d.parameters()) and all(p.grad is not None for p in g.parameters())
    assert all(p.requires_grad for p in d.parameters())  # unfrozen after the call
    assert "forward" not in d.__dict__  # removed on exit


def test_logits_and_bf16_autocast_compute_the_same_loss_from_logits():
    torch.manual_seed(0)
    g, d = G(), D()
    z, target = torch.randn(6, 8), torch.ones(6, 1)
    expected = nn.BCELoss()(d(g(z)), target)
    with fixes.Applied((fixes.LOGITS, fixes.AUTOCAST), _ctx(g, d)):
        d(g(z))  # first calls run as written
        out = d(g(z))
        loss = nn.BCELoss()(out, target)
    # computed in bf16 (the cast back is in its graph), handed back in float32: a loss outside autocast sees one dtype
    assert isinstance(d.net[3], nn.Identity) and out.dtype == torch.float32
    assert type(out.grad_fn).__name__ == "ToCopyBackward0"
    assert abs(loss.item() - expected.item()) < 0.02, (loss, expected)
    assert nn.BCELoss.forward is not fixes._bce_from_logits  # undone


def test_autocast_hands_float32_outputs_to_a_loss_outside_it():
    """MSELoss (LSGAN, PyTorch-GAN's CGAN) on D's output beside a float32 target: before torch 2.14 its backward
    refused a bf16 input (pytorch/pytorch#36553), so the fix hands G's and D's outputs back in float32, as
    torch.autocast's documentation advises for tensors used outside the region; tuples of outputs too."""
    torch.manual_seed(0)
    g, d = G(), D()
    z, target = torch.randn(6, 8), torch.ones(6, 1)
    with fixes.Applied((fixes.AUTOCAST,), _ctx(g, d)):
        d(g(z))  # first calls run as written
        fake = g(z)
        out = d(fake)
        nn.MSELoss()(out, target).backward()
    assert fake.dtype == out.dtype == torch.float32 and all(p.grad is not None for p in g.parameters())
    from gantools.doctor.fixes.autocast import _float32
    assert _float32((torch.ones(1, dtype=torch.bfloat16), 3), torch.bfloat16)[0].dtype == torch.float32


def test_fp16_scales_each_loss_and_steps_through_one_scaler():
    """Where bf16 is not fast (a GPU before Ampere) autocast runs fp16 with a GradScaler; the same code path runs on a
    CPU with fp16 autocast."""
    torch.manual_seed(0)
    g, d = G(), D()
    seen = []
    with fixes.Applied((fixes.AUTOCAST,), _ctx(g, d, bf16=False), on_loss=seen.append) as applied:
        opt = torch.optim.Adam(d.parameters(), lr=1e-2)
        before = [p.detach().clone() for p in d.parameters()]
        d(g(torch.randn(4, 8)))  # first calls run as written
        for _ in range(3):
            opt.zero_grad()
            loss = d(g(torch.randn(4, 8))).float().mean()
            loss.backward()
            opt.step()
        grad = next(d.parameters()).grad
    assert applied.seen and len(seen) == 3 and all(abs(x.item()) < 10 for x in seen)  # seen before scaling
    # the scaler let the steps through
    assert any(not torch.equal(a, b) for a, b in zip(before, d.parameters(), strict=True))
    assert torch.isfinite(grad).all() and grad.abs().max() < 100  # unscaled before the step
    assert "backward" not in torch.Tensor.__dict__ or torch.Tensor.backward.__name__ == "backward"


def test_fp16_step_the_scaler_skips_still_ends_an_iteration():
    """An overflow makes GradScaler skip optimizer.step (no step hook runs): the trial's clock must still see the
    iteration end, or two iterations would be timed as one."""
    model = nn.Linear(4, 1)
    skipped, hooked = [], []
    post = register_optimizer_step_post_hook(lambda opt, a, k: hooked.append(opt))
    try:
        with fixes.Applied((fixes.AUTOCAST,), _ctx(G(), D(), bf16=False),
                           on_skipped_step=lambda opt, a, k: skipped.append(opt)):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            before = model.weight.detach().clone()
            (model(torch.randn(8, 4)).mean() * float("inf")).backward()  # inf gradients: this step is skipped
            opt.step()
            assert skipped == [opt] and hooked == [] and torch.equal(model.weight, before)
            opt.zero_grad()
            model(torch.randn(8, 4)).mean().backward()  # a clean one goes through the optimizer as usual
            opt.step()
            assert skipped == [opt] and hooked == [opt] and not torch.equal(model.weight, before)
    finally:
        post.remove()


def test_fp16_keeps_lr_schedulers_working_and_clips_unscaled_gradients():
    """A scheduler wraps optimizer.step (it needs a bound method); clip_grad_norm_ must see the gradients the
    optimizer will use, not the scaled ones (PyTorch's AMP recipe: unscale_ before clipping)."""
    torch.manual_seed(0)
    g, d = G(), D()
    norms = {}
    for fp16 in (False, True):
        torch.manual_seed(1)
        model = nn.Linear(4, 1)
        with fixes.Applied((fixes.AUTOCAST,) if fp16 else (), _ctx(g, d, bf16=False)):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            schedule = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            norms[fp16] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0))
            opt.step()
            schedule.step()
        assert opt.param_groups[0]["lr"] == 0.05
    assert norms[True] == pytest.approx(norms[False], rel=1e-3)  # unscaled before clipping


def test_optimizers_and_dataloaders_get_their_faster_settings_while_applied():
    ctx = _ctx(G(), D())
    ctx.workers = 2
    with fixes.Applied((fixes.FUSED, fixes.WORKERS), ctx):
        opt = torch.optim.Adam(G().parameters(), lr=1e-3)
        loader = torch.utils.data.DataLoader(list(range(8)), 4, True)
    assert opt.defaults["fused"] and loader.num_workers == 2 and loader.persistent_workers
    assert not torch.optim.Adam(G().parameters()).defaults["fused"]
    assert torch.utils.data.DataLoader(list(range(8))).num_workers == 0


def test_the_guard_rejects_non_finite_and_out_of_range_losses():
    best = [Trial((), "measured", [10, 10], [[0.7, 1.0], [0.6, 1.2]], 16) for _ in range(2)]
    assert trying.guard(best, [Trial((), "measured", [9, 9], [[0.65, 1.1], [0.62, 1.15]], 16)]) is None
    assert "non-finite" in trying.guard(best, [Trial((), "measured", [9], [[float("nan"), 1.0]], 16)])
    why = trying.guard(best, [Trial((), "measured", [9, 9], [[27.6, 1.0], [27.6, 1.1]], 16)])
    assert why.startswith("loss 1 of each iteration averaged 27.6, outside the 0.6 to 0.7"), why


def test_the_guard_compares_iterations_of_the_common_width():
    """A G step every 5 critic steps, restarted each epoch: an iteration of 2 critic losses and G's at the epoch's
    end beside iterations of 5 and G's. Every run shows both widths, so none changed the loop; the losses are held to
    the common width's range (the one short iteration per run spans no noise: met on an H200, where TF32's rounding
    of a bit-identical short iteration failed the guard), and a loss more per iteration is still rejected."""
    full, short = [0.5, 0.4, 0.5, 0.6, 0.5, 2.0], [0.5, 0.5, 3.0]
    best = [Trial((), "measured", [10] * 3, [full, short, [0.6, 0.5, 0.4, 0.5, 0.6, 2.2]], 16) for _ in range(2)]
    rounded = Trial((), "measured", [9] * 3, [full, [0.5, 0.5, 3.01], [0.6, 0.5, 0.4, 0.5, 0.6, 2.2]], 16)
    assert trying.guard(best, [rounded]) is None
    worse = Trial((), "measured", [9] * 3, [[0.5, 0.4, 0.5, 0.6, 0.5, 9.0], short, full], 16)
    assert trying.guard(best, [worse]).startswith("loss 6 of each iteration averaged 5.5"), trying.guard(best, [worse])
    more = Trial((), "measured", [9] * 3, [full + [1.0], short, full + [1.0]], 16)
    assert "changed how many losses" in trying.guard(best, [more])


def test_a_lazy_penalty_takes_the_gradient_every_16th_call_and_weights_its_backward_by_16():
    """--try's lazy penalty at the diagnosed line: the 1st and 17th calls give the true gradient, whose backward
    reaches D's weights 16 times as strong (as `16 * penalty` would); the calls between give zeros that train
    nothing, and a call from another line is left alone."""
    torch.manual_seed(0)
    d = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    x = torch.randn(3, 4, requires_grad=True)

    def penalty_grads():
        d.zero_grad()
        (grad,) = torch.autograd.grad(d(x).sum(), x, create_graph=True)  # the penalty's line
        grad.pow(2).sum().backward()
        return [p.grad.clone() if p.grad is not None else None for p in d.parameters()]
    every = penalty_grads()
    line = penalty_grads.__code__.co_firstlineno + 2
    ctx = fixes.Context("cpu", True, 0, None, None, None, penalty_sites=frozenset({(os.path.abspath(__file__), line)}))
    with fixes.Applied((LAZY,), ctx):
        lazy = [penalty_grads() for _ in range(17)]
        (elsewhere,) = torch.autograd.grad(d(x).sum(), x, create_graph=True)
    for i in (0, 16):  # (the last bias has no part in the gradient: none either way)
        assert all(a is b is None or torch.allclose(a, 16 * b) for a, b in zip(lazy[i], every, strict=True)), i
    assert sum(g is not None for g in every) == 3
    assert all(g is None or not g.any() for grads in lazy[1:16] for g in grads)
    assert elsewhere.requires_grad and elsewhere.abs().sum() > 0
    assert torch.autograd.grad.__module__ == "torch.autograd" and not hasattr(torch.autograd.grad, "__wrapped__")


def test_the_guard_holds_a_fix_that_changes_the_losses_by_design_to_finite_losses_as_many():
    best = [Trial((), "measured", [10, 10], [[0.7, 1.0], [0.6, 1.2]], 16) for _ in range(2)]
    lazier = [Trial((), "measured", [9, 9], [[0.2, 1.0], [0.1, 1.2]], 16)]  # D's loss without its penalty
    assert trying.guard(best, lazier).startswith("loss 1 of each iteration averaged 0.15")
    assert trying.guard(best, lazier, by_design=True) is None
    assert "non-finite" in trying.guard(best, [Trial((), "measured", [9], [[float("inf"), 1.0]], 16)], by_design=True)
    assert "how many losses" in trying.guard(best, [Trial((), "measured", [9], [[0.2]], 16)], by_design=True)
    assert fixes.by_name((LAZY,))[0].changes_losses and not fixes.by_name((fixes.FREEZE_D,))[0].changes_losses


class _Pairs:
    """A runner whose `pair` returns prepared rounds: (ms per iteration of the best so far, of the candidate, or
    "raised" where the candidate's run broke)."""

    def __init__(self, *rounds):
        self.rounds, self.calls = list(rounds), 0

    def pair(self, a, b, repeats):
        best, candidate = self.rounds[self.calls]
        self.calls += 1
        runs_a = [Trial(a, "measured", [ms], [[0.5]], 16) for ms in best]
        if candidate == "raised":
            return runs_a, [Trial(b, "raised", traceback="Traceback: boom")]
        return runs_a, [Trial(b, "measured", [ms], [[0.5]], 16) for ms in candidate]


class _Fix:
    name, title, parts, changes_losses = fixes.AUTOCAST, "autocast", (fixes.AUTOCAST,), ""


def test_a_close_call_runs_as_many_pairs_again_and_is_decided_on_all_of_them():
    runner = _Pairs(([10, 10, 10], [8, 11, 9]), ([10, 10, 10], [9, 8, 9]))  # lost one of 3, then won 3 of 3
    tried, start = trying._compare(runner, (), _Fix.parts, _Fix, 3)
    assert runner.calls == 2 and tried.outcome == "kept" and "5 of 6 repeats" in tried.why and len(start) == 6
    runner = _Pairs(([10, 10, 10], [8, 8, 9]))
    tried, start = trying._compare(runner, (), _Fix.parts, _Fix, 3)
    assert runner.calls == 1 and tried.outcome == "kept" and "all 3 repeats" in tried.why


def test_a_script_that_breaks_on_the_second_round_is_reported_with_the_first_rounds_runs():
    runner = _Pairs(([10, 10, 10], [8, 11, 9]), ([10], "raised"))
    tried, start = trying._compare(runner, (), _Fix.parts, _Fix, 3)
    assert runner.calls == 2 and tried.outcome == "broke the script" and tried.traceback == "Traceback: boom"
    assert len(start) == 3, "the start's runs of the first round: the broken round is not a measurement"


def test_a_penalty_under_compile_is_torch_refusing_not_a_gantools_bug():
    """aot_autograd's refusal of a double backward ends the compile fix as torch's refusal, even though the call
    passed through gantools' own backward wrapper on its way (the run's traceback names fixing.py)."""
    refused = Trial((), "raised", traceback="  File gantools/doctor/fixing.py ...\nRuntimeError: torch.compile with "
                                            "aot_autograd does not currently support double backward")
    refused.ours = True
    assert trying._failed(refused).startswith("torch refused: a compiled module cannot be differentiated twice")
    boom = Trial((), "raised", traceback="Traceback: boom")
    boom.ours = True
    assert "a gantools bug" in trying._failed(boom)


class _Meter:
    """Scores a run by the value its samples carry (the fake runner below puts it there)."""
    n = 1

    def score(self, samples):
        return {"fid": float(samples.flatten()[0])}


def test_the_fid_check_backs_off_the_last_kept_fix_past_the_seed_spread(monkeypatch):
    """The start scores 100 and 104 with its seeds moved (1.04x: inside 1.1x, so the limit stays 1.1x); both kept
    fixes together score 300, the first alone 105: the last one is backed off and the first stays."""
    from gantools.core import metrics

    seeds = []

    def run(parts, warmup=None, steps=None, seed_offset=0, samples=0):
        seeds.extend([seed_offset] if seed_offset else [])
        fid = 104.0 if seed_offset else 300.0 if fixes.FREEZE_D in parts else 105.0 if parts else 100.0
        return Trial(parts, "measured", [1.0], [[0.5]], 16, samples=torch.full((1, 1, 2, 2), fid))
    runner = trying._Runner(PLAIN, [], None, 0, 16, 1, 3, None)
    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(metrics, "quality_meter", lambda *a, **k: _Meter())
    result = trying.TryReport("train.py", "cpu", "cpu")
    result.tried = [trying.Tried(fixes.AUTOCAST, "autocast", (fixes.LOGITS, fixes.AUTOCAST), "kept", ""),
                    trying.Tried(fixes.FREEZE_D, "freeze", (fixes.FREEZE_D,), "kept", "")]
    report = doctor.DoctorReport("train.py", "cpu", models={"G": {"output_shape": [16, 1, 32, 32]}})
    q = trying.quality_check(runner, result, report, "glyphs", 64, lambda line: None)
    assert q["start_fid"] == 100 and q["seed_fid"] == 104 and q["limit"] == pytest.approx(1.1)
    assert q["backed_off"] == [fixes.FREEZE_D] and q["kept_fid"] == 105 and result.kept == [fixes.AUTOCAST]
    assert result.tried[1].outcome == "failed the guard" and "300.0" in result.tried[1].why
    assert "start with another seed 104.0 (1.04x apart)" in q["summary"]
    assert seeds == [1], "the second seed trains once, when the first judgement needs it"


def test_the_fid_check_trains_no_second_seed_when_the_kept_fixes_hold(monkeypatch):
    """The kept fix scores 105 against the start's 100 (1.05x, inside 1.1x): no decision needs a second seed."""
    from gantools.core import metrics

    runs = []

    def run(parts, warmup=None, steps=None, seed_offset=0, samples=0):
        runs.append((parts, seed_offset))
        fid = 105.0 if parts else 100.0
        return Trial(parts, "measured", [1.0], [[0.5]], 16, samples=torch.full((1, 1, 2, 2), fid))
    runner = trying._Runner(PLAIN, [], None, 0, 16, 1, 3, None)
    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(metrics, "quality_meter", lambda *a, **k: _Meter())
    result = trying.TryReport("train.py", "cpu", "cpu")
    result.tried = [trying.Tried(fixes.AUTOCAST, "autocast", (fixes.LOGITS, fixes.AUTOCAST), "kept", "")]
    report = doctor.DoctorReport("train.py", "cpu", models={"G": {"output_shape": [16, 1, 32, 32]}})
    q = trying.quality_check(runner, result, report, "glyphs", 64, lambda line: None)
    assert [offset for _, offset in runs] == [0, 0] and q["seed_fid"] is None and q["spread"] is None
    assert q["limit"] == pytest.approx(1.1) and q["kept_fid"] == 105 and q["backed_off"] == []
    assert result.kept == [fixes.AUTOCAST] and "no second seed of the start needed" in q["summary"]
    assert q["summary"].endswith("(1.05x; limit 1.10x): held")


@pytest.mark.slow
def test_the_fid_check_on_a_real_script_trains_the_start_again_with_moved_seeds_when_fid_rose(pngs, tmp_path):
    args = tiny(pngs, "--nc", "1")
    report = diagnose(TUTORIAL, args, tmp_path)
    runner = trying._Runner(TUTORIAL, args, fixes.context(report, CPU), trying.pacer_index(report),
                            report.images_per_step, 1, 3, 300)
    result = trying.TryReport(str(TUTORIAL), "cpu", "cpu")
    result.tried = [trying.Tried(fixes.FREEZE_D, "freeze", (fixes.FREEZE_D,), "kept", "")]
    from gantools.core import metrics

    shape = report.models["G"]["output_shape"]  # the meter quality_check builds: its classifier trained (and cached)
    metrics.quality_meter("glyphs", image_size=shape[-1], channels=shape[1], device=report.device)
    steps = Counter()  # optimizer -> its steps; the pacer's count is the run's iterations
    handle = register_optimizer_step_post_hook(lambda opt, a, k: steps.update([opt]))
    try:
        q = trying.quality_check(runner, result, report, "glyphs", 64, lambda line: None)
    finally:
        handle.remove()
    assert q["images"] == 64 and q["start_fid"] > 0 and q["kept_fid"] > 0
    rose = q["kept_fid"] / q["start_fid"] > 1.1 or q["backed_off"]
    runs = 3 if rose else 2  # the start, the kept fix, and the start's second seed only where FID rose past 1.1x
    assert len(steps) == 2 * runs and max(steps.values()) == 64 / report.images_per_step  # G and D each
    if rose:
        assert q["seed_fid"] != q["start_fid"]  # the script seeds itself: moved seeds trained another run
        assert q["spread"] >= 1 and q["limit"] == max(1.1, q["spread"])
    else:
        assert q["seed_fid"] is None and q["limit"] == pytest.approx(1.1)


# -- the whole loop ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_try_measures_each_fix_and_the_patch_holds_what_was_kept(pngs, tmp_path, plain_copy, capsys):
    out_json = tmp_path / "r.json"
    code = main(["doctor", "--steps", "3", "--warmup", "1", "--repeats", "2", "--json", str(out_json),
                 "--trace", str(tmp_path / "t.json"), "--patch", str(tmp_path / "fix.patch"),
                 str(plain_copy / "train.py"), *tiny(pngs)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    saved = json.loads(out_json.read_text())
    tried, kinds = saved["try"], [f["kind"] for f in saved["findings"]]
    names = [t["name"] for t in tried["tried"]]
    assert {fixes.AUTOCAST, fixes.FREEZE_D, fixes.WORKERS} <= set(names), printed
    assert fixes.DECODE_ONCE in names and "decode-per-item" in kinds, printed  # ImageFolder, deterministic transforms
    answers = {f.name: f.answers for f in fixes.FIXES}
    rank = [min(kinds.index(k) for k in answers[n] if k in kinds) for n in names]
    assert rank == sorted(rank), (names, kinds)  # tried in the order of the findings
    assert all(t["outcome"] in ("kept", "not faster", "too noisy") for t in tried["tried"]), printed
    assert all(t["speedup"] > 0 and len(t["spread"]) == 2 for t in tried["tried"])
    assert "not judged on this device (cpu): pinned memory" in printed
    patch = (tmp_path / "fix.patch").read_text()
    if set(tried["kept"]) - {fixes.DECODE_ONCE}:  # decode-once is run time only, never written to a patch
        assert tried["together"]["speedup"] > 0 and patch.startswith("--- a/train.py")
        assert f"apply it with: cd {plain_copy.resolve()} && git apply {tmp_path / 'fix.patch'}" in printed
        done = subprocess.run(["git", "apply", "--check", str(tmp_path / "fix.patch")], cwd=plain_copy,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr  # as printed, from the script's folder
    elif tried["kept"]:
        assert patch == "" and "which the doctor could not write" in printed
    else:
        assert patch == "" and "nothing kept" in printed


@pytest.mark.slow
def test_an_already_tuned_script_keeps_nothing_and_the_patch_is_empty(pngs, tmp_path, capsys):
    code = main(["doctor", "--steps", "3", "--warmup", "1", "--trace", str(tmp_path / "t.json"),
                 "--patch", str(tmp_path / "fix.patch"), str(TUTORIAL),
                 *tiny(pngs, "--preload", "--logits", "--bf16", "--no-item", "--freeze-d", "--fused",
                       "--channels-last")])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "[channels-last]" not in printed  # its models are channels_last: a batch fed NCHW runs in their layout
    assert "nothing kept" in printed and "is empty: no fix was kept" in printed
    assert (tmp_path / "fix.patch").read_text() == ""


@pytest.mark.slow
def test_a_fix_that_breaks_the_script_is_rejected_with_its_own_traceback_and_the_rest_go_on(pngs, tmp_path,
                                                                                          plain_copy):
    script = plain_copy / "train.py"
    text = script.read_text().replace("        D_x = output.mean().item()\n",
                                      "        D_x = output.mean().item()\n"
                                      "        assert output.min() >= 0, 'D must output probabilities'\n")
    script.write_text(text)
    report = diagnose(script, tiny(pngs), tmp_path)
    result = trying.try_fixes(script, tiny(pngs), report, CPU, warmup=1, steps=3, repeats=2)
    by_name = {t.name: t for t in result.tried}
    broke = by_name[fixes.AUTOCAST]  # logits out of D: the script's own assert fails
    assert broke.outcome == "broke the script"
    assert "AssertionError: D must output probabilities" in broke.traceback
    assert "train.py" in broke.traceback and "gantools" not in broke.traceback.replace(str(plain_copy), "")
    assert by_name[fixes.FREEZE_D].outcome in ("kept", "not faster", "too noisy")  # the loop went on
    assert "your script raised with it" in str(result)
    assert "(2+ paired repeats" in str(result), "the report states the repeats it ran, not the default"


SHAPES_OF_D = {  # D's class, and the source line its final Sigmoid is on
    "Appended": ("class Appended(nn.Module):\n    def __init__(self, sigmoid=True):\n        super().__init__()\n"
                 "        layers = [nn.Linear(2, 1)]\n        if sigmoid:\n            layers.append(nn.Sigmoid())\n"
                 "        self.main = nn.Sequential(*layers)\n"),
    "Listed": ("class Listed(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
               "        self.main = nn.Sequential(*[\n            nn.Linear(2, 1),\n"
               "            nn.Sigmoid(),\n        ])\n"),
    "Gated": ("class Gated(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              "        self.gate = nn.Sequential(nn.Linear(2, 2), nn.Sigmoid())  # squeeze-and-excitation: kept\n"
              "        self.head = nn.Sequential(\n            nn.Linear(2, 1),  # logit\n            nn.Sigmoid()\n"
              "        )\n"),
}


@pytest.mark.parametrize("cls", sorted(SHAPES_OF_D))
def test_d_loses_only_its_final_sigmoid_and_stays_valid_python(cls):
    source = "import torch.nn as nn\n\n\n" + SHAPES_OF_D[cls] + "\n\nclass G(nn.Module):\n    out = nn.Sigmoid()\n"
    plan = patching._Plan()
    plan.of(FileEdit).sigmoid_class = cls
    edited = patching.edit_source(source, plan)
    compile(edited, "edited.py", "exec")
    assert edited.count("nn.Sigmoid()") == source.count("nn.Sigmoid()") - 1  # one, D's last
    assert "class G(nn.Module):\n    out = nn.Sigmoid()" in edited
    if cls == "Appended":
        assert "if sigmoid:\n            pass" in edited and "append()" not in edited
    if cls == "Gated":
        assert "nn.Sequential(nn.Linear(2, 2), nn.Sigmoid())  # squeeze-and-excitation: kept" in edited
        assert "self.head = nn.Sequential(\n            nn.Linear(2, 1),  # logit\n        )" in edited


def test_keyword_edits_follow_what_runs():
    source = ("import torch\nfrom torch.nn.functional import binary_cross_entropy\nbce = torch.nn.BCELoss\n"
              "opt = torch.optim.Adam([], lr=1e-3, foreach=True)\n"
              "loader = torch.utils.data.DataLoader(\n    data,\n    batch_size=8,\n)\n"
              "old = torch.utils.data.DataLoader(data, 8, True, None, None, 0)\n"
              "loss = binary_cross_entropy(out, y)\n")
    plan = patching._Plan(keywords={4: ("Adam", {"fused": "True"}), 5: ("DataLoader", {"num_workers": "2"}),
                                    9: ("DataLoader", {"num_workers": "2"})})
    plan.of(FileEdit).rename = True
    edited = patching.edit_source(source, plan)
    compile(edited, "edited.py", "exec")
    assert "Adam([], lr=1e-3, fused=True)" in edited  # fused and foreach cannot both be True
    assert "    batch_size=8,\n    num_workers=2,\n)" in edited  # the call's own trailing-comma style
    assert "DataLoader(data, 8, True, None, None, 0)" in edited and "keywords:9" not in plan.done  # by hand
    assert "import binary_cross_entropy_with_logits" in edited and "= binary_cross_entropy_with_logits(out" in edited
    assert "bce = torch.nn.BCEWithLogitsLoss\n" in edited


def test_files_the_doctor_must_not_or_cannot_edit_are_listed_by_hand(tmp_path):
    """A library's class (torch's own file here) is never edited; a file libcst cannot parse is not a crash."""
    broken = tmp_path / "broken.py"
    broken.write_text("class Critic(:\n")
    ctx = fixes.Context("cpu", True, 0, None, ("Critic", 5), "out", bce=True)
    for file, said in ((broken, "cannot be read as Python source"), (nn.__file__, "a library's file, not yours")):
        report = doctor.DoctorReport(str(tmp_path / "train.py"), "cpu", complete=True)
        report.models = {"D": {"name": "critic", "class": "Critic", "defined_in": str(file), "call_sites": []}}
        patch = patching.make_patch((fixes.LOGITS,), report, ctx, root=tmp_path)
        assert patch.diff == "" and any(said in why for _, why in patch.by_hand), patch.by_hand


def test_freezing_around_a_return_is_left_to_do_by_hand():
    source = "def g_loss(fake):\n    return criterion(netD(fake), ones)\n"
    plan = patching._Plan()
    plan.of(FreezeEdit).sites[2] = "netD"
    assert patching.edit_source(source, plan) == source and "freeze:2" not in plan.done


def test_a_sigmoid_kept_as_an_attribute_comes_off_where_forward_calls_it(tmp_path):
    """D keeps its final Sigmoid as an attribute: the run-time fix swaps the module; the source edit takes its call
    off the value forward returns (the module, which holds no weights, stays), and switches the loss with it."""
    source = tmp_path / "gan.py"
    source.write_text("import torch\nimport torch.nn as nn\n\n\nclass Critic(nn.Module):\n    def __init__(self):\n"
                      "        super().__init__()\n        self.body = nn.Linear(4, 1)\n"
                      "        self.out = nn.Sigmoid()  # probabilities\n\n    def forward(self, x):\n"
                      "        return self.out(self.body(x))\n\n\ncritic = Critic()\nloss = nn.BCELoss()\n"
                      "err = loss(critic(torch.randn(2, 4)), torch.ones(2, 1))\n")
    report = doctor.DoctorReport(str(source), "cpu", complete=True)
    report.models = {"D": {"name": "critic", "class": "Critic", "defined_in": str(source),
                           "call_sites": [[str(source), _line_of(source, "err = loss(critic(")]]}}
    ctx = fixes.Context("cpu", True, 0, None, ("Critic", 5), "out", bce=True)
    patch = patching.make_patch((fixes.LOGITS,), report, ctx, root=tmp_path)
    assert not patch.by_hand, patch.by_hand
    assert "-        return self.out(self.body(x))\n+        return self.body(x)\n" in patch.diff
    assert "+loss = nn.BCEWithLogitsLoss()" in patch.diff and "self.out = nn.Sigmoid()  # probabilities" in patch.diff


def test_a_notebook_loop_gets_one_clear_line_not_a_wrong_try():
    report = doctor.DoctorReport("your loop", "cpu", complete=True)
    with pytest.raises(doctor.DoctorError, match="cannot be re-run by the doctor: export it as a script"):
        trying.try_fixes("your loop", [], report, CPU, warmup=1, steps=3)


# -- bad input ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where, said", [("missing-folder/fix.patch", "does not exist"),
                                         ("SCRIPT", "that is your script")])
def test_a_patch_path_that_cannot_be_written_is_refused_before_any_run(pngs, tmp_path, plain_copy, capsys, where,
                                                                       said):
    script = plain_copy / "train.py"
    target = script if where == "SCRIPT" else tmp_path / where
    code = main(["doctor", "--patch", str(target), str(script), *tiny(pngs)])
    captured = capsys.readouterr()
    assert code == 2 and said in captured.err and "Traceback" not in captured.err
    assert "Starting Training Loop" not in captured.out  # nothing ran
    assert script.read_text() == PLAIN.read_text()


def test_a_path_that_cannot_be_created_is_refused_before_any_run(pngs, tmp_path, plain_copy, capsys):
    """/proc takes no new files, not even from root (whom every permission check lets through)."""
    code = main(["doctor", "--patch", "/proc/gantools-fix.patch", str(plain_copy / "train.py"), *tiny(pngs)])
    captured = capsys.readouterr()
    assert code == 2 and "cannot be written here" in captured.err and "Starting Training Loop" not in captured.out


@pytest.mark.slow
def test_ctrl_c_during_try_prints_what_was_measured_and_writes_no_patch(pngs, tmp_path, plain_copy):
    target = tmp_path / "fix.patch"
    cmd = [sys.executable, "-m", "gantools", "doctor", "--steps", "3", "--warmup", "1", "--trace",
           str(tmp_path / "t.json"), "--patch", str(target), str(plain_copy / "train.py"), *tiny(pngs)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    out, deadline = "", time.monotonic() + 180
    try:
        while "trying " not in out and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 1)[0]:
                out += proc.stdout.readline()
        assert "trying " in out, out  # measuring has started
        time.sleep(1.5)  # inside a run of the script, or between two
        os.killpg(proc.pid, signal.SIGINT)
        rest, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    out += rest
    assert proc.returncode == 130, err
    assert "interrupted (Ctrl-C)" in out and "no patch written" in err and "Traceback" not in err
    assert "gantools doctor --try:" in out  # the report of what was measured before it, printed
    assert not target.exists() and not list(tmp_path.glob(".fix.patch*"))


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="torch < 2.9: one TF32 API")
def test_tf32_and_cudnn_fixes_work_whichever_tf32_api_the_process_used():
    """The fixes go through the trainer's `backend_flags`: after a script wrote the per-backend strings (the API
    torch's deprecation notice asks for), reading the legacy flags would raise instead of applying the fix."""
    from gantools.measuring.hardware import tf32_matmuls
    from gantools.core.process import ProcessSnapshot
    benchmark = torch.backends.cudnn.benchmark
    with ProcessSnapshot():
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        with fixes.Applied((fixes.CUDNN, fixes.TF32), _ctx(G(), D())):
            assert torch.backends.cudnn.benchmark and tf32_matmuls()
            assert torch.backends.cudnn.conv.fp32_precision == "tf32"
        assert torch.backends.cuda.matmul.fp32_precision == "ieee" == torch.backends.cudnn.conv.fp32_precision
        assert torch.backends.cudnn.benchmark == benchmark


@pytest.mark.parametrize("line, joins", [
    ("g_loss = adversarial_loss(validity, valid)", True),            # PyTorch-GAN's MSELoss criterion
    ("errD_real = criterion(output, label)", True),                  # the DCGAN tutorial's BCELoss
    ("loss = F.binary_cross_entropy_with_logits(output, label)", True),
    ("d_loss = (output + 1) / 2", True),                            # arithmetic on the outputs
    ("feat = vgg(output)", False),                                  # another network: its precision is not ours
    ("gp = torch.autograd.grad(outputs=output.sum(), inputs=x)[0]", False),
    ("D_x = output.mean().item()", False),                          # a logged value
    ("y = self.output + 1", False),                                 # an attribute, not the name
    ("y = f(output=3)", False),                                     # a keyword, not the name
    ("output2 = criterion(other, label)", False),                   # does not read the block's outputs
    ("loss = criterion(output, label); loss.backward()", False),   # not only assignments
], ids=lambda x: x if isinstance(x, str) else None)
def test_only_a_loss_of_the_wrapped_outputs_joins_the_autocast_block(line, joins):
    import libcst as cst
    from gantools.doctor.fixes.autocast import _loss_of
    assert _loss_of(cst.parse_statement(line + "\n"), {"output", "validity"}) is joins


def test_a_pair_alternates_stops_at_a_broken_candidate_and_raises_for_a_broken_start():
    from types import SimpleNamespace

    runner, calls = trying._Runner.__new__(trying._Runner), []

    def run(parts, warmup=None):
        calls.append((parts, warmup))
        return SimpleNamespace(measured=parts != ("broken",), images_per_sec=10.0 * (1 + len(parts)), rate=1.0,
                               outcome="raised", ours=False, traceback="", times_ms=[])

    runner.run, runner.warmup_for = run, lambda *runs: 7
    a, b = runner.pair((), ("x",), 3)
    assert calls == [((), 7), (("x",), 7), (("x",), 7), ((), 7), ((), 7), (("x",), 7)]
    assert [t.images_per_sec for t in a] == [10.0] * 3 and [t.images_per_sec for t in b] == [20.0] * 3
    calls.clear()
    a, b = runner.pair((), ("broken",), 3)
    assert [p for p, _ in calls] == [(), ("broken",)] and len(a) == 1 and not b[-1].measured
    with pytest.raises(trying.DoctorError, match="the run without the fixes being tried raised"):
        runner.pair(("broken",), ("x",), 2)
    with pytest.raises(trying.DoctorError):
        runner.pair(("broken",), ("broken",), 1)
