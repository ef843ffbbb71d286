"""The doctor's logits edit keeps the math. For each shape of D in tests/scripts whose probabilities go into BCE (an
nn.Sigmoid closing an nn.Sequential or appended to its layers, `torch.sigmoid` on what forward returns, `F.sigmoid` as
a plain function's last line), the edit the doctor shows, applied, trains on the same losses and prints the same D(x),
D(G(z)) and accuracy as the script as written, to rounding, on the same batch from the same seed. Where it cannot make
all of the edit, it shows none (nor autocast, which BCE on probabilities refuses on CUDA) and lists the lines to
change by hand."""
import contextlib
import io
import random
import re
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from gantools import doctor
from gantools.core.data import write_glyph_pngs
from gantools.doctor.diagnosis import analysis
from gantools.doctor.fixes import catalogue as fixes
from gantools.doctor.patching import patch as patching
from gantools.doctor.findings import rules
from gantools.doctor.diagnosis.analysis import machine_facts
from gantools.doctor.editing import logits

from conftest import BatchFreeG

SCRIPTS = Path(__file__).parent / "scripts"
PLAIN, TUTORIAL = SCRIPTS / "dcgan_plain.py", SCRIPTS / "dcgan_tutorial.py"
VANILLA, FUNCTIONAL = SCRIPTS / "vanilla_gan_main.py", SCRIPTS / "vanilla_gan_functional.py"
IN_FORWARD, HELPER = SCRIPTS / "sigmoid_in_forward.py", SCRIPTS / "bce_helper.py"
ACGAN, ADV_LAYER = SCRIPTS / "acgan.py", SCRIPTS / "dcgan_adv_layer.py"
DESCRIBED = {PLAIN: ("netD", "main.11", None), TUTORIAL: ("netD", "main.11", None),  # D's name, its Sigmoid, output
             ACGAN: ("discriminator", "adv_layer.1", 0), ADV_LAYER: ("discriminator", "adv_layer.1", None)}
CPU = machine_facts(torch.device("cpu"))
LOGGED = re.compile(r"(D\(x\)|D\(G\(z\)\)|D accuracy): ([-\d.]+)(?: / ([-\d.]+))?")
pytestmark = pytest.mark.usefixtures("one_thread", "steady_doctor")


def flags(script, pngs, epochs: int) -> list:
    """Tiny networks; `epochs` of the images in `pngs` (the functional script: that many iterations of 16)."""
    if script in (PLAIN, TUTORIAL):
        return ["--dataroot", str(pngs), "--workers", "0", "--batch-size", "16", "--ngf", "8", "--ndf", "8",
                "--nz", "16", "--epochs", str(epochs)]
    if script == FUNCTIONAL:
        return ["--dataroot", str(pngs), "--iters", str(epochs), "--batch-size", "16", "--img-size", "16",
                "--z-dim", "16", "--hidden", "32"]
    if script in (ACGAN, ADV_LAYER):
        return ["--dataroot", str(pngs), "--batch_size", "16", "--latent_dim", "16", "--img_size", "16",
                "--sample_interval", "0", "--n_epochs", str(epochs)]
    return ["--dataroot", str(pngs), "--batch-size", "16", "--img-size", "16", "--nz", "16", "--hidden", "32",
            "--epochs", str(epochs)]


def described(script: Path) -> doctor.DoctorReport:
    """What a diagnosis of a DCGAN script says of its D (test_doctor.py, test_doctor_try.py and, for a two-headed D,
    `test_a_two_headed_d_is_seen_to_make_one_output_with_its_sigmoid` check it on a run): its name, class
    Discriminator, the nn.Sigmoid whose output it returns (of a tuple, which output: `DESCRIBED`), called where the
    loop writes `name(`."""
    path = str(script.resolve())
    name, sigmoid, output = DESCRIBED[script]
    called = re.compile(rf"\s+\S.*[=(] ?{name}\(")  # a statement of the loop, not the docstring
    calls = [n for n, line in enumerate(script.read_text().splitlines(), 1) if called.match(line)]
    report = doctor.DoctorReport(str(script), "cpu", complete=True)
    report.models = {"D": {"name": name, "class": "Discriminator", "parameters": 1, "defined_in": path,
                           "call_sites": [[path, n] for n in calls]}}
    report.settings = {"d_final_sigmoid": sigmoid, "d_sigmoid_output": output,
                       "loss_ops_per_iteration": {"aten::binary_cross_entropy": 3.0}}
    return report


