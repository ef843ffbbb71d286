"""The CUDA syncs the doctor's Tensor-method patches cannot see (`.to("cpu")`, a boolean mask, GradScaler's own
reads, `torch.cuda.synchronize()`), placed on your line. No GPU here: PyTorch's sync debug mode is stood in for (its
warning, raised where the synchronizing call returns to Python, is raised by hand), and torch's own code by functions
compiled under torch's folder, so that their frames are torch's as GradScaler.step's are. A synchronizing op with
no Python frame of torch's between it and your line (`x.to("cpu")`, `x[mask]`) warns in your frame: as
`warnings.warn(SYNC_WARNING)` called on that line does."""
import os
import sys
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from gantools import doctor

from gantools.measuring import hardware
from gantools.doctor.findings import rules
from gantools.doctor.watching.hooks import Hooks
from gantools.doctor.watching.observations import Observations
from gantools.doctor.watching.syncs import SYNC_WARNING, SyncWatch

from conftest import BatchFreeD, BatchFreeG
from test_doctor_rules import A100, report

HERE = os.path.basename(__file__)


def torch_code(source: str, name: str):
    """`name` from `source` compiled as a file in torch's folder: its frames are torch's, not yours."""
    namespace = {"warnings": warnings, "SYNC_WARNING": SYNC_WARNING}
    exec(compile(source, os.path.join(os.path.dirname(torch.__file__), "amp", "stand_in.py"), "exec"), namespace)
    return namespace[name]


# GradScaler.step reads found_inf with .item() inside torch: the read's warning comes from torch's frames
GradScaler = torch_code("class GradScaler:\n    def step(self):\n        warnings.warn(SYNC_WARNING)\n", "GradScaler")


@pytest.fixture
def sync_mode(monkeypatch):
    """torch.cuda's sync debug mode and synchronize, without a GPU: the mode set is recorded, synchronize is a
    no-op that could be told from the real one."""
    modes = [0]
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: modes[-1])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: modes.append(mode))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    return modes


def test_a_sync_is_placed_on_the_line_of_your_code_that_made_it(sync_mode):
    obs = Observations()
    hooks = Hooks(obs)
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = shown = lambda message, *a, **k: seen.append(str(message))
        watch = SyncWatch(obs, hooks).start()
        assert sync_mode[-1] == "warn"
        GradScaler().step(); scaler_line = sys._getframe().f_lineno  # noqa: E702
        warnings.warn(SYNC_WARNING, stacklevel=1); op_line = sys._getframe().f_lineno  # noqa: E702
        torch.cuda.synchronize(); explicit_line = sys._getframe().f_lineno  # noqa: E702
        hardware.synchronize(torch.device("cuda"))  # gantools' own: not yours
        hooks.in_sync = True
        warnings.warn(SYNC_WARNING, stacklevel=1)  # a read the Tensor-method patches counted already
        hooks.in_sync = False
        warnings.warn("something else", stacklevel=1)  # not a sync: passed on
        watch.stop()
        assert sync_mode[-1] == 0 and warnings.showwarning is shown  # the mode and showwarning put back
        warnings.warn(SYNC_WARNING, stacklevel=1)  # after stop: not counted
    w = obs.window
    assert w.syncs == {f"{_here()}:{scaler_line}": 1, f"{_here()}:{op_line}": 1, f"{_here()}:{explicit_line}": 1}
    assert w.sites[f"{_here()}:{scaler_line}"] == ("GradScaler().step(); scaler_line = sys._getframe().f_lineno  "
                                                  "# noqa: E702", "GradScaler.step")
    assert w.sites[f"{_here()}:{op_line}"][1] == "a synchronizing op"
    assert w.sites[f"{_here()}:{explicit_line}"][1] == "torch.cuda.synchronize"
    assert w.located == 3
    assert seen == ["something else", SYNC_WARNING]  # others reach the previous showwarning, and after stop ours too


def _here() -> str:
    from gantools.doctor.watching.frames import shown
    return shown(__file__)


