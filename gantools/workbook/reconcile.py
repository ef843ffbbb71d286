"""One speed-up, measured in turns and alone in the same kernel, set side by side and reconciled.

Every measurement in turns (training side by side, the benchmark's paired repeats, tune's final check, `doctor
--try`) is `measuring.turns.take_turns`: one protocol, one `Spread` of paired ratios, so those figures differ only by
noise. What still needs reconciling is a figure taken alone: a run of its own set against a start measured earlier
(the panel's Run: sequential), which carries the machine's state at its own moment. A notebook that shows both
shows them here, in one table, with the noise each carries, and a sentence computed from them: do they agree, and if
not, what the difference is made of. Quality measured twice (02's bf16: the plain loop's race and the trainer's
runs, each against a second seed of the start) is set side by side by `quality_settled`, each measurement judged by
the one rule (`speed.keep.judge_fid`). And since every quality run costs minutes on a CPU, `scores_from` lets `tune`
reuse the scores of configs the notebook already trained."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .conclusions import Conclusion
from ..core.config import TrainConfig
from ..measuring.turns import Spread
from ..speed import keep

# the fields that say where a run writes and how often it logs, not what it trains or how fast
# Figures of one speed-up taken by different methods read as one where they lie within this share of each other
# (or within their own paired bands, or the start's drift, where wider): not a keep rule, which `speed.keep` is
FIGURES_AGREE = 0.05
BOOKKEEPING = ("out_dir", "steps", "log_interval", "sample_interval", "checkpoint_interval")


@dataclass
class Figure:
    """One measurement of `config`'s speed-up over the start: the `method` that gave it, the figure, where the
    method pairs its chunks or repeats the `Spread` of those paired ratios (`band`), and whether it is
    `sequential`: a run set against a start measured at another moment."""
    config: str
    method: str
    speedup: float
    band: Spread | None = None
    sequential: bool = False

    def __post_init__(self):
        if self.band is not None:  # a (low, high) pair read back from JSON reads as the Spread it was
            self.band = Spread(*self.band)

    @property
    def half_width(self) -> float:
        """Half the band, as a share of the figure: the noise this figure carries (0 where unmeasured)."""
        return self.band.share_of(self.speedup) if self.band else 0.0


def paired_ratios(run, start) -> list[float]:
    """Round by round, `run`'s images/s over `start`'s, for two trainers trained in turns by `train_side_by_side`
    (one log record per chunk): each pair ran back to back, so the machine's state was alike for both. The first
    round (warm-up) is left out, as it is from each run's figure."""
    a = [r["images_per_sec"] for r in run.history.records[1:]]
    b = [r["images_per_sec"] for r in start.history.records[1:]]
    return [x / y for x, y in zip(a, b, strict=False)]


def speedup_table(figures: list[Figure]) -> str:
    """The figures as a Markdown table, one row per config and method."""
    from .display import markdown_table

    rows = [[f.config, f.method, f"{f.speedup:.2f}x",
             f"{f.band[0]:.2f}x-{f.band[1]:.2f}x" if f.band else "none: one run" if f.sequential else "not reported"]
            for f in figures]
    return markdown_table(["config", "method", "speed-up over the start", "paired range"], rows)


def reconcile(figures: list[Figure], drift: float | None = None, warmup: dict | None = None) -> Conclusion:
    """Per config: the lowest and highest of its figures, the one farthest from the first, and whether they are
    apart by more than the noise, which is the widest of: a speed ratio read as equal anyway
    (`FIGURES_AGREE`), the half-width of any of its figures' paired bands, and `drift`, how far the start's
    own images/s moved between two measurements in this kernel (later over earlier, minus 1): a sequential figure
    divides by a start measured at another moment, so it carries that drift whole. `warmup`: run -> its first
    interval's step time over a steady one, which every figure leaves out (said, so a reader sees what a figure
    that kept it would have lost). `keep` is True when every config's figures agree."""
    by_config: dict = {}
    for f in figures:
        by_config.setdefault(f.config, []).append(f)
    lines, agree_all = [], True
    for config, figs in by_config.items():
        if len(figs) == 1:
            lines.append(f"**{config}**: one figure, {figs[0].speedup:.2f}x ({figs[0].method}).")
            continue
        low, high = min(f.speedup for f in figs), max(f.speedup for f in figs)
        first = figs[0]
        far = max(figs[1:], key=lambda f: abs(f.speedup / first.speedup - 1))
        widest = max(f.half_width for f in figs)
        noise = max(FIGURES_AGREE, abs(drift or 0.0), widest)
        agree = high / low - 1 <= noise
        agree_all &= agree
        sources = [f"paired ranges up to ±{100 * widest:.0f}%"] if widest else []
        sources += [f"the start's drift {100 * drift:+.0f}%"] if drift is not None else []
        lines.append(
            f"**{config}**: {len(figs)} figures from {low:.2f}x to {high:.2f}x, {100 * (high / low - 1):.0f}% apart; "
            f"the farthest from *{first.method}* is *{far.method}*, {100 * (far.speedup / first.speedup - 1):+.0f}%. "
            f"The noise here is up to {100 * noise:.0f}%" + (f" ({', '.join(sources)})" if sources else "") + ": "
            + ("they agree within it, so they are one speed-up measured several ways." if agree else
               "they differ by more than it. " + _why_apart(figs)))
    if drift is not None:
        lines.append(f"The start's own images/s moved {100 * drift:+.0f}% between its two measurements in this "
                     "kernel: a figure set against a start measured at another moment carries that much on top of "
                     "its own noise, while an interleaved figure cancels it.")
    if warmup:
        firsts = ", ".join(f"{ratio:.1f}x a steady one in {run}" for run, ratio in warmup.items())
        lines.append(f"Warm-up is left out of every figure: the first interval took {firsts}.")
    return Conclusion("\n\n".join(lines), agree_all)


