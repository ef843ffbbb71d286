"""A config's host budget (`measuring.host_budget`): what one training iteration asks of the device (launches,
views, syncs, CPU reads, copies, autocast casts; graphs, breaks and recompiles when compiled), counted over a few
seeded iterations of its trainer, and the host's time per iteration with the compute made negligible. `bench` stores
both per ladder row, `check` and `profile` print them, and a test pins the GPU preset's counts.

Counted on a CPU for a GPU (`as_on_gpu`), the config is built as it would be there: the optimizer kernels 'auto'
resolves to on CUDA (`config.optimizer_kernels`), so the count is the GPU's, not the CPU's default for-loop Adam."""
from __future__ import annotations

import contextlib

import torch

from ..core.batches import BatchStream
from ..core.loaders import IndexBatches
from ..core.config import TrainConfig, optimizer_kernels
from ..measuring import compile_counts, hardware
from ..measuring.host_budget import HostBudget, counting

# torch's own choice for an optimizer of CUDA tensors when neither foreach nor fused is given
# (torch/optim/optimizer.py, _default_to_fused_or_foreach: foreach where every tensor is on a supported device)
_CUDA_DEFAULT = "foreach"
# the widths the host-time measurement trains at: every layer still runs, on almost no numbers
HOST_TIME_WIDTHS = dict(ngf=2, ndf=2)


HEADER = "launches / syncs / host reads"  # a table's column for `cell`


def cell(budget: dict | None) -> str:
    """An iteration's host budget as a table cell: launches / syncs / host reads ("154 / 0 / 0"); "-" for none."""
    if not budget:
        return "-"
    return f"{budget['launches']:g} / {budget['syncs']:g} / {budget['cpu_reads']:g}"


def on_gpu(cfg: TrainConfig) -> TrainConfig:
    """`cfg` as a GPU would build it, for a count taken on a CPU: the optimizer's kernels as 'auto' and 'pytorch'
    resolve on CUDA (fused, and PyTorch's foreach; an explicit choice stays)."""
    kernels = optimizer_kernels(cfg.optimizer_impl, torch.device("cuda"))
    return cfg.replace(optimizer_impl=_CUDA_DEFAULT if kernels == "pytorch" else kernels)


def _host_steps(*optimizers) -> list[torch.Tensor]:
    """The `step` counters an optimizer keeps on the host: those of a group neither fused nor capturable
    (torch/optim/adam.py's _init_group puts them on the parameter's device otherwise)."""
    return [state["step"] for opt in optimizers for group in opt.param_groups
            if not (group.get("fused") or group.get("capturable"))
            for p in group["params"] if "step" in opt.state.get(p, {})
            for state in (opt.state[p],)]


class _Iterations:
    """A trainer's iterations as fit() runs them, one call each: its batches fetched (a DataLoader's outside
    `budget`, the device loader's inside), then its step: eager, or through the trainer's CUDA graph
    (`Trainer.graphed`: index batches, its warm-up steps, then replays, each replay one launch the dispatcher never
    sees, so counted here as one)."""

    def __init__(self, trainer):
        self.trainer, cfg = trainer, trainer.cfg
        self.graphed = trainer.graphed
        loader = IndexBatches(trainer.loader) if self.graphed is not None else trainer.loader
        self.stream = BatchStream(loader, trainer.batches_seen)
        # a DataLoader's batches are host work (workers hand them over whenever they are ready, and each epoch's
        # start reads a seed back on the host): fetched outside the count, and the profiler's data wait says what
        # loading costs; the device loader's gather, normalise and flip are device work, counted
        self.outside = cfg.loader == "dataloader"
        self.warmup = self.graphed.warmup + 1 if self.graphed is not None else 0  # its eager steps, its capture

    def __call__(self, counter=None) -> None:
        trainer, fetch = self.trainer, lambda: [next(self.stream) for _ in range(trainer.cfg.d_steps)]
        batches = fetch() if self.outside else None
        with counter or contextlib.nullcontext():
            batches = batches if self.outside else fetch()
            if self.graphed is None:
                trainer.train_step(*batches)
                return
            replays = self.graphed.replays
            self.graphed(batches, trainer.batches_seen, lambda *real: trainer.train_step(*real))
        if counter is not None and self.graphed.replays > replays:
            counter.budget.note("launches", "graph replay", ("gantools/core/graphed_step.py:__call__",) * 2)

    def close(self) -> None:
        self.stream.close()


