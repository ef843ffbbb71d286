"""Keep a change or drop it: the one rule `tune` and `doctor --try` share, and the notebooks' conclusions too.

Speed (`decide`, `decide_in_two`): a sequential sign test on paired ratios. The candidate is measured against the
incumbent in paired repeats; a close call is measured again, as many repeats more, and decided once more. A range
of paired ratios wider than the effect it would decide on (`too_noisy`) decides nothing: the machine's load did not
cancel in the pairs, so it is measured again, and said to be too noisy if it still is.

Quality (`judge_fid`): FID of the changed run against the start's at an equal number of training images. A short
GAN run's FID moves by chance from seed to seed, so a change counts as hurting (or helping) quality only beyond the
wider of `QUALITY_TARGET` and what a second seed of the unchanged start moves it; that second seed costs a whole
training run, so it is trained only when a decision needs it.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

from ..measuring.turns import Paired, Spread

QUALITY_TARGET = 1.1  # a FID within this factor of the start's reads as quality kept (evidence: docs/tune.md)
# A FID compares shapes only between generators that draw most classes: below this share of them (8 of 10 glyph
# classes) a run is still learning which classes exist, and its FID moves by hundreds from seed to seed
ENOUGH_CLASSES = 0.8
# Half a paired range past this share of its median (`Spread.share_of`, the noise in a figure) is more noise than
# pairing leaves on a machine doing nothing else (the ranges docs/doctor.md shows); one under another job's load
# spans several times the ratio
NOISE_LIMIT = 0.25
TOO_NOISY = "too noisy"
FIRST_LOOK = 5  # repeats in a first look (bench.PLAN's, doctor --try's REPEATS); a close call gets as many again
QUIET = "measure again on a quiet machine"


def too_noisy(ratio: float, spread: Spread) -> bool:
    """Whether paired ratios with median `ratio` and range `spread` are too noisy to keep or drop on: the range holds
    1 (neither every repeat won nor every one lost), its half is past `NOISE_LIMIT` of the median, and past the
    effect itself (the median's distance from 1). A change that does nothing on a quiet machine has a range wider
    than its effect but narrow; a real gain measured under load a range several times itself."""
    half = (spread.high - spread.low) / 2
    return spread.low <= 1 <= spread.high and spread.share_of(ratio) > NOISE_LIMIT and half > abs(ratio - 1)


def decide(incumbent_runs: list, candidate_runs: list, final: bool = True) -> tuple[bool | None, float, Paired, str]:
    """Keep the candidate or not (`decide_paired` on the candidate's images/s over the incumbent's, repeat by repeat).
    """
    return decide_paired(Paired(c / i for c, i in zip(candidate_runs, incumbent_runs, strict=True)), final)


def decide_paired(paired: Paired, final: bool = True) -> tuple[bool | None, float, Paired, str]:
    """Keep the candidate or not: the rule, a sequential sign test on paired ratios.

    Each repeat of an interleaved measurement times the incumbent and the candidate back to back, so repeat r gives
    one paired ratio rho_r = candidate images/s / incumbent images/s, in which machine noise common to both
    cancels. The speed-up is the median of the rho_r; the spread shown is their range [min rho, max rho].

    First measurement (`final=False`, the plan's repeats, 5): kept if the whole range lies above 1 (it won every
    repeat; a change that does nothing passes by chance 1 time in 32); not kept if it is not faster on the median;
    otherwise undecided (None): faster on the median but it lost a repeat, which on a noisy machine is what a small
    real gain often does. The caller then measures as many repeats again and asks once more (`final=True`): kept if
    faster on the median and it won at least 80% of all the repeats (8 of 10), i.e. the range without its lowest and
    highest fifth lies above 1. How often each stage keeps a change that does nothing, and one slightly faster:
    docs/tune.md.

    A range too noisy to decide on (`too_noisy`) is undecided at the first look and, at the last, neither kept nor
    dropped (None, "too noisy: ..."): the caller says to measure again on a quiet machine.

    Args:
        paired: the candidate's round-by-round ratios over the incumbent (`measuring.turns.Paired`).
        final: whether this is the last look (undecided only when too noisy).

    Returns:
        (kept, or None when undecided or too noisy; speed-up; the paired ratios; why, starting "kept: ",
        "not kept: ", "undecided: " or "too noisy: ")."""
    ratios, spread = paired.ratios, paired
    ratio = statistics.median(ratios)
    shown = f"{ratio:.2f}x ({spread[0]:.2f}-{spread[1]:.2f})"
    wins, n = sum(r > 1 for r in ratios), len(ratios)
    if spread[0] > 1:
        return True, ratio, spread, f"kept: {shown}, faster in all {n} repeats"
    if too_noisy(ratio, spread):
        head = f"{TOO_NOISY}: " if final else "undecided: "
        return None, ratio, spread, f"{head}{shown}, a paired range wider than the effect: {QUIET}"
    if ratio <= 1:
        return False, ratio, spread, f"not kept: {shown}, not faster"
    if not final:
        return None, ratio, spread, f"undecided: {shown}, faster in {wins} of {n} repeats"
    if wins >= 0.8 * n:
        return True, ratio, spread, f"kept: {shown}, faster in {wins} of {n} repeats"
    return False, ratio, spread, f"not kept: {shown}, faster in only {wins} of {n} repeats: within the noise"


def decide_in_two(incumbent_runs: list, candidate_runs: list, again: Callable[[str], tuple | None]
                  ) -> tuple[bool, float, Spread, str]:
    """The two stages of `decide` in one: decided on the first measurement where it can be; undecided, measured
    again (`again`) and decided on all the repeats; undecided with no room to measure again, not kept.

    Args:
        incumbent_runs: the first measurement's incumbent images/s per repeat.
        candidate_runs: the candidate's, paired with them.
        again: called with the undecided reason; measures as many repeats again and returns the new
            (incumbent runs, candidate runs), or None when there is no time left to. It may raise to end the
            comparison its own way (a run that broke, say).

    Returns:
        (kept, speed-up, spread, why) as `decide` gives them, never undecided; kept is None only when too noisy."""
    first = list(incumbent_runs), list(candidate_runs)  # as measured: `again` may extend the caller's lists
    kept, ratio, spread, why = decide(*first, final=False)
    if kept is not None:
        return kept, ratio, spread, why
    more = again(why)
    if more is None:
        return _no_second_look(ratio, spread, why, "and no time left to measure it again")
    return decide([*first[0], *more[0]], [*first[1], *more[1]])


def _no_second_look(ratio: float, spread: Paired, why: str, because: str) -> tuple[bool | None, float, Paired, str]:
    """An undecided first look that is not measured again: too noisy where it is, else not kept."""
    why = why.removeprefix("undecided: ")
    if too_noisy(ratio, spread):
        return None, ratio, spread, f"{TOO_NOISY}: {why}"
    return False, ratio, spread, f"not kept: {why}, {because}"


def decide_once(paired: Paired) -> tuple[bool | None, float, Paired, str]:
    """A measurement that is not taken again (a notebook's race, trained runs side by side), decided as
    `decide_in_two` decides with no room for a second look: up to twice `FIRST_LOOK` rounds it is a first look
    (kept only when it won every round; a close call not kept), from then on it holds both looks' rounds and is
    the last look (kept with 80% of the rounds won). Kept is None only when too noisy."""
    final = len(paired.ratios) >= 2 * FIRST_LOOK
    kept, ratio, spread, why = decide_paired(paired, final)
    if kept is not None or final:
        return kept, ratio, spread, why
    return _no_second_look(ratio, spread, why, "and not measured again")


@dataclass(frozen=True, kw_only=True)
class FidJudgement:
    """How far a change moved FID, judged against the limit: `QUALITY_TARGET`, widened to a second seed's spread
    where that seed was trained (`seed_fid`, `spread`: None where no decision needed it)."""

    moved: float
    limit: float
    seed_fid: float | None = None
    spread: float | None = None
    not_judged: str | None = None  # why quality is not judged (`too_few_classes`); None where it is

    @property
    def worse(self) -> bool:
        """FID rose past the limit: quality not kept (never where it is not judged)."""
        return self.not_judged is None and self.moved > self.limit

    @property
    def better(self) -> bool:
        """FID fell past the limit's inverse (never where it is not judged)."""
        return self.not_judged is None and self.moved < 1 / self.limit


def too_few_classes(**scores: dict) -> str | None:
    """Why these runs' FIDs cannot be judged against each other (name -> a score with `classes_covered` and
    `classes`, as `metrics` and a trainer's summary give them): one draws fewer than `ENOUGH_CLASSES` of the
    classes, so its FID says which classes it has learned yet, not how well it draws them. None where every run
    draws enough, or where a score has no class count (a dataset without a classifier: FID alone is judged)."""
    few = [f"{name} draws {s['classes_covered']} of {s['classes']} classes" for name, s in scores.items()
           if s.get("classes_covered") is not None and s.get("classes")
           and s["classes_covered"] < ENOUGH_CLASSES * s["classes"]]
    if not few:
        return None
    return (f"{' and '.join(few)}, under the {100 * ENOUGH_CLASSES:.0f}% of classes a FID comparison needs: "
            "still learning which classes exist")


def judge_fid(fid: float, start_fid: float, seed: float | Callable[[], float] | None = None,
              classes: dict | None = None) -> FidJudgement:
    """Judge a change's FID against the start's, at an equal number of training images: not judged at all where
    `classes` (name -> score, see `too_few_classes`) says a run draws too few classes.

    Args:
        fid: the changed run's FID.
        start_fid: the start's.
        seed: the FID of the start trained with another seed: a number where it is already known (it then always
            widens the limit), a function that trains and scores it, called only when the change's FID is worse than
            `QUALITY_TARGET` allows (the one case where that seed can change the decision), or None where no second
            seed is to be had (the limit is then `QUALITY_TARGET`).

        classes: name -> score with `classes_covered` and `classes`, for the runs compared (None: not checked).

    Returns:
        The `FidJudgement`."""
    moved = fid / start_fid
    why = too_few_classes(**(classes or {}))
    if why:
        return FidJudgement(moved=moved, limit=QUALITY_TARGET, not_judged=why)
    seed_fid = (seed() if moved > QUALITY_TARGET else None) if callable(seed) else seed
    if seed_fid is None:
        return FidJudgement(moved=moved, limit=QUALITY_TARGET)
    spread = max(seed_fid / start_fid, start_fid / seed_fid)
    return FidJudgement(moved=moved, limit=max(QUALITY_TARGET, spread), seed_fid=seed_fid, spread=spread)