@pytest.mark.filterwarnings(f"ignore:{SYNC_WARNING}")  # the stand-ins warn outside the profiled window too
def test_the_doctor_reports_the_syncs_torch_makes_for_your_loop(glyphs64, sync_mode, monkeypatch):
    """End to end, with the sync watch forced on (it watches CUDA devices only): GradScaler's read and a
    synchronizing op, once each per iteration, are host syncs of your code, FILE:LINE and per iteration."""
    monkeypatch.setattr(SyncWatch, "wanted", staticmethod(lambda device: True))
    torch.manual_seed(0)
    G, D = BatchFreeG(), BatchFreeD()
    opt_g, opt_d = torch.optim.Adam(G.parameters()), torch.optim.Adam(D.parameters())
    bce, scaler, lines = nn.BCEWithLogitsLoss(), GradScaler(), {}

    def train_step(batch):
        real = batch[0].float() / 127.5 - 1
        fake = G(torch.randn(real.shape[0], 8))
        out_real, out_fake = D(real), D(fake.detach())
        loss_d = bce(out_real, torch.ones_like(out_real)) + bce(out_fake, torch.zeros_like(out_fake))
        opt_d.zero_grad()
        loss_d.backward()
        scaler.step(); lines["scaler"] = sys._getframe().f_lineno  # noqa: E702
        opt_d.step()
        out = D(fake)
        loss_g = bce(out, torch.ones_like(out))
        opt_g.zero_grad()
        loss_g.backward()
        warnings.warn(SYNC_WARNING, stacklevel=1); lines["op"] = sys._getframe().f_lineno  # noqa: E702
        opt_g.step()

    r = doctor.run(train_step, DataLoader(glyphs64, batch_size=16), steps=2, warmup=1)
    sites = {s["where"]: s for s in r.sync_sites}
    assert sites[f"{_here()}:{lines['scaler']}"]["method"] == "GradScaler.step"
    assert sites[f"{_here()}:{lines['scaler']}"]["per_step"] == 1 and sites[f"{_here()}:{lines['op']}"]["per_step"] == 1
    assert r.host_syncs_per_step == 2 and "host-sync" in r.kinds()
    assert sync_mode[-1] == 0  # the debug mode put back


def test_the_host_sync_finding_names_what_each_kind_of_wait_needs():
    """The finding lists the sites the profiler and the sync watch found beside the value reads, and the change
    says what removes each kind (a GradScaler's read, an explicit synchronize), and what was not located."""
    sites = [{"where": "train.py:80", "code": "scaler.step(optimizerD)", "method": "GradScaler.step", "per_step": 1.0},
             {"where": "train.py:91", "code": "torch.cuda.synchronize()", "method": "torch.cuda.synchronize",
              "per_step": 1.0},
             {"where": "train.py:95", "code": "fake = fake[keep]", "method": "a synchronizing op", "per_step": 1.0},
             {"where": "elsewhere", "code": "", "method": "not located", "per_step": 1.0}]
    r = report("cuda:0", host_syncs_per_step=4.0, device_busy_ms=50.0, sync_sites=sites)
    found = rules.host_sync(r, A100)
    assert found is not None and "waits for the device 4 times per iteration" in found.title
    assert "train.py:80 `scaler.step(optimizerD)` (GradScaler.step, 1/it)" in found.seen
    assert "elsewhere (not located, 1/it)" in found.seen
    assert "bfloat16" in found.change and "torch.cuda.synchronize()" in found.change
    assert "torch.where" in found.change
    reads = report("cuda:0", host_syncs_per_step=2.0, device_busy_ms=50.0,
                   sync_sites=[{"where": "train.py:60", "code": "loss.item()", "method": "item", "per_step": 2.0}])
    only_reads = rules.host_sync(reads, A100)
    assert "reads values from the device 2 times" in only_reads.title and "GradScaler" not in only_reads.change


def test_where_the_sync_debug_mode_cannot_be_set_the_watch_stays_off(monkeypatch):
    def refuse(mode):
        raise RuntimeError("Found no NVIDIA driver on your system")
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", refuse)
    synchronize, showwarning = torch.cuda.synchronize, warnings.showwarning
    watch = SyncWatch(Observations(), Hooks(Observations())).start()
    assert torch.cuda.synchronize is synchronize and warnings.showwarning is showwarning
    watch.stop()  # nothing to put back
    assert torch.cuda.synchronize is synchronize
