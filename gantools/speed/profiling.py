"""torch.profiler over a few training steps of any config, and the answer to "what do I fix next?".

The verdict (`Verdict`) is decided by documented thresholds, in this order:

1. **data-bound** when the step waits for its batch for at least `DATA_BOUND` (20%) of the step time.
   Fix: per-batch normalisation on the device, worker processes, or the device-resident loader (03_data_loading).
2. **host-overhead-bound** (CUDA only) when the GPU is idle for at least `HOST_BOUND` (40%) of the step: kernel
   launches and host syncs (`.item()`) leave it waiting. Fix: no per-step `.item()` where the config reads losses
   every step (`sync_every_step`), else torch.compile (with reduce-overhead, CUDA graphs, only once `gantools
   check` has validated it on this machine; else the default mode), a larger batch (05_all_together).
3. Otherwise the device is busy. **compute-bound** when convolutions and matrix multiplies take at least
   `COMPUTE_SHARE` (50%) of the busy time; fix: 16-bit autocast, channels_last (02_mixed_precision).
   **memory-bound** when other ops (BatchNorm, activations, copies: bandwidth-limited) dominate; fix:
   torch.compile to fuse them, channels_last (05_all_together).

On a CPU there is no separate device to sit idle: the verdict rests on waiting for data against computing
(compute-bound, naming the heaviest ops, whenever the step is not data-bound).

On CUDA the profiled steps synchronise the device around each data wait (`Trainer.sync_data_wait`), so GPU work
still queued from the step before is not counted as waiting for data (a false data-bound verdict). Those
synchronisations are gantools' own: the host syncs per step count only the training code's
(`measuring.code_syncs`).

Under the verdict, a profiled config's host budget (`ProfileReport.host_budget`, `iteration_budget.budget_of`): the
launches, syncs and host reads of one iteration, counted exactly, on a CPU as a GPU would run the config. A timed
profile on a CPU cannot say whether a GPU would wait for its host; that count can.
"""
from __future__ import annotations

import os
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.autograd import DeviceType

from ..core import techniques
from ..core.config import TrainConfig
from ..measuring.clock import logged_seconds
from ..measuring.protocol import PHASES, PhaseTable, amdahl, profile_trainer
from ..core.trainer import Trainer

DATA_BOUND = 0.20      # share of the step spent waiting for data
HOST_BOUND = 0.40      # share of the step the GPU sits idle
COMPUTE_SHARE = 0.50   # share of busy time in convolutions / matmuls
COMPUTE_OPS = ("conv", "mm", "gemm", "cudnn", "xmma", "cutlass", "linear", "matmul")


@dataclass
class Verdict:
    """The bottleneck, the numbers that decided it, what to try and where it is taught, and the most the fix could
    gain (`estimated_speedup`: Amdahl's law, 1 / (1 - `removed_share`), on the share of the step the fix is assumed
    to remove, `removed`: all of it where the fix removes the bottleneck outright, half the operations it speeds up
    where it only makes them faster). A bound only as good as that assumption: a fix that does better beats it."""

    bottleneck: str
    evidence: dict
    technique: str
    notebook: str
    fix: dict
    estimated_speedup: float | None
    removed_share: float | None = None
    removed: str = "the bottleneck's time"

    def __str__(self):
        ev = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in self.evidence.items())
        if self.estimated_speedup is None:
            gain = "estimated gain: no estimate (already in 16-bit; measure it)"
        else:
            share = "" if self.removed_share is None else f", {100 * self.removed_share:.0f}% of the step"
            gain = (f"upper bound on the gain if the fix removed {self.removed}{share} (Amdahl's law): "
                    f"up to {self.estimated_speedup:.2f}x")
        return (f"verdict: {self.bottleneck}\n  evidence: {ev}\n  try next: {self.technique} "
                f"(notebook {self.notebook}; config {self.fix})\n  {gain}")


