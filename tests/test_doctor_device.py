"""The autocast edit runs on the device the script chooses, wherever the patch was made: its device type is read from
the script's own device choice (`editing.scopes`), never the type the doctor measured on, and the losses stay in
float32 as the doctor's template computes them. All static or in-process, on tiny sources: a patch is applied and its
device type evaluated under `torch.cuda.is_available()` True and False."""
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from gantools import doctor
from gantools.doctor.patching import patch as patching
from gantools.doctor.fixes import catalogue as fixes

CGAN = Path(__file__).parent / "scripts" / "cgan_mlp.py"


@pytest.mark.parametrize("source, named", [
    ("import torch\ndevice = torch.device('cpu')\ndef main():\n    x = 1\n", "device.type"),  # the module's
    ("import torch\ndef main():\n    device = torch.device('cpu')\n    x = 1\n", "device.type"),
    ("import torch\ndef main(device):\n    x = 1\n", None),  # a parameter: a string, an index or None, perhaps
    ("import torch\ndevice = torch.device('cpu')\ndef main():\n    device = 'cpu'\n    x = 1\n",
     "torch.device(device).type"),  # a string: torch.device takes it, and .type drops "cuda:0"'s index
    ("import torch\ndevice = 'cuda:0' if torch.cuda.is_available() else 'cpu'\ndef main():\n    x = 1\n",
     "torch.device(device).type"),
    ("import torch\ndef setup():\n    device = torch.device('cpu')\ndef main():\n    x = 1\n", None),
    ("import torch\nclass T:\n    def __init__(self):\n        self.device = torch.device('cpu')\n"
     "    def main(self):\n        x = 1\n", "self.device.type"),  # a trainer class's attribute
    ("import torch\nclass T:\n    def __init__(self, device):\n        self.device = device\n"
     "    def main(self):\n        x = 1\n", None),
    ("import torch\ndevice = torch.device('cpu')\ndef main():\n    device: str = 'cpu'\n    x = 1\n", None),
    ("import torch\ndevice = torch.device('cpu')\ndef main():\n    for device in ['cpu']:\n        x = 1\n", None),
    ("import torch\ndef main():\n    x = 1\n    device = torch.device('cpu')\n", None),  # bound after the line
    ("import torch\ncuda = True if torch.cuda.is_available() else False\ndef main():\n    x = 1\n",
     '"cuda" if cuda else "cpu"'),  # PyTorch-GAN's flag
    ("import torch\ndef main(args):\n    use_cuda = not args.no_cuda and torch.cuda.is_available()\n    x = 1\n",
     '"cuda" if use_cuda else "cpu"'),
    ("import torch\ncuda = torch.cuda.is_available()\ndef main(cuda):\n    x = 1\n", None),  # shadowed
    ("import torch\ncuda = torch.cuda.is_available()\ncuda = False\ndef main():\n    x = 1\n", None),  # not a flag
    ("import torch\ndef main(real):\n    x = netD(real)\n", "real.device.type"),  # the tensor D computes on
    ("import torch\ndef main():\n    x = netD(real)\n    real = 1\n", None),  # bound after the line
    ("import torch\ndef main(real):\n    x = other(real)\n", None),  # not G or D
    ("import torch\ndef main(fake):\n    x = netD(fake.detach().view(-1))\n", "fake.device.type"),
    ("import torch\ndef main(real):\n    x = netD(real.to(device))\n", None),  # real is not where D computes
], ids=["module", "main", "parameter", "string", "string-choice", "another-function", "self-device",
        "self-device-parameter", "annotated", "loop-variable", "bound-after", "cuda-flag", "cuda-flag-and",
        "cuda-flag-shadowed", "cuda-rebound", "fed-tensor", "fed-tensor-after", "fed-tensor-not-a-model",
        "fed-tensor-detached", "fed-tensor-moved"])
def test_autocast_names_the_device_the_wrapped_line_sees_in_the_scripts_own_code(source, named):
    from gantools.doctor.editing.scopes import autocast_items
    line = next(i for i, x in enumerate(source.splitlines(), 1) if x.strip().startswith("x = "))
    item = autocast_items(source, [line], models=("netD", "netG"))[line]
    assert item == (f"torch.autocast({named}, dtype=torch.bfloat16)" if named else None)


def _report(script: Path, calls: dict) -> doctor.DoctorReport:
    """The diagnosis's facts the autocast edit reads, for a script: G's and D's names and the lines calling them."""
    path = str(script.resolve())
    text = script.read_text().splitlines()
    report = doctor.DoctorReport(str(script), "cpu", complete=True)
    report.models = {role: {"name": name, "class": cls, "parameters": 1, "defined_in": path,
                            "call_sites": [[path, n] for n, line in enumerate(text, 1)
                                           if re.search(rf"\b{name}\(", line) and "def " not in line]}
                     for role, (name, cls) in calls.items()}
    return report


