"""The autocast fix, whole: at run time G's and D's forward under `torch.autocast` (bf16 where the device runs it
fast, else fp16 with a GradScaler: `fix.watch_backward`), their outputs back in float32; in your source, the
statements that call G and D wrapped in `with torch.autocast(...)`, with the loss computed from their outputs
(`AutocastEdit`)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst
import torch

from ..editing.edit import Edit
from ..editing.logits_file import LOGITS
from ..editing.scopes import autocast_items
from ..editing.sources import callee
from ..watching.lightning import precision_keywords
from .fix import Fix

AUTOCAST = "autocast"


def no_models(ctx) -> str | None:
    return None if ctx.g or ctx.d else "the doctor did not tell G and D apart in this loop"


def no_final_sigmoid(ctx) -> str | None:
    if ctx.bce and not ctx.d_sigmoid:
        return ("D's sigmoid is not a final nn.Sigmoid module, the one form --try swaps at run time: make the "
                "sigmoid-bce finding's change (its edit, or by hand), then try again")
    return None


class Autocast(Fix):
    """G's and D's forward under torch.autocast; fp16 (no bf16) adds the GradScaler (`fix.watch_backward`)."""

    needs_why = ("autocast goes with D's logits (BCELoss is refused under autocast on CUDA): make the logits change "
                 "above first, then ask the doctor again")

    def not_applicable(self, ctx):
        return no_models(ctx) or no_final_sigmoid(ctx)

    def needs(self, ctx):
        return (LOGITS,) if ctx.bce else ()

    def trainer_keywords(self, bf16):
        return precision_keywords(bf16)

    def install(self, applied):
        applied.scaled = not applied.ctx.bf16

    def wrap(self, applied, module, role, forward):
        dtype = torch.bfloat16 if applied.ctx.bf16 else torch.float16
        # the type of the device your script put the model on (autocast on another type leaves its ops alone)
        device_type = next(module.parameters()).device.type

        def run(*args, **kwargs):
            with torch.autocast(device_type, dtype=dtype):
                out = forward(*args, **kwargs)
            return _float32(out, dtype)
        return run

    def plan(self, plans, report, ctx, by_hand):
        if not ctx.bf16:
            by_hand.append((AUTOCAST, "fp16 needs a GradScaler per network around each backward and step: "
                                      "see notebook 02; --try measured it at run time"))
            return
        for role in ("G", "D"):
            model = report.models.get(role, {})
            for file, line in model.get("call_sites", []):
                edit = plans[file].of(AutocastEdit)
                edit.wrap.add(line)
                edit.models.add(model.get("name"))

    def missed(self, plan, shown):
        edit = plan.of(AutocastEdit)
        left = sorted(line for line in edit.wrap if f"{AUTOCAST}:{line}" not in plan.done)
        nameless = [line for line in left if not edit.items.get(line)]
        if nameless:  # never the device the doctor ran on: the patch runs where the script chooses
            return [(AUTOCAST, f"{shown}: lines {nameless}: no device named in your code (`scopes`): wrap them in "
                               "`with torch.autocast(<your device>.type, dtype=torch.bfloat16):`, outputs `.float()`")]
        return [(AUTOCAST, f"{shown}: no plain statement at lines {left} to wrap in torch.autocast")] if left else []


def _float32(out, dtype):
    """The outputs of G's or D's forward under autocast, back in float32 where autocast made them 16-bit, as
    torch.autocast's documentation advises for tensors used outside the autocast region: your loss then sees one
    dtype (MSELoss's backward refuses a bf16 input beside a float32 target before torch 2.14, pytorch/pytorch#36553;
    the patch puts the loss inside the block instead, where autocast runs losses in float32 anyway)."""
    if isinstance(out, torch.Tensor):
        return out.float() if out.dtype == dtype else out
    if isinstance(out, (tuple, list)) and not hasattr(out, "_fields"):
        return type(out)(_float32(x, dtype) for x in out)
    return out


# -- the source edit -------------------------------------------------------------------------------------------------
@dataclass
class AutocastEdit(Edit):
    """The statements at `wrap`'s lines, each run of them in one `with torch.autocast(...)` block for the device your
    script picks (`scopes.autocast_items`), G's and D's outputs there back in float32 (`leave_Call`)."""

    wrap: set = field(default_factory=set)     # lines of statements to run under autocast
    models: set = field(default_factory=set)   # the names your code calls G and D by
    items: dict = field(default_factory=dict)  # line -> the `with` item's source; None: no device named there
    whole: set = field(default_factory=set)    # ids of calls whose output is unpacked or indexed
    wrapping: bool = False                     # in a simple statement autocast wraps
    name = AUTOCAST

    def __bool__(self):
        return bool(self.wrap)

    def prepare(self, source):
        self.items = autocast_items(source, self.wrap, self.models) if self.wrap else {}

    def visit_SimpleStatementLine(self, node):
        self.wrapping = any(self.items.get(line) for line in self.wrap & set(self.lines(node)))

    def leave_SimpleStatementLine(self, original, updated):
        self.wrapping = False
        return updated

    def visit_Assign(self, node):
        self.whole.update(id(node.value) for t in node.targets if isinstance(t.target, (cst.Tuple, cst.List)))

    def visit_Subscript(self, node):
        self.whole.add(id(node.value))

    def leave_Call(self, original, updated):
        """`D(x)` as `D(x).float()` on a wrapped line, so its losses run in float32 whatever their ops (BEGAN's
        `torch.mean(torch.abs(D(x) - x))` is on no autocast list and would run in bf16), as the finding's template
        (`criterion(output.float(), label)`) and `--try` (`_float32`) have it; torch.autocast's documentation advises
        the cast for tensors used outside the region, and a float32 tensor's `.float()` is itself. An output
        unpacked or indexed (a tuple of heads, perhaps) is left as it is."""
        if not self.wrapping or id(original) in self.whole or callee(original) not in self.models:
            return updated
        return cst.Call(func=cst.Attribute(value=updated, attr=cst.Name("float")))

    def _joins(self, lines, open_item: str) -> str:
        """The `with` item of the block a statement at `lines` joins (the open block's, else its first line's own); ""
        for no G or D call, or no device named in your code (`scopes.autocast_items`: then by hand)."""
        wrapped = sorted(self.wrap & set(lines))
        item = (open_item or self.items.get(wrapped[0]) or "") if wrapped else ""
        self.done.update(f"{AUTOCAST}:{line}" for line in (wrapped if item else ()))
        return item

    def block(self, groups):
        out, run, made, item = [], [], set(), [""]  # made: the names the autocast run assigns; item: its `with` item

        def flush():
            made.clear()
            if run:
                out.append((None, [cst.With(items=[cst.WithItem(cst.parse_expression(item[0]))],
                                            body=cst.IndentedBlock(body=[s.with_changes(leading_lines=[]) if i == 0
                                                                         else s for i, s in enumerate(run)]),
                                            leading_lines=run[0].leading_lines
                                            if isinstance(run[0], cst.SimpleStatementLine) else [])]))
                run.clear()
        for orig, group in groups:
            if not isinstance(orig, cst.SimpleStatementLine):
                flush()
                out.append((orig, group))
                continue
            if not group:  # removed by another fix's edit
                continue
            bracketed = len(group) > 1  # another fix's statements around it (D frozen in G's step)
            joins = self._joins(self.lines(orig), item[0] if run else "")
            if joins or (run and not bracketed and _loss_of(orig, made)):
                # a statement right after the wrapped forward that computes from its outputs (the loss) joins the
                # block, as in PyTorch's AMP recipe, computing in float32 from G's and D's outputs (`leave_Call`)
                item[0] = joins or item[0]
                made.update(_assigned_names(orig))
                run.extend(group)
            else:
                flush()
                out.append((orig, group))
        flush()
        return out


def _assigned_names(stmt) -> set:
    """The plain names a simple statement assigns (`a = ...`, `a, b = ...`, `a += ...`)."""
    names = set()
    for small in stmt.body:
        targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else \
            [small.target] if isinstance(small, (cst.AugAssign, cst.AnnAssign)) else []
        for target in targets:
            elements = [e.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else [target]
            names.update(e.value for e in elements if isinstance(e, cst.Name))
    return names


LOSS_CALL = re.compile(r"(loss|criterion|cross_entropy)", re.IGNORECASE)


def _loss_of(stmt, made: set) -> bool:
    """An assignment that reads a name in `made` and calls nothing but losses (a criterion, `F.mse_loss`,
    `adversarial_loss`...) or nothing at all (`d_loss = (real_loss + fake_loss) / 2`): the loss of the forward above.
    Under autocast torch runs its losses in float32, as `--try` computes them from its float32 outputs; any other
    call (another network, autograd.grad, a logged `.item()`) stays outside the block, at the precision it had."""
    if not made or not all(isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign)) for small in stmt.body):
        return False
    read, calls = set(), []

    class Find(cst.CSTVisitor):
        def visit_Name(self, node):
            read.add(node.value)

        def visit_Attribute(self, node):  # `x.output` reads x, not a name `output`
            node.value.visit(self)
            return False

        def visit_Arg(self, node):  # `f(target=y)` reads y, not a name `target`
            node.value.visit(self)
            return False

        def visit_Call(self, node):
            calls.append(callee(node).split(".")[-1])
    for small in stmt.body:  # the values read; an assignment's targets are not reads
        (small.value.visit(Find()) if small.value is not None else None)
    return bool(read & made) and all(LOSS_CALL.search(c) for c in calls)
