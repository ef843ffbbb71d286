"""`gantools doctor --try`: after the diagnosis, each applicable fix applied to your script at run time
(`fixes`), measured against the current best, and kept if it wins.

The protocol is tune's (`keep.decide_in_two`): each repeat runs the current best and the candidate back to back, in
alternating order, each as a fresh run of your script (`trial`: its warm-up iterations left out, the device
synchronised); repeat r gives one paired ratio of images/s. Five repeats first; kept if the candidate won them all,
dropped if it is not faster on the median, else five more and kept if it won 8 of 10; a range wider than the
effect, which another job's load makes, is measured again and, still that wide, neither kept nor dropped but "too
noisy": measure again on a quiet machine (`keep.too_noisy`; the CPU time other processes took while the runs were
timed says why, `measuring.load`). Fixes are tried in the order of the findings (ranked by estimated gain), each on
top of those kept before it.

The quality guard, per candidate, against the runs of the current best in the same comparison: a candidate whose
losses go non-finite is rejected, as is one whose mean of any loss (the scalars your code calls backward() on, in
order) leaves the range the current best's losses took over the same measured steps, widened by half that range
(the noise of the loss itself: the range moves from step to step, and a fix that changes the numbers by rounding
stays inside it). A fix that changes the losses by design (lazy regularisation: `fixing.Fix.changes_losses`) is held
to finite losses only, and says so. With `--fid`, the kept fixes are also held to FID the way tune holds its own
(`keep.judge_fid`: a second seed of the start trained only when the FID rose past the target, `quality_check`)."""
from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ...measuring import hardware
from ...measuring.load import doubts
from ...measuring.turns import ALTERNATE, Contender, Spread, take_turns
from ...speed.keep import QUALITY_TARGET, QUIET, TOO_NOISY, FidJudgement, decide_in_two, judge_fid, too_noisy
from ...errors import DoctorError
from ..fixes.catalogue import Context, by_name, candidates, context
from ..fixes.fix import Fix
from ..findings.report import DoctorReport
from ..findings.rules import MachineFacts, not_judged
from .trial import Trial, run_trial

REPEATS = 5
FID_IMAGES = 12_800   # training images per quality run (100 iterations of a batch of 128)


@dataclass
class Tried:
    """One fix and what measuring it decided."""

    name: str
    title: str
    parts: tuple
    outcome: str           # kept, not faster, too noisy, broke the script, failed the guard
    why: str
    speedup: float | None = None
    spread: tuple | None = None
    traceback: str = ""
    load: dict | None = None  # the busiest of its runs: other processes' CPU time while it was timed


