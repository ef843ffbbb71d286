"""The fix for G's weight gradients in D's step, whole: G's images detached where they enter D's step (D's calls
that the diagnosis saw followed by D's optimizer step, those lines only: the same line text in G's step must keep
its graph back to G). Without it D's loss backpropagates through the fakes into G's weights at every critic step, and
G's `zero_grad` throws the result away before G's step uses its own. Detached, D's weight gradients are the same
(a detached tensor has the same values), so the losses are too.

At run time G's outputs are remembered (weakly, for the run) and each of D's calls from those lines gets them
detached; in your source the argument of D's call there that holds G's output (`fake = G(z)` before it, or `G(z)`
itself) gets `.detach()` (`DetachEdit`)."""
from __future__ import annotations

import ast
import weakref
from dataclasses import dataclass, field

import libcst as cst
import torch

from ..editing.edit import Edit
from ..editing.sources import callee
from .fix import Fix, site_lookup

DETACH = "detach-fakes"


class DetachFakes(Fix):
    """G's images detached in D's step (see the module docstring)."""

    def not_applicable(self, ctx):
        if not ctx.d_step_sites:
            return "D is called from the same lines in its own step and in G's: detach the fakes by hand in D's step"
        return None

    def wrap(self, applied, module, role, forward):
        fakes = applied.state.setdefault(self.name, {})  # id -> weak reference: G's outputs, while your code holds them
        if role == "G":
            return _remembering(forward, fakes)
        return _detaching(forward, fakes, applied, self.name + ":calls") if role == "D" else None

    def plan(self, plans, report, ctx, by_hand):
        g, d = (report.models.get(role, {}).get("name", "") for role in ("G", "D"))
        for file, line in ctx.d_step_sites:
            edit = plans[file].of(DetachEdit)
            edit.g, edit.d = g, d
            edit.sites.add(line)

    def missed(self, plan, shown):
        edit = plan.of(DetachEdit)
        if not edit or any(f"{DETACH}:{x}" in plan.done for x in edit.sites):
            return []
        return [(DETACH, f"{shown}: no argument of {edit.d or 'D'}'s calls in D's step (line(s) "
                         f"{sorted(edit.sites)}) is G's output or a name bound to it: add .detach() where G's images "
                         "enter D's step")]


def _remembering(forward, fakes: dict):
    """G's forward, its outputs that carry a graph remembered (weakly: gone with your code's last reference)."""
    def run_g(*args, **kwargs):
        out = forward(*args, **kwargs)
        for x in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(x, torch.Tensor) and x.requires_grad:
                fakes[id(x)] = weakref.ref(x, _forget(fakes, id(x)))
        return out
    return run_g


def _forget(fakes: dict, key: int):
    """The callback that drops a remembered output once it is freed (its id may then be another tensor's)."""
    return lambda _: fakes.pop(key, None)


def _detaching(forward, fakes: dict, applied, counter: str):
    """D's forward, G's outputs (or views of them) detached in its calls from D's step lines."""
    sites, seen = applied.ctx.d_step_sites, site_lookup(applied)

    def fake(x) -> bool:
        return any(t is not None and (ref := fakes.get(id(t))) is not None and ref() is t for t in (x, x._base))

    def detached(x):
        if isinstance(x, torch.Tensor) and x.requires_grad and fake(x):
            applied.state[counter] = applied.state.get(counter, 0) + 1
            return x.detach()
        return x

    def run_d(*args, **kwargs):
        if seen(sites):
            args = tuple(detached(a) for a in args)
            kwargs = {k: detached(v) for k, v in kwargs.items()}
        return forward(*args, **kwargs)
    return run_d


@dataclass
class DetachEdit(Edit):
    """`.detach()` on each argument of D's calls at `sites` that holds G's output (`fed`, found in `prepare`)."""

    sites: set = field(default_factory=set)   # lines of D's calls in D's step
    g: str = ""                               # G's and D's names in your code
    d: str = ""
    fed: dict = field(default_factory=dict)   # line -> the names bound to G's output there (`prepare`)
    name = DETACH

    def __bool__(self):
        return bool(self.sites)

    def prepare(self, source):
        """For each site, the names whose last assignment before it, in the same function, is a call of G."""
        tree = ast.parse(source)
        scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))] + [tree]
        for line in self.sites:
            scope = min((s for s in scopes if getattr(s, "lineno", 0) <= line <= getattr(s, "end_lineno", line)),
                        key=lambda s: (getattr(s, "end_lineno", 10 ** 9) - getattr(s, "lineno", 0)))
            bound: dict = {}
            for node in sorted((n for n in ast.walk(scope) if isinstance(n, ast.Assign) and n.lineno < line),
                               key=lambda n: n.lineno):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        bound[target.id] = self._is_g(node.value)
            names = {n for n, is_g in bound.items() if is_g}
            if names:
                self.fed[line] = names

    def _is_g(self, node) -> bool:
        if not isinstance(node, ast.Call) or not self.g:
            return False
        called = ast.unparse(node.func)
        return called == self.g or called.endswith("." + self.g)

    def leave_Call(self, original, updated):
        lines = self.lines(original)
        if not lines or lines.start not in self.sites or not self.d:
            return updated
        called = callee(updated)
        if not (called == self.d or called.endswith("." + self.d)):
            return updated
        fed, args = self.fed.get(lines.start, set()), list(updated.args)
        for i, arg in enumerate(args):
            value = arg.value
            fake = isinstance(value, cst.Name) and value.value in fed or (
                isinstance(value, cst.Call) and (callee(value) == self.g or callee(value).endswith("." + self.g)))
            if fake:
                args[i] = arg.with_changes(value=cst.Call(func=cst.Attribute(value=value, attr=cst.Name("detach"))))
                self.done.add(f"{DETACH}:{lines.start}")
        return updated.with_changes(args=args)
