"""`gantools doctor --try`: after the diagnosis, each applicable fix applied to your script at run time
(`fixes`), measured against the current best, and kept if it wins.

The protocol is tune's (`bench.decide`): each repeat runs the current best and the candidate back to back, in
alternating order, each as a fresh run of your script (`trial`: its warm-up iterations left out, the device
synchronised); repeat r gives one paired ratio of images/s. Five repeats first; kept if the candidate won them all,
dropped if it is not faster on the median, else five more and kept if it won 8 of 10. Fixes are tried in the order
of the findings (ranked by estimated gain), each on top of those kept before it.

The quality guard, per candidate, against the runs of the current best in the same comparison: a candidate whose
losses go non-finite is rejected, as is one whose mean of any loss (the scalars your code calls backward() on, in
order) leaves the range the current best's losses took over the same measured steps, widened by half that range
(the noise of the loss itself: the range moves from step to step, and a fix that changes the numbers by rounding
stays inside it). A script cannot be scored for FID without knowing where its images are: gantools' trainer can
(`tune`, whose FID check measures its own seed spread)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from .. import hardware
from ..bench import decide
from ..errors import DoctorError
from .fixes import Context, candidates, context
from .report import DoctorReport
from .rules import MachineFacts, not_judged
from .trial import Trial, run_trial

REPEATS = 5


@dataclass
class Tried:
    """One fix and what measuring it decided."""

    name: str
    title: str
    parts: tuple
    outcome: str           # kept, not faster, broke the script, failed the guard
    why: str
    speedup: float | None = None
    spread: tuple | None = None
    traceback: str = ""


@dataclass
class TryReport:
    """What `--try` measured on your script."""

    source: str
    device: str
    machine: str
    start_images_per_sec: float = float("nan")
    tried: list = field(default_factory=list)
    skipped: list = field(default_factory=list)   # (fix or finding, why not tried here)
    not_judged: list = field(default_factory=list)
    together: dict | None = None                 # speedup, spread, images_per_sec of all kept fixes vs the start
    interrupted: bool = False
    sites: dict = field(default_factory=dict)    # what the kept fixes touched at run time (for the patch)
    repeats: int = REPEATS                       # paired repeats per comparison (five more when undecided)

    @property
    def kept(self) -> list:
        return [t.name for t in self.tried if t.outcome == "kept"]

    @property
    def kept_parts(self) -> tuple:
        return tuple(p for t in self.tried if t.outcome == "kept" for p in t.parts)

    def to_dict(self) -> dict:
        from .report import _jsonable
        return _jsonable({"source": self.source, "device": self.device, "machine": self.machine,
                          "start_images_per_sec": self.start_images_per_sec, "kept": self.kept,
                          "tried": [t.__dict__ for t in self.tried], "skipped": self.skipped,
                          "not_judged": self.not_judged, "together": self.together,
                          "interrupted": self.interrupted})

    def __str__(self):
        lines = [f"gantools doctor --try: {self.source} on {self.device} ({self.machine})",
                 f"  each fix applied at run time, measured against the best so far ({self.repeats}+ paired repeats, "
                 "warm-up left out); kept if it wins"]
        if self.interrupted:
            lines.append("  interrupted (Ctrl-C): what was measured before it follows; no patch was written")
        for t in self.tried:
            lines.append(f"  {t.outcome:>16}: {t.title}: {t.why}")
            if t.traceback:
                lines += ["      your script raised with it:"] + ["      " + x for x in t.traceback.splitlines()]
        for name, why in self.skipped:
            lines.append(f"  {'not tried':>16}: {name}: {why}")
        if self.together:
            t = self.together
            lines.append(f"  all kept fixes together ({', '.join(self.kept)}) against the start: {t['speedup']:.2f}x "
                         f"({t['spread'][0]:.2f}-{t['spread'][1]:.2f}, paired), {self.start_images_per_sec:.0f} -> "
                         f"{t['images_per_sec']:.0f} images/s (medians)")
        elif not self.interrupted:
            lines.append("  nothing kept: no fix made this loop faster here")
        if self.not_judged:
            lines.append(f"  not judged on this device ({self.device}): " + "; ".join(self.not_judged))
        return "\n".join(lines)


def pacer_index(report: DoctorReport) -> int:
    """The construction-order place of the optimizer that paces the loop (the one stepping least often)."""
    timed = [o for o in report.optimizers.values() if o.get("steps_per_iteration") and o.get("built") is not None]
    if not timed:
        raise DoctorError("--try needs the loop's rhythm (an optimizer built and stepped while the doctor watched): "
                          "the diagnosis did not find one")
    return min(timed, key=lambda o: o["steps_per_iteration"])["built"]


def try_fixes(path, args, report: DoctorReport, facts: MachineFacts, warmup: int, steps: int,
              repeats: int = REPEATS, timeout: float | None = None, progress=None) -> TryReport:
    """Measure each applicable fix on the script (see the module docstring). Ctrl-C stops the measuring and returns
    what was measured so far (`interrupted`)."""
    progress = progress or (lambda line: None)
    path = Path(path)
    if not (path.suffix == ".py" and path.is_file()):
        raise DoctorError(f"--try runs a script again with each fix: {path} is not one. A loop in a notebook (watch(), "
                          "run()) cannot be re-run by the doctor: export it as a script (JupyterLab: File > Save and "
                          "Export Notebook As > Executable Script) and run: python -m gantools doctor --try SCRIPT.py")
    if not report.complete:
        raise DoctorError(f"--try needs a complete diagnosis first: {report.note}")
    ctx = context(report, facts)
    fixes, skipped = candidates(report, facts)
    result = TryReport(str(path), report.device, hardware.machine_info(report.device)["device_name"],
                       skipped=skipped, not_judged=not_judged(facts), repeats=repeats)
    runner = _Runner(path, args, ctx, pacer_index(report), report.images_per_step, warmup, steps, timeout)
    best: tuple = ()
    start_runs: list = []
    try:
        for fix in fixes:
            progress(f"trying {fix.title} ...")
            tried, runs = _compare(runner, best, best + fix.parts, fix, repeats)
            start_runs = start_runs or runs
            result.tried.append(tried)
            progress(f"  {tried.outcome}: {tried.why}")
            if tried.outcome == "kept":
                best = best + fix.parts
        if best:
            progress("measuring all kept fixes together against the start ...")
            a, b = runner.pair((), best, repeats)
            ratios = [y.images_per_sec / x.images_per_sec for x, y in zip(a, b)]
            result.together = {"speedup": statistics.median(ratios), "spread": (min(ratios), max(ratios)),
                               "images_per_sec": statistics.median(t.images_per_sec for t in b)}
            start_runs = a
    except KeyboardInterrupt:
        result.interrupted = True
    if start_runs:
        result.start_images_per_sec = statistics.median(t.images_per_sec for t in start_runs)
    return result


class _Runner:
    def __init__(self, path, args, ctx: Context, pacer: int, images: float, warmup: int, steps: int, timeout):
        self.path, self.args, self.ctx, self.pacer, self.images = path, args, ctx, pacer, images
        self.warmup, self.steps, self.timeout = warmup, steps, timeout

    def run(self, parts: tuple) -> Trial:
        return run_trial(self.path, self.args, parts, self.ctx, self.pacer, self.images, self.warmup, self.steps,
                         self.timeout)

    def pair(self, a: tuple, b: tuple, repeats: int) -> tuple[list, list]:
        """Runs of `a` and `b` back to back, the order alternating per repeat; stops at the first failed run of
        `b` (returned as its last). A failed run of `a`, which ran before, is the machine's or ours: raised."""
        runs_a, runs_b = [], []
        for r in range(repeats):
            for which in ((a, b) if r % 2 == 0 else (b, a)):
                trial = self.run(which)
                if not trial.measured:
                    if which is b and b != a:
                        runs_b.append(trial)
                        return runs_a, runs_b
                    raise DoctorError(f"the run without the fixes being tried {_failed(trial)}")
                (runs_a if which is a else runs_b).append(trial)
        return runs_a, runs_b