@dataclass
class TryReport:
    """What `--try` measured on your script."""

    source: str
    device: str
    machine: str
    start_images_per_sec: float = float("nan")   # the start's median: images/s, or iterations/s (`unit`)
    unit: str = "images/s"                         # "iterations/s" where the images per iteration are unknown
    tried: list = field(default_factory=list)
    skipped: list = field(default_factory=list)   # (fix or finding, why not tried here)
    not_judged: list = field(default_factory=list)
    together: dict | None = None                 # speedup, spread, images_per_sec (in `unit`) of all kept fixes
    interrupted: bool = False
    error: str = ""                              # why measuring stopped early, when it did (not Ctrl-C)
    quality: dict | None = None                  # the FID check (`--fid`): FIDs, seed spread, limit, verdict
    repeats: int = REPEATS                       # paired repeats per comparison (five more when undecided)

    @property
    def kept(self) -> list:
        return [t.name for t in self.tried if t.outcome == "kept"]

    @property
    def kept_parts(self) -> tuple:
        return tuple(p for t in self.tried if t.outcome == "kept" for p in t.parts)

    def to_dict(self) -> dict:
        from ..findings.report import _jsonable
        return _jsonable({"source": self.source, "device": self.device, "machine": self.machine,
                          "start_images_per_sec": self.start_images_per_sec, "unit": self.unit, "kept": self.kept,
                          "tried": [{**t.__dict__, "ratios": getattr(t.spread, "ratios", None)} for t in self.tried],
                          "skipped": self.skipped,
                          "not_judged": self.not_judged, "together": self.together,
                          "interrupted": self.interrupted, "error": self.error, "quality": self.quality})

    def __str__(self):
        lines = [f"gantools doctor --try: {self.source} on {self.device} ({self.machine})",
                 f"  each fix applied at run time, measured against the best so far ({self.repeats}+ paired repeats, "
                 "warm-up left out); kept if it wins"]
        if self.unit != "images/s":
            lines.append(f"  compared in {self.unit}: the images per iteration are unknown (no batch size found); "
                         "between runs of one loop the ratios are the same")
        if self.interrupted:
            lines.append("  interrupted (Ctrl-C): what was measured before it follows; no patch was written")
        if self.error:
            lines.append(f"  stopped early: {self.error}; what was measured before it follows")
        lines += self._fix_lines()
        if self.together:
            t = self.together
            noisy = too_noisy(t["speedup"], Spread(*t["spread"]))
            lines.append(f"  all kept fixes together ({', '.join(self.kept)}) against the start: {t['speedup']:.2f}x "
                         f"({t['spread'][0]:.2f}-{t['spread'][1]:.2f}, paired), {self.start_images_per_sec:.0f} -> "
                         f"{t['images_per_sec']:.0f} {self.unit} (medians)"
                         + (f"; {TOO_NOISY} to quote: {QUIET}" if noisy else ""))
        elif not self.interrupted:
            lines.append(f"  nothing kept: {self._none_kept()}")
        if self.quality:
            lines.append("  quality: " + self.quality["summary"])
        if self.not_judged:
            lines.append(f"  not judged on this device ({self.device}): " + "; ".join(self.not_judged))
        return "\n".join(lines)

    def _none_kept(self) -> str:
        """Why no fix was kept, from what was tried: nothing (every candidate not tried, or measuring stopped before
        one was decided), every fix too noisy to decide, or fixes measured and none faster."""
        if not self.tried:
            if self.error:
                return "measuring stopped before any fix was decided"
            return ("nothing was tried: " + ("no fix the findings call for can be applied at run time here (each is "
                                             "listed as not tried, with why)" if self.skipped else
                                             "no finding calls for a fix --try can apply"))
        names = [t.name for t in self.tried]
        noisy = [t.name for t in self.tried if t.outcome == TOO_NOISY]
        if len(noisy) == len(names):
            return f"{', '.join(noisy)} measured {TOO_NOISY} to decide: {QUIET}"
        said = f"of the {len(names)} fix{'es' if len(names) > 1 else ''} tried ({', '.join(names)}), none made this " \
            "loop faster here"
        return said + (f"; {', '.join(noisy)} {TOO_NOISY} to decide: {QUIET}" if noisy else "")

    def _fix_lines(self) -> list:
        """`__str__`'s line per fix, tried (with the traceback of a run it broke) or not tried and why: the body
        of the report, apart from its head and its verdict."""
        lines = []
        for t in self.tried:
            lines.append(f"  {t.outcome:>16}: {t.title}: {t.why}")
            if t.traceback:
                who = "gantools' fix raised" if "gantools bug" in t.why else "your script raised with it"
                lines += [f"      {who}:"] + ["      " + x for x in t.traceback.splitlines()]
        for name, why in self.skipped:
            lines.append(f"  {'not tried':>16}: {name}: {why}")
        return lines


def pacer_index(report: DoctorReport) -> int:
    """The construction-order place of the optimizer that paces the loop (the one stepping least often)."""
    timed = [o for o in report.optimizers.values() if o.get("steps_per_iteration") and o.get("built") is not None]
    if not timed:
        raise DoctorError("--try needs the loop's rhythm (an optimizer built and stepped while the doctor watched): "
                          "the diagnosis did not find one")
    return min(timed, key=lambda o: o["steps_per_iteration"])["built"]


def try_fixes(path, args, report: DoctorReport, facts: MachineFacts, warmup: int, steps: int,
              repeats: int = REPEATS, timeout: float | None = None, progress=None, fid: str | None = None,
              fid_images: int = FID_IMAGES) -> TryReport:
    """Measure each applicable fix on the script (see the module docstring). Ctrl-C stops the measuring and returns
    what was measured so far (`interrupted`). `fid`: the gantools dataset the script trains on (glyphs, mnist, ...):
    then the kept fixes are also held to FID at `fid_images` training images (`quality_check`)."""
    progress = progress or (lambda line: None)
    path = _script(path, report)
    ctx = context(report, facts)
    fixes, skipped = _on_functions(*candidates(report, facts), report)
    result = TryReport(str(path), report.device, hardware.machine_info(report.device)["device_name"],
                       skipped=skipped, not_judged=not_judged(facts), repeats=repeats,
                       unit="images/s" if report.images_per_step else "iterations/s")
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
        if best and fid:  # before the speed of all together: a fix backed off here is not in it
            result.quality = quality_check(runner, result, report, fid, fid_images, progress)
            best = result.kept_parts
        if best:
            result.together, start_runs = _together(runner, best, repeats, progress)
    except KeyboardInterrupt:
        result.interrupted = True
    except DoctorError as e:  # a run that had worked before failed (the machine, or a flaky script): keep the rest
        result.error = str(e)
    if start_runs:
        result.start_images_per_sec = statistics.median(t.rate for t in start_runs)
    return result