def _why_apart(figs: list[Figure]) -> str:
    sequential = [f"*{f.method}*" for f in figs if f.sequential]
    if sequential:
        one = len(sequential) == 1
        return (f"The figure{'' if one else 's'} {' and '.join(sequential)} also carr{'ies' if one else 'y'} the "
                "machine's state at its own moment, which no interleaving cancelled: quote an interleaved figure.")
    return "Interleaved figures that disagree say the machine changed during the runs: measure again before quoting."


BETTER, KEPT, WORSE, NOT_JUDGED = "better", "kept", "worse", "not judged"


def _quality(change: dict, start: dict, seed: dict, names: tuple) -> tuple[str, str]:
    """One measurement's quality verdict (BETTER, KEPT, WORSE or NOT_JUDGED) and the numbers behind it."""
    judged = keep.judge_fid(change["fid"], start["fid"], seed["fid"],
                            classes=dict(zip(names, (change, start, seed), strict=True)))
    if judged.not_judged:
        return NOT_JUDGED, judged.not_judged
    verdict = WORSE if judged.worse else BETTER if judged.better else KEPT
    return verdict, (f"FID {start['fid']:.1f} to {change['fid']:.1f}, {judged.moved:.2f}x, where a second seed "
                     f"moved it {judged.spread:.2f}x")


def quality_settled(change: str, start: str, measured: dict) -> Conclusion:
    """Whether several measurements of one change's quality reach the same verdict: `measured` is where -> (the
    change's score, the start's, the start's with a second seed), each a dict with `fid` and, where a classifier
    counted them, `classes_covered` and `classes` (`tutorial.score`, a trainer's summary). Each is judged by the one
    rule (`speed.keep.judge_fid`; not judged where a run draws too few classes). Judged verdicts that differ leave
    quality **not settled** (kept beside better excepted: neither finds a loss): each rests on one run of the change,
    and a second measurement that says otherwise shows that one run cannot tell its effect from chance. `keep` is
    True when the judged measurements (at least one) agree.
    """
    said = {where: _quality(*scores, (change, start, f"{start} (second seed)")) for where, scores in measured.items()}
    shown = "; ".join(f"{where} says **{verdict}** ({why})" for where, (verdict, why) in said.items())
    judged = {verdict for verdict, _ in said.values()} - {NOT_JUDGED}
    head = f"**{change}**'s quality against **{start}**: {shown}"
    short = f"**{change}**'s quality, " + ", ".join(f"{where}: {verdict}" for where, (verdict, _) in said.items())
    if not judged:
        return Conclusion(f"{head}: **quality not judged** by any measurement here.", False,
                          f"{short}: **not judged**.")
    count = sum(verdict != NOT_JUDGED for verdict, _ in said.values())
    agree = (f"{'both' if count == 2 else 'all'} judged measurements say" if count > 1
             else "the one judged measurement says")
    if len(judged) == 1:
        return Conclusion(f"{head}: {agree} **{next(iter(judged))}**.", True, f"{short}: **{next(iter(judged))}**.")
    if judged == {KEPT, BETTER}:  # FID fell past the limit in one, within it in the other: neither finds a loss
        return Conclusion(f"{head}: no measurement finds it worse: **quality {KEPT}**.", True,
                          f"{short}: **quality {KEPT}**.")
    return Conclusion(f"{head}: the measurements disagree, and each rests on a single run of {change}, so at least "
                      f"one verdict is chance: **quality not settled here**; train more seeds of both {change} and "
                      f"{start} to tell.", False, f"{short}: **not settled here**.")


def same_training(a: TrainConfig, b: TrainConfig) -> bool:
    """Whether two configs train the same thing at the same speed settings (only bookkeeping fields differ)."""
    da, db = a.to_dict(), b.to_dict()
    return all(da[k] == db[k] for k in da if k not in BOOKKEEPING)


def scores_from(trainers: dict, images: int) -> Callable[[TrainConfig], dict]:
    """A quality function for `tune(quality=...)`: a config one of `trainers` (already trained on `images` real
    images and scored, e.g. by `train_side_by_side`) trains the same way gets that trainer's scores; any other is
    trained from scratch on `images` and scored, as tune itself would. Saves tune retraining what was just measured.
    Its `train_images(cfg)` says what scoring `cfg` will train (0: its scores are held), so tune's time budget
    reserves what it costs (`tuning.budget`)."""
    def held(cfg: TrainConfig) -> dict | None:
        return next((dict(t.history.quality) for t in trainers.values() if same_training(t.cfg, cfg)
                     and t.history.quality and t.history.quality.get("images_trained") == images), None)

    def quality(cfg: TrainConfig) -> dict:
        scores = held(cfg)
        if scores is not None:
            return scores
        from ..core.metrics import QualityCallback
        from ..core.trainer import Trainer

        run = Trainer(cfg.replace(steps=max(1, images // cfg.images_per_step), sample_interval=0,
                                  checkpoint_interval=0), callbacks=[QualityCallback()])
        run.fit()
        return dict(run.history.quality)

    quality.train_images = lambda cfg: 0 if held(cfg) is not None else images
    return quality