@pytest.fixture(scope="module")
def shown_edit(small_pngs, tmp_path_factory, steady_doctor):
    """The sigmoid-bce finding's edit of a script: from the doctor's diagnosis where it takes a second or two, else
    made from the diagnosis's facts (`described`) the same way (`patching.make_patch` of the logits fix)."""
    edits, traces = {}, tmp_path_factory.mktemp("traces")

    def get(script):
        if script not in edits:
            if script in DESCRIBED:
                report = described(script)
                edits[script] = patching.make_patch(fixes.parts_for("sigmoid-bce", fixes.context(report, CPU)),
                                                    report, fixes.context(report, CPU)).diff
            else:
                report = doctor.run_script(script, flags(script, small_pngs, 400), steps=3, warmup=1,
                                           trace=traces / f"{script.stem}.json")
                (finding,) = [f for f in report.findings if f.kind == "sigmoid-bce"]
                assert not finding.by_hand, finding.by_hand
                edits[script] = finding.patch
        return edits[script]
    return get


def run_once(script: Path, args: list) -> tuple:
    """One run of a script in this process, seeded: the losses it called backward() on, in order, and what it
    printed."""
    losses, backward, out = [], torch.Tensor.backward, io.StringIO()

    def recorded(self, *a, **k):
        losses.append(self.item())
        return backward(self, *a, **k)
    argv = sys.argv
    try:
        torch.Tensor.backward, sys.argv = recorded, [str(script), *args]
        random.seed(0), np.random.seed(0), torch.manual_seed(0)
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(script), run_name="__main__")
    finally:
        torch.Tensor.backward, sys.argv = backward, argv
    return losses, out.getvalue()


@pytest.fixture(scope="module")
def both(shown_edit, tmp_path_factory):
    """A script as written and with the shown edit applied (`patch -p1`), each run for one iteration on one batch of
    16 images from the same seeds: (losses, printed) before and after."""
    runs, one_batch = {}, write_glyph_pngs(tmp_path_factory.mktemp("one_batch"), n=16, image_size=32, channels=3,
                                           seed=1)

    def get(script):
        if script not in runs:
            diff = shown_edit(script)
            folder = tmp_path_factory.mktemp(script.stem)
            edited = folder / re.search(r"^\+\+\+ b/(.+)$", diff, re.M).group(1)
            edited.parent.mkdir(parents=True, exist_ok=True)
            edited.write_text(script.read_text())
            applied = subprocess.run(["patch", "-p1"], input=diff, cwd=folder, capture_output=True, text=True)
            assert applied.returncode == 0, applied.stdout + applied.stderr
            args = flags(script, one_batch, 1)
            runs[script] = run_once(script, args), run_once(edited, args), edited.read_text()
        return runs[script]
    return get


@pytest.mark.parametrize("script", [PLAIN, TUTORIAL, VANILLA, FUNCTIONAL, IN_FORWARD, HELPER, ACGAN, ADV_LAYER],
                         ids=["sequential", "appended", "in-main", "plain-function", "torch-sigmoid-in-forward",
                              "loss-helper", "two-headed", "head-moved-with-cuda"])
