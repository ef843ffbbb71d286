"""The step clock: the training time of each log interval (between device synchronisations), with what is not
training (sampling, checkpoints, callbacks) kept out, and the time figures of a log record from it: step time,
images/s, data wait, total training time. It reads time through `hardware.Timer`, the one clock;
`logged_seconds` reads its figures back from a run's log records (how bench's chunks and the profiler's unprofiled
steps are timed)."""
from __future__ import annotations

import contextlib

import torch

from . import hardware, protocol


class StepClock:
    """Times one log interval after another. `interval_step` and `interval_batches` are the step and data position
    where the interval began; `interval_wait` and `waits` the data waits timed in it."""

    def __init__(self, device: torch.device):
        self.timer = hardware.Timer(device)
        self.train_time = 0.0  # seconds of training in the whole run, up to the last interval
        self._restart(0, 0)

    @property
    def device(self) -> torch.device:
        """The device its timer synchronises (one, so the clock and its timer never disagree)."""
        return self.timer.device

    @device.setter
    def device(self, device: torch.device) -> None:
        self.timer.device = device

    def _restart(self, step: int, batches_seen: int) -> None:
        self.interval_start, self.interval_step, self.interval_batches = self.timer.now(sync=False), step, batches_seen
        self.interval_wait, self.waits, self.excluded_time = 0.0, 0, 0.0

    def start(self, step: int, batches_seen: int, train_time: float) -> None:
        """fit() begins: a new interval, the run's training time so far `train_time`."""
        self.timer.now()  # nothing queued before fit() counts as its time
        self.train_time = train_time
        self._restart(step, batches_seen)

    @contextlib.contextmanager
    def excluded(self, restart_at: tuple | None = None):
        """Sampling, checkpoints and callbacks are not training: keep their time out of the step times. With
        `restart_at` (step, batches seen) a new interval starts at the end of the block instead."""
        t0 = self.timer.now()
        try:
            yield
        finally:
            now = self.timer.now()
            if restart_at is not None:
                self._restart(*restart_at)
            else:
                self.excluded_time += now - t0

    @contextlib.contextmanager
    def data_wait(self, step: int, sync: bool, label_phase):
        """Times fetching a step's batches as data wait. On CUDA the host runs ahead of the GPU, and fetching a batch
        can block on work already queued there (a copy from pageable memory waits for the stream: see
        loaders.prepare_batch), which would be counted as data wait and make a compute-bound run look data-bound. So the
        wait is timed between device synchronisations: on every step while profiling (`sync`), else on the first step
        of each log interval, which follows the log's synchronisation anyway (one sample per interval, no extra host
        sync in the other steps). On the CPU nothing is queued: every step is timed, without syncs."""
        cuda = self.device.type == "cuda"
        timed = not cuda or sync or step == self.interval_step
        t = self.timer.now(sync=cuda and timed)
        with label_phase(protocol.DATA_WAIT):
            yield
            if cuda and timed:
                self.timer.now()  # the copy to the device is part of waiting for data
        if timed:
            self.interval_wait += self.timer.now(sync=False) - t
            self.waits += 1

    def interval(self, step: int, batches_seen: int, batch_size: int) -> dict | None:
        """The interval's time figures for its log record (None when no step was taken in it): synced step time,
        images/s of real images (`batch_size` each, the global batch: all ranks' images), the mean timed data wait
        and the run's training time."""
        now = self.timer.now()
        steps = step - self.interval_step
        if steps == 0:
            return None
        elapsed = max(now - self.interval_start - self.excluded_time, 1e-9)
        self.train_time += elapsed
        return {"step_time_ms": 1e3 * elapsed / steps,
                "images_per_sec": (batches_seen - self.interval_batches) * batch_size / elapsed,
                "data_wait_ms": 1e3 * self.interval_wait / max(self.waits, 1),
                "train_time_s": self.train_time}


def logged_seconds(records, since_step: int) -> tuple[int, float]:
    """Steps and training seconds a trainer's clock logged after step `since_step` (`records`: its log records
    since then, each with its step and synced `step_time_ms`), each record's step time weighted by the steps it
    covers, so the config's log_interval does not matter. Returns (steps, seconds)."""
    steps, seconds, previous = 0, 0.0, since_step
    for record in records:
        n = record["step"] - previous
        steps, seconds, previous = steps + n, seconds + n * record["step_time_ms"] / 1e3, record["step"]
    return steps, seconds
