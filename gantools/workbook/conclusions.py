"""Conclusions computed from a notebook's own numbers, so the sentence under a result stays true on any machine (a
GPU included): "here bf16 ran 1.62x as fast as fp32 and FID moved 1.03x: keep it". What counts as faster in one
run's ratio is decided here (`SPEED_BAND`); what counts as quality kept is tune's and doctor --try's rule
(`speed.keep.judge_fid`)."""
from __future__ import annotations

from dataclasses import dataclass

from ..speed.keep import QUALITY_TARGET, judge_fid

SPEED_BAND = 0.05  # a speed ratio within 5% of 1 reads as "no faster": timed chunks on a busy machine spread this much


@dataclass
class Conclusion:
    """A sentence in Markdown (shown as such in a notebook) and the decision it states, for code and tests."""
    text: str
    keep: bool

    def _repr_markdown_(self) -> str:
        return self.text

    def __str__(self) -> str:
        return self.text


def speed_words(ratio: float, start: str) -> str:
    """'1.62x as fast as fp32', 'no faster than fp32 (1.02x, ...)' or 'slower than fp32 (0.80x)'."""
    if abs(ratio - 1) < SPEED_BAND:
        return f"no faster than {start} ({ratio:.2f}x, within {100 * SPEED_BAND:.0f}%)"
    return f"{ratio:.2f}x as fast as {start}" if ratio > 1 else f"slower than {start} ({ratio:.2f}x)"


def still_learning(*scores: dict) -> bool:
    """Whether any of these scores (`tutorial.score`, a trainer's summary) comes from a generator that draws fewer
    than half the classes: a run that short has FIDs in the hundreds that move a lot from seed to seed, so they
    tell whether a change broke training, not whether it kept quality."""
    return any(2 * s["classes_covered"] < s["classes"] for s in scores)


def keep_or_leave(change: str, start: str, speedup: float, fid: float | None = None,
                  fid_start: float | None = None, early: bool = False) -> Conclusion:
    """Whether to keep `change` over `start`, from the speed-up measured in one run and, where the change can
    affect images, the two FIDs at the same number of training images, judged by `keep.judge_fid` (with no second
    seed: the notebook's sentence asks for one where FID rose). `early` (see `still_learning`): the FIDs are shown
    but not judged, and the decision rests on speed.

    Args:
        change: the change's name, as the sentence shows it.
        start: what it is compared with.
        speedup: the change's images/s over the start's.
        fid: the change's FID, or None where it cannot affect images.
        fid_start: the start's, at the same number of training images.
        early: whether the generators are still early in training.

    Returns:
        The `Conclusion`: the sentence, and whether to keep the change."""
    text = f"Here **{change}** ran {speed_words(speedup, f'**{start}**')}"
    quality_kept = True
    if fid is not None and fid_start is not None and early:
        text += (f"; FID {fid_start:.1f} and {fid:.1f} come from generators still early in training, so they "
                 "are not judged here")
    elif fid is not None and fid_start is not None:
        judged = judge_fid(fid, fid_start)
        quality_kept = not judged.worse
        text += f", and FID went from {fid_start:.1f} to {fid:.1f} ({judged.moved:.2f}x)"
    faster = speedup >= 1 + SPEED_BAND
    if faster and quality_kept:
        decision = "keep it"
    elif faster:
        decision = (f"faster, but FID rose by more than {100 * (QUALITY_TARGET - 1):.0f}%: look at the samples and "
                    "try a second seed before keeping it")
    elif speedup > 1 - SPEED_BAND:
        decision = ("no gain on this machine: the time goes elsewhere (01 finds where)" if quality_kept else
                    "no gain, and quality fell: leave it off")
    else:
        decision = "slower here: leave it off on this machine"
    return Conclusion(f"{text}: **{decision}**.", faster and quality_kept)


