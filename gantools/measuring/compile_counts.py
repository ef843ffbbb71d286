"""What torch.compile did while some code ran: the graphs it compiled, the recompiles (a guard failed: a new shape,
dtype, `requires_grad`, `training` flag or Python number, and the frame is compiled again, seconds each time), the
graph breaks (code dynamo cannot capture: the graph is cut there and Python runs between the pieces) and the graphs
kept out of CUDA graphs. torch keeps them in dynamo's own records, private but what its troubleshooting tools read:
`torch._dynamo.utils.counters` (`stats.unique_graphs`, bumped for every graph compiled; `graph_break`, one entry per
break reason; `inductor.cudagraph_skips`) and the compilation metrics (`get_compilation_metrics()`: one record per
frame compiled, whose `recompile_reason` is set where it was a recompile: the first guard that failed, what
TORCH_LOGS=recompiles prints first). Dynamo's `guard_failures` is not read: it holds one reason per cached version
that failed, several for one recompile, and `torch._dynamo.reset()` clears it. Counts are differences of those
records around the code measured; the metrics keep the last 64 compiles, so a stretch with more recompiles than that
is undercounted. On a torch without these records every count reads 0."""
from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

KEYS = ("compiled_graphs", "graph_breaks", "cudagraph_skips")  # dynamo's counters, process-wide


def _records() -> tuple[dict, list, list[str]]:
    """The process-wide counts (KEYS), the compilation metrics dynamo keeps (its last compiles, oldest first) and
    every graph-break reason so far; all empty where dynamo was never imported (nothing compiled yet: importing it
    here would cost seconds for nothing)."""
    if "torch._dynamo" not in sys.modules:
        return dict.fromkeys(KEYS, 0), [], []
    try:
        from torch._dynamo.utils import counters, get_compilation_metrics
    except ImportError:
        return dict.fromkeys(KEYS, 0), [], []
    breaks = counters["graph_break"]
    break_reasons = [reason for reason, n in breaks.items() for _ in range(n)]
    counts = {"compiled_graphs": counters["stats"].get("unique_graphs", 0), "graph_breaks": len(break_reasons),
              "cudagraph_skips": counters["inductor"].get("cudagraph_skips", 0)}
    return counts, get_compilation_metrics(), break_reasons


def compile_counters() -> dict:
    """The process-wide counts now, one per KEYS name."""
    return _records()[0]


@dataclass
class CompileCount:
    """What the compiler did between two moments (`since`, `counting`): graphs compiled, recompiles, graph breaks,
    CUDA-graph skips, and the reasons dynamo gave for each recompile (the first guard that failed) and each break."""
    compiled_graphs: int = 0
    recompiles: int = 0
    graph_breaks: int = 0
    cudagraph_skips: int = 0
    recompile_reasons: list = field(default_factory=list)
    break_reasons: list = field(default_factory=list)

    def __add__(self, other: "CompileCount") -> "CompileCount":
        """Two stretches' counts together (the reasons of both, in order)."""
        return CompileCount(**{key: getattr(self, key) + getattr(other, key) for key in (*KEYS, "recompiles")},
                            recompile_reasons=self.recompile_reasons + other.recompile_reasons,
                            break_reasons=self.break_reasons + other.break_reasons)


def compiled_code_cached() -> bool:
    """Whether dynamo holds compiled code in this process (`convert_frame.output_codes`, the code objects it made,
    which `torch._dynamo.reset()` clears): a compiled function called again from its cache compiles nothing, so no
    count shows it. Where that record is missing, any graph compiled so far answers."""
    if "torch._dynamo" not in sys.modules:
        return False
    from torch._dynamo import convert_frame
    codes = getattr(getattr(convert_frame, "output_codes", None), "seen", None)
    if codes is None:
        return _records()[0]["compiled_graphs"] > 0
    return any(ref() is not None for ref in list(codes))


def snapshot() -> tuple:
    """The records now, for `since`."""
    return _records()


def since(before: tuple) -> CompileCount:
    """What the compiler did after `before` (a `snapshot()`)."""
    counts, compiles, broke = before
    after, compiles_now, broke_now = _records()
    seen = {id(record) for record in compiles}  # `before` holds them, so no new record can reuse an id
    recompiled = [record.recompile_reason for record in compiles_now
                  if id(record) not in seen and record.recompile_reason]
    return CompileCount(**{key: max(0, after[key] - counts[key]) for key in KEYS}, recompiles=len(recompiled),
                        recompile_reasons=recompiled, break_reasons=_added(broke, broke_now))


@contextmanager
def counting():
    """`with counting() as count: ...`: `count` holds what torch.compile did inside the block once it ends."""
    before, count = snapshot(), CompileCount()
    try:
        yield count
    finally:
        vars(count).update(vars(since(before)))


def _added(before: list, after: list) -> list:
    """The reasons in `after` beyond those in `before`, each as often as it was added (break reasons are counted by
    reason, so a reason seen before may be seen again)."""
    left = list(before)
    added = []
    for reason in after:
        if reason in left:
            left.remove(reason)
        else:
            added.append(reason)
    return added


class CompileStats:
    """The trainer's running totals of graphs compiled and CUDA-graph skips, over its own fit() calls only: the
    counters are read at each fit's start and at each log, and the differences added up."""

    def __init__(self):
        self.totals = {"compiled_graphs": 0, "cudagraph_skips": 0}
        self._last = None

    @staticmethod
    def _now() -> dict:
        return compile_counters()

    def start(self) -> None:
        self._last = self._now()

    def read(self) -> dict:
        now = self._now()
        for key in self.totals:
            self.totals[key] += max(0, now[key] - self._last[key])
        self._last = now
        return dict(self.totals)


def first_lines(reasons: list, most: int = 5) -> list[str]:
    """Dynamo's reasons as one line each (the first: the rest is a stack), each once, at most `most` of them."""
    lines = list(dict.fromkeys(reason.splitlines()[0].strip() for reason in reasons if reason.strip()))
    return lines[:most] + ([f"... and {len(lines) - most} more"] if len(lines) > most else [])
