"""The fix for D's weight gradients in G's step, whole: at run time D's parameters frozen for its calls from the lines
the diagnosis saw followed by G's optimizer step (those call sites, FILE:LINE, and only those: a call whose input
merely carries gradients can be D's own step, as in WGAN-GP scripts that do not detach); in your source, those
statements bracketed by `D.requires_grad_(False)` and `D.requires_grad_(True)` (`FreezeEdit`). Freezing for the
forward alone is enough: autograd records at each op whether a parameter requires grad, so the backward computes no
weight gradients for D there."""
from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from ..editing.edit import Edit
from ..editing.sources import callee
from .fix import Fix, site_lookup

FREEZE_D = "freeze-d"


class FreezeD(Fix):
    """D's parameters frozen in the calls G's step makes (those call sites only), so its backward stores no weight
    gradients there."""

    def not_applicable(self, ctx):
        if not ctx.g_step_sites:
            return "D is called from the same lines in its own step and in G's: freeze it by hand around G's step"
        return None

    def wrap(self, applied, module, role, forward):
        if role != "D":
            return None
        sites, called_from = applied.ctx.g_step_sites, site_lookup(applied)

        def run(*args, **kwargs):
            params = []
            if called_from(sites):
                params = [p for p in module.parameters() if p.requires_grad]
                applied.frozen_calls += 1
            for p in params:
                p.requires_grad_(False)
            try:
                return forward(*args, **kwargs)
            finally:
                for p in params:  # the graph is recorded: D's weights got no gradient edges in this call
                    p.requires_grad_(True)
        return run

    def plan(self, plans, report, ctx, by_hand):
        for file, line in ctx.g_step_sites:
            plans[file].of(FreezeEdit).sites[line] = report.models.get("D", {}).get("name", "")

    def missed(self, plan, shown):
        missing = sorted(x for x in plan.of(FreezeEdit).sites if f"freeze:{x}" not in plan.done)
        if not missing:
            return []
        return [(FREEZE_D, f"{shown}: D's call in G's step at line(s) {missing} could not be bracketed (a return "
                           "statement, or D called by another name): call D.requires_grad_(False) before G's step "
                           "and D.requires_grad_(True) after it")]


@dataclass
class FreezeEdit(Edit):
    """D frozen around each statement at `sites`' lines."""

    sites: dict = field(default_factory=dict)   # line -> D's name, frozen around that statement
    name = FREEZE_D

    def __bool__(self):
        return bool(self.sites)

    def statement(self, original, group):
        frozen = [x for x in self.lines(original) if x in self.sites]
        if not frozen or len(group) != 1:
            return group
        new = group[0]
        name = _callee_named(new, self.sites[frozen[0]])
        if not name or _leaves(new):  # D unfrozen after a return would never run: left to do by hand
            return group
        self.done.update(f"freeze:{x}" for x in frozen)
        return [cst.parse_statement(f"{name}.requires_grad_(False)  # no weight gradients for {name} "
                                    "in G's step\n").with_changes(leading_lines=new.leading_lines),
                new.with_changes(leading_lines=[]),
                cst.parse_statement(f"{name}.requires_grad_(True)  # (the graph is recorded: "
                                    "gradients still flow through it to G)\n")]


def _leaves(stmt) -> bool:
    """A statement after which the next line does not run (return, raise)."""
    return any(isinstance(small, (cst.Return, cst.Raise)) for small in stmt.body)


def _callee_named(stmt, name: str) -> str | None:
    """The expression a statement calls D by (`netD`, `self.discriminator`), when it ends with D's name."""
    found = []

    class Find(cst.CSTVisitor):
        def visit_Call(self, node):
            called = callee(node)
            if called == name or called.endswith("." + name):
                found.append(called)
    stmt.visit(Find())
    return found[0] if found else None