@dataclass
class ProfileReport(PhaseTable):
    """What one profile found. Times are milliseconds per step."""

    device: str
    steps: int
    batch_size: int                # real images per step (batch_size x d_steps)
    step_time_ms: float            # profiled, host wall time per step
    unprofiled_step_time_ms: float  # the same config without the profiler, synchronised
    phases_ms: dict = field(default_factory=dict)
    device_busy_ms: float = 0.0
    h2d_copy_ms: float = 0.0
    host_syncs_per_step: float = 0.0
    top_ops: list = field(default_factory=list)  # (name, ms per step) by self time on the device in use
    peak_mem_mb: float = 0.0
    table: str = ""
    cpu_table: str = ""
    trace_path: str | None = None
    verdict: Verdict | None = None
    host_budget: dict | None = None  # `iteration_budget.budget_of` of the profiled config; None for a Trainer given

    @property
    def images_per_step(self) -> float:
        return self.batch_size

    def __str__(self):
        lines = [f"{self.steps} profiled steps on {self.device}: {self.step_time_ms:.1f} ms/step profiled, "
                 f"{self.unprofiled_step_time_ms:.1f} ms/step without the profiler "
                 f"(overhead {self.overhead:.2f}x), {self.images_per_sec:.0f} images/s"]
        lines += self.phase_lines(20)
        lines.append(f"  device busy {self.device_busy_ms:.1f} ms, host-to-device copies {self.h2d_copy_ms:.2f} ms,"
                     f" host syncs {self.host_syncs_per_step:.1f} per step,"
                     f" peak tensor memory {self.peak_mem_mb:.0f} MB")
        if self.verdict:
            lines.append(str(self.verdict))
        if self.host_budget:
            lines.append(host_budget_line(self.host_budget))
        return "\n".join(lines)


def host_budget_line(budget: dict) -> str:
    """A config's host budget (`iteration_budget.budget_of`) in the words `profile` prints under its verdict."""
    how = "as a GPU runs it" if budget["as_on"] == "cuda" else f"as it runs on {budget['as_on']}"
    if budget["counted"] == "eager":  # compiled: the eager networks' ops, which its graphs run in fewer launches
        how += f", uncompiled; torch.compile runs them in its {budget['compiled_graphs']:g} graphs"
    return (f"host budget: {budget['launches']:g} launches, {budget['syncs']:g} syncs, {budget['cpu_reads']:g} host "
            f"reads an iteration (counted {how})")


def config_budget(cfg: TrainConfig, dataset=None) -> dict:
    """`cfg`'s host budget, counted by a trainer of its own (`iteration_budget.budget_of`) whose run folder is a
    scratch one: the count leaves nothing in the profiled run's folder."""
    from .iteration_budget import budget_of

    with tempfile.TemporaryDirectory(prefix="gantools-host-budget-") as scratch:
        return budget_of(cfg.replace(out_dir=scratch), dataset=dataset)


def _self_device_ms(event) -> float:
    return getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0)) / 1e3


