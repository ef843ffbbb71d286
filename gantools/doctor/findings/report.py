"""What the doctor tells you: the `DoctorReport` (a `measuring.PhaseTable`, so `profiling.compare` and
`display.plot_phases` work on your own loop) and its `Finding`s, as text and as JSON."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...measuring import hardware
from ...measuring.protocol import PhaseTable
from ...measuring.results import megabytes
from ..watching.hooks import SYNC_METHODS
from ..watching.host_count import budget_line

READ_METHODS = {name.strip("_") for name in SYNC_METHODS}  # as the hooks record them
UNKNOWN_RATE = "images/s unknown (no batch size found)"
MIN_SHARE = 0.05  # a cost under 5% of the step (data wait, copies, optimizer steps) is not worth a finding
MIN_GAIN = 1.02   # a finding whose whole estimated gain is under 2% would be noise


@dataclass
class Finding:
    """One change to make in your code, and the evidence from this run that it is worth making."""

    kind: str                 # stable: host-sync, sigmoid-bce, fp32-convolutions, per-sample-transforms, ...
    title: str
    seen: str                 # numbers from this run, FILE:LINE where known
    why: str
    change: str               # a short snippet for your code
    notebook: str
    estimated_speedup: float | None  # Amdahl from measured shares; None: measure it
    patch: str = ""           # the change as a unified diff of your own files, where it can be made as an edit
    by_hand: str = ""         # what of it the doctor cannot make as an edit: why, and the lines to change

    def __str__(self):
        return self.text()

    def text(self, estimated: bool = True) -> str:
        """The finding as the report prints it; `estimated=False` where the run's timings are in doubt
        (`DoctorReport.timings_doubted`): its gain is then not shown. A gain is an estimate from one profile, which
        the measured change may beat or miss, never a bound."""
        gain = ("gain not estimated: the timings are unreliable" if not estimated and self.estimated_speedup else
                f"estimated gain {self.estimated_speedup:.2f}x" if self.estimated_speedup else "measure it")
        shown = self.patch or self.change
        change = "\n".join("      " + line for line in shown.splitlines())
        label = "your lines, before (-) and after (+)" if self.patch else "in your code"
        learn = self.notebook if "/" in self.notebook else f"notebook {self.notebook}"  # a notebook, or a docs page
        by_hand = "".join(f"\n      {line}" for line in self.by_hand.splitlines())
        return (f"[{self.kind}] {self.title} ({gain})\n   seen: {self.seen}\n   why: {self.why}\n"
                f"   change, {label}:\n{change}\n" + (f"   by hand:{by_hand}\n" if by_hand else "")
                + f"   learn it: {learn}")


@dataclass
class Verdict:
    """What bounds your loop and the numbers that decided it (`speed.profiling.bottleneck`), typed as the
    profiler's `speed.profiling.Verdict` is; in the JSON it is the same two fields."""

    bottleneck: str   # data-, host-overhead-, compute- or memory-bound
    evidence: dict    # the shares and times the decision read, by name