def _patched(script: Path, report, folder: Path) -> Path:
    """A copy of the script in `folder`, its autocast patch (made on this CPU) applied with `patch -p1`."""
    ctx = fixes.Context("cpu", True, 0, ("Generator", 1), ("Discriminator", 1), None)  # made on this CPU
    patch = patching.make_patch((fixes.AUTOCAST,), report, ctx, root=script.parent)
    assert patch and not patch.by_hand, patch.by_hand
    copy = folder / script.name
    copy.write_text(script.read_text())
    done = subprocess.run(["patch", "-p1"], input=patch.diff, cwd=folder, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return copy


class _Entered(Exception):
    """Raised by the recording autocast: the patched script reached its first wrapped forward."""


@pytest.mark.parametrize("gpu", [True, False], ids=["on-a-gpu", "on-a-cpu"])
def test_a_patch_made_on_a_cpu_autocasts_on_the_device_the_script_picks(gpu, small_pngs, tmp_path, monkeypatch):
    """PyTorch-GAN's cGAN picks its device with `cuda = True if torch.cuda.is_available() else False`: its patch,
    made here on a CPU, run where CUDA is available (faked: `.cuda()` and the cuda tensor types made CPU ones), enters
    autocast for 'cuda', and for 'cpu' where it is not. Before, the patch wrote 'cpu' on both."""
    copy = _patched(CGAN, _report(CGAN, {"G": ("generator", "Generator"), "D": ("discriminator", "Discriminator")}),
                    tmp_path)
    seen = []

    def autocast(device_type, *args, **kwargs):
        seen.append(device_type)
        raise _Entered
    monkeypatch.setattr(torch, "autocast", autocast)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    if gpu:
        monkeypatch.setattr(nn.Module, "cuda", lambda self, device=None: self)
        monkeypatch.setattr(torch.cuda, "FloatTensor", torch.FloatTensor)
        monkeypatch.setattr(torch.cuda, "LongTensor", torch.LongTensor)
    monkeypatch.setattr(sys, "argv", [str(copy), "--dataroot", str(small_pngs), "--batch_size", "4", "--hidden",
                                      "4", "--latent_dim", "4", "--sample_interval", "0", "--n_epochs", "1"])
    with pytest.raises(_Entered):
        runpy.run_path(str(copy), run_name="__main__")
    assert seen == ["cuda" if gpu else "cpu"]


BEGAN = '''import torch
from torch import nn

torch.manual_seed(0)
generator, discriminator = nn.Linear(4, 8), nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 8))
real_imgs, z, k, gamma, lambda_k = torch.randn(16, 8), torch.randn(16, 4), 0.0, 0.75, 0.001
gen_imgs = generator(z)
d_loss_real = torch.mean(torch.abs(discriminator(real_imgs) - real_imgs))
d_loss_fake = torch.mean(torch.abs(discriminator(gen_imgs.detach()) - gen_imgs.detach()))
d_loss = d_loss_real - k * d_loss_fake
diff = torch.mean(gamma * d_loss_real - d_loss_fake)
k = k + lambda_k * diff.item()
'''


def test_the_autocast_edit_keeps_l1_losses_that_drive_a_control_variable_in_float32(tmp_path):
    """BEGAN's L1 losses (`torch.mean(torch.abs(D(x) - x))`, not in autocast's float32 list) feed its control
    variable k: the patch casts G's and D's outputs back to float32 (`.float()`), as the doctor's template and
    `--try`'s run-time fix do, so every loss and k are computed in float32, not bf16."""
    script, patched = tmp_path / "began.py", tmp_path / "patched"
    script.write_text(BEGAN)
    patched.mkdir()
    copy = _patched(script, _report(script, {"G": ("generator", "Generator"), "D": ("discriminator", "Discriminator")}),
                    patched)
    done = runpy.run_path(str(copy))
    assert [done[name].dtype for name in ("d_loss_real", "d_loss_fake", "d_loss", "diff")] == [torch.float32] * 4
    assert "with torch.autocast(z.device.type, dtype=torch.bfloat16):" in copy.read_text()  # the tensor G is fed


def test_tries_autocast_on_the_device_the_models_are_on():
    """`--try` wraps G's and D's forward in autocast for the device their parameters are on, whatever the context
    says: here a context claiming CUDA, and the CPU model's inner Linear still runs in bf16 (autocast on 'cuda' would
    leave this CPU model in fp32)."""
    g, d = nn.Sequential(nn.Linear(4, 4)), nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 1))
    ctx = fixes.Context("cuda", True, 0, ("Sequential", 20), ("Sequential", 19), None)
    dtypes = []
    d[0].register_forward_hook(lambda m, args, out: dtypes.append(out.dtype))
    with fixes.Applied((fixes.AUTOCAST,), ctx):
        d(g(torch.randn(2, 4)))  # first sight: wrapped from the next call on
        out = d(g(torch.randn(2, 4)))
    assert dtypes[-1] == torch.bfloat16 and out.dtype == torch.float32


TWO_HEADS = '''import torch
from torch import nn


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.adv, self.aux = nn.Linear(8, 4), nn.Linear(4, 1), nn.Linear(4, 3)

    def forward(self, x):
        h = self.body(x)
        return self.adv(h), self.aux(h)


generator, discriminator = nn.Linear(4, 8), Discriminator()
z = torch.randn(16, 4)
gen_imgs = generator(z)
validity, label = discriminator(gen_imgs)
aux = discriminator(gen_imgs)[1]
'''


def test_a_two_headed_ds_tuple_is_left_whole_under_autocast(tmp_path):
    """The float32 cast is for one tensor: D's output unpacked into heads, or indexed, is left as written (a tuple has
    no `.float()`), and the patched script still runs."""
    script, patched = tmp_path / "acgan.py", tmp_path / "patched"
    script.write_text(TWO_HEADS)
    patched.mkdir()
    copy = _patched(script, _report(script, {"G": ("generator", "Generator"), "D": ("discriminator", "Discriminator")}),
                    patched)
    done = runpy.run_path(str(copy))
    text = copy.read_text()
    assert "    gen_imgs = generator(z).float()\n" in text and "    validity, label = discriminator(gen_imgs)\n" in text
    assert "    aux = discriminator(gen_imgs)[1]\n" in text and done["validity"].shape == (16, 1)