def profile(cfg: TrainConfig | Trainer, steps: int = 5, warmup: int = 2, trace_path=None,
            row_limit: int = 15) -> ProfileReport:
    """Profile `steps` steps of a config (or of a Trainer you built with your own G and D), by the protocol of
    `gantools.measuring.protocol`: `warmup`
    steps, then `steps` profiled (after one profiler warm-up step), then `steps` timed
    without the profiler (to state its overhead). Phases are host time inside each labelled range; the op table is
    sorted by self time on the device in use. A config's host budget is counted too (`config_budget`); a Trainer's
    is not, as its networks may be your own (`iteration_budget.count(trainer)` counts them)."""
    given = cfg
    trainer = cfg if isinstance(cfg, Trainer) else Trainer(cfg.replace(sample_interval=0, log_interval=steps))
    device, cfg = trainer.device, trainer.cfg
    cuda = device.type == "cuda"
    trainer.fit(warmup)
    trace_path = Path(trace_path or trainer.out_dir / "trace.json")
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    session = profile_trainer(trainer, steps, on_trace_ready=lambda p: p.export_chrome_trace(str(trace_path)))
    unprofiled_ms = _unprofiled_ms(trainer, steps)

    averages = session.averages
    step_ms = session.step_ms()
    phases = phase_ms(averages, steps)
    busy, h2d, top = device_time(averages, steps, step_ms, phases.get("data wait", 0.0), cuda,
                                 skip=lambda key: key in PHASES)
    sort = "self_device_time_total" if hasattr(averages[0], "self_device_time_total") else "self_cuda_time_total"
    table = averages.table(sort_by=sort, row_limit=row_limit) if cuda else None
    cpu_table = averages.table(sort_by="self_cpu_time_total", row_limit=row_limit)
    # On a CPU nothing waits for a device, so there are no host syncs to count; on CUDA the data waits' own
    # synchronisations (sync_data_wait) are gantools', not the training code's
    syncs = session.code_syncs_per_step() if cuda else 0.0
    report = ProfileReport(str(device), steps, cfg.images_per_step, step_ms, unprofiled_ms, phases, busy, h2d, syncs,
                           top[:10], trainer.history[-1]["peak_mem_mb"], table or cpu_table, cpu_table,
                           str(trace_path))
    report.verdict = diagnose(report, cfg)
    if not isinstance(given, Trainer):
        report.host_budget = config_budget(cfg, trainer.dataset)
    return report


def phase_ms(averages, steps: int, names=PHASES) -> dict:
    """Milliseconds per step in each labelled phase of `prof.key_averages()`, in the order of `names`: host time
    inside the range, from its CPU row. On a GPU each record_function label has a second row under the same name, its
    GPU annotation (the kernels' time, no CPU time), which must not replace the first."""
    rows = {e.key: e for e in averages if e.device_type == DeviceType.CPU}
    return {name: rows[name].cpu_time_total / 1e3 / steps for name in names if name in rows}


def _unprofiled_ms(trainer: Trainer, steps: int) -> float:
    """`steps` more steps without the profiler, by the trainer's own clock: synchronised at log points only, so on
    a GPU the host runs ahead as it does in training (a per-step sync would hide what removing `.item()` gains), and
    sampling, checkpoints and callbacks left out."""
    start, first_record = trainer.step, len(trainer.history)
    trainer.fit(steps)
    _, seconds = logged_seconds(trainer.history.records[first_record:], start)  # synced, weighted by steps
    return 1e3 * seconds / steps


def device_time(averages, steps: int, step_ms: float, wait_ms: float, cuda: bool, skip=lambda key: False):
    """(device busy ms, host-to-device copy ms, [(op, ms)] by self time on the device in use), per step, from
    `prof.key_averages()`. On CUDA: kernel time. On a CPU the device is the CPU: busy is the step minus waiting for
    data, and the ops are aten ops by self CPU time. `skip(key)` leaves out labelled ranges."""
    ops = [e for e in averages if not e.key.startswith("ProfilerStep") and not skip(e.key)]
    if cuda:
        # Kernel rows only. With kineto the CPU op that launched a kernel also carries its time as self device time,
        # and user-annotation rows (Optimizer.step#Adam.step) span whole regions: summing every row counts the GPU
        # about twice (pytorch/pytorch#60783, #130730). torch's own table total keeps device_type CUDA rows that are
        # not user annotations (torch/autograd/profiler_util.py, _build_table); is_user_annotation exists since 2.5.
        kernels = {e.key: _self_device_ms(e) / steps for e in ops
                   if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
                   and _self_device_ms(e) > 0}
        busy = sum(ms for name, ms in kernels.items() if not name.startswith("Memcpy"))
        h2d = sum(ms for name, ms in kernels.items() if name.startswith("Memcpy HtoD"))
        return busy, h2d, sorted(kernels.items(), key=lambda kv: -kv[1])
    top = [(e.key, e.self_cpu_time_total / 1e3 / steps) for e in ops if e.key.startswith("aten::")]
    return step_ms - wait_ms, 0.0, sorted(top, key=lambda kv: -kv[1])