def _script(path, report: DoctorReport) -> Path:
    """`path` as a Path, once it is a script `--try` can run again and `report` a complete diagnosis of it: both
    refused before any run, with what to do instead."""
    path = Path(path)
    if not (path.suffix == ".py" and path.is_file()):
        raise DoctorError(f"--try runs a script again with each fix: {path} is not one. A loop in a notebook (watch(), "
                          "run()) cannot be re-run by the doctor: export it as a script (JupyterLab: File > Save and "
                          "Export Notebook As > Executable Script) and run: python -m gantools doctor --try SCRIPT.py")
    if not report.complete:
        raise DoctorError(f"--try needs a complete diagnosis first: {report.note}")
    return path


def _together(runner: "_Runner", best: tuple, repeats: int, progress) -> tuple[dict, list]:
    """All the kept fixes at once against the start, in paired runs: the speed-up the report ends with (speedup,
    spread, images_per_sec), and the start's runs, which give its own figure."""
    progress("measuring all kept fixes together against the start ...")
    a, b = runner.pair((), best, repeats)
    if b and not b[-1].measured:
        raise DoctorError(f"all kept fixes together: the run {_failed(b[-1])}")
    ratios = [y.rate / x.rate for x, y in zip(a, b, strict=True)]
    return ({"speedup": statistics.median(ratios), "spread": Spread.of(ratios), "ratios": ratios,
             "images_per_sec": statistics.median(t.rate for t in b)}, a)


def _on_functions(fixes: list, skipped: list, report: DoctorReport) -> tuple[list, list]:
    """Where G or D is a plain function (no nn.Module: `functions`), the fixes that change a module's forward at run
    time have nothing to change: not tried, and said so."""
    plain = [role for role in ("G", "D") if report.models.get(role, {}).get("class") == "function"]
    if not plain:
        return fixes, skipped
    on_modules = [f for f in fixes if type(f).on_model is not Fix.on_model or type(f).wrap is not Fix.wrap]
    why = (f"{' and '.join(plain)} {'are plain functions' if len(plain) > 1 else 'is a plain function'}, not "
           "nn.Modules: --try makes this change to a module's forward at run time")
    return [f for f in fixes if f not in on_modules], skipped + [(f.name, why) for f in on_modules]


def quality_check(runner: "_Runner", result: TryReport, report: DoctorReport, dataset: str, images: int,
                  progress) -> dict:
    """FID of the kept fixes against the start at an equal number of training images, judged by `keep.judge_fid`:
    past `keep.QUALITY_TARGET`, the start is trained again (the script's seeds moved by one) and the limit widens to
    the two seeds' distance. A kept fix set outside the limit loses its last fix, measured again, until it holds or
    none is left (the speed verdicts above stay as measured; the report says which were backed off).

    Returns:
        The FIDs, the second seed's and its spread (None where no decision needed it), the limit, the fixes backed
        off and a one-line summary; or only a summary saying why nothing was scored."""
    from ...core import metrics
    from .trial import NotScorable

    shape = report.models.get("G", {}).get("output_shape") or []
    if len(shape) != 4:
        return {"summary": "not scored: G's output is not a batch of images"}
    if not runner.images:
        return {"summary": "not scored: the images per iteration are unknown (no batch size found)"}
    meter = metrics.quality_meter(dataset, image_size=shape[-1], channels=shape[1], device=report.device)
    steps = max(1, math.ceil(images / runner.images))

    def fid(parts, seed_offset=0, what=""):
        progress(f"quality: training {what} for {steps * runner.images:.0f} images, then FID ...")
        # a run's first pacer step only starts the clock: `steps - 1` timed laps end it after `steps` iterations
        trial = runner.run(parts, warmup=0, steps=steps - 1, seed_offset=seed_offset, samples=meter.n)
        if not trial.measured:
            raise DoctorError(f"the quality run of {what} {_failed(trial)}")
        return meter.score(trial.samples)["fid"]
    try:
        start = fid((), what="the start")
        fixed, backed_off, seeded = _back_off(result, start, fid)
    except NotScorable as e:
        return {"summary": f"not scored: {e}"}
    limit, seed_fid, spread = QUALITY_TARGET, None, None
    if seeded is not None:
        limit, seed_fid, spread = seeded.limit, seeded.seed_fid, seeded.spread
    verdict = ("held" if not backed_off else f"backed off {', '.join(backed_off)}")
    seed = (f"start with another seed {seed_fid:.1f} ({spread:.2f}x apart)" if seeded is not None else
            "no second seed of the start needed")
    summary = (f"FID at {steps * runner.images:.0f} training images ({dataset} features): start {start:.1f}, {seed}, "
               f"kept fixes {fixed:.1f} ({fixed / start:.2f}x; limit {limit:.2f}x): {verdict}")
    return {"dataset": dataset, "images": steps * runner.images, "start_fid": start, "seed_fid": seed_fid,
            "spread": spread, "limit": limit, "kept_fid": fixed, "backed_off": backed_off, "summary": summary}


