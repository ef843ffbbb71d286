"""One measuring protocol for `profiling.profile` and `gantools.doctor`, so their numbers mean the same thing.

1. Warm-up iterations, not measured.
2. One profiler warm-up iteration, then `steps` iterations under torch.profiler (`ProfilerSession`): the phase table.
3. `steps` iterations timed without the profiler: the step time and images/s. Timed last, when everything is warm:
   right after a short warm-up they would still consume the batches DataLoader workers prefetched during it, and
   overstate images/s. `profile` reads gantools' own Trainer clock (synchronised at log points, as in training); the
   doctor, which does not know the loop, times each iteration with `IterationClock` (the device synchronised at each
   iteration's end, so its GPU work is inside the iteration it belongs to) and takes their median.

The profiler's overhead is the profiled step time over the unprofiled one (`PhaseTable.overhead`); a gain is
estimated by Amdahl's law on measured shares (`amdahl`).

Host syncs are the `SYNC_EVENTS` the profiled code made (`code_syncs`): the measuring's own synchronisations
(`hardware.synchronize`, inside its `hardware.OWN_SYNC` range) are left out, or every CUDA profile would show them.
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, record_function, schedule

from . import hardware

KINETO_LOG_LEVEL = "KINETO_LOG_LEVEL"
# CUDA runtime calls in which the host waits for the GPU, as the profiler names them (kineto's names of the CUDA
# runtime API callbacks). A blocking read (.item(), .to("cpu"), a boolean mask's nonzero) is a cudaMemcpyAsync then a
# cudaStreamSynchronize (c10's memcpy_and_sync; seen in torch 2.14.1's _local_scalar_dense_cuda), so counting the
# synchronisations alone counts each read once.
SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
OWN_SYNC = hardware.OWN_SYNC
# The phases of a GAN step, labelled one way for the trainer (its `label_phase` ranges), the profiler's phase table
# and the doctor's, in the order they are shown
PHASES = ("data wait", "G forward", "D forward", "D penalty", "D backward", "D optimizer step", "D forward (G step)",
          "D backward (G step)", "G backward", "G optimizer step", "EMA update", "host sync")
OPTIONAL_PHASES = ("D penalty", "EMA update")  # only with a gradient penalty (wgan-gp, R1) or ema_decay
DATA_WAIT = PHASES[0]


def amdahl(step_ms: float, removed_ms: float) -> float:
    """The whole step's speed-up if `removed_ms` of its `step_ms` went away (Amdahl's law)."""
    return step_ms / max(step_ms - removed_ms, 1e-9)


def amdahl_speedup(parallel: float, n: int) -> float:
    """Amdahl's law for `n` workers: S = 1 / ((1 - P) + P / n), where `parallel` (P) is the share of one worker's
    time that the workers split between them and the rest runs as long on every worker."""
    return 1 / ((1 - parallel) + parallel / n)


def parallel_share(speedup: float, n: int) -> float:
    """The P that makes `amdahl_speedup(P, n)` the measured `speedup` (Amdahl's law solved for P; the Karp-Flatt
    serial share is 1 - P): one measured process count is enough to predict the others, as far as the law holds.
    Clipped to 0..1: a speed-up below 1 has no parallel share, one of n or more no serial part to find."""
    if n < 2:
        raise ValueError(f"a parallel share needs at least 2 workers, not {n}")
    return min(max((1 - 1 / speedup) / (1 - 1 / n), 0.0), 1.0)


@dataclass(frozen=True)
class Span:
    """One profiler event as the sync count reads it: its name and its host time range (microseconds)."""

    name: str
    start: float
    end: float


def spans(events) -> list:
    """`Span`s of `prof.events()` (FunctionEvents)."""
    return [Span(e.name, e.time_range.start, e.time_range.end) for e in events]


# torch.profiler's range around each iteration, from start() or one step() to the next ("ProfilerStep#N" in a trace,
# "ProfilerStep*" in prof.events())
STEP_RANGE = "ProfilerStep"


def code_syncs(events, names=SYNC_EVENTS, skip=(OWN_SYNC,)) -> list:
    """The events named in `names` whose middle lies inside an iteration (a `STEP_RANGE`) and outside every range
    named in `skip`: by default the host syncs the profiled code made, gantools' own left out. Outside the iterations
    lies the profiler's own: stopping the trace synchronises the device (torch/autograd/profiler.py, profile.__exit__),
    after the last step range has closed. Told apart by time, not by the profiler's parent links: a
    cudaDeviceSynchronize called outside any ATen op (torch.cuda.synchronize) is linked to no CPU op, so it has no
    parent there, and its thread id is the OS thread's, not the one torch gives its ops (torch/autograd/profiler.py,
    _parse_kineto_results, re-threads only linked runtime events). The middle, not the ends: CUPTI's timestamps and
    the profiler's own clock may disagree by a little at the edges."""
    steps = [(e.start, e.end) for e in events if e.name.startswith(STEP_RANGE)]
    ranges = [(e.start, e.end) for e in events if e.name in skip]
    found = []
    for e in events:
        if e.name in names:
            middle = (e.start + e.end) / 2
            if any(start <= middle <= end for start, end in steps) and \
                    not any(start <= middle <= end for start, end in ranges):
                found.append(e)
    return found


def sync_site(sync: Span, events) -> str:
    """Where a host sync was made, as a reader looks for it: the ranges around it (a phase, the ops), outermost
    first, the profiler's own step ranges left out, e.g. "D optimizer step > aten::item > aten::_local_scalar_dense"."""
    middle = (sync.start + sync.end) / 2
    around = sorted((e for e in events if e is not sync and e.start <= middle <= e.end
                     and not e.name.startswith(STEP_RANGE)), key=lambda e: (e.start, -e.end))
    return " > ".join(e.name for e in around) or "outside every range"


