"""The learning-rate schedule: a linear warm-up, then constant or cosine decay, as a factor of each network's own
learning rate (`lr_g`, `lr_d`: TTUR keeps its ratio all the way). The factor is a pure function of the run's step
(a generator step: D's rate follows the same clock whatever `d_steps` is), so a resumed run is on schedule with
nothing more in its checkpoint, and setting it costs one float per parameter group per step (no kernel, no sync).

In your own loop the same factor is what `torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=factor)` takes, with
`scheduler.step()` after each optimizer step."""
from __future__ import annotations

import math
from dataclasses import dataclass

SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True)
class Schedule:
    """`factor(step)`: 0 -> 1 linearly over `warmup` steps, then 1 (constant) or a cosine from 1 down to 0 at
    `steps` (SGDR's decay, without restarts; a run fitted past its configured length stays at 0)."""
    kind: str
    warmup: int
    steps: int

    def factor(self, step: int) -> float:
        """The share of the base rate for the step about to train (step 0 is the first)."""
        if step < self.warmup:
            return (step + 1) / (self.warmup + 1)  # never 0: a first step at rate 0 would train nothing
        if self.kind == "constant":
            return 1.0
        done = min(1.0, (step - self.warmup) / max(1, self.steps - self.warmup))
        return 0.5 * (1 + math.cos(math.pi * done))


class ScheduledRates:
    """Sets each optimizer's learning rate to its base rate times the schedule's factor before every step (with no
    `schedule`, constant rates: nothing to set)."""

    def __init__(self, schedule: Schedule | None, optimizers: dict):
        self.schedule, self.base = schedule, optimizers  # optimizer -> its base learning rate

    @classmethod
    def of(cls, cfg, optimizers: dict) -> "ScheduledRates":
        """The rates a config asks for: `lr_schedule` after `warmup_steps`, over the run's `steps`."""
        constant = cfg.lr_schedule == "constant" and not cfg.warmup_steps
        return cls(None if constant else Schedule(cfg.lr_schedule, cfg.warmup_steps, cfg.steps), optimizers)

    def set(self, step: int) -> None:
        if self.schedule is None:
            return
        factor = self.schedule.factor(step)
        for opt, base in self.base.items():
            for group in opt.param_groups:
                group["lr"] = base * factor