def _back_off(result: TryReport, start: float, fid) -> tuple[float, list, FidJudgement | None]:
    """The kept fixes scored together and judged against the start; past the limit, the last is marked "failed the
    guard" and the rest scored again, until they hold or none is left. The start's second seed is trained at most
    once, when a judgement first needs it.

    Returns:
        (the FID of the fixes left, or the start's where none is; the names backed off; the judgement that trained
        the second seed, or None where none needed it)."""
    def seed() -> float:  # called only when a judgement needs it
        return fid((), 1, "the start with its seeds moved by one")
    kept = [t for t in result.tried if t.outcome == "kept"]
    backed_off, seeded = [], None
    while kept:
        fixed = fid(tuple(p for t in kept for p in t.parts), what="the kept fixes")
        judged = judge_fid(fixed, start, seed)
        if judged.seed_fid is not None:
            seed, seeded = judged.seed_fid, seeded or judged
        if not judged.worse:
            return fixed, backed_off, seeded
        t = kept.pop()
        t.outcome, t.why = "failed the guard", (f"FID {fixed:.1f} with it against the start's {start:.1f}: "
                                               f"{judged.moved:.2f}x, past the {judged.limit:.2f}x limit")
        backed_off.append(t.name)
    return start, backed_off, seeded


class _Runner:
    def __init__(self, path, args, ctx: Context, pacer: int, images: float | None, warmup: int, steps: int,
                 timeout):
        self.path, self.args, self.ctx, self.pacer, self.images = path, args, ctx, pacer, images
        self.warmup, self.steps, self.timeout = warmup, steps, timeout

    def run(self, parts: tuple, warmup: int | None = None, steps: int | None = None, **kwargs) -> Trial:
        return run_trial(self.path, self.args, parts, self.ctx, self.pacer, self.images,
                         self.warmup_for(parts) if warmup is None else warmup, self.steps if steps is None else steps,
                         self.timeout, **kwargs)

    def warmup_for(self, *runs: tuple) -> int:
        """Warm-up long enough that DataLoader workers are past the batches they prepare ahead (num_workers x
        prefetch_factor, 2 by default): timed sooner, a run with workers is served from that buffer while one
        without pays for every batch (the reason `bench.prefetched` exists for tune)."""
        workers = max([w for w, _, _ in self.ctx.loaders] + [f.workers(self.ctx) for r in runs for f in by_name(r)]
                      + [0])
        return max(self.warmup, 2 * workers + 1) if workers else self.warmup

    def pair(self, a: tuple, b: tuple, repeats: int) -> tuple[list, list]:
        """Runs of `a` and `b` back to back, the order alternating per repeat (`turns.take_turns`); stops at the
        first failed run of `b` (returned as its last). A failed run of `a`, which ran before, is the machine's or
        ours: raised."""
        warmup = self.warmup_for(a, b)  # the same warm-up for both
        measured = take_turns({"a": Contender(subject=a, turn=lambda parts: self.run(parts, warmup=warmup)),
                               "b": Contender(subject=b, turn=lambda parts: self.run(parts, warmup=warmup))},
                              repeats, order=ALTERNATE, figure=lambda trial: trial.rate,
                              until=lambda trial: not trial.measured)
        runs_a, runs_b = measured["a"].turns, measured["b"].turns
        failed = next((t for t in runs_a if not t.measured), None)
        if failed is None and runs_b and not runs_b[-1].measured and b == a:
            failed = runs_b[-1]
        if failed is not None:
            raise DoctorError(f"the run without the fixes being tried {_failed(failed)}"
                              + (f":\n{failed.traceback}" if failed.traceback else ""))
        return runs_a, runs_b


class _Ended(Exception):
    """A comparison ended before its decision (the candidate broke the script, or failed the guard)."""

    def __init__(self, tried: Tried):
        super().__init__(tried.why)
        self.tried = tried