def compute_ms(ops) -> float:
    """Milliseconds of [(op, ms)] spent in convolutions and matrix multiplies."""
    return sum(ms for name, ms in ops if any(k in name.lower() for k in COMPUTE_OPS))


def suggested_workers() -> int:
    """DataLoader workers to suggest: one per core, 1 to 4 (more rarely pays for a DCGAN-sized model)."""
    return max(1, min(4, os.cpu_count() or 2))


def bottleneck(step_ms: float, data_wait_ms: float, device_busy_ms: float, compute_share: float,
               cuda: bool) -> str:
    """The thresholds of this module's docstring, in order: the one place that names the bottleneck (for
    `profile` and for `gantools.doctor`)."""
    if data_wait_ms / step_ms >= DATA_BOUND:
        return "data-bound"
    if cuda and 1 - device_busy_ms / step_ms >= HOST_BOUND:
        return "host-overhead-bound"
    if compute_share >= COMPUTE_SHARE or not cuda:  # on a CPU: data against compute only
        return "compute-bound"
    return "memory-bound"


def diagnose(report: ProfileReport, cfg: TrainConfig) -> Verdict:
    """Apply the thresholds in this module's docstring to a report, and say what to change in the config: the fix
    for the bottleneck of the technique that owns it (`techniques.fix`), with the most removing the bottleneck gains.

    Args:
        report: what `profile` measured.
        cfg: the profiled config.
    Returns:
        The `Verdict`.
    """
    from .check import validated

    step, wait = report.step_time_ms, report.phases_ms.get("data wait", 0.0)
    compute = compute_ms(report.top_ops)
    busy = max(report.device_busy_ms, 1e-9)
    verdict = bottleneck(step, wait, report.device_busy_ms, compute / busy, report.device.startswith("cuda"))
    device = torch.device(report.device)
    where = techniques.Where(device=device, validated=lambda name: validated(name, device),
                             workers=suggested_workers(), host_syncs=report.host_syncs_per_step)
    fix = techniques.fix(verdict, cfg, where)
    evidence, removable, removed = _evidence(verdict, report, compute)
    if not fix.bounded:  # no model of its gain: measure it
        return Verdict(verdict, evidence, fix.text, _taught(fix.change), fix.change, None)
    return Verdict(verdict, evidence, fix.text, _taught(fix.change), fix.change, amdahl(step, removable),
                   min(removable / step, 1.0), removed)


def _evidence(verdict: str, report: ProfileReport, compute: float) -> tuple[dict, float, str]:
    """The numbers that decided `verdict`, the milliseconds per step its fix is assumed to save, and what they are:
    all the data wait, all the GPU's idle time, half the convolutions and matmuls (16-bit is assumed to halve
    them), or half the other ops (fused)."""
    step, wait = report.step_time_ms, report.phases_ms.get("data wait", 0.0)
    if verdict == "data-bound":
        return {"data wait ms": wait, "step ms": step, "data wait share": wait / step}, wait, "all the data wait"
    if verdict == "host-overhead-bound":
        return ({"GPU busy ms": report.device_busy_ms, "step ms": step,
                 "GPU idle share": 1 - report.device_busy_ms / step,
                 "host syncs per step": report.host_syncs_per_step}, step - report.device_busy_ms,
                "all the GPU's idle time")
    busy = max(report.device_busy_ms, 1e-9)
    heaviest = ", ".join(name for name, _ in report.top_ops[:3])
    evidence = {"busy ms": busy, "conv/matmul share of busy": compute / busy, "heaviest ops": heaviest}
    if verdict == "compute-bound":
        return evidence, compute / 2, "half the convolutions' and matmuls' time"
    return evidence, (busy - compute) / 2, "half the other ops' time"


def _taught(fix: dict) -> str:
    """The notebook that teaches a fix: its first field's technique's (`techniques.notebook`); a fix that changes
    nothing (data already read with no DataLoader) is the loader's."""
    return techniques.notebook(next(iter(fix), "loader"))


