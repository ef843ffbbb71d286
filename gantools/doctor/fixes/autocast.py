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
from ..editing.scopes import autocast_item
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
        device_type = applied.ctx.device_type

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
            for file, line in report.models.get(role, {}).get("call_sites", []):
                edit = plans[file].of(AutocastEdit)
                edit.device_type = ctx.device_type
                edit.wrap.add(line)

    def missed(self, plan, shown):
        wrap = plan.of(AutocastEdit).wrap
        if wrap and AUTOCAST not in plan.done:
            return [(AUTOCAST, f"{shown}: no plain statement at lines {sorted(wrap)} to wrap in torch.autocast")]
        return []


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
    """The statements at `wrap`'s lines, each run of them in one `with torch.autocast(...)` block."""

    wrap: set = field(default_factory=set)   # lines of statements to run under autocast
    device_type: str = "cpu"                 # the device the diagnosis ran on (`scopes.autocast_item`)
    item: str = ""                           # the `with` item's source
    name = AUTOCAST

    def __bool__(self):
        return bool(self.wrap)

    def prepare(self, source):
        self.item = autocast_item(source, self.device_type, self.wrap) if self.wrap else ""

    def block(self, groups):
        out, run, made = [], [], set()  # made: the names the autocast run assigns

        def flush():
            made.clear()
            if run:
                out.append((None, [cst.With(items=[cst.WithItem(cst.parse_expression(self.item))],
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
            if self.wrap & set(self.lines(orig)) or (run and not bracketed and _loss_of(orig, made)):
                # a statement right after the wrapped forward that computes from its outputs (the loss) joins the
                # block, as in PyTorch's AMP recipe: losses in autocast's float32 list see one dtype (MSELoss's
                # backward refuses a bf16 input beside a float32 target before torch 2.14: pytorch/pytorch#36553)
                self.done.add(AUTOCAST)
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
