"""The machine's own noise while gantools measures: the CPU time other processes took on the cores this process may
run on, over a window (`LoadWindow`), and the judgement of what that and a profiler's overhead say about a timing
(`doubts`).

Timings taken in turns (`turns.take_turns`) cancel the load common to both contenders in their paired ratios, and a
paired range (`turns.Spread`) says how much did not cancel (`speed.keep` reads it). A diagnosis times one loop alone,
so nothing cancels there: another job on the same cores stretches some iterations and not others, and the profiled
and unprofiled windows stop being comparable. What can be read is how much of the cores' time went to other work
while it measured: on Linux, each core's busy time in /proc/stat (user, nice, system, irq, softirq and steal: a
hypervisor's other guests count too) over the cores of this process's affinity, less the CPU time of this process and
of every live child of it (DataLoader workers run on the same cores) from /proc/PID/stat, with the children already
reaped counted in the parent's own. One of several processes of a job on this machine (torchrun, `doctor --nproc`:
LOCAL_WORLD_SIZE above 1) counts its siblings, the ranks its parent started, as its own. Where /proc is not there
(macOS, Windows) nothing is read and only the profiler's overhead is judged. A GPU another process shares is not
seen here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from . import hardware

# Other processes took at least this share of the cores' time while a timing ran: the timing is not this loop's
# alone. One core kept busy beside a run on two cores is half of it; a quiet machine's daemons take a few percent.
BUSY_SHARE = 0.25
# The profiled iteration over the unprofiled one. The profiler only adds work, so below the low end the unprofiled
# iterations ran slower than the profiled ones, which only the machine can do (a few percent is timing jitter); the
# high end is above what the profiler's per-op cost reaches on a quiet machine for the tiny op-heavy loops in
# tests/scripts/ (docs/doctor-shapes.md), so past it the profiled window was slowed by something else.
PLAUSIBLE_OVERHEAD = (0.8, 6.0)
PROC = "/proc"


@dataclass(frozen=True)
class CpuTimes:
    """One reading, in seconds since boot: the busy time of the `cores` this process may run on, and the CPU time of
    this process and its children, both counted by the kernel in clock ticks of `tick_s`."""

    cores: int
    busy_s: float
    own_s: float
    tick_s: float = 0.01


@dataclass(frozen=True)
class Load:
    """What other processes took of the cores while a window lasted: `others_s` core-seconds of `cores` x `seconds`,
    give or take `error_s` (the kernel counts in clock ticks: a window of a few hundred milliseconds holds a few dozen
    per core)."""

    seconds: float
    cores: int
    others_s: float
    error_s: float = 0.0

    @property
    def others_share(self) -> float:
        return self.others_s / self._room if self._room else 0.0

    @property
    def busy(self) -> bool:
        """Other processes took `BUSY_SHARE` of the cores' time or more, even at the low end of the reading's error:
        a short window's rounding never reads as load."""
        return bool(self._room) and (self.others_s - self.error_s) / self._room >= BUSY_SHARE

    @property
    def _room(self) -> float:
        return self.seconds * self.cores if self.seconds > 0 else 0.0

    def describe(self) -> dict:
        """As a report's JSON holds it (`doubts` reads it back)."""
        return {"seconds": round(self.seconds, 3), "cores": self.cores, "others_cpu_s": round(self.others_s, 3),
                "error_cpu_s": round(self.error_s, 3), "others_share": round(self.others_share, 3),
                "busy": self.busy}


def read_cpu_times(proc: str = PROC) -> CpuTimes | None:
    """The reading now, or None where /proc cannot be read."""
    try:
        cores = sorted(os.sched_getaffinity(0))
        tick = os.sysconf("SC_CLK_TCK")
        with open(f"{proc}/stat") as f:
            lines = f.read().splitlines()
    except (AttributeError, OSError, ValueError):
        return None
    wanted = {f"cpu{c}" for c in cores}
    busy = 0
    for line in lines:
        name, *fields = line.split()
        if name in wanted:  # user nice system idle iowait irq softirq steal (guest is inside user)
            busy += sum(int(v) for i, v in enumerate(fields[:8]) if i not in (3, 4))
    return CpuTimes(cores=len(cores), busy_s=busy / tick, own_s=_own_ticks(proc) / tick, tick_s=1 / tick)


def _own_ticks(proc: str) -> int:
    """Clock ticks of CPU time of this process (its reaped children in it) and of each live descendant; of one of
    several local ranks, of its parent's whole tree."""
    stats, children = {}, {}
    for entry in os.listdir(proc):
        if entry.isdigit():
            try:
                with open(f"{proc}/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()  # after the command's name, which may hold spaces
            except (OSError, IndexError):
                continue  # ended meanwhile
            pid = int(entry)
            # fields[1] is the parent (stat's 4th); [11:15] utime stime cutime cstime (its 14th to 17th)
            stats[pid] = sum(int(v) for v in fields[11:15])
            children.setdefault(int(fields[1]), []).append(pid)
    several = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1) > 1  # the other ranks are the same job's
    total, todo = 0, [os.getppid() if several else os.getpid()]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


class LoadWindow:
    """`start()`, then `stop()`: the `Load` over the time between, or None where the machine's times cannot be read.
    `read` takes a reading (`read_cpu_times`; a test hands its own); the window's length is `hardware.seconds`'."""

    def __init__(self, read: Callable[[], CpuTimes | None] | None = None):
        self.read = read or read_cpu_times
        self._start: tuple | None = None

    def start(self) -> "LoadWindow":
        self._start = (hardware.seconds(), self.read())
        return self

    def stop(self) -> Load | None:
        if self._start is None:
            return None
        (t0, first), now = self._start, self.read()
        self._start = None
        if first is None or now is None or now.cores != first.cores:
            return None
        others = (now.busy_s - first.busy_s) - (now.own_s - first.own_s)
        # each of the two readings of each core's busy time and of this process's own rounds down by up to a tick
        error = 2 * (now.cores + 1) * now.tick_s
        return Load(seconds=hardware.seconds() - t0, cores=now.cores, others_s=max(others, 0.0), error_s=error)


def doubts(load: dict | None, overhead: float | None) -> list:
    """Why timings taken under `load` (a `Load.describe()`, or None where not read) with a profiler `overhead`
    (profiled over unprofiled iteration; None or NaN where not measured) are not to be read as the loop's own: one
    sentence per reason, none where both look like a quiet machine's."""
    out = []
    if load and load["busy"]:
        out.append(f"other processes took {100 * load['others_share']:.0f}% of the CPU time of the {load['cores']} "
                   f"core{'s' if load['cores'] != 1 else ''} this process runs on while it was measured "
                   f"({load['others_cpu_s']:.1f} of {load['cores'] * load['seconds']:.1f} core-seconds)")
    low, high = PLAUSIBLE_OVERHEAD
    if overhead is not None and overhead == overhead and not low <= overhead <= high:
        out.append(f"the profiler's overhead came out at {overhead:.2f}x, outside the {low:.1f}x-{high:.1f}x it "
                   "costs when nothing else runs: the profiled and the timed iterations did not run alike")
    return out
