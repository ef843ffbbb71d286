"""Conclusions computed from a notebook's own numbers, so the sentence under a result stays true on any machine (a
GPU included): "here bf16 ran 1.62x as fast as fp32 (paired 1.41x-1.80x), FID 24.1 and 24.9: keep it". One rule
per kind of claim, shared by every notebook:

- speed (`speed_verdict`): the one keep rule tune and `doctor --try` decide with (`speed.keep.decide_paired`, a
  sign test on the round-by-round ratios, `measuring.turns.Paired`): "faster" where it would keep the change,
  "slower" where it would keep the start over it, "too noisy to tell" where the ratios spread too wide to decide,
  "no difference measured" otherwise; a single figure with no paired ratios is one measurement and gets no verdict;
- quality (`quality_words`): judged only between runs that draw enough classes (`keep.too_few_classes`) and against
  a second seed's spread, by tune's and doctor --try's rule (`keep.judge_fid`); else the FIDs are shown, not judged;
- a quality curve (`fid_trend`): one run's FID described, not judged: a rise above its best so far, or a fall over
  the last interval or two, only by more than `keep.QUALITY_TARGET`, a rise on the way named before how it ended;
- a data bottleneck: a share of the step spent waiting for data of at least `DATA_BOTTLENECK`;
- scaling (`scaling_prediction`): Amdahl's parallel share P only from a speed-up the paired range calls faster;
- memory (`memory_verdict`): a step's peak tensor memory (`measuring.memory`) is "less" or "more" only beyond
  `MEMORY_SAME` of the start's; a memory-for-speed trade (`memory_trade`) is worth it only where memory limits;
- compile time (`compile_payback`): paid back only by steps the race measured faster, after compile time over the
  time each saves."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ..errors import ConfigError
from ..measuring.results import megabytes
from ..measuring.turns import Paired
from ..speed.keep import ENOUGH_CLASSES, QUALITY_TARGET, decide_once, judge_fid

DATA_BOTTLENECK = 0.05  # a step waiting for data this share of its time or more has a data bottleneck
# Peak tensor memory repeats to the byte on a CPU (counted op by op); on a GPU the allocator rounds each block and
# cuDNN may pick another workspace, so within 2% of the start's is read as the same memory
MEMORY_SAME = 0.02

FASTER, SLOWER, NO_DIFFERENCE, TOO_NOISY = "faster", "slower", "no difference measured", "too noisy to tell"
LESS, MORE, SAME_MEMORY = "less memory", "more memory", "the same memory"
ONE_MEASUREMENT = "one measurement, no verdict"


@dataclass
class Conclusion:
    """A sentence in Markdown and the decision it states, for code and tests. A notebook shows `short`, one line,
    with the whole `text` behind a fold; `str()` is the whole text (for a sentence built around it)."""
    text: str
    keep: bool
    short: str | None = None

    def _repr_markdown_(self) -> str:
        if not self.short:
            return self.text
        return f"{self.short}\n\n<details><summary>why</summary>\n\n{self.text}\n\n</details>"

    def __str__(self) -> str:
        return self.text


def _paired(paired) -> Paired | None:
    """`paired` as `Paired` ratios, or None. A bare (low, high) pair (a range saved without its ratios) is read as
    its two ends: two rounds, the least a verdict reads."""
    if paired is None or isinstance(paired, Paired):
        return paired
    low, high = paired
    if not 0 < low <= high:
        raise ConfigError(f"a paired range is (low, high) with 0 < low <= high, not {tuple(paired)}")
    return Paired((float(low), float(high)))


def speed_verdict(paired) -> str:
    """The keep rule's verdict on the round-by-round ratios (change over start), as tune and doctor --try decide
    one measurement they do not take again (`keep.decide_once`): FASTER where it keeps the change, TOO_NOISY where
    it cannot decide either way for the noise, SLOWER where it keeps the start over the change (the same rule on the
    inverted ratios), NO_DIFFERENCE otherwise, ONE_MEASUREMENT where there are no paired ratios (None). Noise common
    to both arms cancels in each paired ratio."""
    ratios = _paired(paired)
    if ratios is None:
        return ONE_MEASUREMENT
    kept, inverse = decide_once(ratios)[0], decide_once(Paired(1 / r for r in ratios.ratios))[0]
    if kept:
        return FASTER
    if kept is None or inverse is None:
        return TOO_NOISY
    return SLOWER if inverse else NO_DIFFERENCE


def paired_text(paired) -> str:
    """'paired 1.41x-1.80x': the range of the round-by-round ratios."""
    spread = _paired(paired)
    return f"paired {spread.low:.2f}x-{spread.high:.2f}x"


def shown_ratio(ratio: float, paired) -> float:
    """The ratio a sentence shows beside a verdict: the median of the paired ratios the verdict reads, where there
    are some (a ratio of two medians can sit on the other side of 1 from them), else `ratio`."""
    return statistics.median(paired.ratios) if isinstance(paired, Paired) else ratio  # a bare range: its ends


def speed_words(ratio: float, start: str, paired=None) -> str:
    """The speed phrase, reading after "ran": '1.62x as fast as fp32 (paired 1.41x-1.80x)', 'with no difference
    measured against fp32 (1.03x, paired 0.91x-1.12x)', 'slower than fp32 (0.80x, paired 0.74x-0.86x)', or with no
    paired range 'at 1.45x the speed of fp32 (one measurement, no verdict)'."""
    verdict, ratio = speed_verdict(paired), shown_ratio(ratio, paired)
    if verdict == FASTER:
        return f"{ratio:.2f}x as fast as {start} ({paired_text(paired)})"
    if verdict == SLOWER:
        return f"slower than {start} ({ratio:.2f}x, {paired_text(paired)})"
    if verdict == NO_DIFFERENCE:
        return f"with no difference measured against {start} ({ratio:.2f}x, {paired_text(paired)})"
    if verdict == TOO_NOISY:
        return f"at {ratio:.2f}x the speed of {start}, {TOO_NOISY} ({paired_text(paired)})"
    return f"at {ratio:.2f}x the speed of {start} ({ONE_MEASUREMENT})"


def still_learning(*scores: dict) -> bool:
    """Whether any of these scores (`tutorial.score`, a trainer's summary) comes from a generator that draws fewer
    than `keep.ENOUGH_CLASSES` of the classes, the line tune and the quality rule use: its FID says which classes
    it has learned yet, so it tells whether a change broke training, not whether it kept quality."""
    return any(s["classes_covered"] < ENOUGH_CLASSES * s["classes"] for s in scores)


def seed_fid(fid_start: float, fid_spread) -> float:
    """The start's FID with a second seed, as `keep.judge_fid` reads it, from `fid_spread`: the two seeds' FIDs
    apart (|FID(seed 0) - FID(seed 1)|, read as the second seed above the start), or their (low, high) pair (the
    same factor apart as those two)."""
    if isinstance(fid_spread, (tuple, list)):
        low, high = sorted(fid_spread)
        if low <= 0:
            raise ConfigError(f"fid_spread as (low, high) holds two seeds' FIDs, both above 0, not {fid_spread}")
        return fid_start * high / low
    return fid_start + abs(fid_spread)


def quality_words(fid: float, fid_start: float, early: bool = False, fid_spread=None) -> tuple[str, bool | None]:
    """The quality clause of a conclusion and whether quality fell (None where it is not judged): judged only
    against a second seed's spread (`seed_fid`), by `keep.judge_fid`; `early` (see `still_learning`) or no second
    seed: the FIDs are shown and not judged."""
    fids = f"FID {fid_start:.1f} and {fid:.1f}"
    if early:
        return (f"; {fids}: quality not judged (a generator here draws fewer than {100 * ENOUGH_CLASSES:.0f}% of "
                "the classes, still learning which exist)"), None
    if fid_spread is None:
        return f"; {fids}: quality not judged (no second seed)", None
    judged = judge_fid(fid, fid_start, seed_fid(fid_start, fid_spread))
    text = (f"; FID went from {fid_start:.1f} to {fid:.1f} ({judged.moved:.2f}x), where a second seed of the start "
            f"moves it {judged.spread:.2f}x (limit {judged.limit:.2f}x)")
    if judged.worse:
        return f"{text}: **quality fell** beyond that", True
    return text + (": **better** beyond that" if judged.better else ": quality kept"), False


def fid_trend(curve, x: str = "images_trained") -> str:
    """How one run's FID moved over its scores (`runs.quality_curve`: a History with `fid` and `x` columns), by the
    factor that counts as a change of quality (`keep.QUALITY_TARGET`). It describes one run and judges no quality:
    the largest rise above the best score before it, where one passed the factor (a collapse the end alone would
    hide), then how it ended: still falling (over the last interval by more than the factor, or over the last two,
    each lower than the one before, from the best score up to then by more than the factor), risen, or neither
    (settled or stuck)."""
    fid, at = curve.column("fid"), curve.column(x)
    where = (lambda i: f"step {at[i]}") if x == "step" else (lambda i: f"{at[i]:,} images")
    if not fid:
        return "no FID scores"
    broken = next((i for i, f in enumerate(fid) if not math.isfinite(f)), None)
    if broken is not None:
        return f"FID {fid[broken]} at {where(broken)}: not a finite score, so no trend is read"
    if len(fid) < 2:
        return f"FID {fid[0]:.1f} at {where(0)}: one score, no trend"
    best = [min(range(i), key=fid.__getitem__) for i in range(1, len(fid))]  # the best index before each score
    rise = max(range(1, len(fid)), key=lambda i: fid[i] / max(fid[best[i - 1]], 1e-9))
    low = best[rise - 1]
    risen = fid[rise] / max(fid[low], 1e-9) > QUALITY_TARGET
    if risen and rise == len(fid) - 1:
        return (f"FID {fid[low]:.1f} at {where(low)}, {fid[-1]:.1f} at {where(-1)}: **rose** "
                f"{fid[-1] / fid[low]:.2f}x above its best by the end")
    text = (f"FID **rose** {fid[rise] / fid[low]:.2f}x on the way, from {fid[low]:.1f} at {where(low)} to "
            f"{fid[rise]:.1f} at {where(rise)}; then " if risen else "")
    two = len(fid) >= 3 and fid[-3] > fid[-2] > fid[-1]  # the last two intervals both fell
    first = len(fid) - 3 if two else len(fid) - 2
    text += f"FID {', '.join(f'{f:.1f}' for f in fid[first:])} from {where(first)} to {where(-1)}"
    best = min(fid[:first + 1]) if two else 0.0  # two intervals: from the best score up to their start
    fell = max(fid[-2], best) / max(fid[-1], 1e-9)
    over = "its last interval" if fid[-2] >= best else "its last two intervals, from its best up to then"
    if fell > QUALITY_TARGET:
        return text + f": **still falling** ({fell:.2f}x lower over {over}): not settled at this budget"
    return text + f": no longer falling by more than {QUALITY_TARGET}x, settled or stuck at this budget"


def _decision(verdict: str, worse: bool | None) -> str:
    """What to do, from the speed verdict and whether quality fell (None: not judged)."""
    if verdict == FASTER:
        return ("keep it" if not worse else "faster, but quality fell beyond a second seed's spread: a trade, "
                "not a free gain; leave it off unless the time matters more than these images")
    if verdict == SLOWER:
        return "slower here: leave it off on this machine"
    if verdict == NO_DIFFERENCE:
        return ("no difference measured, and quality fell: leave it off" if worse else
                "nothing to keep on this machine; time it longer to tell a small gain from none")
    if verdict == TOO_NOISY:
        return "too noisy to tell: measure it again on a quiet machine"
    return "one measurement, no verdict: time it in turns against the start (a paired range) before keeping it"


SHORT_DECISION = {FASTER: "keep it", SLOWER: "leave it off", NO_DIFFERENCE: "nothing to keep",
                  TOO_NOISY: "too noisy to tell", ONE_MEASUREMENT: "one measurement, no verdict"}


def keep_or_leave(change: str, start: str, speedup: float, fid: float | None = None,
                  fid_start: float | None = None, early: bool = False, paired=None,
                  fid_spread=None) -> Conclusion:
    """Whether to keep `change` over `start`: "keep it" only when it ran faster on the paired range
    (`speed_verdict`) and quality is not judged worse (`quality_words`).

    Args:
        change: the change's name, as the sentence shows it.
        start: what it is compared with.
        speedup: the change's images/s over the start's.
        fid: the change's FID, or None where it cannot affect images.
        fid_start: the start's, at the same number of training images.
        early: whether the generators are still early in training (FIDs shown, not judged).
        paired: the round-by-round ratios (`Race.paired`, `SideBySide.paired`: a `turns.Paired`; a bare (low,
            high) is read as its two ends); None: one measurement, no verdict.
        fid_spread: a second seed's spread of the start's FID (see `seed_fid`); None: quality not judged.

    Returns:
        The `Conclusion`: the sentence, and whether to keep the change."""
    verdict = speed_verdict(paired)
    text = f"Here **{change}** ran {speed_words(speedup, f'**{start}**', paired)}"
    worse, quality = None, ""
    if fid is not None and fid_start is not None:
        clause, worse = quality_words(fid, fid_start, early, fid_spread)
        text += clause
        quality = "; quality not judged" if worse is None else "; quality fell" if worse else "; quality kept"
    keep = verdict == FASTER and not worse
    decision = "a trade: faster, quality fell" if verdict == FASTER and worse else SHORT_DECISION[verdict]
    ranged = f", {paired_text(paired)}" if _paired(paired) else ""
    short = f"**{change}**: {shown_ratio(speedup, paired):.2f}x {start}{ranged}{quality}: **{decision}**."
    return Conclusion(f"{text}: **{_decision(verdict, worse)}**.", keep, short)


def _overlap(a: Paired, b: Paired) -> bool:
    return a.low <= b.high and b.low <= a.high


def agreement(plain: float, switch: float, what: str = "speed-up", tolerance: float = 0.10,
              plain_paired=None, switch_paired=None) -> Conclusion:
    """Whether the plain loop's measured `what` and gantools' switch's agree: where both come with paired ranges,
    when the ranges overlap; otherwise within `tolerance` (a share) of each other."""
    a, b = _paired(plain_paired), _paired(switch_paired)
    plain, switch = shown_ratio(plain, plain_paired), shown_ratio(switch, switch_paired)  # what each verdict reads
    shown = [f"{x:.2f}x" + (f" ({paired_text(p)})" if p else "") for x, p in ((plain, a), (switch, b))]
    text = f"The lines in your own loop gave a {what} of {shown[0]}, gantools' switch {shown[1]}: "
    gap = abs(plain / switch - 1)
    head = f"Your loop's lines {plain:.2f}x, gantools' switch {switch:.2f}x ({what})"
    if a is not None and b is not None:
        agree = _overlap(a, b)
        return Conclusion(text + ("their paired ranges overlap: **they agree** within the noise, so the switch is "
                                  "these lines." if agree else
                                  "their paired ranges do not overlap: **they differ** beyond each one's noise. "
                                  "They were timed at different moments, so the machine's state may differ between "
                                  "them; or the rest of each loop (gantools' step does more than the plain one) "
                                  "makes the same change weigh differently."), agree,
                          f"{head}: **{'they agree' if agree else 'they differ'}**.")
    if gap <= tolerance:
        return Conclusion(text + f"they agree (within {100 * tolerance:.0f}%), so the switch is these lines.", True,
                          f"{head}: **they agree**.")
    return Conclusion(text + f"they differ by {100 * gap:.0f}%: either the timings' noise (a short run's ratio moves "
                      "this much), or the rest of each loop (gantools' step does more than the plain one) makes the "
                      "same change weigh differently; time both in turns, with paired ranges, to tell.", False,
                      f"{head}: **they differ**.")


def settled(paired: dict, change: str | None = None) -> Conclusion:
    """Whether several measurements of one change (where -> paired range, e.g. the plain loop's race and the
    trainer's runs) reach the same speed verdict: a verdict one of them cannot reproduce is not settled here."""
    said = {where: speed_verdict(p) for where, p in paired.items()}
    head = f"**{change}**: " if change else ""
    if len(set(said.values())) == 1:
        return Conclusion(f"{head}{'both' if len(said) == 2 else 'all'} measurements say "
                          f"**{next(iter(said.values()))}**.", True)
    return Conclusion(head + " and ".join(f"{where} says **{v}**" for where, v in said.items()) + ": the "
                      "measurements do not settle on one verdict, so this change's speed is not settled on this "
                      "machine; time them longer to tell.", False)


def estimate_held(change: str, estimate: float | None, measured: float, spread: tuple | None = None,
                  by: str = "the doctor") -> Conclusion:
    """Whether a speed-up measured on the code itself (`doctor --try`'s paired repeats: `measured`, with its paired
    ratios in `spread`, or their (low, high); None: one measurement) bears out the doctor's estimate for that fix: an
    upper bound ("up to 1.30x", Amdahl's law on a profiled share under an assumption such as "autocast halves the
    convolutions' time"), or None where it made none ("measure it"). Beyond the bound means the whole paired range
    above it; one measurement decides nothing. `keep` is True when the measurement stayed within the bound: the
    estimate held (a bound promises no gain, so a fix that gave none does not contradict it). `by`: whose estimate,
    as the sentence names it ("the profiler" for a `profiling.Verdict`'s)."""
    paired, measured = _paired(spread), shown_ratio(measured, spread)
    verdict = speed_verdict(paired)
    text = f"**{change}**: measured {measured:.2f}x ({paired_text(paired) if paired else 'one measurement'})"

    def said(outcome: str, why: str, keep: bool) -> Conclusion:
        bound = f" against an estimate of up to {estimate:.2f}x" if estimate else ""
        return Conclusion(f"{text}{why}", keep, f"**{change}**: {measured:.2f}x{bound}: **{outcome}**.")
    if estimate is None:
        return said(verdict, f"; {by} made no estimate (\"measure it\"), so the measurement is the only figure: "
                             f"**{verdict}** here.", True)
    text += f" against {by}'s estimate of up to {estimate:.2f}x"
    if paired is None:
        return said(ONE_MEASUREMENT, f": **{ONE_MEASUREMENT}**: time it in turns (paired ratios) to hold it to "
                                     "the estimate.", True)
    if paired.low > estimate:
        return said("more than the estimate allowed", ": **more than the estimate allowed** (the whole paired range "
                    "above it): the assumption behind the estimate was too modest on this machine, so the bound does "
                    "not limit this fix here.", False)
    within = "within the bound" if measured <= estimate else "above the bound by less than the noise"
    if verdict != FASTER:
        gave = ("it made the step slower" if verdict == SLOWER else "the measurement is too noisy to hold to the "
                "bound" if verdict == TOO_NOISY else "it gave nothing the keep rule keeps")
        return said(verdict, f": {within}, but **{verdict}**: an estimate says what a fix could give at most, and "
                             f"here {gave}.", True)
    share = (measured - 1) / (estimate - 1) if estimate > 1 else 1.0
    return said("the estimate held", f": {within}: **the estimate held**, and the fix gave "
                                     f"{100 * min(share, 1):.0f}% of the gain it allowed.", True)


def same_story(a: dict, b: dict, a_name: str, b_name: str, tolerance: float = 0.10) -> Conclusion:
    """Whether two profiles' shares (`profiling.time_shares`, name -> share) agree within `tolerance` (a share, so
    0.10 is ten points): whether a plain loop's profile and gantools' say the same about where the time goes."""
    apart = [name for name in a if abs(a[name] - b[name]) > tolerance]
    first, *rest = a
    pairs = [f"{first} {100 * a[first]:.0f}% in **{a_name}**, {100 * b[first]:.0f}% in **{b_name}**",
             *(f"{name} {100 * a[name]:.0f}% and {100 * b[name]:.0f}%" for name in rest)]
    text = f"Where the time goes: {'; '.join(pairs)}: "
    if not apart:
        text += f"**the same story** (each within {100 * tolerance:.0f} points)."
    else:
        text += (f"they differ by more than {100 * tolerance:.0f} points in {' and '.join(apart)}: the two loops "
                 "differ in more than their labels, so compare their phases one by one.")
    return Conclusion(text, not apart)


def worth_removing(share: float, what: str = "waiting for data", fix: str = "feed the device faster",
                   noise: float = 0.0) -> Conclusion:
    """Whether `what`, taking `share` (0-1) of each step, is a bottleneck worth the work: at least `DATA_BOTTLENECK`
    of the step. Removing it entirely makes the step at most 1 / (1 - share) as fast (Amdahl's law), the bound the
    sentence shows. `.keep` is True when it is a bottleneck. `noise`: the spread of the timings the share was
    computed from; a share below it is not a measurement."""
    share = min(max(share, 0.0), 1.0)  # a share measured as a difference of two speeds can fall below zero: noise
    text = f"Here the step spent **{100 * share:.1f}%** of its time {what}"
    head = f"{what[0].upper()}{what[1:]}: **{100 * share:.1f}%** of the step"
    if share < noise:
        return Conclusion(f"{text}, less than the timings' own spread (±{100 * noise:.0f}%): **too small for this "
                          "measurement to tell from nothing**; time the wait directly to judge it.", False,
                          f"{head}: **too small to tell from nothing** here.")
    if share >= 1:
        return Conclusion(f"{text}: it did nothing else: **this is the bottleneck: {fix}**.", True,
                          f"{head}: **the bottleneck: {fix}**.")
    text += f", so removing that entirely would make the step at most {1 / (1 - share):.3f}x as fast"
    if share >= DATA_BOTTLENECK:
        return Conclusion(f"{text}: at least the {100 * DATA_BOTTLENECK:.0f}% that counts as a bottleneck: **a "
                          f"bottleneck here: {fix}**.", True, f"{head}: **a bottleneck here: {fix}**.")
    return Conclusion(f"{text}: under the {100 * DATA_BOTTLENECK:.0f}% that counts as a bottleneck: **not this "
                      "machine's bottleneck**; the step's time goes to compute.", False,
                      f"{head}: **not this machine's bottleneck**.")


def scaling_prediction(speedup: float, start: str, processes: int = 2, paired=None,
                       predict=(2, 4, 8)) -> Conclusion:
    """What `processes` workers measured against one (`speedup`, with its paired range) predict for more, by
    Amdahl's law: the parallel share P that gives the measured speed-up (`protocol.parallel_share`), then
    S(N) = 1 / ((1 - P) + P / N) for each N in `predict`, and the limit 1 / (1 - P). Only a speed-up the paired
    range calls faster (`speed_verdict`) gives a P; `.keep` is True when it did. A prediction, not a measurement:
    the law assumes the serial part stays the same at every N (a ring all-reduce's time grows with N)."""
    from ..measuring.protocol import amdahl_speedup, parallel_share

    verdict, speedup = speed_verdict(paired), shown_ratio(speedup, paired)  # the figure the verdict reads
    text = (f"{processes} processes ran {speed_words(speedup, f'**{start}**', paired)}: scaling efficiency "
            f"{100 * speedup / processes:.0f}% (the speed-up over the processes)")
    head = f"{processes} processes: {speedup:.2f}x one ({100 * speedup / processes:.0f}% efficiency)"
    if verdict != FASTER:
        return Conclusion(f"{text}. **No parallel share can be read from that** (it needs a speed-up the paired "
                          "range calls faster), so no prediction for more processes.", False,
                          f"{head}, {verdict}: **no prediction for more processes**.")
    p = parallel_share(speedup, processes)
    spread = _paired(paired)
    low, high = parallel_share(spread.low, processes), parallel_share(spread.high, processes)
    text += (f". Amdahl's law, S = 1/((1-P) + P/N), gives that at N = {processes} with **P = {p:.2f}** "
             f"({low:.2f}-{high:.2f} over the paired range): the share of one process's step that the processes "
             "split")
    if p >= 1:
        return Conclusion(f"{text}; nothing serial is left to limit more processes, so the law predicts N times "
                          "as fast at any N: **a prediction the law cannot bound** (the speed-up met the process "
                          "count, as when one process lacked a resource that two have).", True,
                          f"{head}: **P = {p:.2f}**, no serial part left to bound it.")
    shown = ", ".join(f"N = {n}: {amdahl_speedup(p, n):.2f}x ({100 * amdahl_speedup(p, n) / n:.0f}%)"
                      for n in predict)
    return Conclusion(f"{text}. **Predicted from this machine's P**, not measured: {shown}; never more than "
                      f"{1 / (1 - p):.1f}x, however many processes.", True,
                      f"{head}: **P = {p:.2f}**, at most {1 / (1 - p):.1f}x however many processes (predicted).")


def memory_verdict(mb: float, start_mb: float) -> str:
    """LESS or MORE when a step's peak tensor memory differs from the start's by more than `MEMORY_SAME` of it,
    else SAME_MEMORY."""
    held = mb / start_mb
    return LESS if held < 1 - MEMORY_SAME else MORE if held > 1 + MEMORY_SAME else SAME_MEMORY


def memory_words(mb: float, start_mb: float, start: str) -> str:
    """'**62 MB**, 0.62x the 99 MB of fp32: **less memory**'."""
    return (f"**{megabytes(mb)}**, {mb / start_mb:.2f}x the {megabytes(start_mb)} of {start}: "
            f"**{memory_verdict(mb, start_mb)}**")


def memory_trade(change: str, start: str, mb: float, start_mb: float, speedup: float, paired=None) -> Conclusion:
    """A change that saves memory, judged by both rules: its peak tensor memory (`memory_verdict`) and its speed
    (`speed_verdict`). Less memory at no speed cost: keep it. Less memory, slower: a trade, worth it only where
    memory limits the batch (`.keep` False: not by default). No saving: leave it."""
    memory, speed = memory_verdict(mb, start_mb), speed_verdict(paired)
    text = (f"**{change}** held {memory_words(mb, start_mb, start)}; it ran {speed_words(speedup, start, paired)}")
    head = f"**{change}**: {mb / start_mb:.2f}x the memory, {shown_ratio(speedup, paired):.2f}x the speed ({speed})"
    if memory != LESS:
        return Conclusion(f"{text}: **no memory saved here: leave it off**.", False, f"{head}: **leave it off**.")
    if speed == SLOWER:
        return Conclusion(f"{text}: **a trade: use it where memory limits the batch**, not by default.", False,
                          f"{head}: **a trade for when memory limits the batch**.")
    if speed in (ONE_MEASUREMENT, TOO_NOISY):
        return Conclusion(f"{text}: **less memory; what it costs in speed is not judged here**.", False,
                          f"{head}: **less memory, speed not judged**.")
    return Conclusion(f"{text}: **keep it** (less memory, no speed lost that this run could measure).", True,
                      f"{head}: **keep it**.")


def compile_payback(compile_s: float, step_s: float, compiled_step_s: float, paired=None,
                    start: str = "eager") -> Conclusion:
    """When compiling pays for itself: the seconds its first call spent compiling (`compile_s`, beyond a step's own
    time) come back only from the time each compiled step saves (`step_s - compiled_step_s`), so after
    compile_s / saved steps, and only where the steps measured faster (`speed_verdict` of the race's `paired`
    range). `.keep` True when they did: then a run longer than that many steps gains."""
    verdict, speedup = speed_verdict(paired), step_s / compiled_step_s
    text = (f"Compiling took **{compile_s:.1f} s** before the first step; then the compiled step ran "
            f"{speed_words(speedup, start, paired)}")
    head = f"Compiling: {compile_s:.1f} s, then {shown_ratio(speedup, paired):.2f}x {start} ({verdict})"
    if verdict == SLOWER:
        return Conclusion(f"{text}: **it does not pay back here**: with slower steps the compile time is never "
                          "returned on this machine.", False, f"{head}: **it does not pay back here**.")
    if verdict != FASTER or step_s <= compiled_step_s:
        return Conclusion(f"{text}: **no payback measured**: the steps were not measured faster, so no number of "
                          "steps returns the compile time that this run could show.", False,
                          f"{head}: **no payback measured**.")
    steps = compile_s / (step_s - compiled_step_s)
    return Conclusion(f"{text}, saving {1e3 * (step_s - compiled_step_s):.1f} ms a step: **it pays back after "
                      f"{steps:,.0f} steps** ({steps * step_s / 60:.1f} min of {start} training); a shorter run is "
                      "faster without it.", True, f"{head}: **it pays back after {steps:,.0f} steps**.")
