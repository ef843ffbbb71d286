"""tune's time budget (`minutes`, wall clock): what is left, what the phases after the search are reserved, and what
a candidate would cost. Every estimate comes from what tune has measured so far (its trials' speeds, warm-ups and
scoring time), so the budget holds on any machine.

The reserve, kept from the start of the search: a quality run each for the start, the final config (costed at the
incumbent's speed: whatever is kept next is faster) and the start with a second seed (trained only when the final
FID rose past `keep.QUALITY_TARGET`, but on a short run it often does, so it is reserved), and the final speed check
(one more measurement). A quality function of yours that says what it trains (`train_images(cfg)`, as
`workbook.reconcile.scores_from`'s does) is costed by that, nothing where it already holds a config's scores; one that
says nothing is taken as quick. Not reserved: backing off kept changes (each one more quality run); where it runs
past the budget, the result says so and by how much (`TuneResult.summary`)."""
from __future__ import annotations

from ..core.config import TrainConfig
from ..measuring import hardware
from .space import Candidate
from .trials import Trials, key

# Extra warm-up when a candidate first turns torch.compile on (evidence: docs/tune.md).
COMPILE_S = 20.0


class Budget:
    """The clock tune runs against: `deadline` is `minutes` after it was made."""

    def __init__(self, minutes: float, trials: Trials):
        self.trials = trials
        self.t0 = hardware.seconds()
        self.deadline = self.t0 + 60 * minutes

    def left(self) -> float:
        return self.deadline - hardware.seconds()

    def reserve(self, start: TrainConfig, incumbent: TrainConfig) -> float:
        """Seconds kept for after the search (the module's docstring): quality runs for the start, the final and a
        second seed of the start, and the final speed check."""
        quality = 0.0
        if self.trials.options.quality is not False:
            runs = (start, incumbent, start.replace(seed=start.seed + 1))
            quality = sum(self.trials.quality_s(cfg, start) for cfg in runs)
        return quality + (self.trials.measure_s or 0.0)

    def estimate(self, cand: Candidate, incumbent: TrainConfig, compiled: bool) -> float:
        """Seconds to measure a candidate: the last measurement's wall time (before any: both contenders' images
        at the incumbent's profiled speed, and two builds), plus `COMPILE_S` when it first turns compile on."""
        trials = self.trials
        seconds = trials.measure_s
        if seconds is None:
            p = trials.options.plan
            images = p["warmup_images"] + p["repeats"] * p["images_per_repeat"]
            images = max(images, (1 + p["repeats"]) * trials.options.cfg.images_per_step)  # a step per chunk
            seconds = 2 * images / (trials.speed.get(key(incumbent)) or 1.0) + 2 * trials.build_s
        # A first compile costs COMPILE_S here, and once more in the final config's quality run if it is kept.
        return seconds + (2 * COMPILE_S if cand.change.get("compile", "off") != "off" and not compiled else 0.0)

    def fits(self, cand: Candidate, start: TrainConfig, incumbent: TrainConfig, compiled: bool) -> bool:
        """Whether measuring `cand` leaves the reserve for after the search."""
        return self.estimate(cand, incumbent, compiled) + self.reserve(start, incumbent) <= self.left()
