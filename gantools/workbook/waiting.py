"""How much of a step waits, answered once. A wait (for data, say) can be read three ways in one notebook: timed
directly by the trainer (`measuring.clock.StepClock.data_wait`), implied by a race's speed-up when the wait is
removed (a share s gives 1 / (1 - s)), and predicted from the loader timed alone. Only the first measures the wait
itself; the other two read it through whole steps' speeds, noise included. So the timed share is the evidence and
gets the verdict (`conclusions.worth_removing`); the other two are set beside it and said to agree or not; and each
fix that removed the wait is read against the most removing it could give (Amdahl's law), so that a small wait's
fix measured as "no difference" and the wait's own verdict tell one story."""
from __future__ import annotations

from dataclasses import dataclass

from .conclusions import FASTER, Conclusion, paired_text, shown_ratio, speed_verdict, worth_removing


@dataclass
class Fix:
    """A change that removed (some of) the wait: its name, its run's summary (`data_wait_ms`, `step_time_ms`),
    its speed over the start's and the paired range of that ratio (`SideBySide.paired`)."""
    name: str
    summary: dict
    ratio: float
    paired: object = None


def implied_share(ratio: float) -> float:
    """The share of the start's step that a change made `ratio` times as fast removed, if all it removed was
    waiting: 1 - 1 / ratio (Amdahl's law read backwards; below zero where the change ran slower)."""
    return 1 - 1 / ratio


def timed_share(summary: dict) -> float:
    """The share of a run's step spent waiting, as its trainer timed it."""
    return summary["data_wait_ms"] / summary["step_time_ms"]


def _estimates(share: float, implied, predicted) -> str:
    """The indirect readings beside the timed share, and whether a race's implied range holds it."""
    parts, held = [], None
    if implied is not None:
        name, ratio, paired = implied
        shown = f"{100 * implied_share(shown_ratio(ratio, paired)):.1f}%"
        if paired is not None:
            low, high = (implied_share(x) for x in paired)
            held = low <= share <= high
            shown += f" ({100 * low:.1f}%-{100 * high:.1f}% over its paired range)"
        parts.append(f"The race's speed-up with **{name}** implies {shown}")
    if predicted is not None:
        parts.append(f"{'the' if parts else 'The'} loader timed alone predicts {100 * predicted:.1f}%")
    if not parts:
        return ""
    text = " " + ", ".join(parts)
    if held is None:
        return text + "."
    return text + (": the race's range holds the timed share, so they agree within the race's noise." if held else
                   ": the race's range misses the timed share; the race reads the wait through whole steps of "
                   "another loop, so the timed wait is the one to go by.")


def _fix_words(fix: Fix, start: dict) -> tuple[str, str]:
    """What `fix` did to the wait, and its speed read against the gain that removing that much wait gives with the
    rest of the step unchanged (Amdahl's law): the sentence, and a few words for the one-line answer."""
    removed = start["data_wait_ms"] - fix.summary["data_wait_ms"]
    wait = f"**{fix.name}** cut the wait to {fix.summary['data_wait_ms']:.2f} ms"
    if fix.paired is None:
        return f"{wait}; its speed ({fix.ratio:.2f}x) is one measurement, no verdict.", "one measurement"
    gain = start["step_time_ms"] / max(start["step_time_ms"] - removed, 1e-9)
    low, high = fix.paired
    ranged = f"{shown_ratio(fix.ratio, fix.paired):.2f}x, {paired_text(fix.paired)}"
    rest = (f"{fix.summary['step_time_ms'] - fix.summary['data_wait_ms']:.0f} ms against "
            f"{start['step_time_ms'] - start['data_wait_ms']:.0f} ms, the waits left out")
    if low > gain:
        return (f"{wait} and ran faster than that explains ({ranged}, above {gain:.3f}x): the rest of its step "
                f"ran faster too ({rest}).", "faster than the wait explains")
    if high < gain:
        return (f"{wait} but ran slower than that should give ({ranged}, below {gain:.3f}x): the rest of its step "
                f"ran slower ({rest}), e.g. worker processes competing with the step for the cores.",
                "slower than the removed wait should give")
    verdict = speed_verdict(fix.paired)
    if verdict == FASTER:
        return f"{wait} and ran faster ({ranged}), as removing it allows (up to {gain:.3f}x).", "faster"
    return (f"{wait}, worth at most {gain:.3f}x: inside its paired range ({ranged}), so runs this long cannot tell "
            f"that gain from nothing (**{verdict}**); the wait it removed shows that it works.",
            f"worth up to {gain:.3f}x, which these runs cannot tell from nothing")


def one_answer(start: dict, fixes: list[Fix] = (), implied=None, predicted: float | None = None,
               what: str = "waiting for data") -> Conclusion:
    """The wait's one answer: the timed share's verdict (`conclusions.worth_removing`), then, behind it, the
    indirect readings set against it and each fix read against the most removing the wait could give.

    Args:
        start: the start's summary (`data_wait_ms`, `step_time_ms`: the wait timed by its trainer).
        fixes: the changes that removed the wait (`Fix`), each timed by its own trainer in the same turns.
        implied: (name, ratio, paired) of a race in which `name` removed the wait: the share its speed-up implies.
        predicted: the share predicted another way (the loader timed alone), or None.
        what: the wait, as the sentence names it.

    Returns:
        The `Conclusion`: one line (`short`: the verdict and each fix in a few words), the whole reading behind it;
        `keep` as `worth_removing`'s (a bottleneck)."""
    share = timed_share(start)
    verdict = worth_removing(share, f"{what} ({start['data_wait_ms']:.2f} ms of a {start['step_time_ms']:.1f} ms "
                                    f"step, timed by the trainer)")
    said = [_fix_words(fix, start) for fix in fixes]
    text = " ".join([verdict.text + _estimates(share, implied, predicted), *(sentence for sentence, _ in said)])
    short = " ".join([verdict.short or verdict.text, *(f"**{fix.name}** cut it to "
                                                       f"{fix.summary['data_wait_ms']:.2f} ms: {words}."
                                                       for fix, (_, words) in zip(fixes, said, strict=True))])
    return Conclusion(text, verdict.keep, short)