def test_the_shown_logits_edit_trains_on_the_same_losses(both, script):
    """D's sigmoid gone with the BCE on probabilities: BCE on logits, the same loss (a sigmoid left in D, or one
    loss not switched, would not be)."""
    (losses, _), (edited_losses, _), edited = both(script)
    assert not re.search(r"BCELoss\(|binary_cross_entropy\(", edited), edited
    assert len(losses) == len(edited_losses) >= 2, (losses, edited_losses)
    assert edited_losses == pytest.approx(losses, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("script", [PLAIN, TUTORIAL, IN_FORWARD, HELPER],
                         ids=["sequential", "appended", "torch-sigmoid-in-forward", "loss-helper"])
def test_what_the_script_logs_of_d_keeps_its_meaning(both, script):
    """D(x), D(G(z)) and D's accuracy (`p > 0.5`), read from D's output for the log, are read through a sigmoid in the
    edit: every number printed is the one printed before, to its last digit's rounding."""
    (_, printed), (_, edited_printed), _ = both(script)
    before, after = LOGGED.findall(printed), LOGGED.findall(edited_printed)
    assert before and [b[0] for b in before] == [a[0] for a in after], (printed, edited_printed)
    values = [float(v) for x in before for v in x[1:] if v]
    assert all(0 <= v <= 1 for v in values), printed  # probabilities, as written
    assert [float(v) for x in after for v in x[1:] if v] == pytest.approx(values, abs=1.5e-4)


def test_the_plain_function_d_loses_its_last_line_sigmoid_not_g(shown_edit):
    """The bug this rule had: the losses switched while D, a plain function ending in `y = F.sigmoid(...)`, kept its
    sigmoid. G also ends in F.sigmoid (its images): only D's goes."""
    diff = shown_edit(FUNCTIONAL)
    assert "-    y = F.sigmoid(h @ Why + bhy.repeat(h.size(0), 1))\n+    y = h @ Why + bhy.repeat(h.size(0), 1)" in diff
    assert diff.count("+    D_loss_") == 2 and "+    G_loss = F.binary_cross_entropy_with_logits(D_fake" in diff
    assert "X = F.sigmoid(h @ Whx" not in diff


def test_a_loss_helper_is_switched_once_and_its_own_read_of_d_goes_through_a_sigmoid(shown_edit):
    """The loss is computed in `adversarial_loss(pred, target)`, which every call (positional or `pred=`) hands D's
    output: the BCE inside it switches once, D's nn.Sigmoid goes, and the mean the helper returns for the log is read
    through a sigmoid; the calls themselves stay as they are."""
    diff = shown_edit(HELPER)
    assert "+criterion = nn.BCEWithLogitsLoss()" in diff and diff.count("+criterion") == 1
    assert "+    return criterion(pred.view(-1), target), pred.sigmoid().mean()" in diff
    assert "nn.Linear(hidden, 1))" in diff and "adversarial_loss(D(" not in diff


HELPER_SOURCE = ("import torch\nimport torch.nn.functional as F\nfrom torch import nn\n\n\n"
                 "class Critic(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                 "        self.body = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\n\n"
                 "    def forward(self, x):\n        return self.body(x)\n\n\n"
                 "def loss_fn(pred, target):\n    return F.binary_cross_entropy(pred, target)\n\n\n"
                 "critic = Critic()\nx, y = torch.randn(8, 4), torch.ones(8, 1)\nloss = loss_fn(critic(x), y)\n")
BY_HAND = {  # D's sigmoid or its loss in a form the doctor does not follow: (source, the lines to list)
    "sigmoid-in-the-loop": ("import torch\nimport torch.nn.functional as F\nfrom torch import nn\n\n\n"
                            "class Critic(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                            "        self.body = nn.Linear(4, 1)\n\n    def forward(self, x):\n"
                            "        return self.body(x)\n\n\ncritic = Critic()\n"
                            "x, y = torch.randn(8, 4), torch.ones(8, 1)\n"
                            "p = torch.sigmoid(critic(x))\nloss = F.binary_cross_entropy(p, y)\n",
                            ("p = torch.sigmoid(critic(x))", "loss = F.binary_cross_entropy(p, y)")),
    "criterion-passed-on": ("import torch\nfrom torch import nn\n\n\nclass Critic(nn.Module):\n"
                            "    def __init__(self):\n        super().__init__()\n"
                            "        self.body = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\n\n"
                            "    def forward(self, x):\n        return self.body(x)\n\n\n"
                            "def step(critic, loss_fn, x):\n    return loss_fn(critic(x), torch.ones(8, 1))\n\n\n"
                            "critic = Critic()\ncriterion = nn.BCELoss()\n"
                            "loss = step(critic, criterion, torch.randn(8, 4))\n",
                            ("criterion = nn.BCELoss()", "self.body = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())")),
    "loss-helper-fed-another-value": (HELPER_SOURCE + "smooth = loss_fn(torch.full((8, 1), 0.9), y)\n",
                                      ("return F.binary_cross_entropy(pred, target)",
                                       "smooth = loss_fn(torch.full((8, 1), 0.9), y)",
                                       "self.body = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())")),
    "loss-helper-passed-on": (HELPER_SOURCE + "losses = [loss_fn]\n",
                              ("return F.binary_cross_entropy(pred, target)", "loss = loss_fn(critic(x), y)")),
}


@pytest.mark.parametrize("case", sorted(BY_HAND))
def test_an_edit_the_doctor_cannot_make_whole_is_not_shown_and_its_lines_are_listed_by_hand(case, tmp_path):
    source, listed = BY_HAND[case]
    script = tmp_path / "train.py"
    script.write_text(source)
    lines = [line.strip() for line in source.splitlines()]
    calls = [n for n, line in enumerate(lines, 1) if "critic(x)" in line]
    report = doctor.DoctorReport(str(script), "cpu", complete=True)
    report.models = {"D": {"name": "critic", "class": "Critic", "parameters": 5, "defined_in": str(script),
                           "call_sites": [[str(script), n] for n in calls]}}
    report.settings = {"d_final_sigmoid": "body.1" if "Sigmoid()" in source else None,
                       "loss_ops_per_iteration": {"aten::binary_cross_entropy": 1.0}}
    report.findings = [rules.sigmoid_bce(report, CPU)]
    analysis._in_your_code(report, CPU)
    (finding,) = report.findings
    assert finding.patch == "" and "cannot make all of it" in finding.by_hand, finding.by_hand
    text = str(finding)
    assert "your lines, before (-) and after (+)" not in text and "   by hand:" in text
    for line in listed:
        assert f"train.py:{lines.index(line) + 1}: {line}" in text, text
    patch = patching.make_patch((fixes.LOGITS,), report, fixes.context(report, CPU), root=tmp_path)
    assert patch.diff == "" and [fix for fix, _ in patch.by_hand] == [fixes.LOGITS]
    amp = patching.make_patch((fixes.LOGITS, fixes.AUTOCAST), report, fixes.context(report, CPU), root=tmp_path)
    assert amp.diff == "" and [fix for fix, _ in amp.by_hand] == [fixes.LOGITS, fixes.AUTOCAST]  # BCE refuses it


class TwoHeads(nn.Module):
    """PyTorch-GAN's ACGAN D in miniature: the adversarial head's nn.Sequential ends in nn.Sigmoid, the auxiliary
    head's (registered last: D's last module) in nn.Softmax; forward returns both."""

    def __init__(self, size=32, classes=10):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 4, 4, 2, 1), nn.LeakyReLU(0.2), nn.Flatten())
        self.adv_layer = nn.Sequential(nn.Linear(4 * (size // 2) ** 2, 1), nn.Sigmoid())
        self.aux_layer = nn.Sequential(nn.Linear(4 * (size // 2) ** 2, classes), nn.Softmax(dim=1))

    def forward(self, x):
        out = self.body(x)
        return self.adv_layer(out), self.aux_layer(out)


def test_a_two_headed_d_is_seen_to_make_one_output_with_its_sigmoid(glyphs64):
    """D's last module is the auxiliary head's Softmax; the Sigmoid that makes the output BCE takes is found by the
    output it made (D.adv_layer.1, output 0), named so in the finding, and swapped at run time by the logits fix."""
    torch.manual_seed(0)
    G, D = BatchFreeG(), TwoHeads()
    opt_g, opt_d = torch.optim.Adam(G.parameters()), torch.optim.Adam(D.parameters())
    bce, ce = nn.BCELoss(), nn.CrossEntropyLoss()

    def train_step(batch):
        real, labels = batch[0].float() / 127.5 - 1, batch[1]
        ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)
        fake = G(torch.randn(real.shape[0], 8))
        real_pred, real_aux = D(real)
        fake_pred, _ = D(fake.detach())
        opt_d.zero_grad()
        (bce(real_pred, ones) + bce(fake_pred, zeros) + ce(real_aux, labels)).backward()
        opt_d.step()
        validity, _ = D(fake)
        opt_g.zero_grad()
        bce(validity, ones).backward()
        opt_g.step()

    report = doctor.run(train_step, DataLoader(glyphs64, batch_size=16, shuffle=True), steps=2, warmup=1)
    s = report.settings
    assert (s["d_last_module"], s["d_final_sigmoid"], s["d_sigmoid_output"]) == ("Softmax", "adv_layer.1", 0)
    (finding,) = [f for f in report.findings if f.kind == "sigmoid-bce"]
    assert "D's output 0 comes from nn.Sigmoid (D.adv_layer.1" in finding.seen, finding.seen
    with fixes.Applied((fixes.LOGITS,), fixes.context(report, CPU)):
        D(torch.zeros(2, 1, 32, 32))
    assert isinstance(D.adv_layer[1], nn.Identity) and isinstance(D.aux_layer[1], nn.Softmax)


TWO_HEADS = ("import torch\nfrom torch import nn\n\n\nclass Critic(nn.Module):\n    def __init__(self):\n"
             "        super().__init__()\n        self.adv = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\n"
             "        self.aux = nn.Sequential(nn.Linear(4, 3), nn.Sigmoid())\n\n    def forward(self, x):\n"
             "        validity = self.adv(x)\n        return validity, self.aux(x)\n\n\n"
             "torch.manual_seed(0)\ncritic = Critic()\ncriterion = nn.BCELoss()\nif torch.cuda.is_available():\n"
             "    criterion.cuda()\nx, y = torch.randn(8, 4), torch.ones(8, 1)\n")
UNPACKED = "p, attrs = critic(x)\nloss = criterion(p, y) + attrs.mean()\nloss.backward()\n"


def two_heads(tmp_path, loop: str):
    """A two-headed D (both heads end in nn.Sigmoid, the auxiliary one last) and `loop`, as a script; what the run
    saw of it: the Sigmoid that makes output 0, adv.1."""
    script = tmp_path / "train.py"
    script.write_text(TWO_HEADS + loop)
    calls = [n for n, line in enumerate(script.read_text().splitlines(), 1) if "critic(x)" in line]
    report = doctor.DoctorReport(str(script), "cpu", complete=True)
    report.models = {"D": {"name": "critic", "class": "Critic", "parameters": 20, "defined_in": str(script),
                           "call_sites": [[str(script), n] for n in calls]}}
    report.settings = {"d_final_sigmoid": "adv.1", "d_sigmoid_output": 0,
                       "loss_ops_per_iteration": {"aten::binary_cross_entropy": 1.0}}
    return script, report


def test_a_two_headed_ds_edit_takes_the_sigmoid_off_its_head_and_reads_that_head_through_one(tmp_path):
    """Only the head the BCE takes loses its Sigmoid (not the auxiliary head's, the last one the class builds), the
    criterion moved with .cuda() is followed, and the head's value printed is read through a sigmoid: the loss and
    the printed numbers are the script's own."""
    script, report = two_heads(tmp_path, UNPACKED + "print(f'{p.mean().item():.6f} {attrs.mean().item():.6f}')\n")
    ctx = fixes.context(report, CPU)
    diff = patching.make_patch((fixes.LOGITS,), report, ctx, root=tmp_path).diff
    assert "+        self.adv = nn.Sequential(nn.Linear(4, 1))\n" in diff, diff
    assert "-        self.aux" not in diff and "+criterion = nn.BCEWithLogitsLoss()" in diff
    assert "+print(f'{p.sigmoid().mean().item():.6f} {attrs.mean().item():.6f}')" in diff
    edited = tmp_path / "edited"
    edited.mkdir()
    (edited / "train.py").write_text(script.read_text())
    applied = subprocess.run(["patch", "-p1"], input=diff, cwd=edited, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    (losses, printed), (edited_losses, edited_printed) = run_once(script, []), run_once(edited / "train.py", [])
    assert edited_losses == pytest.approx(losses, rel=1e-5) and printed == edited_printed


@pytest.mark.parametrize("loop", ["loss = criterion(critic(x)[0], y)\n",
                                  "out = critic(x)\nloss = criterion(out[0], y)\n"], ids=["indexed", "held-whole"])
def test_a_two_headed_d_read_other_than_unpacked_is_listed_by_hand_with_its_heads_sigmoid(tmp_path, loop):
    script, report = two_heads(tmp_path, loop)
    edit = logits.logits_edit(report, fixes.context(report, CPU))
    assert edit.why_not and not edit.files
    text = edit.by_hand()
    for line in ("self.adv = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())    # D's nn.Sigmoid() that makes its "
                 "output 0", "criterion = nn.BCELoss()    # switch to nn.BCEWithLogitsLoss"):
        assert line in text, text
    assert "self.aux" not in text and "passed on" not in text


def test_the_fixes_try_kept_on_a_dcgan_whose_loss_moves_with_cuda_are_written_into_the_patch():
    """The bug: `--try` kept autocast with logits on PyTorch-GAN's DCGAN (`adversarial_loss.cuda()` under `if cuda:`,
    read as the loss passed on), then wrote an empty patch. Both are written, nothing left by hand."""
    report = described(ADV_LAYER)
    patch = patching.make_patch((fixes.LOGITS, fixes.AUTOCAST), report, fixes.context(report, CPU))
    assert not patch.by_hand, patch.by_hand
    assert "+adversarial_loss = torch.nn.BCEWithLogitsLoss()" in patch.diff
    assert "+        self.adv_layer = nn.Sequential(nn.Linear(128 * ds_size ** 2, 1))" in patch.diff
    assert patch.diff.count("with torch.autocast(") == 2, patch.diff  # G's step; D's two lines in one block


def test_a_kept_fix_the_patch_cannot_write_is_named_never_no_fix_kept():
    """`--patch` after `--try` kept fixes: an empty diff names the kept fixes it could not write (their lines are
    listed above it); "no fix was kept" only where --try kept none."""
    empty = patching.Patch(by_hand=[(fixes.LOGITS, "by hand: train.py:3: ...")])
    line = patching.patch_line("fix.diff", empty, (fixes.LOGITS, fixes.AUTOCAST))
    assert "no fix was kept" not in line and "autocast" in line and "logits" in line and "by hand" in line
    assert "no fix was kept" in patching.patch_line("fix.diff", patching.Patch(), ())


def test_torch_sigmoid_on_one_head_of_a_two_headed_d_comes_off_that_head(tmp_path):
    """No nn.Sigmoid module made D's output (the run names none): the head is the value the losses unpack, and the
    `torch.sigmoid` forward puts on it comes off; a loss built and moved in one line (`nn.BCELoss().to(...)`) is
    followed."""
    source = TWO_HEADS.replace("nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())", "nn.Linear(4, 1)").replace(
        "validity = self.adv(x)", "validity = torch.sigmoid(self.adv(x))").replace(
        "criterion = nn.BCELoss()", "criterion = nn.BCELoss().to('cpu')")
    script, report = two_heads(tmp_path, UNPACKED)
    script.write_text(source + UNPACKED)
    report.settings.update(d_final_sigmoid=None, d_sigmoid_output=None)
    patch = patching.make_patch((fixes.LOGITS,), report, fixes.context(report, CPU), root=tmp_path)
    assert not patch.by_hand, patch.by_hand
    assert "-        validity = torch.sigmoid(self.adv(x))\n+        validity = self.adv(x)\n" in patch.diff
    assert "+criterion = nn.BCEWithLogitsLoss().to('cpu')" in patch.diff and "-        self.aux" not in patch.diff