class IterationClock(hardware.Timer):
    """Milliseconds per iteration without the profiler: `start()` before the first, `lap()` at each one's end (the
    device synchronised there, so an iteration's GPU work is inside it)."""

    def __init__(self, device: torch.device):
        super().__init__(device)
        self.times_ms = []

    def lap(self) -> float:
        seconds = super().lap()
        self.times_ms.append(1e3 * seconds)
        return seconds

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms) if self.times_ms else float("nan")


class ProfilerSession:
    """torch.profiler over one warm-up iteration and `steps` active ones (CPU activity, and CUDA's on a GPU):
    `start()`, `step()` at each iteration's end, `stop()`; then `step_ms()`, `per_step(names)` and `averages`."""

    def __init__(self, device: torch.device, steps: int, on_trace_ready=None):
        self.device, self.steps, self.on_trace_ready = device, steps, on_trace_ready
        self.prof = None
        self.active = False
        self._kineto_set = False
        self._averages = None

    def start(self) -> None:
        if not torch.cuda.is_available() and KINETO_LOG_LEVEL not in os.environ:
            # A CUDA build on a CPU-only machine: kineto's "no GPU" error (level 4) and its USDT profiler_start/stop
            # lines (level 5, the highest) are noise there; 6 silences both. With a GPU its errors stay visible.
            # Kineto reads it when the first profiler starts; it is unset again at stop().
            os.environ[KINETO_LOG_LEVEL] = "6"
            self._kineto_set = True
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self.prof = torch.profiler.profile(activities=activities, on_trace_ready=self.on_trace_ready,
                                           schedule=schedule(wait=0, warmup=1, active=self.steps, repeat=1))
        try:
            self.prof.start()
        except BaseException:
            self._restore_env()
            raise
        self.active = True

    def step(self) -> None:
        self.prof.step()

    def stop(self) -> None:
        if self.active:
            self.active = False
            try:
                self.prof.stop()
            finally:
                self._restore_env()

    def _restore_env(self) -> None:
        if self._kineto_set:
            os.environ.pop(KINETO_LOG_LEVEL, None)
            self._kineto_set = False

    def __enter__(self) -> "ProfilerSession":
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    @property
    def averages(self):
        """`prof.key_averages()` of the active iterations (computed once)."""
        if self._averages is None:
            self._averages = self.prof.key_averages()
        return self._averages

    def step_ms(self) -> float:
        """Host wall time per profiled iteration (the profiler folds its ProfilerStep#N ranges into one row)."""
        step = next((e for e in self.averages if e.key == "ProfilerStep*"), None)
        return step.cpu_time_total / 1e3 / step.count if step else float("nan")

    def per_step(self, names) -> float:
        """How many events named one of `names` the profiled iterations recorded, per iteration."""
        return sum(e.count for e in self.averages if e.key in names) / self.steps

    def code_syncs_per_step(self, names=SYNC_EVENTS, skip=(OWN_SYNC,)) -> float:
        """Host syncs the profiled code made (`code_syncs`), per iteration."""
        return len(code_syncs(spans(self.prof.events()), names, skip)) / self.steps

    def code_sync_sites(self, names=SYNC_EVENTS, skip=(OWN_SYNC,)) -> list:
        """Each host sync the profiled code made, with where it was made (`sync_site`): what a failed count shows."""
        events = spans(self.prof.events())
        return [f"{e.name} in {sync_site(e, events)}" for e in code_syncs(events, names, skip)]


def profile_trainer(trainer, steps: int, on_trace_ready=None) -> ProfilerSession:
    """A gantools Trainer's next 1 + `steps` steps under the profiler (its warm-up step, then `steps` profiled), the
    phases labelled and each data wait synchronised, so it measures waiting for data, not GPU work queued before it
    (`Trainer.instrument`). The stopped session, for `profiling.profile` and `gantools check`."""
    session = ProfilerSession(trainer.device, steps, on_trace_ready=on_trace_ready)

    class StepProfiler:
        def on_step_end(self, t):
            session.step()

    trainer.callbacks.append(stepper := StepProfiler())
    try:
        with trainer.instrument(label_phase=record_function, sync_data_wait=True), session:
            trainer.fit(1 + steps)
    finally:
        trainer.callbacks.remove(stepper)
    return session


class PhaseTable:
    """Where an iteration's time goes, the figures `profiling.compare` and `display.plot_phases` read; both reports
    (`profiling.ProfileReport`, `doctor.DoctorReport`) are one. Subclasses provide `phases_ms` (milliseconds per
    iteration in each phase, profiled), `step_time_ms` (profiled), `unprofiled_step_time_ms`, `images_per_step`
    and `device`."""

    @property
    def images_per_sec(self) -> float | None:
        """Real images per second, from the iterations timed without the profiler; None where the images per
        iteration are not known (a loop the doctor could not count them in), never 0."""
        return None if self.images_per_step is None else self.images_per_step * self.iterations_per_sec

    @property
    def iterations_per_sec(self) -> float:
        """Iterations per second, timed without the profiler: the figure to compare where images/s is unknown."""
        return 1e3 / self.unprofiled_step_time_ms if self.unprofiled_step_time_ms else 0.0

    @property
    def overhead(self) -> float:
        """Profiled step time over unprofiled: what the profiler (and any hooks) cost."""
        return self.step_time_ms / self.unprofiled_step_time_ms

    def phase_lines(self, width: int) -> list:
        return [f"  {name:<{width}} {ms:8.2f} ms  {100 * ms / self.step_time_ms:5.1f}%"
                for name, ms in self.phases_ms.items()]
