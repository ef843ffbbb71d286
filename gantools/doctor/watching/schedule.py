"""The doctor's iteration schedule (`mark`'s state machine), by `gantools.measuring.protocol`'s protocol: `warmup`
iterations with every hook on, one profiler warm-up iteration and `steps` profiled, then `host_count.COUNTED` whose
ops are counted (the host budget; none where torch.compile has compiled code) and `steps` timed, both with nothing
installed but the iteration marks. In a script the iterations are paced by an optimizer's steps, once the loop's
rhythm is known. From the profiler's warm-up iteration to the last timed one, the CPU time other processes take is
read (`measuring.load`): the report says when it was too much to read the timings as the loop's own."""
from __future__ import annotations

import contextlib
import sys
from collections import Counter

from ...measuring import hardware
from ...errors import ScriptMeasured
from ...measuring.compile_counts import compiled_code_cached, since, snapshot
from ...measuring.load import Load, LoadWindow
from ...measuring.protocol import IterationClock, ProfilerSession
from .hooks import Hooks
from .host_count import COUNTED, HostCount
from .memory import MemoryWatch
from .observations import Observations, Optimizer
from .syncs import SyncWatch

STEPS, WARMUP = 5, 2
PACING_LIMIT = 64  # optimizer steps after which the loop's rhythm is decided from the optimizers seen so far


def say(message: str) -> None:
    print(f"gantools doctor: {message}", file=sys.stderr, flush=True)


