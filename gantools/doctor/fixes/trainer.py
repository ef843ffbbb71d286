"""The fixes `--try` makes through Lightning's Trainer, in a loop it runs: the Trainer your script builds gets the
argument while the run lasts, so Lightning makes the change itself, as it will once your `Trainer(...)` line has the
edit (`lightning.trainer_edit`, the patch). The doctor's own run-time changes would fight Lightning's there
(`lightning.trainer_owned`)."""
from __future__ import annotations

import sys

from .fix import Fix, with_kwargs
from ..watching.lightning import TRAINER_MODULES, precision, precision_keywords

PRECISION = "trainer-precision"


class TrainerPrecision(Fix):
    """16-bit as the Trainer's `precision` argument: Lightning's precision plugin runs training_step under autocast.
    Tried where the device runs bf16 fast; fp16's GradScaler would be the plugin's own, whose scaled losses and
    skipped steps the doctor's trial does not see."""

    def rank(self, report, ctx, order):
        """Only in a loop Lightning's Trainer runs (the autocast fix answers the others); see `Fix.rank`."""
        found = [order[k] for k in self.answers if k in order]
        if not found or not report.settings.get("lightning"):
            return None, None
        why = self.not_applicable(ctx)
        return (None, why) if why else (min(found), None)

    def trainer_keywords(self, bf16):
        return precision_keywords(bf16)

    def not_applicable(self, ctx):
        if not ctx.bf16:
            return (f'this GPU runs fp16, not bf16: set Trainer(..., precision="{precision(False)}") by hand (the '
                    "finding's diff); its GradScaler is Lightning's own, whose scaled losses --try cannot read")
        if ctx.bce and not ctx.d_sigmoid:  # the autocast fix's condition too: CUDA refuses BCE under autocast
            return ("autocast needs the logits loss, and D's sigmoid is not a final nn.Sigmoid module, the one form "
                    "--try swaps at run time: make the sigmoid-bce finding's change, then try again")
        return None

    def install(self, applied):
        trainers = [sys.modules[m].Trainer for m in TRAINER_MODULES if m in sys.modules]
        if not trainers:  # the diagnosis of this loop imported it in this process
            raise RuntimeError("gantools' precision fix found no Lightning Trainer imported in this process")
        for cls in trainers:
            applied.patch(cls, "__init__", with_kwargs(cls.__init__, {"precision": precision(applied.ctx.bf16)}))
