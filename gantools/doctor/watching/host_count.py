"""The host budget of your loop (`measuring.host_budget`): every op a few of its iterations dispatch, sorted into
kernel launches, syncs (a read that waits for the device) and host reads (a read of a tensor kept on the host), per
iteration. A GPU runs a small GAN's kernels in microseconds each, and the host needs about as long to issue each
one, so past a few hundred launches an iteration the GPU waits for Python: a count a CPU can take exactly.

The `Schedule` counts `COUNTED` iterations right after the profiled ones, with the doctor's hooks off (as for the
timed ones), so what is counted is your loop's own ops; a batch's loading (`Hooks.fetch`: a DataLoader without
workers collating in your process) is left out, as its cost is the data wait's. On a CPU reads are sorted as a GPU
would run the loop (`as_on_gpu`): a read of a tensor that would be on the GPU is a sync there, a read of an
optimizer's step counter (kept on the host by torch) is not. Never where torch.compile has compiled code in this
process: under a dispatch mode dynamo skips a compiled frame, for good (pytorch/pytorch#190286)."""
from __future__ import annotations

import contextlib

import torch

from ...measuring.compile_counts import compiled_code_cached
from ...measuring.host_budget import HostBudget, counting
from ...speed.iteration_budget import _host_steps
from .observations import Observations

COUNTED = 2  # iterations counted: a read every other iteration shows at its rate
COMPILED = ("not counted: torch.compile has compiled code in this process, and under the counting dispatch mode "
            "dynamo would skip it for good (pytorch/pytorch#190286)")
COST = "on a GPU each launch costs the host a few microseconds; at small batch sizes the GPU waits for them"


class HostCount:
    """Counting on (`start`), paused around a batch's loading (`paused`), off (`stop`), across iteration marks."""

    def __init__(self, obs: Observations):
        self.obs = obs
        self.counter: counting | None = None
        self.as_on_gpu = False

    def why_not(self) -> str | None:
        """Why this loop's ops cannot be counted, or None."""
        if any(m.compiled for m in self.obs.models.values()) or compiled_code_cached():
            return COMPILED
        return None

    def start(self, device: torch.device) -> None:
        self.as_on_gpu = device.type == "cpu"
        host = _host_steps(*(o.opt for o in self.obs.optimizers.values()))
        self.counter = counting(device, host, as_on_gpu=self.as_on_gpu)
        self.counter.__enter__()

    @contextlib.contextmanager
    def paused(self):
        """A block whose ops are not counted: a batch's loading."""
        counter = self.counter
        if counter is None:
            yield
            return
        counter.__exit__(None, None, None)
        try:
            yield
        finally:
            counter.__enter__()

    def stop(self, iterations: int = 0) -> dict | None:
        """Counting off; the count of `iterations` whole iterations as the report's `host_budget`, or None (none
        asked: the loop ended or raised while counting)."""
        counter, self.counter = self.counter, None
        if counter is None:
            return None
        counter.__exit__(None, None, None)
        if not iterations:
            return None
        counter.budget.iterations = iterations
        return described(counter.budget, self.obs.device_in_use(), self.as_on_gpu)


def described(budget: HostBudget, device: torch.device, as_on_gpu: bool) -> dict:
    """A count as plain values: every kind per iteration, the iterations counted, the device the reads are sorted
    for, and where the syncs come from (FILE:LINE, op, per iteration)."""
    n = budget.iterations
    return {**budget.per_iteration(), "iterations": n, "as_on": "cuda" if as_on_gpu else device.type,
            "sync_sites": [{"where": line, "op": op, "per_iteration": round(count / n, 2)}
                           for op, line, count in budget.where("syncs")[:3]]}


def budget_line(budget: dict | None) -> str | None:
    """The report's line for the count (None where none was taken: the run did not get that far)."""
    if not budget:
        return None
    if "skipped" in budget:
        return f"host budget: {budget['skipped']}"
    return (f"host budget: {budget['launches']:g} launches, {budget['syncs']:g} syncs and {budget['cpu_reads']:g} "
            f"host reads an iteration ({COST})")
