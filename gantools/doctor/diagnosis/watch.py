"""`Watch`, the doctor attached to a running loop, and the two ways in from Python: `watch()` around your own loop
and `run()` on a step function."""
from __future__ import annotations

import contextlib
import sys
import warnings

from ...errors import DoctorError
from .analysis import Run, analyse
from ..watching.frames import site
from ..watching.hooks import _ACTIVE, Hooks
from ..watching.observations import Observations
from ..findings.report import DoctorReport
from ..watching.schedule import STEPS, WARMUP, Schedule


class Watch:
    """The doctor attached to a running loop (see `gantools.doctor`): the hooks record (`hooks`, into `obs`), the
    iteration marks drive the schedule (`schedule`), and `close()` analyses. Use `watch()`, `run()` or
    `run_script()`; after the loop, `report` holds the `DoctorReport`."""

    def __init__(self, steps: int = STEPS, warmup: int = WARMUP, trace=None, source: str = "your loop",
                 by_optimizer: bool = False, iteration: str = "one pass of your loop, up to doc.end_step()"):
        if steps < 1 or warmup < 0:
            raise DoctorError(f"steps={steps}, warmup={warmup}: the doctor needs steps >= 1 and warmup >= 0")
        self.request = Run(source, iteration, by_optimizer, trace)
        self.obs = Observations()
        self.hooks = Hooks(self.obs)
        self.schedule = Schedule(steps, warmup, self.obs, self.hooks, by_optimizer)
        if by_optimizer:  # a script: its optimizer steps pace the iterations
            self.hooks.on_step = self.schedule.pace
        self.report: DoctorReport | None = None
        self.interrupted = False  # a Ctrl-C came (run_script's signal handler)

    # -- install / remove ---------------------------------------------------------------------------------------
    def __enter__(self) -> "Watch":
        if _ACTIVE:
            raise DoctorError("the doctor is already watching a loop in this process: one at a time")
        _ACTIVE.append(self)
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        # torch warns that global module hooks fire once more for a torch.compile'd module: true, and handled here
        warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
        try:
            self.hooks.install()
        except BaseException:
            self._remove_all()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        """Stop the profiler, remove every hook and patch, and build `report` from what was measured."""
        if self in _ACTIVE:
            try:
                self.schedule.stop_profiler()
            finally:
                self._remove_all()
            self.report = analyse(self.obs, self.schedule, self.request)

    def _remove_all(self) -> None:
        self.hooks.remove()
        if self in _ACTIVE:
            _ACTIVE.remove(self)
            self._warnings.__exit__(None, None, None)

    # -- the two marks of the watch() form ------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.schedule.done

    def mark(self) -> None:
        """The end of one iteration (and the start of the next)."""
        self.schedule.mark()

    def data(self, iterable):
        """Your loop's data, timed as data wait. Ends the loop once the doctor has measured; re-iterates a
        re-iterable source (a DataLoader: a new epoch) when it runs out first."""
        if self.schedule.marks < 0:
            self.mark()
        self.obs.data_site = site(sys._getframe(1))[0]
        it = iter(iterable)
        one_shot, fresh = it is iterable, True  # an iterator (a generator, say) cannot start over
        while not self.done:
            try:
                batch = self.hooks.fetch(it.__next__)
                fresh = False
            except StopIteration:
                if fresh or one_shot:  # empty, or used up: nothing more to read
                    return
                it, fresh = iter(iterable), True
                continue
            yield batch

    def end_step(self) -> None:
        """Mark the end of one iteration of your loop."""
        self.mark()


@contextlib.contextmanager
def watch(steps: int = STEPS, warmup: int = WARMUP, trace=None, source: str = "your loop", **kw):
    """Wrap your own loop: `for batch in doc.data(loader): ...; doc.end_step()`; the loop ends once the doctor has
    measured (`warmup` + 1 + `steps` profiled + `steps` timed iterations); then `doc.report`."""
    doc = Watch(steps, warmup, trace, source, **kw)
    with doc:
        yield doc


def run(step, data, steps: int = STEPS, warmup: int = WARMUP, trace=None) -> DoctorReport:
    """Diagnose a step function: `step(batch)` is called on batches of `data` (re-iterated when it runs out) until
    the doctor has measured."""
    name = getattr(step, "__name__", "step")
    with watch(steps, warmup, trace, source=name, iteration=f"one call of {name}") as doc:
        for batch in doc.data(data):
            step(batch)
            doc.end_step()
    return doc.report