def _compare(runner: _Runner, best: tuple, candidate: tuple, fix, repeats: int) -> tuple[Tried, list]:
    """`candidate` against `best` in paired runs, kept or not by `keep.decide_in_two` (a close call runs as many
    pairs again); returns what was decided and the runs of `best` (the first comparison's are the start's)."""
    def ended(outcome: str, why: str, traceback: str = "") -> _Ended:
        return _Ended(Tried(fix.name, fix.title, fix.parts, outcome, why, traceback=traceback))

    def checked(a: list, b: list) -> None:
        if b and not b[-1].measured:
            raise ended("broke the script", _failed(b[-1]), b[-1].traceback)
        bad = guard(a, b, by_design=bool(fix.changes_losses))
        if bad:
            raise ended("failed the guard", bad)

    def again(why: str) -> tuple:
        a2, b2 = runner.pair(best, candidate, repeats)
        if b2 and not b2[-1].measured:
            raise ended("broke the script", _failed(b2[-1]), b2[-1].traceback)
        a.extend(a2)
        b.extend(b2)
        checked(a, b)
        return [t.rate for t in a2], [t.rate for t in b2]

    a, b = runner.pair(best, candidate, repeats)
    try:
        checked(a, b)
        kept, ratio, spread, why = decide_in_two([t.rate for t in a], [t.rate for t in b], again)
    except _Ended as e:
        return e.tried, a
    why = why.split(": ", 1)[1]  # decide's "kept: " / "not kept: " / "too noisy: " is the outcome, said once
    load = busiest(a + b)
    if kept is None:  # too noisy to decide: why, where the machine's load says it
        why += "".join(f"; {reason}" for reason in doubts(load, None))
    if fix.changes_losses:
        why += f"; losses held to be finite only ({fix.changes_losses})"
    outcome = "kept" if kept else TOO_NOISY if kept is None else "not faster"
    return Tried(fix.name, fix.title, fix.parts, outcome, why, ratio, spread, load=load), a


def busiest(trials: list) -> dict | None:
    """The load (`Trial.load`) of the run other processes took most CPU time from, or None where none was read."""
    loads = [t.load for t in trials if t.load]
    return max(loads, key=lambda load: load["others_share"]) if loads else None


DOUBLE_BACKWARD = "does not currently support double backward"  # aot_autograd's refusal (torch/_functorch)


def _failed(trial: Trial) -> str:
    if trial.outcome == "raised" and DOUBLE_BACKWARD in (trial.traceback or ""):
        return ("torch refused: a compiled module cannot be differentiated twice (torch.compile's aot_autograd "
                "does not support double backward), and your loop's gradient penalty does that through D")
    if trial.outcome == "raised" and trial.ours:
        return "failed inside gantools' own fix code: a gantools bug, not yours (please report it)"
    if trial.outcome == "raised":
        return "raised"
    if trial.outcome == "timeout":
        return "stopped: no iteration ended within --timeout seconds"
    return f"{trial.outcome} after {len(trial.times_ms)} of the iterations the doctor times"


def guard(best: list, candidate: list, by_design: bool = False) -> str | None:
    """Why the candidate's losses are not the current best's, or None (see the module docstring). Iterations of one
    loop may compute different numbers of losses (a G step every n critic steps, restarted each epoch, leaves a short
    iteration at an epoch's end): every run measures the same iterations, so each must show the same widths, and the
    k-th loss is compared over the iterations of the most common width (a rare width's few values span no noise).
    `by_design`: the fix changes the losses on purpose (`fixing.Fix.changes_losses`): finite, and as many, is all
    that is asked."""
    if not all(t.finite for t in candidate):
        return "its losses went non-finite (nan or inf) in the measured steps"
    if len({frozenset(len(row) for row in t.losses) for t in best + candidate}) > 1:
        widths = sorted({len(row) for t in best + candidate for row in t.losses})
        return f"it changed how many losses your loop computes per iteration ({widths})"
    if by_design:
        return None
    common = Counter(len(row) for t in best for row in t.losses).most_common(1)
    width = common[0][0] if common else 0
    for k in range(width):
        values = [row[k] for t in best for row in t.losses if len(row) == width]
        lo, hi = min(values), max(values)
        margin = (hi - lo) / 2
        for t in candidate:
            mean = statistics.fmean(row[k] for row in t.losses if len(row) == width)
            if not lo - margin <= mean <= hi + margin:
                return (f"loss {k + 1} of each iteration averaged {mean:.4g}, outside the {lo:.4g} to {hi:.4g} "
                        "the loop without it took over the same steps (widened by half that range)")
    return None
