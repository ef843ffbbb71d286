"""The host budget: what an iteration asks of the device, counted exactly on this CPU (measuring.host_budget,
speed.iteration_budget), the ladder's counts pinned, and the lean step's math unchanged."""
import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from gantools.measuring.host_budget import counting

sys.path.insert(0, str(Path(__file__).parent))
import budget_pins  # noqa: E402
import step_fingerprint  # noqa: E402

CPU = torch.device("cpu")


def test_each_kind_of_op_is_sorted_where_a_gpu_would_spend_it():
    host_step, on_device = torch.tensor(3.0), torch.tensor(2.0)
    net = nn.Linear(4, 2)
    with counting(CPU, host_tensors=[host_step], as_on_gpu=True) as budget:
        x = torch.randn(8, 4)            # a launch
        x.view(2, 16).t()                # two views
        torch.empty(3)                   # an allocation: no kernel
        on_device.item()                 # on a GPU: the host waits for the device
        host_step.item()                 # a host tensor by design: a read, no wait
        with torch.autocast("cpu", dtype=torch.bfloat16):
            net(x)                       # weight, bias and input cast: three autocast casts
            x.to(torch.bfloat16)         # the user's own cast: a launch, not autocast's
        with torch.profiler.record_function("a label"):  # annotations are not counted
            pass
    assert budget.totals["syncs"] == 1 and budget.totals["cpu_reads"] == 1
    assert budget.totals["views"] >= 2 and budget.totals["allocations"] == 1
    assert budget.totals["autocast_casts"] == 3
    assert budget.totals["launches"] == 1 + 3 + 1 + 1  # randn, the casts, the matmul, the explicit cast
    assert not any(op.startswith("_record_function") for _, op, _ in budget.sites)


def test_on_its_own_device_a_read_of_a_cpu_tensor_is_a_sync_only_where_the_device_is_another():
    t = torch.tensor(1.0)
    with counting(CPU) as on_cpu:
        t.item()
    assert on_cpu.totals["syncs"] == 1  # counted as run on the CPU: no GPU to say otherwise
    with counting(torch.device("cuda"), as_on_gpu=False) as on_gpu:
        t.item()  # a CPU tensor read while training on CUDA: a host read
    assert on_gpu.totals["cpu_reads"] == 1 and on_gpu.totals["syncs"] == 0


def test_each_op_is_traced_to_the_line_that_asked_for_it():
    with counting(CPU) as budget:
        torch.zeros(2).add_(1)
    sites = budget.where("launches")
    assert {op for op, _, _ in sites} == {"zeros", "add_"}
    assert all(line.startswith("test_host_budget.py:") for _, line, _ in sites)


@pytest.fixture(scope="module")
def pinned_and_counted(tmp_path_factory):
    return json.loads(budget_pins.FILE.read_text()), budget_pins.pins(tmp_path_factory.mktemp("budgets"))


def test_the_ladder_s_host_budgets_are_pinned_and_a_change_names_the_line_that_moved_them(pinned_and_counted):
    pinned, counted = pinned_and_counted
    assert list(counted) == list(pinned)
    moved = []
    for row, now in counted.items():
        before = pinned[row]["sites"]
        for site in sorted(set(before) | set(now["sites"])):
            if before.get(site, 0) != now["sites"].get(site, 0):
                moved.append(f"{row}: {site}: {before.get(site, 0)} -> {now['sites'].get(site, 0)}")
    assert not moved, ("the step's host budget changed (if meant, run `python tests/budget_pins.py`):\n"
                       + "\n".join(moved))
    assert {row: now["counts"] for row, now in counted.items()} == {row: p["counts"] for row, p in pinned.items()}


def test_gantools_own_device_data_step_launches_at_most_160_ops_with_no_sync_and_no_host_read(pinned_and_counted):
    lean = pinned_and_counted[1][budget_pins.LEAN]["counts"]
    assert lean["launches"] <= 160 and lean["syncs"] == 0 and lean["cpu_reads"] == 0
    reference = pinned_and_counted[1]["device-resident data"]["counts"]  # the tutorial's loop, its data on the device
    assert reference["cpu_reads"] == 48  # foreach Adam's step counters: two reads per parameter per step
    assert reference["syncs"] == 4       # its .item() calls, asked for (sync_every_step)


def test_fused_adam_and_dropping_the_per_step_item_each_remove_what_they_should(pinned_and_counted):
    counts = {row: c["counts"] for row, c in pinned_and_counted[1].items()}
    reference = counts["reference (tutorial loop)"]
    assert counts["fused Adam"]["cpu_reads"] == 0 < reference["cpu_reads"]
    assert counts["fused Adam"]["launches"] < reference["launches"]
    assert counts["no per-step .item()"]["syncs"] == 0 < reference["syncs"]
    assert counts["D frozen in G step"]["launches"] < reference["launches"]  # no weight gradients for D in G's step
    assert counts["bf16 autocast"]["autocast_casts"] > 0 == reference["autocast_casts"]


@pytest.mark.usefixtures("one_thread")  # as the fingerprints were written: one thread sums in one order
@pytest.mark.parametrize("case", list(step_fingerprint.CASES))
def test_the_lean_step_trains_to_the_same_losses_and_weights_as_before(case, tmp_path):
    """tests/data/step_fingerprints.json holds what the step left before it was made lean (written by
    tests/step_fingerprint.py from that code): each step's logged losses and every weight's sum and norm after a few
    seeded steps. Float tolerance: another CPU may round differently, and bf16 rounds coarsely."""
    before = json.loads(step_fingerprint.FILE.read_text())[case]
    now = step_fingerprint.fingerprint(case, tmp_path)
    rel = 2e-3 if step_fingerprint.CASES[case][1].get("precision") == "bf16" else 1e-4
    assert len(now["logged"]) == len(before["logged"])
    for step, (values, expected) in enumerate(zip(now["logged"], before["logged"], strict=True)):
        assert values == pytest.approx(expected, rel=rel, abs=10 * rel), f"step {step + 1}"
    for name, (total, norm) in before["weights"].items():
        assert now["weights"][name][1] == pytest.approx(norm, rel=rel, abs=1e-6), name
        assert now["weights"][name][0] == pytest.approx(total, abs=rel * max(norm, 1.0)), name


@pytest.mark.slow  # compiles twice
def test_compiled_rows_at_two_batch_sizes_in_one_process_are_counted_and_never_recompile(tmp_path):
    """Each call site compiles a function of its own (`builders.own_call`, dynamic=False): D in D's step and in G's,
    real and fake images alike in dtype and layout, and a second trainer at twice the batch (the ladder's max
    throughput row) with graphs of its own."""
    from gantools.core.config import preset
    from gantools.speed.bench import SIZES
    from gantools.speed.iteration_budget import budget_of

    base = preset("default", **SIZES["tiny"], loader="device", compile="default", device="cpu", precision="bf16",
                  channels_last=True, freeze_d=True)
    first = budget_of(base.replace(out_dir=str(tmp_path / "a")), iterations=1)
    second = budget_of(base.replace(batch_size=2 * base.batch_size, out_dir=str(tmp_path / "b")), iterations=1)
    # a compiled config's ops are counted on its eager networks, as a GPU would run it, its graphs beside them
    assert first["as_on"] == "cuda" and first["counted"] == "eager" and first["launches"] > 0
    assert first["syncs"] == first["cpu_reads"] == 0
    assert first["recompiles"] == second["recompiles"] == 0
    assert first["graph_breaks"] == second["graph_breaks"] == 0
    assert first["compiled_graphs"] == second["compiled_graphs"] >= 3  # G, D in D's step, D in G's step