def _compare(runner: _Runner, best: tuple, candidate: tuple, fix, repeats: int) -> tuple[Tried, list]:
    a, b = runner.pair(best, candidate, repeats)
    if b and not b[-1].measured:
        t = b[-1]
        return Tried(fix.name, fix.title, fix.parts, "broke the script", _failed(t), traceback=t.traceback), a
    bad = guard(a, b)
    if bad:
        return Tried(fix.name, fix.title, fix.parts, "failed the guard", bad), a
    kept, ratio, spread, why = decide([t.images_per_sec for t in a], [t.images_per_sec for t in b], final=False)
    if kept is None:
        a2, b2 = runner.pair(best, candidate, repeats)
        if b2 and not b2[-1].measured:
            t = b2[-1]
            return Tried(fix.name, fix.title, fix.parts, "broke the script", _failed(t), traceback=t.traceback), a
        a, b = a + a2, b + b2
        bad = guard(a, b)
        if bad:
            return Tried(fix.name, fix.title, fix.parts, "failed the guard", bad), a
        kept, ratio, spread, why = decide([t.images_per_sec for t in a], [t.images_per_sec for t in b])
    why = why.split(": ", 1)[1]  # decide's "kept: " / "not kept: " is the outcome, said once
    return Tried(fix.name, fix.title, fix.parts, "kept" if kept else "not faster", why, ratio, spread), a


def _failed(trial: Trial) -> str:
    if trial.outcome == "raised":
        return "raised (its traceback below)"
    if trial.outcome == "timeout":
        return "did not finish in time"
    return f"{trial.outcome} before the doctor had timed {len(trial.times_ms)} iterations"


def guard(best: list, candidate: list) -> str | None:
    """Why the candidate's losses are not the current best's, or None (see the module docstring)."""
    if not all(t.finite for t in candidate):
        return "its losses went non-finite (nan or inf) in the measured steps"
    widths = {len(row) for t in best + candidate for row in t.losses}
    if len(widths) > 1:
        return f"it changed how many losses your loop computes per iteration ({sorted(widths)})"
    for k in range(min(widths, default=0)):
        values = [row[k] for t in best for row in t.losses]
        lo, hi = min(values), max(values)
        margin = (hi - lo) / 2
        for t in candidate:
            mean = statistics.fmean(row[k] for row in t.losses)
            if not lo - margin <= mean <= hi + margin:
                return (f"loss {k + 1} of each iteration averaged {mean:.4g}, outside the {lo:.4g} to {hi:.4g} "
                        "the loop without it took over the same steps (widened by half that range)")
    return None