def count(trainer, iterations: int = 3, warmup: int = 2, as_on_gpu: bool = False) -> tuple[HostBudget, dict]:
    """The host budget of `trainer`'s iteration (`_Iterations`: its batches, then its step, eager or graphed),
    counted over `iterations` after `warmup` iterations (the optimizers' state made, compiled code compiled, a CUDA
    graph captured), and what the compiler did across all of them. The trainer is left as it was
    (`Trainer.unchanged`).

    A compiled trainer's iterations run uncounted (the compiler's records count them), and its ops are counted on
    its eager networks (`TrainStep.eager`): a compiled frame run under a dispatch mode is skipped by dynamo, for
    good (pytorch/pytorch#190286, the reason `bench.flops_per_image` counts eagerly too), and its kernels never
    pass the dispatcher anyway.

    Returns:
        (budget, compiles): the HostBudget, and compile_counts' counts as a dict (graphs, recompiles, breaks).
    """
    iteration = _Iterations(trainer)
    compiled_run = trainer.cfg.compile != "off"
    try:
        with trainer.unchanged():
            with compile_counts.counting() as compiled:
                for _ in range(max(warmup, iteration.warmup) + (iterations if compiled_run else 0)):
                    iteration()
            with trainer.stepper.eager() if compiled_run else contextlib.nullcontext():
                counter = counting(trainer.device, _host_steps(trainer.opt_g, trainer.opt_d), as_on_gpu=as_on_gpu)
                for _ in range(iterations):
                    iteration(counter)
            budget = counter.budget
            budget.iterations = iterations
    finally:
        iteration.close()
    return budget, {"compiled_graphs": compiled.compiled_graphs, "recompiles": compiled.recompiles,
                    "graph_breaks": compiled.graph_breaks, "counted": "eager" if compiled_run else "as run"}


def budget_of(cfg: TrainConfig, iterations: int = 3, as_on_gpu: bool | None = None, **trainer_args) -> dict:
    """The per-iteration counts of `cfg` (`count`) and the compile counts: what a ladder row stores, `check` and
    `profile` print. On a CPU they are counted as a GPU would run the config (`as_on_gpu`, unless told otherwise):
    a CPU has no launches or syncs of its own to save, and the counts are what a GPU user's host will issue.
    `as_on` says which ('cuda', or the device's own type)."""
    from ..core.trainer import Trainer

    device = hardware.resolve_device(cfg.device)
    as_on_gpu = device.type == "cpu" if as_on_gpu is None else as_on_gpu
    built = on_gpu(cfg) if as_on_gpu else cfg
    # workers not kept between epochs: closing the count's stream then ends them at once (kept, they would be ended
    # by the garbage collector, waiting out their timeouts: core/batches.py)
    trainer = Trainer(built.replace(sample_interval=0, checkpoint_interval=0, persistent_workers=False),
                      **trainer_args)
    try:
        budget, compiles = count(trainer, iterations, as_on_gpu=as_on_gpu)
    finally:
        trainer.close()
    return {**budget.per_iteration(), **compiles, "as_on": "cuda" if as_on_gpu else device.type}


def host_ms(cfg: TrainConfig, iterations: int = 20, warmup: int = 3, **trainer_args) -> float:
    """Milliseconds of host time per iteration of `cfg` at `HOST_TIME_WIDTHS` and a batch of 2: the networks'
    every layer and the step's every op still run, on almost no numbers, so what is left is the time the host
    takes to issue them (Python, the dispatcher, the optimizer's loops). The median of `iterations`, each timed
    with the device synchronised (`hardware.Timer`)."""
    import statistics

    from ..core.trainer import Trainer

    small = cfg.replace(batch_size=2 * cfg.grad_accum_steps, **HOST_TIME_WIDTHS,
                        sample_interval=0, checkpoint_interval=0)
    trainer = Trainer(small, **trainer_args)
    iteration = _Iterations(trainer)
    timer = hardware.Timer(trainer.device)
    times = []
    try:
        with trainer.unchanged():
            for i in range(max(warmup, iteration.warmup) + iterations):
                timer.start()
                iteration()
                if i >= max(warmup, iteration.warmup):
                    times.append(timer.stop())
    finally:
        iteration.close()
        trainer.close()
    return 1000 * statistics.median(times)