@dataclass
class Comparison:
    """Before and after a fix: each phase and the (unprofiled) images per second."""

    before: PhaseTable
    after: PhaseTable

    @property
    def by_images(self) -> bool:
        """Compared in images/s where both counts are known, else in iterations/s (a loop whose images per iteration
        the doctor could not count: the same ratio for one loop)."""
        return self.before.images_per_sec is not None and self.after.images_per_sec is not None

    @property
    def speedup(self) -> float:
        if self.by_images:
            return self.after.images_per_sec / self.before.images_per_sec
        return self.after.iterations_per_sec / self.before.iterations_per_sec

    def __str__(self):
        names = list(dict.fromkeys([*self.before.phases_ms, *self.after.phases_ms]))
        w = max([20, *map(len, names)])
        lines = [f"{'phase':>{w}}  {'before':>9}  {'after':>9}  (ms per step)"]
        for name in names:
            lines.append(f"{name:>{w}}  {self.before.phases_ms.get(name, 0.0):9.2f}  "
                         f"{self.after.phases_ms.get(name, 0.0):9.2f}")
        unit, rate = ("images/s", "images_per_sec") if self.by_images else ("iterations/s", "iterations_per_sec")
        lines.append(f"{unit:>{w}}  {getattr(self.before, rate):9.0f}  {getattr(self.after, rate):9.0f}  "
                     f"-> {self.speedup:.2f}x (measured without the profiler)")
        return "\n".join(lines)


def compare(before: PhaseTable, after: PhaseTable) -> Comparison:
    """The change in each phase and in images per second after a fix: profile, fix, measure in two lines. Works on
    `ProfileReport`s and on `gantools.doctor` reports of your own loop alike."""
    return Comparison(before, after)


def time_optimizer_steps(cfg: TrainConfig, impls=("for-loop", "foreach", "fused"), repeats: int = 30) -> dict:
    """Median milliseconds of one optimizer step over both DCGAN networks, per implementation. The variants are
    timed interleaved (one step of each, repeated) so a noisy machine disturbs them all alike."""
    from ..measuring.hardware import Timer, resolve_device, seeded
    from ..measuring.turns import SAME, Contender, take_turns
    from ..core.models import build_dcgan
    from ..core.trainer import make_optimizer

    device = resolve_device(cfg.device)
    with seeded(cfg.seed):  # reproducible, and the caller's RNG untouched
        g, d = build_dcgan(cfg.image_size, cfg.channels, cfg.nz, cfg.ngf, cfg.ndf)
        grads = [torch.randn_like(p) * 1e-3 for p in [*g.parameters(), *d.parameters()]]
    params = list(g.to(device).parameters()) + list(d.to(device).parameters())
    for p, grad in zip(params, grads, strict=True):
        p.grad = grad.to(device)
    optimizers = {impl: make_optimizer(params, cfg.replace(optimizer_impl=impl), cfg.lr_g) for impl in impls}
    for opt in optimizers.values():  # allocate the moment buffers outside the timing
        opt.step()
    timer = Timer(device)

    def turn(opt) -> float:  # the seconds of one step
        timer.start()
        opt.step()
        return timer.stop()

    measured = take_turns({impl: Contender(subject=opt, turn=turn) for impl, opt in optimizers.items()}, repeats,
                          order=SAME, figure=lambda seconds: 1 / seconds)
    return {impl: 1e3 * statistics.median(m.turns) for impl, m in measured.items()}


def time_shares(phases_ms: dict, ops, busy_ms: float) -> dict:
    """Two shares by which any two profiles of a GAN step compare, whatever their labels and loader: the backward
    passes' share of the step's work (the labelled phases, waiting for data and host syncs left out: they are not
    the step's arithmetic) and the share of the device's busy time in convolutions and matrix multiplies
    (`compute_ms` over `ops`, [(op, ms)])."""
    work = {name: ms for name, ms in phases_ms.items() if name not in ("data wait", "host sync")}
    return {"backward passes": sum(ms for name, ms in work.items() if "backward" in name) / sum(work.values()),
            "convolutions and matrix multiplies": compute_ms(ops) / busy_ms}
