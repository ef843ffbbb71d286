"""Taking turns: the one way gantools measures things against each other in one process (the benchmark's ladder,
tune, the tutorial's race, training side by side, `doctor --try`'s pairs).

Every contender is warmed up first, one after another (that time is kept apart: it holds torch.compile and
worker start-up); then they take turns for `repeats` rounds, one turn each per round, so machine noise hits them
all alike. In `ALTERNATE` order the round is reversed every other time (A B, B A, A B ...), so no contender always
runs right after the same one; in `SAME` order it is not (A B, A B ...). Each turn gives one images/s figure; a
contender's figure is the median of its turns and its spread (`Spread`) their lowest and highest. Two contenders'
turns pair up round by round (`Measured.ratios`), so noise common to both cancels in their ratio.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from . import hardware

ALTERNATE, SAME = "alternate", "same"


class Spread(NamedTuple):
    """The lowest and highest of a set of figures (images/s, or paired ratios): the noise a median carries. A
    tuple, so it reads and saves as (low, high)."""

    low: float
    high: float

    @classmethod
    def of(cls, values) -> "Spread | None":
        """The spread of `values`, or None when there are none."""
        values = list(values)
        return cls(min(values), max(values)) if values else None

    def share_of(self, median: float) -> float:
        """Half the range as a share of `median`: the noise in that figure (e.g. 0.05 for +-5%)."""
        return (self.high - self.low) / 2 / median


class Paired(Spread):
    """The round-by-round ratios of one contender over another (`Measured.ratios`), read as their range (a `Spread`:
    `.low`, `.high`, `low, high = p`) and kept whole in `.ratios`: what the one keep rule (`speed.keep`) decides on,
    since a range alone cannot say how many rounds were won."""

    ratios: tuple

    def __new__(cls, ratios):
        ratios = tuple(float(r) for r in ratios)
        paired = super().__new__(cls, min(ratios), max(ratios))
        paired.ratios = ratios
        return paired

    def __getnewargs__(self):  # pickled and copied from its ratios, not its (low, high)
        return (self.ratios,)

    @classmethod
    def of(cls, ratios) -> "Paired | None":
        """The paired ratios, or None with fewer than two rounds: one ratio is one measurement, not a range a
        verdict could read (`conclusions.speed_verdict` then says "one measurement, no verdict")."""
        ratios = list(ratios)
        return cls(ratios) if len(ratios) >= 2 else None

    def scaled(self, k: float) -> "Paired":
        """Every ratio times `k`: the same rounds read in another unit (images/s ratios as time per G step)."""
        return Paired(k * r for r in self.ratios)


@dataclass
class Measured:
    """One contender of `take_turns`: what took the turns (`subject`: a trainer, a loop, a config), its warm-up
    seconds, what each turn returned (`turns`, in round order) and each turn's images/s (`images_per_sec_runs`)."""

    subject: object = None
    warmup_s: float = 0.0
    turns: list = field(default_factory=list)
    images_per_sec_runs: list = field(default_factory=list)

    @property
    def images_per_sec(self) -> float:
        """The median over its turns."""
        return statistics.median(self.images_per_sec_runs)

    @property
    def spread(self) -> Spread:
        return Spread.of(self.images_per_sec_runs)

    def ratios(self, base: "Measured") -> list:
        """Round by round, this contender's images/s over `base`'s: paired figures, each pair run back to back."""
        return [a / b for a, b in zip(self.images_per_sec_runs, base.images_per_sec_runs, strict=True)]


@dataclass(frozen=True, kw_only=True)
class Contender:
    """How one contender takes part: `turn(subject)` runs one turn and returns its images/s (or what `figure`
    reads it from); `warm_up()`, when given, builds and warms the subject first (timed as warm-up), else `subject`
    takes the turns as it is."""

    turn: Callable
    warm_up: Callable | None = None
    subject: object = None


def take_turns(contenders: dict, repeats: int, *, order: str = ALTERNATE, figure: Callable = float,
               until: Callable | None = None, after_round: Callable | None = None,
               progress: Callable | None = None) -> dict:
    """Measure `contenders` (name -> `Contender`) against each other by taking turns (see the module docstring).

    Args:
        contenders: name -> Contender, warmed up and then taking turns in this order.
        repeats: rounds of turns.
        order: ALTERNATE (reversed every other round) or SAME.
        figure: reads a turn's images/s from what its `turn` returned.
        until: asked of each turn's result; True ends the measurement there (that turn kept in `turns` only).
        after_round: called with the round's index after each round.
        progress: told each warm-up's time and each round's end.

    Returns:
        name -> Measured, in the order of `contenders`.
    """
    progress = progress or (lambda line: None)
    measured = {}
    for name, contender in contenders.items():
        if contender.warm_up is None:  # taken as it is: nothing to warm up, no warm-up time
            measured[name] = Measured(subject=contender.subject)
            continue
        t0 = hardware.seconds()
        subject = contender.warm_up()
        measured[name] = Measured(subject=subject, warmup_s=hardware.seconds() - t0)
        progress(f"warmed up {name} in {measured[name].warmup_s:.1f} s")
    for r in range(repeats):
        names = list(measured) if order == SAME or r % 2 == 0 else list(measured)[::-1]
        for name in names:
            m = measured[name]
            result = contenders[name].turn(m.subject)
            m.turns.append(result)
            if until is not None and until(result):
                return measured
            m.images_per_sec_runs.append(figure(result))
        if after_round is not None:
            after_round(r)
        progress(f"repeat {r + 1}/{repeats} done")
    return measured
