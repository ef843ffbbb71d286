"""The tuner: the loop of `gantools.tuning`'s docstring (profile, try a candidate against the incumbent, keep it
or not; then hold quality and measure start against final), with its state: one incumbent trainer alive (kept warm
between measurements), the candidates tried, the time spent."""
from __future__ import annotations

import shutil
import threading


from ..speed import bench, keep
from ..core.config import TrainConfig, differences
from ..core.data import returns_cpu_tensors
from ..errors import ConfigError, GantoolsError
from ..core.recovery import is_out_of_memory
from ..core.process import on_interrupt
from ..measuring import hardware
from ..measuring.torch_versions import room_to_recompile
from .result import ROW_HEAD, Step, TuneResult, markdown_line, path_row
from .space import Candidate, allowed, checkpointed, complete, describe, search_space
from .trials import Trials, TuneOptions, key, reason
from .budget import COMPILE_S, Budget

__all__ = ["COMPILE_S", "PROFILE_STEPS", "PROFILE_WARMUP", "Tuner"]

# Profiled steps per profile: enough for a verdict (the profiler's own warm-up step comes on top), few enough to
# cost seconds.
PROFILE_STEPS, PROFILE_WARMUP = 3, 1


class Tuner:
    """The loop of `gantools.tuning`'s docstring, with its state: one incumbent trainer alive (kept warm between
    measurements), the candidates tried, the time spent."""

    def __init__(self, options: TuneOptions):
        self.options = o = options
        self.trials = Trials(o, self._say)
        self.result = TuneResult({"config": o.cfg, "images_per_sec": None, "fid": None},
                                 {"config": o.cfg, "images_per_sec": None, "fid": None}, device=str(o.device),
                                 minutes=o.minutes)
        self.budget = Budget(o.minutes, self.trials)  # the clock and what the phases after the search need
        self.tried: set = set()
        self.profile_s = None   # wall time of the last profile
        self.chain = [o.cfg]    # the start, then the incumbent after each accepted step
        self.kept = []          # the Step that made each chain entry after the first
        self.incumbent = None   # the incumbent's trainer, kept warm between measurements
        self.compiled = o.cfg.compile != "off"  # whether a config with torch.compile has been built yet
        # your dataset's items already on the GPU: no workers, no pinning tried (space.search_space)
        self.cpu_tensors = o.dataset is None or returns_cpu_tensors(o.dataset)

    def _reserve(self, incumbent: TrainConfig) -> float:
        return self.budget.reserve(self.chain[0], incumbent)

    def _fits(self, cand: Candidate, inc_cfg: TrainConfig) -> bool:
        return self.budget.fits(cand, self.chain[0], inc_cfg, self.compiled)

    def _say(self, line: str, now: str | None = None) -> None:
        if line:
            self.options.progress(line)
        self.result.now = now if now is not None else self.result.now
        self.result.elapsed_s = hardware.seconds() - self.budget.t0
        self.options.on_update(self.result)

    # -- the loop ------------------------------------------------------------------------------------------------
    def run(self) -> TuneResult:
        r = self.result
        # Ctrl-C stops tune between measurements (trainers stop after their step); a second one interrupts at once.
        # A tune compiles many versions of one G and D (precision, memory format, batch size): room for them all,
        # or a compile candidate late in the path would be measured eager.
        with on_interrupt(lambda signum, frame: self.options.stop.set()), room_to_recompile():
            try:
                self._search()
                r.seconds.update(search=hardware.seconds() - self.budget.t0, left=self.budget.left(),
                                 reserved=self._reserve(self.chain[-1]))
                if not self.options.stop.is_set():
                    self._after_search(self._hold_quality, "quality")
                if not self.options.stop.is_set():
                    self._after_search(self._speed_check, "final speed check")
            except bench.Stopped:
                r.stopped = True
            finally:
                self.trials.discard(self.incumbent)
                shutil.rmtree(self.trials.dir / "trials", ignore_errors=True)
        if self.options.stop.is_set() or r.stopped:
            r.stopped = True
            r.ended = r.ended or "stopped"  # the search's own reason stays when the stop came later
            r.quality.setdefault("note", "not checked: tune was stopped before the quality check ended, so the "
                                         "final config (the fastest so far) has no quality verdict")
        self._say(f"done in {(hardware.seconds() - self.budget.t0) / 60:.1f} min", now="done")
        return r

    def _after_search(self, phase, name: str) -> None:
        """Run a phase after the search; its failure (an out-of-memory quality run, say) is noted in the result
        instead of losing the path found. Its wall time goes into the result's `seconds`."""
        t = hardware.seconds()
        try:
            phase()
        except Exception as e:  # noqa: BLE001 - a user's error or out of memory is noted; anything else is a bug
            if not (isinstance(e, GantoolsError) or is_out_of_memory(e)):
                raise
            self.result.quality.setdefault("note", f"not checked: the {name} failed: {reason(e)}")
        finally:
            self.result.seconds[name] = hardware.seconds() - t

    def _search(self) -> None:
        r, o, cfg = self.result, self.options, self.options.cfg
        self._say(f"tune on {o.device} for up to {o.minutes:g} min, from: {describe(_diff(cfg))}",
                  now="building the start config")
        if o.quality is True:  # before any measuring: a dataset without labels cannot be scored (QualityError)
            self.trials.quality_meter()
        t = hardware.seconds()
        self.incumbent = self.trials.trainer(cfg, "start")  # the start must run: its errors are the caller's to see
        self.trials.build_s = hardware.seconds() - t
        candidates, r.skipped = self._space(cfg)
        verdict, ratio_to_start, header = None, 1.0, False
        while True:
            if self.options.stop.is_set():
                raise bench.Stopped("stopped")
            inc_cfg = self.chain[-1]
            if verdict is None:  # a new incumbent: profile it (the start always), if that and the reserve fit
                if self.profile_s is not None and self.profile_s + self._reserve(inc_cfg) > self.budget.left():
                    r.ended = (f"time: profiling the new incumbent (about {self.profile_s:.0f} s) and the reserve "
                               f"for quality and the final check (about {self._reserve(inc_cfg):.0f} s) would not "
                               f"fit in the {max(0.0, self.budget.left()):.0f} s left")
                    break
                verdict = self._profile()
            cand = self._next(verdict, inc_cfg)
            if cand is None:
                r.ended = "no untried candidate left"
                break
            if not self._fits(cand, inc_cfg):
                cost = self.budget.estimate(cand, inc_cfg, self.compiled)
                r.ended = (f"time: the next candidate ({cand.label}, about {cost:.0f} s) and the reserve for quality "
                           f"and the final check (about {self._reserve(inc_cfg):.0f} s) would not fit in the "
                           f"{max(0.0, self.budget.left()):.0f} s left")
                break
            if not header:
                from ..measuring.results import markdown_table

                self._say("\n".join(markdown_table(list(ROW_HEAD), []).splitlines()[:2]))
                header = True
            step = self._try(cand, inc_cfg, ratio_to_start)
            r.path.append(step)
            self._say(markdown_line(path_row(len(r.path), step)))
            if step.accepted:
                ratio_to_start = step.ratio_to_start
                verdict = None  # a new incumbent: profile it
        self._say(f"search ended: {r.ended}")

    def _profile(self):
        from ..speed.profiling import profile

        self._say("", now=f"profiling the incumbent ({describe(_diff(self.chain[-1])) or 'the start'})")
        t, trainer = hardware.seconds(), self.incumbent
        before = trainer.step
        report = profile(trainer, steps=PROFILE_STEPS, warmup=PROFILE_WARMUP,
                         trace_path=self.trials.dir / "trials" / "trace.json")
        if trainer.step - before < PROFILE_WARMUP + 1 + 2 * PROFILE_STEPS or self.options.stop.is_set():
            raise bench.Stopped("stopped while profiling")
        self.profile_s = hardware.seconds() - t
        self.trials.speed.setdefault(key(self.chain[-1]), report.images_per_sec)
        if self.result.start["images_per_sec"] is None:  # until the first interleaved measurement
            self.result.start["images_per_sec"] = report.images_per_sec
        v = report.verdict
        self._say(f"profile: {report.images_per_sec:.0f} images/s, verdict {v.bottleneck}; its fix: {describe(v.fix)}")
        return v

    def _next(self, verdict, cfg: TrainConfig) -> Candidate | None:
        o = self.options
        fix = complete(cfg, verdict.fix) if verdict.fix else {}
        if fix and allowed(fix, cfg, o.space, self.cpu_tensors) and key(fix) not in self.tried:
            return Candidate(fix, f"verdict: {verdict.bottleneck}")
        candidates, _ = self._space(cfg)
        return next((c for c in candidates if key(c.change) not in self.tried), None)

    def _space(self, cfg: TrainConfig) -> tuple[list, list]:
        """`search_space` from `cfg` for this tune's device, space, dataset and thread."""
        o = self.options
        return search_space(cfg, o.device, o.space, o.dataset is not None,
                            threading.current_thread() is threading.main_thread(), self.cpu_tensors)

    def _try(self, cand: Candidate, inc_cfg: TrainConfig, ratio_to_start: float) -> Step:
        """Measure one candidate against the incumbent; keep it or not. One that ran out of memory is measured once
        more with activation checkpointing (`space.checkpointed`), where that is untried and fits in the time left."""
        self.tried.add(key(cand.change))
        t = hardware.seconds()
        try:
            cfg = inc_cfg.replace(**cand.change).validate()
        except ConfigError as e:
            return Step(cand.change, cand.source, False, f"rejected: {reason(e)}")
        measured, failure = self._measure(cand, cfg, inc_cfg)
        retry = failure is not None and failure.out_of_memory and checkpointed(inc_cfg, cand)
        if retry and key(retry.change) not in self.tried and self._fits(retry, inc_cfg):
            self.tried.add(key(retry.change))
            first, cand, cfg = failure, retry, inc_cfg.replace(**retry.change)
            measured, failure = self._measure(cand, cfg, inc_cfg)
            failure = failure and f"{first}; with activation checkpointing: {failure}"  # failed again: both reasons
        step = Step(cand.change, cand.source, False, "" if failure is None else f"rejected: {failure}")
        if failure is None:
            inc, new = measured["incumbent"], measured["candidate"]
            step.accepted, step.ratio, step.spread, step.why = self.trials.decide(
                measured, {"incumbent": inc_cfg, "candidate": cfg}, lambda: self._fits(cand, inc_cfg), cand.label)
            step.images_per_sec, step.incumbent_images_per_sec = new.images_per_sec, inc.images_per_sec
            step.ratio_to_start, step.warmup_s = ratio_to_start * step.ratio, new.warmup_s
            if len(self.chain) == 1:
                self.result.start["images_per_sec"] = inc.images_per_sec
            if step.accepted:
                self._accept(step, inc_cfg, cfg, new.subject)
            else:
                self.trials.discard(new.subject)
        step.seconds = hardware.seconds() - t
        return step

    def _measure(self, cand: Candidate, cfg: TrainConfig, inc_cfg: TrainConfig) -> tuple:
        self._say("", now=f"measuring {cand.label} against the incumbent ({self.budget.left():.0f} s left)")
        return self.trials.measure_candidate(self.incumbent, cfg, inc_cfg)

    def _accept(self, step: Step, inc_cfg: TrainConfig, cfg: TrainConfig, trainer) -> None:
        """The kept candidate becomes the incumbent. Never try to undo it later: the old values were just measured
        slower, as this candidate's incumbent."""
        self.tried.update(key({k: getattr(inc_cfg, k)}) for k in step.change)
        self.tried.add(key({k: getattr(inc_cfg, k) for k in step.change}))
        self.trials.discard(self.incumbent)
        self.incumbent = trainer
        self.compiled = self.compiled or cfg.compile != "off"
        self.chain.append(cfg)
        self.kept.append(step)
        self.result.final = {"config": cfg, "images_per_sec": (self.result.start["images_per_sec"] *
                                                               step.ratio_to_start), "fid": None}

    # -- quality and the final check -------------------------------------------------------------------------------
    def _hold_quality(self) -> None:
        r = self.result
        limit = keep.QUALITY_TARGET
        if self.options.quality is False:
            r.quality = {"held": None, "note": "not checked (quality=False)"}
            return
        r.quality = {"limit": limit, "images": self.options.quality_images, "tries": []}
        final = len(self.chain) - 1
        if final == 0:
            r.quality.update(held=True, note="nothing was kept, so the final config is the start")
            return
        self._say(f"quality: the start and the final config each train on {self.options.quality_images:,} images, "
                  f"then are scored", now="quality: training the start config")
        start_q = self.trials.score(self.chain[0], "quality-start")
        r.start.update(start_q)
        while final > 0:
            cfg = self.chain[final]
            r.final = {"config": cfg, "images_per_sec": self.trials.speed.get(key(cfg)), "fid": None}
            self._say("", now=f"quality: training {describe(_diff(cfg, self.chain[0]))}")
            q = self.trials.score(cfg, f"quality-{len(r.quality['tries']) + 1}")
            judged = keep.judge_fid(q["fid"], start_q["fid"], r.quality.get("seed_fid", self._seed_fid),
                                    classes={"the start": start_q, "the final config": q})
            if judged.seed_fid is not None and "seed_fid" not in r.quality:  # just trained: the limit widens
                r.quality.update(seed_fid=judged.seed_fid, spread=judged.spread, limit=judged.limit)
                self._say(f"  the start with seed {self.chain[0].seed + 1}: FID {judged.seed_fid:.2f} against "
                          f"{start_q['fid']:.2f} ({judged.spread:.2f}x apart): the limit is {judged.limit:.2f}x")
            limit, held = judged.limit, None if judged.not_judged else not judged.worse
            r.quality["tries"].append({"changes": _diff(cfg, self.chain[0]), "fid": q["fid"],
                                       "ratio": judged.moved, "held": held})
            said = f"not judged: {judged.not_judged}" if judged.not_judged else "held" if held else "worse"
            self._say(f"  FID {q['fid']:.2f} against the start's {start_q['fid']:.2f}: {judged.moved:.2f}x (limit "
                      f"{limit}x): {said}")
            if held is not False:  # kept, or not judged: nothing to back off for
                r.final = {**r.final, "config": cfg, **q}
                break
            self.kept[final - 1].backed_off = True
            final -= 1
        if final == 0:
            r.final = {**r.start}
        r.quality["held"] = None if judged.not_judged else True
        r.quality["note"] = _quality_note(r, start_q["fid"], limit, len(self.chain) - 1 - final, judged.not_judged)
        if final < len(self.chain) - 1:  # the incumbent trainer no longer matches the final config
            self.trials.discard(self.incumbent)
            self.incumbent = None
        self.chain = self.chain[:final + 1]

    def _seed_fid(self) -> float:
        """FID of the start trained again with another seed (`keep.judge_fid` asks for it once, when a back-off
        is in question): a short run's FID moves by chance, two GAN runs parting ways from the first rounding
        difference."""
        start = self.chain[0]
        self._say("", now="quality: training the start again with another seed (FID's own spread)")
        t = hardware.seconds()
        fid = self.trials.score(start.replace(seed=start.seed + 1), "quality-start-seed")["fid"]
        self.result.seconds["second seed"] = hardware.seconds() - t
        return fid

    def _speed_check(self) -> None:
        """Start against final, interleaved: the speed-up the result reports."""
        r = self.result
        if len(self.chain) == 1:
            r.final["images_per_sec"] = r.start["images_per_sec"]
            r.speedup = 1.0 if r.start["images_per_sec"] else None
            return
        self._say("", now="measuring the final config against the start")
        trials = self.trials
        final = self.incumbent if self.incumbent is not None else (lambda: trials.trainer(self.chain[-1], "final"))
        measured = trials.measure({"start": lambda: trials.trainer(self.chain[0], "start"), "final": final},
                                  {"start": self.chain[0], "final": self.chain[-1]})
        self.incumbent = measured["final"].subject
        r.start["images_per_sec"] = measured["start"].images_per_sec
        r.final["images_per_sec"] = measured["final"].images_per_sec
        start_runs, final_runs = measured["start"].images_per_sec_runs, measured["final"].images_per_sec_runs
        _, r.speedup, spread, _ = keep.decide(start_runs, final_runs)
        r.speedup_spread = spread
        self.trials.discard(measured["start"].subject)
        self._say(f"final against start, interleaved: {r.start['images_per_sec']:.0f} -> "
                  f"{r.final['images_per_sec']:.0f} images/s, {r.speedup:.2f}x ({spread[0]:.2f}-{spread[1]:.2f})")


def _quality_note(r: TuneResult, start_fid: float, limit: float, backed: int, not_judged: str | None) -> str:
    """The quality check's outcome in one line: the final FID against the start's, the limit, the second seed's
    spread where one was trained, and what was backed off; first why it was not judged, where it was not."""
    seed = f"; a second seed of the start moved FID {r.quality['spread']:.2f}x" if "spread" in r.quality else ""
    return ((f"quality not judged: {not_judged}; " if not_judged else "") +
            f"final FID {r.final['fid']:.2f} against the start's {start_fid:.2f} "
            f"({r.final['fid'] / start_fid:.2f}x, limit {limit:.2f}x{seed})" +
            (f"; {backed} kept change(s) backed off to hold it" if backed else ""))


def _diff(cfg: TrainConfig, base: TrainConfig | None = None) -> dict:
    """The fields of `cfg` that differ from `base` (default: TrainConfig()), with `cfg`'s values."""
    return {k: new for k, (_, new) in differences(cfg, base).items()}