class Schedule:
    """Counts iteration marks and switches hooks, timing and the profiler at each stage's end. Stages: pacing
    (script mode, until the rhythm is known), warmup, profiling, counting, timed, done."""

    def __init__(self, steps: int, warmup: int, obs: Observations, hooks: Hooks, by_optimizer: bool):
        self.steps, self.warmup, self.timed = steps, warmup, steps
        self.obs, self.hooks, self.by_optimizer = obs, hooks, by_optimizer
        self.marks = -1            # iteration marks seen; mark 0 starts the first warm-up iteration
        self.stage = "pacing" if by_optimizer else "warmup"
        self.profiled = 0
        self.order: list = []      # optimizer steps before the rhythm is decided
        self.pacer: Optimizer | None = None
        self.clock: IterationClock | None = None
        self.session: ProfilerSession | None = None
        self.syncs: SyncWatch | None = None  # while profiling on CUDA: the syncs the Tensor patches do not see
        # torch.compile's records, read at the stage changes: the doctor's own hooks are guarded by dynamo, so taking
        # them off for the timed window recompiles every graph once; that first timed iteration is left out
        self.compiler = {"start": snapshot()}
        self.memory: MemoryWatch | None = None  # the last warm-up iteration's memory, watched
        self.count = HostCount(obs)
        self.counted = COUNTED  # 0 where the loop's ops cannot be counted (`HostCount.why_not`)
        self.host_budget: dict | None = None  # the report's, once counted (or why not)
        self.load_window = LoadWindow()
        self.load: Load | None = None  # other processes' CPU time over the measured iterations, once they are over

    @property
    def done(self) -> bool:
        return self.stage == "done"

    @property
    def needed(self) -> int:
        return self.warmup + 1 + self.steps + self.counted + self.timed

    def mark(self) -> None:
        """The end of one iteration (and the start of the next)."""
        if self.done:
            return
        self.marks += 1
        b, w, n = self.marks, self.warmup, self.steps
        self.hooks.new_iteration()
        device = self.obs.device_in_use()
        if b == w - 1 and b > 0:  # the last warm-up iteration starts, after one that showed the networks: watched
            self.watch_memory()
        if b == w:  # warm-up over: the profiler's warm-up iteration starts
            self.start_profiling(device)
        elif b == w + 1:  # the profiler's warm-up iteration is over: the counted window starts
            self.session.step()
            self.obs.open_window()
            self.profiled = 0
            hardware.reset_peak_memory(device)
        elif w + 1 < b <= w + 1 + n:
            self.profiled += 1
            if b < w + 1 + n:
                self.session.step()
                return
            self.end_profiling(device)
        elif b > w + 1 + n:
            self.after_profiling(b, device)

    def end_profiling(self, device) -> None:
        """The last profiled iteration is over: the profiler stops, the hooks come off, and the host budget's count
        starts (or, where it cannot be taken, the timed iterations do)."""
        hardware.synchronize(device)
        self.obs.peak_mem_mb = hardware.peak_memory_mb(device)
        self.session.step()  # the last active step: the trace is complete
        self.stop_profiler()
        self.obs.close_window()
        self.compiler["profiled"] = since(self.compiler["warm"])
        self.hooks.set_full(False)  # from here on nothing installed but the marks
        why = self.count.why_not()
        if why:
            self.counted, self.host_budget = 0, {"skipped": why}
            self.start_timing(device)
            return
        self.stage = "counting"
        self.count.start(device)
        self.hooks.uncounted = self.count.paused

    def after_profiling(self, b: int, device) -> None:
        """Iteration `b` (by its mark) after the profiled ones ends: a counted one (after the last, the count is
        read and the timing starts), else a timed one (synchronised, so its GPU work is inside it)."""
        if self.stage == "counting":
            if b == self.warmup + 1 + self.steps + self.counted:
                self.stop_counting(keep=True)
                self.start_timing(device)
            return
        self.timed_lap(b - self.counted)

    def start_timing(self, device) -> None:
        """Time `timed` iterations with nothing installed but the marks."""
        self.stage = "timed"
        self.clock = IterationClock(device)
        self.clock.start()

    def stop_counting(self, keep: bool = False) -> None:
        """The count ends; kept as the host budget only after whole iterations (`keep`), not on an error or the
        loop's end."""
        self.hooks.uncounted = contextlib.nullcontext
        budget = self.count.stop(self.counted if keep else 0)
        if budget is not None:
            self.host_budget = budget

    def start_profiling(self, device) -> None:
        """Warm-up is over: the profiler (and on CUDA the sync watch) starts, for its own warm-up iteration first
        (a stage's work kept out of `mark`, which decides when each stage begins)."""
        self.stop_memory(keep=True)
        self.stage = "profiling"
        self.compiler["warm"] = snapshot()
        self.session = ProfilerSession(device, self.steps)
        self.load_window.start()
        self.session.start()
        self.hooks.profiling = True
        if SyncWatch.wanted(device):
            self.syncs = SyncWatch(self.obs, self.hooks).start()

    def timed_lap(self, b: int) -> None:
        """Timed iteration `b` (by its mark) ends: its lap is taken, and after the last one the compiler's records
        are read and the schedule is done (a stage's work kept out of `mark`, which decides when each begins)."""
        w, n, t = self.warmup, self.steps, self.timed
        self.clock.lap()
        if b == w + 2 + n:
            self.compiler["timed"] = snapshot()
        if b == w + 1 + n + t:
            self.stage = "done"
            self.load = self.load_window.stop()
            self.obs.compiler = {"whole run": since(self.compiler["start"]), "iterations after warm-up": n + t,
                                 "after warm-up": self.compiler["profiled"] + since(self.compiler["timed"])}

    def watch_memory(self) -> None:
        hooks = self.hooks
        compiled = any(m.compiled for m in self.obs.models.values()) or compiled_code_cached()
        self.memory = MemoryWatch(self.obs, lambda: hooks.top[0].model if hooks.top else None, bool(compiled))
        self.memory.start()

    def stop_memory(self, keep: bool = False) -> None:
        """Unhook the memory watch; its measure kept only for a whole iteration (`keep`: the loop reached the mark
        after it, not an error or its end)."""
        if self.memory is not None:
            watch, self.memory = self.memory, None
            measured = watch.stop(measure=keep)
            if keep:
                self.obs.memory = measured

    def stop_profiler(self) -> None:
        """Everything the schedule started that is still running stops (the loop may end at any mark)."""
        self.hooks.profiling = False
        try:
            self.stop_counting()
            self.stop_memory()
            if self.syncs is not None:
                self.syncs.stop()
        finally:
            if self.session is not None:
                self.session.stop()

    @property
    def timed_ms(self) -> float:
        """The median timed iteration: NaN until the timed window has finished."""
        return self.clock.median_ms if self.clock and len(self.clock.times_ms) == self.timed else float("nan")

    def pace(self, o: Optimizer) -> None:
        """Script mode: decide which optimizer marks iterations (the one stepping least often, once every optimizer
        built has stepped and one has stepped twice), then mark an iteration at each of its steps."""
        if self.pacer is None:
            self.order.append(o)
            counts = Counter(self.order)
            built = {id(opt) for opt in self.obs.constructed} or set(self.obs.optimizers)
            everyone = all(i in {id(k.opt) for k in counts} for i in built)
            if (max(counts.values()) >= 2 and everyone) or len(self.order) >= PACING_LIMIT:
                last = {k: i for i, k in enumerate(self.order)}
                self.pacer = min(counts, key=lambda k: (counts[k], -last[k]))
                self.stage = "warmup"
                say(f"found the training loop: one iteration = one step of {self.pacer.name}; now {self.warmup} "
                    f"warm-up, 1 + {self.steps} profiled, then {self.timed} timed iterations")
            return
        if o is self.pacer:
            self.mark()
            if self.done:
                raise ScriptMeasured()