def agreement(plain: float, switch: float, what: str = "speed-up", tolerance: float = 0.10) -> Conclusion:
    """Whether the plain loop's measured `what` and gantools' switch's agree within `tolerance` (a share)."""
    gap = abs(plain / switch - 1)
    text = f"The lines in your own loop gave a {what} of {plain:.2f}x, gantools' switch {switch:.2f}x: "
    if gap <= tolerance:
        text += f"they agree (within {100 * tolerance:.0f}%), so the switch is these lines."
    else:
        text += (f"they differ by {100 * gap:.0f}%: either the timings' noise (a short run's ratio moves this much), "
                 "or the rest of each loop (gantools' step does more than the plain one) makes the same change weigh "
                 "differently; time both longer to tell.")
    return Conclusion(text, gap <= tolerance)


def estimate_held(change: str, estimate: float | None, measured: float, spread: tuple | None = None) -> Conclusion:
    """Whether a speed-up measured on the code itself (`doctor --try`'s paired repeats: `measured`, with the lowest and
    highest paired ratios in `spread`) bears out the doctor's estimate for that fix: an upper bound ("up to 1.30x",
    Amdahl's law on a profiled share under an assumption such as "autocast halves the convolutions' time"), or None
    where it made none ("measure it"). The noise is the wider of `SPEED_BAND` and the spread's half-width. `keep` is
    True when the measurement stayed within the bound, noise allowed: the estimate held (a bound promises no gain,
    so a fix that gave none within it does not contradict it)."""
    noise = max(SPEED_BAND, (spread[1] - spread[0]) / 2 / measured if spread else 0.0)
    shown = f"{measured:.2f}x" + (f" (paired {spread[0]:.2f}x-{spread[1]:.2f}x)" if spread else "")
    gained = measured >= 1 + noise
    text = f"**{change}**: measured {shown}"
    if estimate is None:
        return Conclusion(f"{text}; the doctor made no estimate (\"measure it\"), so the measurement is the only "
                          f"figure: **{'a gain' if gained else 'no gain beyond the noise'}** here.", True)
    text += f" against the doctor's estimate of up to {estimate:.2f}x"
    if measured > estimate * (1 + noise):
        return Conclusion(f"{text}: **more than the estimate allowed**, beyond the noise (±{100 * noise:.0f}%): the "
                          "assumption behind the estimate was too modest on this machine; the measurement is the "
                          "figure to trust.", False)
    within = "within the bound" if measured <= estimate else "above the bound by less than the noise"
    if not gained:
        return Conclusion(f"{text}: {within}, but **no gain beyond the noise** (±{100 * noise:.0f}%): an estimate "
                          "says what a fix could give at most, and here it gave nothing measurable.", True)
    share = (measured - 1) / (estimate - 1) if estimate > 1 else 1.0
    return Conclusion(f"{text}: {within}: **the estimate held**, and the fix gave {100 * min(share, 1):.0f}% of the "
                      "gain it allowed.", True)


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
    """Whether `what`, taking `share` (0-1) of each step, is worth making faster: removing it entirely makes the
    step at most 1 / (1 - share) as fast (Amdahl's law), so a share whose bound stays inside the speed band is not
    this machine's bottleneck, however much faster it could be made. `.keep` is True when it is worth the work.
    `noise`: the spread of the timings the share was computed from; a share below it is not a measurement."""
    share = min(max(share, 0.0), 1.0)  # a share measured as a difference of two speeds can fall below zero: noise
    text = f"Here the step spent **{100 * share:.1f}%** of its time {what}"
    if share < noise:
        return Conclusion(f"{text}, less than the timings' own spread (±{100 * noise:.0f}%): **too small for this "
                          "measurement to tell from nothing**; time the wait directly to judge it.", False)
    if share >= 1:
        return Conclusion(f"{text}: it did nothing else: **this is the bottleneck: {fix}**.", True)
    bound = 1 / (1 - share)
    text += f", so removing that entirely would make the step at most {bound:.3f}x as fast"
    if bound >= 1 + SPEED_BAND:
        return Conclusion(f"{text}: **a bottleneck here: {fix}**.", True)
    return Conclusion(f"{text}, less than the {100 * SPEED_BAND:.0f}% a speed-up needs to count: **not this "
                      "machine's bottleneck**; the step's time goes to compute.", False)