@dataclass
class DoctorReport(PhaseTable):
    """What the doctor measured in your loop. Times are milliseconds per iteration. A `measuring.PhaseTable`, so
    the fix-measure loop works on your own code: `compare(before, after)`."""

    source: str
    device: str
    complete: bool = False
    note: str = ""                       # why the report is partial, when it is
    steps: int = 0                       # profiled iterations
    iterations_seen: int = 0
    step_time_ms: float = float("nan")   # profiled, host wall time per iteration
    unprofiled_step_time_ms: float = float("nan")  # timed without the profiler, device synchronised
    images_per_step: float | None = None  # real images per iteration; None: not known (`images_source` says why)
    images_source: str = ""
    batch_size: int | None = None
    phases_ms: dict = field(default_factory=dict)
    device_busy_ms: float = 0.0
    compute_share: float = 0.0           # of busy time, in convolutions and matmuls
    host_syncs_per_step: float = 0.0     # value reads and other device waits in your code (a GPU wait each)
    sync_sites: list = field(default_factory=list)  # {"where", "code", "method", "per_step"}: `describe_site`
    top_ops: list = field(default_factory=list)
    peak_mem_mb: float = 0.0
    models: dict = field(default_factory=dict)      # role or name -> what it is
    optimizers: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    verdict: Verdict | None = None                  # None until profiled
    findings: list = field(default_factory=list)
    not_judged: list = field(default_factory=list)  # what this device cannot tell (a CPU: pinned memory, ...)
    trace_path: str | None = None
    missing: list = field(default_factory=list)     # the parts of your loop the doctor could not find, in words
    host_budget: dict | None = None  # launches, syncs, host reads per iteration, counted (`host_count`), or why not
    timings_doubted: list = field(default_factory=list)  # why this run's timings are not the loop's own (`load`)

    def kinds(self) -> list:
        return [f.kind for f in self.findings]

    def to_dict(self) -> dict:
        """Everything above as plain JSON values (what `--json` writes); numbers not measured are null."""
        d = asdict(self)
        d["verdict"] = d["verdict"] or {}  # not profiled: an empty object, as the field always wrote
        d.update(images_per_sec=self.images_per_sec, iterations_per_sec=self.iterations_per_sec, overhead=self.overhead,
                 machine=hardware.machine_info(self.device))
        return _jsonable(d)

    def save_json(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    def __str__(self):
        lines = [f"gantools doctor: {self.source} on {self.device}"]
        lines += ["  " + line for line in _describe_loop(self)]
        if not self.complete:
            lines.append(f"  incomplete: {self.note}")
        lines += _doubt_lines(self.timings_doubted)
        timed = self.settings.get("timed_iterations_ms") or []
        if self.unprofiled_step_time_ms == self.unprofiled_step_time_ms:  # not NaN: the timed window finished
            lines.append(f"  {self.unprofiled_step_time_ms:.1f} ms per iteration (median of {len(timed)} timed "
                         f"without the profiler, device synchronised; {min(timed):.0f}-{max(timed):.0f}), "
                         + (f"{self.images_per_sec:.0f} images/s" if self.images_per_sec is not None
                            else UNKNOWN_RATE))
        if not self.phases_ms:
            return "\n".join(lines)
        lines.append(f"  {self.steps} profiled iterations: {self.step_time_ms:.1f} ms each (profiler overhead "
                     f"{self.overhead:.2f}x)")
        v = self.verdict
        first = f" (try first: finding 1, {self.findings[0].kind})" if self.findings else ""
        lines += ["", f"verdict: {v.bottleneck}{first}",
                  "  evidence: " + ", ".join(f"{k} {_fmt(val)}" for k, val in v.evidence.items()), "",
                  "where an iteration's time goes (profiled, ms per iteration):"]
        lines += self.phase_lines(22)
        syncs = "; ".join(_site_line(s) for s in self.sync_sites[:4])
        lines.append(f"  host syncs in your code: {self.host_syncs_per_step:.1f} per iteration"
                     + (f": {syncs}" if syncs else ""))
        budget = budget_line(self.host_budget)
        if budget:
            lines.append(f"  {budget}")
        memory = ("peak tensor memory" if self.device.startswith("cuda") else  # hardware.peak_memory_mb says why
                  "peak resident memory (the whole process)")
        lines.append(f"  device busy {self.device_busy_ms:.1f} ms, convolutions and matmuls "
                     f"{100 * self.compute_share:.0f}% of it; {memory} {self.peak_mem_mb:.0f} MB")
        if self.settings.get("memory"):
            lines.append("  " + memory_line(self.settings["memory"]))
        lines += ["", _findings_head(self)]
        for i, f in enumerate(self.findings, 1):
            lines.append(f"{i}. {f.text(estimated=not self.timings_doubted)}")
        if self.not_judged:
            lines += ["", f"not judged on this device ({self.device}): " + "; ".join(self.not_judged)]
        if self.trace_path:
            lines += ["", f"trace (open in https://ui.perfetto.dev): {self.trace_path}"]
        return "\n".join(lines)


def _doubt_lines(doubts: list) -> list:
    """The warning a report whose timings are in doubt starts with: why, and what to do."""
    if not doubts:
        return []
    return [f"  timings unreliable: {'; '.join(doubts)}.",
            "  The times, shares and verdict below are this run's, not your loop's alone, and no gain is estimated "
            "from them: run the doctor again on a quiet machine."]


def _findings_head(r: DoctorReport) -> str:
    if not r.findings:
        return "findings: none. Nothing in this run is worth changing by the doctor's rules."
    if r.timings_doubted:
        return "findings (what your loop does; their gains not estimated: the timings are unreliable, above):"
    return "findings, ranked by estimated gain:"


def memory_line(m: dict) -> str:
    """The last warm-up iteration's memory (`watching.memory`) in one line: its peak and the parts, largest first."""
    parts = sorted(m["parts_mb"].items(), key=lambda kv: -kv[1])
    peak = m["peak_mb"]
    shares = ", ".join(f"{k} {megabytes(v)}" + (f" ({100 * v / peak:.0f}%)" if peak else "") for k, v in parts)
    where = f" of the {megabytes(m['room_mb'])} within reach on the GPU" if m.get("room_mb") else ""
    head = f"peak {megabytes(peak)}{where} ({m['counted_by']}): " if peak is not None else "peak not measured; "
    nets = m.get("activations_by_network_mb") or {}
    by = "; activations by network: " + ", ".join(f"{k} {megabytes(v)}" for k, v in nets.items()) if nets else ""
    left = f" (left out: {m['left_out']})" if m.get("left_out") else ""
    return f"memory of one warm-up iteration's tensors, {head}{shares}{by}{left}"


def describe_site(x: dict) -> str:
    """One host-sync site: FILE:LINE `source` (what it called, per iteration); a site without source (the
    profiler's syncs that no site was found for) is its place and kind alone."""
    code = f" `{x['code']}`" if x["code"] else ""
    return f"{x['where']}{code} ({x['method']}, {x['per_step']:g}/it)"


def _site_line(x: dict) -> str:
    """A site in the report's summary line: a value read's method goes without saying (it is in the source)."""
    code = f" {x['code']}" if x["code"] else ""
    called = "" if x["method"] in READ_METHODS else f"{x['method']}, "
    return f"{x['where']}{code} ({called}{x['per_step']:g}/it)"


def _jsonable(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value if value is None or isinstance(value, (str, int, bool)) else str(value)


def _fmt(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _describe_loop(r: DoctorReport) -> list:
    out = []
    g, d = r.models.get("G"), r.models.get("D")
    if g and d:
        out.append(f"the loop: {g['name']} ({g['class']}, {g['parameters'] / 1e6:.2f}M parameters) feeds "
                   f"{d['name']} ({d['class']}, {d['parameters'] / 1e6:.2f}M)")
    elif r.models:
        out.append("models: " + ", ".join(f"{m['name']} ({m['class']})" for m in r.models.values()))
    if r.settings.get("iteration"):
        out.append(f"one iteration = {r.settings['iteration']}")
    if r.optimizers:
        out.append("optimizers: " + "; ".join(
            f"{o['name']} ({o['class']}, {o['implementation']}) steps " + (f"{o['role']} " if o["role"] else "")
            + (f"{o['steps_per_iteration']:g}x per iteration" if o["steps_per_iteration"] is not None
               else "(its rhythm not measured)") for o in r.optimizers.values()))
    if r.images_per_step:
        out.append(f"{r.images_per_step:g} real images per iteration ({r.images_source})")
    elif r.images_source:
        out.append(f"real images per iteration: unknown ({r.images_source})")
    out += [f"not found: {part}" for part in r.missing]
    if r.settings.get("ddp"):  # several processes (`ranks`)
        from ..watching.ddp import describe
        out += describe(r.settings["ddp"])
    return out
