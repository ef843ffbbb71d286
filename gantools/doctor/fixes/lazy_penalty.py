"""`--try`'s lazy gradient penalty (finding `gradient-penalty-every-step`, `findings.penalties`), at run time:
`torch.autograd.grad` at your penalty's lines (as the diagnosis placed them) computes the gradient once every
`LAZY_INTERVAL` calls, and its gradient's backward is weighted by that interval (a hook on the gradient: the penalty,
whatever your code makes of the gradient, then pulls on D's weights `LAZY_INTERVAL` times as hard, as if written
`LAZY_INTERVAL * penalty`); the other calls return zeros, which carry no gradient to D, so those steps train on D's
loss alone. That is the penalty added to D's loss every k-th step, weighted by k: the cost saved is StyleGAN2's (its
recipe also gives the penalty an optimizer step of its own, corrected by `findings.penalties.lazy_adam`), and it changes
what your loop computes, by design: the loss guard then holds it to finite losses only (`changes_losses`).

As a source edit it is left to do by hand (`plan`): how your loop counts D steps and where the penalty joins D's loss
are written in your own way, across several lines, and a half-made edit would train on another loss."""
from __future__ import annotations

import sys

import torch

from ...core.losses import LAZY_INTERVAL
from .fix import Fix
from ..watching.frames import location, shown
from ..watching.penalties import creates_graph, grad_inputs
from ..findings.report import DoctorReport

LAZY = "lazy-penalty"
KIND = "gradient-penalty-every-step"


def penalty_sites(report: DoctorReport) -> frozenset:
    """(file, line) of each autograd.grad call of D's penalty in your code, as the diagnosis saw them."""
    gp = report.settings.get("gradient_penalty") or {}
    return frozenset(tuple(x["at"]) for x in gp.get("sites", []) if x.get("at"))


class LazyPenalty(Fix):
    """D's gradient penalty every `LAZY_INTERVAL` calls, weighted by it (see the module docstring)."""

    changes_losses = "lazy regularisation changes D's loss by design; hold it to FID with --fid"

    def not_applicable(self, ctx):
        return None if ctx.penalty_sites else "the penalty's autograd.grad call was not placed in your code"

    def install(self, applied):
        grad, sites, k = torch.autograd.grad, applied.ctx.penalty_sites, LAZY_INTERVAL
        calls = [0]

        def lazy_grad(outputs, inputs, *args, **kwargs):
            if not creates_graph(args, kwargs) or location(sys._getframe(1)) not in sites:
                return grad(outputs, inputs, *args, **kwargs)
            due, calls[0] = calls[0] % k == 0, calls[0] + 1
            if not due:  # zeros that require grad: whatever your code does with them runs, and trains nothing
                return tuple(torch.zeros_like(x).requires_grad_(True) for x in grad_inputs(inputs))
            out = grad(outputs, inputs, *args, **kwargs)
            for g in out:
                if g is not None and g.requires_grad:
                    g.register_hook(lambda g_grad: g_grad * k)
            return out
        applied.patch(torch.autograd, "grad", lazy_grad)

    def plan(self, plans, report, ctx, by_hand):
        lines = ", ".join(f"{shown(file)}:{line}" for file, line in sorted(ctx.penalty_sites))
        by_hand.append((LAZY, f"lazy regularisation is yours to write (the change above): the penalty at {lines} "
                              "and the lines that add it to D's loss, and D's optimizer; the doctor does not edit "
                              "them, since how your loop counts D steps and where the penalty joins D's loss are "
                              "your own, and half of the change would train on another loss"))


LAZY_PENALTY = LazyPenalty(name=LAZY, title=f"D's gradient penalty every {LAZY_INTERVAL}th call, weighted by "
                                            f"{LAZY_INTERVAL}", answers=(KIND,))
