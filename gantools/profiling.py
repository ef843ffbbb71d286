"""torch.profiler over a few training steps of any config: where does a step's time go?"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, record_function, schedule

from .config import TrainConfig
from .train import Trainer

if not torch.cuda.is_available():  # a CUDA build on a CPU-only machine: kineto's "no GPU" error is expected noise
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")

PHASES = ("data wait", "G forward", "D forward", "D backward", "D optimizer step", "G backward",
          "G optimizer step", "host sync")


@dataclass
class ProfileReport:
    """What one profile found: the op table, milliseconds per step in each phase, and the trace for Perfetto."""

    device: str
    steps: int
    step_time_ms: float
    phases_ms: dict = field(default_factory=dict)
    table: str = ""
    trace_path: str | None = None

    def __str__(self):
        lines = [f"{self.steps} profiled steps on {self.device}: {self.step_time_ms:.1f} ms/step"]
        lines += [f"  {name:<18} {ms:8.2f} ms  {100 * ms / self.step_time_ms:5.1f}%"
                  for name, ms in self.phases_ms.items()]
        return "\n".join(lines)


def profile(cfg: TrainConfig | Trainer, steps: int = 5, warmup: int = 2, trace_path=None,
            row_limit: int = 15) -> ProfileReport:
    """Profile `steps` steps of a config (or of a Trainer you built with your own G and D) after `warmup`
    unrecorded ones. Phases are host (CPU) time inside each labelled range of the step; on CUDA the op table is
    sorted by time on the GPU."""
    trainer = cfg if isinstance(cfg, Trainer) else Trainer(cfg.replace(sample_interval=0))
    device = trainer.device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    trace_path = Path(trace_path or trainer.out_dir / "trace.json")
    trace_path.parent.mkdir(parents=True, exist_ok=True)

    class StepProfiler:
        def on_step_end(self, t):
            prof.step()

    unlabelled, trainer.label_phase = trainer.label_phase, record_function
    trainer.callbacks.append(stepper := StepProfiler())
    try:
        with torch.profiler.profile(activities=activities, schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1),
                                    on_trace_ready=lambda p: p.export_chrome_trace(str(trace_path))) as prof:
            trainer.fit(warmup + steps)
    finally:
        trainer.callbacks.remove(stepper)
        trainer.label_phase = unlabelled
    averages = prof.key_averages()
    by_name = {e.key: e for e in averages}
    phases = {name: by_name[name].cpu_time_total / 1e3 / steps for name in PHASES if name in by_name}
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = averages.table(sort_by=sort, row_limit=row_limit)
    step = by_name.get("ProfilerStep*")  # the profiler folds ProfilerStep#N into one row
    step_ms = step.cpu_time_total / 1e3 / step.count if step else float("nan")
    return ProfileReport(str(device), steps, step_ms, phases, table, str(trace_path))


def time_optimizer_steps(cfg: TrainConfig, impls=("for-loop", "foreach", "fused"), repeats: int = 30) -> dict:
    """Median milliseconds of one optimizer step over both DCGAN networks, per implementation. The variants are
    timed interleaved (one step of each, repeated) so a noisy machine disturbs them all alike."""
    import statistics

    from .hardware import Timer, resolve_device
    from .models import build_dcgan
    from .train import make_optimizer

    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    g, d = build_dcgan(cfg.image_size, cfg.channels, cfg.nz, cfg.ngf, cfg.ndf)
    params = list(g.to(device).parameters()) + list(d.to(device).parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    optimizers = {impl: make_optimizer(params, cfg.replace(optimizer_impl=impl), cfg.lr_g) for impl in impls}
    for opt in optimizers.values():  # allocate the moment buffers outside the timing
        opt.step()
    times, timer = {impl: [] for impl in impls}, Timer(device)
    for _ in range(repeats):
        for impl, opt in optimizers.items():
            timer.start()
            opt.step()
            times[impl].append(1e3 * timer.stop())
    return {impl: statistics.median(t) for impl, t in times.items()}
