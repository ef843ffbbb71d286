"""The doctor's host budget of a loop it did not write (`watching.host_count`): the launches, syncs and host reads of a
few of its iterations, counted after the profiled ones with the doctor's hooks off. On this CPU reads are sorted as a
GPU would run the loop: an `.item()` of a loss is a sync, Adam's step counters (kept on the host) are host reads. A
loop that runs compiled code is not counted, and says so; nothing stays installed, whenever the loop ends."""
from pathlib import Path

import pytest
import torch
from torch.overrides import _len_torch_function_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode

from gantools import doctor
from gantools.doctor.watching.host_count import COST, COUNTED

from conftest import BatchFreeD, BatchFreeG

TUTORIAL = Path(__file__).parent / "scripts" / "dcgan_tutorial.py"
pytestmark = pytest.mark.usefixtures("one_thread", "steady_doctor")


def tutorial(pngs, *flags):
    return ["--dataroot", str(pngs), "--batch-size", "16", "--ngf", "8", "--ndf", "8", "--nz", "16", "--epochs", "50",
            *flags]


@pytest.fixture(scope="module")
def counted(pngs, tmp_path_factory):
    """The tutorial's script as written (`.item()` of its losses every iteration) and with `--no-item`, each
    diagnosed, in a process with no compiled code cached (earlier tests compile; the doctor then counts nothing)."""
    torch._dynamo.reset()
    out = tmp_path_factory.mktemp("host-budget")
    return {name: doctor.run_script(TUTORIAL, tutorial(pngs, *flags), steps=1, warmup=1, trace=out / f"{name}.json")
            for name, flags in (("item", ()), ("no item", ("--no-item",)))}


def nothing_installed() -> bool:
    return _get_current_dispatch_mode() is None and _len_torch_function_stack() == 0


def test_a_loop_that_reads_its_losses_every_iteration_syncs_and_one_that_does_not_never_does(counted):
    item, quiet = counted["item"].host_budget, counted["no item"].host_budget
    for budget in (item, quiet):
        assert budget["launches"] > 0 and budget["iterations"] == COUNTED and budget["as_on"] == "cuda"
        assert budget["cpu_reads"] > 0  # Adam's step counters: on the host on a GPU too, read without a wait
    assert item["syncs"] > 0 and quiet["syncs"] == 0 and not quiet["sync_sites"]
    assert all(site["where"].startswith("dcgan_tutorial.py:") for site in item["sync_sites"])
    assert nothing_installed()


def test_the_report_prints_the_count_and_writes_it_to_json(counted):
    report = counted["item"]
    b = report.host_budget
    line = (f"  host budget: {b['launches']:g} launches, {b['syncs']:g} syncs and {b['cpu_reads']:g} host reads an "
            f"iteration ({COST})")
    assert line in str(report).splitlines()
    assert report.to_dict()["host_budget"] == {**b, "sync_sites": [dict(s) for s in b["sync_sites"]]}


def test_a_batch_s_loading_is_left_out_of_the_count(glyphs64):
    """A DataLoader without workers collates in your process, and a new epoch draws its seed: loading, which the
    data wait measures, not what the step asks of the device. Counted over an epoch's end, the count is the
    step's alone, the same whatever the loader does."""
    from torch.utils.data import DataLoader

    def budget(loader):
        torch.manual_seed(0)
        g, d = BatchFreeG(), BatchFreeD()
        opt_g, opt_d = torch.optim.Adam(g.parameters()), torch.optim.Adam(d.parameters())

        def step(batch):
            real = batch[0].float() / 127.5 - 1
            loss_d = d(real).mean() - d(g(torch.randn(real.shape[0], 8)).detach()).mean()
            opt_d.zero_grad()
            loss_d.backward()
            opt_d.step()
            loss_g = -d(g(torch.randn(real.shape[0], 8))).mean()
            opt_g.zero_grad()
            loss_g.backward()
            opt_g.step()
        return doctor.run(step, loader, steps=1, warmup=1).host_budget

    torch._dynamo.reset()
    # 4 batches an epoch: the counted iterations (4 and 5) cross into a new epoch
    collated = budget(DataLoader(glyphs64, batch_size=16, shuffle=True))
    ready = budget([(glyphs64.images[i:i + 16], glyphs64.labels[i:i + 16]) for i in range(0, 64, 16)])
    assert collated["syncs"] == 0 and collated == ready


def test_a_compiled_loop_is_not_counted_and_says_why(glyphs64):
    from torch.utils.data import DataLoader

    g, d = BatchFreeG(), BatchFreeD()
    cg = torch.compile(g, backend="eager")
    opt_g, opt_d = torch.optim.Adam(g.parameters()), torch.optim.Adam(d.parameters())

    def step(batch):
        real = batch[0].float() / 127.5 - 1
        loss_d = d(real).mean() - d(cg(torch.randn(real.shape[0], 8)).detach()).mean()
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        loss_g = -d(cg(torch.randn(real.shape[0], 8))).mean()
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()

    report = doctor.run(step, DataLoader(glyphs64, batch_size=16), steps=1, warmup=1)
    assert report.complete and set(report.host_budget) == {"skipped"}
    assert "host budget: not counted: torch.compile has compiled code" in str(report)
    assert report.unprofiled_step_time_ms > 0 and nothing_installed()  # timed as ever, right after the profiled


def test_a_loop_that_ends_while_counted_leaves_nothing_installed(glyphs64):
    torch._dynamo.reset()
    g, d = BatchFreeG(), BatchFreeD()
    opt = torch.optim.Adam([*g.parameters(), *d.parameters()])
    batches = iter([glyphs64.images[:16]] * (1 + 1 + 1 + 1))  # warm-up, profiler warm-up, profiled, one counted

    def step(real):
        loss = d(g(torch.randn(real.shape[0], 8))).mean() - d(real.float()).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    with doctor.watch(steps=1, warmup=1) as doc:
        for real in doc.data(batches):
            step(real)
            doc.end_step()
    assert not doc.report.complete and doc.report.host_budget is None and nothing_installed()
