"""The doctor on loops that use torch.compile: graphs compiled again after the warm-up (a preview through the compiled
G under `no_grad`) and graph breaks (a logged `.item()` inside compiled code) are findings with dynamo's own reasons,
and the doctor's own hooks, which dynamo guards, are never blamed on the loop. The models compile with dynamo's
"eager" backend: dynamo's guards and breaks are the same, and no C++ compiler is needed."""
import itertools
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import gantools
from gantools import doctor
from gantools.doctor.findings.compile import graph_breaks, recompiles
from gantools.doctor.watching.hooks import SYNC_METHODS
from gantools.doctor.findings.report import DoctorReport

from conftest import BatchFreeD, BatchFreeG

pytestmark = pytest.mark.usefixtures("one_thread", "steady_doctor")


def compiled_loop(preview_at=None, log_item=False):
    """A plain GAN step over compiled G and D; `preview_at`: the call that also samples through the compiled G in
    eval mode under no_grad; `log_item`: D's loss read with .item() inside a compiled function (printed as it is,
    or formatted in an f-string with "f-string")."""
    torch.manual_seed(0)
    G, D = BatchFreeG(), BatchFreeD()
    cG, cD = torch.compile(G, backend="eager"), torch.compile(D, backend="eager")
    opt_g, opt_d = torch.optim.Adam(G.parameters()), torch.optim.Adam(D.parameters())
    bce = nn.BCEWithLogitsLoss()
    calls = [0]

    def d_loss(real, fake):
        out_real, out_fake = cD(real), cD(fake)
        loss = bce(out_real, torch.ones_like(out_real)) + bce(out_fake, torch.zeros_like(out_fake))
        if log_item == "f-string":
            print(f"D loss {loss.item():.3f}")
        elif log_item:
            print("D loss", loss.item())
        return loss

    d_loss_fn = torch.compile(d_loss, backend="eager") if log_item else d_loss

    def train_step(batch):
        real = batch[0].float() / 127.5 - 1
        fake = cG(torch.randn(real.shape[0], 8))
        loss_d = d_loss_fn(real, fake.detach())
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        out = cD(fake)
        loss_g = bce(out, torch.ones_like(out))
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
        calls[0] += 1
        if calls[0] == preview_at:
            cG.eval()
            with torch.no_grad():
                cG(torch.randn(4, 8))
            cG.train()

    return train_step


def test_a_compiled_loop_that_keeps_its_graphs_gets_no_compile_finding(glyphs64):
    report = doctor.run(compiled_loop(), DataLoader(glyphs64, batch_size=16), steps=2, warmup=2)
    assert report.complete and report.settings["compiler"]["graphs"] >= 3
    assert report.settings["compiler"]["recompiles_after_warmup"] == 0  # the doctor's hooks are not blamed
    memory = report.settings["memory"]  # a CPU's op-by-op count would make dynamo skip the compiled frames
    assert memory["peak_mb"] is None and "activations" not in memory["parts_mb"]
    assert "torch.compile" in memory["left_out"]
    assert not {"recompiles", "graph-breaks"} & set(report.kinds())


def test_a_preview_through_the_compiled_g_is_a_recompile_with_its_guard_and_fix(glyphs64):
    # call 4 is a profiled iteration (warm-up 1, the profiler's warm-up 1, then 2 profiled)
    report = doctor.run(compiled_loop(preview_at=4), DataLoader(glyphs64, batch_size=16), steps=2, warmup=1)
    finding = next(f for f in report.findings if f.kind == "recompiles")
    assert report.settings["compiler"]["recompiles_after_warmup"] >= 1
    assert "grad_mode" in finding.seen and "_orig_mod" in finding.change and finding.estimated_speedup is None
    assert finding.notebook == "09_compiler"


def test_a_recompile_in_the_profilers_warm_up_iteration_counts_too(glyphs64):
    report = doctor.run(compiled_loop(preview_at=2), DataLoader(glyphs64, batch_size=16), steps=2, warmup=1)
    assert report.settings["compiler"]["recompiles_after_warmup"] >= 1 and "recompiles" in report.kinds()


def test_an_item_inside_compiled_code_is_a_graph_break_with_dynamos_reason(glyphs64, capsys):
    report = doctor.run(compiled_loop(log_item=True), DataLoader(glyphs64, batch_size=16), steps=2, warmup=1)
    finding = next(f for f in report.findings if f.kind == "graph-breaks")
    assert report.settings["compiler"]["graph_breaks"] >= 1 and "item()" in finding.seen
    assert "fullgraph=True" in finding.change
    # D is called only inside compiled code in D's step, so its optimizer first looks like a network written as a
    # function: the doctor's torch function mode comes off once D is seen, and its own traces are not your loop's
    compiler = report.settings["compiler"]
    assert not any("function_mode_stack" in reason for reason in compiler["recompile_reasons"])
    assert not any("sourceless" in reason for reason in compiler["break_reasons"])


def _raised(run) -> type | None:
    try:
        run()
    except Exception as e:  # what dynamo does to the loop is the question, whatever it is
        return type(e)
    return None


def test_an_f_string_of_a_read_in_compiled_code_fares_as_it_does_without_the_doctor(glyphs64, capsys):
    """`f"{loss.item():.3f}"` in a compiled function: dynamo decides, not the doctor's value-read patches. Where dynamo
    fails to format the float it made symbolic once the value changed (pytorch/pytorch#197093, torch 2.14), the
    doctor raises that same error of the user's line and leaves no patch behind; where dynamo copes, it completes."""
    loader = DataLoader(glyphs64, batch_size=16)
    plain_step = compiled_loop(log_item="f-string")
    torch._dynamo.reset()  # both runs compile `d_loss` afresh: one code object, one cache
    plain = _raised(lambda: [plain_step(batch) for batch in itertools.islice(itertools.cycle(loader), 3)])
    assert "D loss " in capsys.readouterr().out  # the user's f-string ran at least once
    torch._dynamo.reset()
    methods = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS}
    if plain is None:
        report = doctor.run(compiled_loop(log_item="f-string"), loader, steps=2, warmup=1)
        assert report.complete and report.settings["compiler"]["graph_breaks"] >= 1
    else:
        with pytest.raises(plain) as raised:
            doctor.run(compiled_loop(log_item="f-string"), loader, steps=2, warmup=1)
        user_code = str(raised.value).partition("from user code:")[2]
        package = str(Path(gantools.__file__).parent)  # no frame of gantools' own code (the checkout may be named so)
        assert 'print(f"D loss {loss.item():.3f}")' in user_code and package not in user_code
    assert "D loss " in capsys.readouterr().out
    assert {name: getattr(torch.Tensor, name) for name in SYNC_METHODS} == methods


def test_each_failed_guard_gets_the_change_that_keeps_it():
    report = DoctorReport(source="loop", device="cpu")
    report.settings["compiler"] = {"recompiles_after_warmup": 3, "iterations_after_warmup": 9, "graphs": 5,
                                   "graph_breaks": 0, "break_reasons": [],
                                   "recompile_reasons": ["1/0: tensor 'x' size mismatch at index 0. expected 128, "
                                                         "actual 96", "2/0: std == 0.1"]}
    finding = recompiles(report, None)
    assert "3 recompile(s) in the 9 iterations" in finding.seen and "0.33 per iteration" in finding.seen
    assert "drop_last=True" in finding.change and "torch.tensor(value" in finding.change
    assert "_orig_mod" not in finding.change and graph_breaks(report, None) is None
    report.settings["compiler"] = None  # a run that never finished its timed window: nothing to say
    assert recompiles(report, None) is None and graph_breaks(report, None) is None
