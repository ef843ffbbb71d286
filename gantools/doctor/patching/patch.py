"""The fixes as source edits of your own files, in your names, made with libcst (a concrete syntax tree: your
formatting and comments survive) and handed back as a unified diff (`git apply` or `patch -p1`, from the folder the
doctor ran in, or the script's folder when the script is not below it). Your files are never written.

Where each edit goes comes from the diagnosed run: the lines that called G and D (autocast wraps those statements),
the lines of D's calls in G's step (freezing D around them), where each optimizer and DataLoader was built (a keyword
set), D's class (its final nn.Sigmoid removed), the names your code gives its models. A fix whose place cannot be
found as written (a model built dynamically, D built from a library's class) is listed "apply by hand" with the lines
the diagnosis saw; the logits edit is made whole or not at all (`logits`)."""
from __future__ import annotations

import difflib
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ..fixes.catalogue import AUTOCAST, FIXES, LOGITS, Context, by_name
from ..watching.frames import cell_label, yours
from ..watching.lightning import trainer_missed
from ..editing.logits import RENAMES, LastSigmoid, is_sigmoid_module, rewrite
from ..findings.report import DoctorReport
from ..editing.scopes import autocast_item
from ..editing.sources import callee, node_key

WHOLE = (LOGITS,)  # fixes made whole or not at all: half of the logits edit trains on another loss


@dataclass
class Patch:
    """The diff of every file edited, and each fix that could not be made as an edit, with why."""

    diff: str = ""
    by_hand: list = field(default_factory=list)   # (fix, why)
    files: list = field(default_factory=list)     # relative to `root`
    root: str = ""                                # the folder to apply it from (absolute)
    missed: list = field(default_factory=list)    # of by_hand, the edits planned that found nothing to edit

    def __bool__(self):
        return bool(self.diff)


@dataclass
class _Plan:
    """The edits of one file."""

    wrap: set = field(default_factory=set)            # lines of statements to run under autocast
    freeze: dict = field(default_factory=dict)        # line -> D's name, frozen around that statement
    keywords: dict = field(default_factory=dict)      # line -> (callee suffix, {keyword: value source})
    sigmoid_class: str | None = None                  # the class whose final nn.Sigmoid goes
    sigmoid_at: tuple | None = None                   # (line, column) of that nn.Sigmoid(), where `logits` placed it
    rename: bool = False                              # BCELoss -> BCEWithLogitsLoss
    nodes: dict = field(default_factory=dict)         # `logits.node_key` -> its logits edit (`logits.rewrite`)
    after_assign: dict = field(default_factory=dict)  # module-level name -> statements after its last assignment
    after_imports: list = field(default_factory=list)
    autocast: str = ""                                # the `with` item's source
    done: set = field(default_factory=set)            # what was found and edited


def make_patch(parts, report: DoctorReport, ctx: Context, root=None) -> Patch:
    """The edits for `parts` (fix names, `fixes`) as one unified diff, paths relative to `root`; by default here, or
    the folder the edited files share when one is not below here (`git apply` and `patch` refuse `..` in a path).
    Each fix plans its edits (`Fix.plan`), one pass of `_Edits` per file makes them, and each fix names what found
    nothing to edit (`Fix.missed`); a fix made whole or not at all (`WHOLE`) that missed a part is left out, and
    autocast with it on a BCE loop whose logits change is left to do by hand.

    Args:
        parts: the names of the fixes to make.
        report: the diagnosis (call sites, where each optimizer and DataLoader was built, D's class).
        ctx: what the fixes know of the run.
        root: the folder the diff's paths are relative to.

    Returns:
        The `Patch`: the diff, its files, its root, and the fixes to apply by hand with why.
    """
    patch = _attempt(parts, report, ctx, root)
    dropped = {fix for fix, _ in patch.missed if fix in WHOLE}
    if ctx.bce and AUTOCAST in parts and LOGITS in {fix for fix, _ in patch.by_hand}:
        dropped |= {AUTOCAST, LOGITS}  # BCE on probabilities is refused under autocast on CUDA
    if not dropped:
        return patch
    again = _attempt(tuple(p for p in parts if p not in dropped), report, ctx, root)
    again.by_hand = [x for x in patch.by_hand if x[0] in dropped] + again.by_hand
    if AUTOCAST in dropped:
        again.by_hand.append((AUTOCAST, "autocast goes with D's logits (BCELoss is refused under autocast on CUDA): "
                                        "make the logits change above first, then ask the doctor again"))
    return again


def _attempt(parts, report: DoctorReport, ctx: Context, root) -> Patch:
    plans: dict = defaultdict(_Plan)
    patch = Patch()
    for fix in by_name(parts):
        fix.edits(plans, report, ctx, patch.by_hand)
    edited = []  # (absolute path, before, after)
    for file, plan in sorted(plans.items()):
        path = Path(file)
        if cell_label(file):  # a notebook cell (IPython keeps each in a temporary file): nothing to patch
            continue
        if not yours(file):
            patch.by_hand.append((_name_of(plan), f"{file} is a library's file, not yours: the doctor does not edit "
                                                  "it; make the change where you use it"))
            continue
        try:
            before = path.read_text(encoding="utf-8")
            plan.autocast = autocast_item(before, ctx.device_type, plan.wrap) if plan.wrap else ""
            after = edit_source(before, plan)
        except (OSError, UnicodeDecodeError, SyntaxError, cst.ParserSyntaxError) as e:
            patch.by_hand.append((_name_of(plan), f"{os.path.relpath(file)}: cannot be read as Python source here "
                                                  f"({type(e).__name__}): make the changes by hand"))
            continue
        missed = [line for fix in FIXES for line in fix.missed(plan, os.path.relpath(file))]
        missed += trainer_missed(plan, os.path.relpath(file))
        patch.by_hand += missed
        patch.missed += missed
        if after != before:
            edited.append((str(path.resolve()), before, after))
    patch.root = str(Path(root).resolve()) if root else _root_for([f for f, _, _ in edited])
    for file, before, after in edited:
        rel = os.path.relpath(file, patch.root)
        patch.files.append(rel)
        patch.diff += "".join(difflib.unified_diff(before.splitlines(keepends=True),
                                                   after.splitlines(keepends=True), f"a/{rel}", f"b/{rel}"))
    return patch


def _root_for(files: list) -> str:
    """Here, when every file is below it; else the folder the files share."""
    here = str(Path.cwd().resolve())
    try:
        if all(os.path.commonpath([here, f]) == here for f in files):
            return here
        return os.path.commonpath([os.path.dirname(f) for f in files])
    except ValueError:  # files on different drives (Windows): no folder holds them all
        return here


def edit_source(source: str, plan: _Plan) -> str:
    """`source` with the plan's edits made (`plan.done` records which were)."""
    wrapper = MetadataWrapper(cst.parse_module(source))
    return wrapper.visit(_Edits(plan)).code


class _Edits(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, plan: _Plan):
        super().__init__()
        self.plan = plan
        self.classes: list = []

    # -- D's final Sigmoid and the BCE loss -----------------------------------------------------------------------
    def visit_Module(self, node):
        """D's nn.Sigmoid to remove: where `logits` placed it (a two-headed D's, by its path), else the last one its
        class builds, in source order (an earlier one is a gate inside the network, as in squeeze-and-excitation):
        only that one is removed, as at run time."""
        self.final_sigmoid = self.plan.sigmoid_at
        if self.plan.sigmoid_class and self.final_sigmoid is None:
            last = LastSigmoid(self.plan.sigmoid_class)
            MetadataWrapper(node, unsafe_skip_copy=True).visit(last)
            self.final_sigmoid = last.position

    def visit_ClassDef(self, node):
        self.classes.append(node.name.value)

    def leave_ClassDef(self, original, updated):
        self.classes.pop()
        return updated

    def _in_d(self) -> bool:
        return bool(self.classes) and self.classes[-1] == self.plan.sigmoid_class

    def _is_final_sigmoid(self, original_node) -> bool:
        return (self.final_sigmoid is not None and is_sigmoid_module(original_node)
                and self._position(original_node) == self.final_sigmoid)

    def leave_List(self, original, updated):
        return self._items(original, updated, "elements")

    def leave_Tuple(self, original, updated):
        return self._items(original, updated, "elements")

    def _items(self, original, updated, field_name):
        if not self._in_d():
            return updated
        return updated.with_changes(**{field_name: self._without_sigmoid(getattr(original, field_name),
                                                                         getattr(updated, field_name))})

    def _without_sigmoid(self, originals, items) -> list:
        """Arguments or elements without D's final nn.Sigmoid(); the line break before the closing bracket moves to
        the item now last, so the bracket keeps its place and indentation, and that item keeps its comment."""
        items = list(items)
        kept = [x for o, x in zip(originals, items, strict=True) if not self._is_final_sigmoid(o.value)]
        if len(kept) == len(items):
            return items
        self.plan.done.add(LOGITS + ":sigmoid")
        if kept and items[-1] not in kept:
            last, gone = kept[-1], items[-1]
            closing = (gone.whitespace_after_arg if isinstance(gone, cst.Arg) else
                       gone.comma.whitespace_after if isinstance(gone.comma, cst.Comma) else None)
            if isinstance(closing, cst.ParenthesizedWhitespace) and isinstance(last.comma, cst.Comma):
                after = last.comma.whitespace_after
                if isinstance(after, cst.ParenthesizedWhitespace):
                    closing = closing.with_changes(first_line=after.first_line, empty_lines=after.empty_lines)
                kept[-1] = last.with_changes(comma=last.comma.with_changes(whitespace_after=closing))
            elif not isinstance(closing, cst.ParenthesizedWhitespace):  # all on one line: no trailing comma
                kept[-1] = last.with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return kept

    def leave_ImportAlias(self, original, updated):
        """`from torch.nn.functional import binary_cross_entropy` follows the calls it feeds."""
        if self.plan.rename and isinstance(updated.name, cst.Name) and updated.name.value in RENAMES:
            self.plan.done.add(LOGITS + ":loss")
            return updated.with_changes(name=cst.Name(RENAMES[updated.name.value]))
        return updated

    def leave_Attribute(self, original, updated):
        """`nn.BCELoss(...)`, `F.binary_cross_entropy(...)`, and either named without a call (`loss = nn.BCELoss`)."""
        if self.plan.rename and updated.attr.value in RENAMES:
            self.plan.done.add(LOGITS + ":loss")
            return updated.with_changes(attr=cst.Name(RENAMES[updated.attr.value]))
        return updated

    def leave_Call(self, original, updated):
        if self._in_d() and not callee(updated).endswith(".append"):
            updated = updated.with_changes(args=self._without_sigmoid(original.args, updated.args))
        if self.plan.rename and isinstance(updated.func, cst.Name) and updated.func.value in RENAMES:
            self.plan.done.add(LOGITS + ":loss")  # the name imported from torch.nn(.functional), renamed there too
            updated = updated.with_changes(func=cst.Name(RENAMES[updated.func.value]))
        line = self._line(original)
        if line in self.plan.keywords:
            suffix, kws = self.plan.keywords[line]
            if callee(updated).endswith(suffix):
                edited = _set_keywords(updated, kws)
                if edited is not None:
                    updated = edited
                    self.plan.done.add(f"keywords:{line}")
        return updated

    def on_leave(self, original, updated):
        """After each node's own edit, the logits edit planned at it (`logits.rewrite`)."""
        updated = super().on_leave(original, updated)
        if self.plan.nodes and isinstance(original, (cst.Call, cst.Name, cst.Attribute, cst.Subscript)):
            try:
                key = node_key(original, self.get_metadata(PositionProvider, original))
            except KeyError:
                return updated
            if key in self.plan.nodes:
                self.plan.done.add(f"{LOGITS}:{key}")
                updated = rewrite(self.plan.nodes[key], updated)
        return updated

    # -- statements: autocast, freezing, removals -------------------------------------------------------------
    def leave_IndentedBlock(self, original, updated):
        body = self._statements(original.body, updated.body)
        return updated.with_changes(body=body or [cst.SimpleStatementLine([cst.Pass()])])

    def leave_Module(self, original, updated):
        body = self._statements(original.body, updated.body)
        body = self._after_assign(body)
        body = self._after_imports(body)
        return updated.with_changes(body=body)

    def _statements(self, originals, updated) -> list:
        out, run, made = [], [], set()  # made: the names the autocast run assigns

        def flush():
            made.clear()
            if run:
                out.append(cst.With(items=[cst.WithItem(cst.parse_expression(self.plan.autocast))],
                                    body=cst.IndentedBlock(body=[s.with_changes(leading_lines=[]) if i == 0 else s
                                                                 for i, s in enumerate(run)]),
                                    leading_lines=run[0].leading_lines if isinstance(run[0], cst.SimpleStatementLine)
                                    else []))
                run.clear()
        for orig, new in zip(originals, updated, strict=True):
            if not isinstance(orig, cst.SimpleStatementLine):
                flush()
                out.append(new)
                continue
            if self._in_d() and self._appends_final_sigmoid(orig):
                self.plan.done.add(LOGITS + ":sigmoid")
                continue
            lines = self._lines(orig)
            group = [new]
            frozen = [x for x in lines if x in self.plan.freeze]
            name = _callee_named(new, self.plan.freeze[frozen[0]]) if frozen else None
            if name and _leaves(new):  # D unfrozen after a return would never run: left to do by hand
                name = None
            if name:
                self.plan.done.update(f"freeze:{x}" for x in frozen)
                group = [cst.parse_statement(f"{name}.requires_grad_(False)  # no weight gradients for {name} "
                                             "in G's step\n").with_changes(leading_lines=new.leading_lines),
                         new.with_changes(leading_lines=[]),
                         cst.parse_statement(f"{name}.requires_grad_(True)  # (the graph is recorded: "
                                             "gradients still flow through it to G)\n")]
            if self.plan.wrap & set(lines) or (run and not frozen and _loss_of(orig, made)):
                # a statement right after the wrapped forward that computes from its outputs (the loss) joins the
                # block, as in PyTorch's AMP recipe: losses in autocast's float32 list see one dtype (MSELoss's
                # backward refuses a bf16 input beside a float32 target before torch 2.14: pytorch/pytorch#36553)
                self.plan.done.add(AUTOCAST)
                made.update(_assigned_names(orig))
                run.extend(group)
            else:
                flush()
                out.extend(group)
        flush()
        return out

    def _after_assign(self, body: list) -> list:
        for name, statements in self.plan.after_assign.items():
            last = max((i for i, s in enumerate(body) if _assigns(s, name)), default=None)
            if last is None:
                continue
            self.plan.done.add(f"assign:{name}")
            body = body[:last + 1] + [cst.parse_statement(s + "\n") for s in statements] + body[last + 1:]
        return body

    def _after_imports(self, body: list) -> list:
        if not self.plan.after_imports:
            return body
        last = max((i for i, s in enumerate(body) if _is_import(s)), default=-1)
        self.plan.done.add("imports")
        return body[:last + 1] + [cst.parse_statement(s + "\n") for s in self.plan.after_imports] + body[last + 1:]

    def _appends_final_sigmoid(self, stmt) -> bool:
        """`layers.append(nn.Sigmoid())` whose Sigmoid is D's final one."""
        for small in stmt.body:
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                call = small.value
                if callee(call).endswith(".append") and call.args and self._is_final_sigmoid(call.args[0].value):
                    return True
        return False

    def _position(self, node):
        try:
            pos = self.get_metadata(PositionProvider, node)
        except KeyError:
            return None
        return pos.start.line, pos.start.column

    def _line(self, node) -> int | None:
        try:
            return self.get_metadata(PositionProvider, node).start.line
        except KeyError:
            return None

    def _lines(self, node) -> range:
        try:
            pos = self.get_metadata(PositionProvider, node)
        except KeyError:
            return range(0)
        return range(pos.start.line, pos.end.line + 1)


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


def _set_keywords(call: cst.Call, kws: dict) -> cst.Call | None:
    """The call with keywords set (replaced where given, added otherwise, in the call's own comma style); `fused`
    drops a `foreach` argument (the two cannot both be True). None when an argument is given by position (a
    DataLoader's sixth) or through **kwargs: then the edit is left to do by hand."""
    positional = sum(1 for a in call.args if a.keyword is None and not a.star)
    if any(a.star == "**" for a in call.args) or ("num_workers" in kws and positional > 5):
        return None
    args = [a for a in call.args if not ("fused" in kws and a.keyword is not None and a.keyword.value == "foreach")]
    if len(args) < len(call.args) and args and not isinstance(call.args[-1].comma, cst.Comma):
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    for k, v in kws.items():
        value = cst.parse_expression(v)
        for i, a in enumerate(args):
            if a.keyword is not None and a.keyword.value == k:
                args[i] = a.with_changes(value=value)
                break
        else:
            new = cst.Arg(value=value, keyword=cst.Name(k),
                          equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                whitespace_after=cst.SimpleWhitespace("")))
            if args and isinstance(args[-1].comma, cst.Comma):  # a trailing comma: the new one goes on its own line
                new = new.with_changes(comma=args[-1].comma)
                args[-1] = args[-1].with_changes(comma=args[-2].comma if len(args) > 1 and isinstance(
                    args[-2].comma, cst.Comma) else cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            elif args:
                args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            args.append(new)
    return call.with_changes(args=args)


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


def _assigns(stmt, name: str) -> bool:
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    for small in stmt.body:
        if isinstance(small, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == name
                                                 for t in small.targets):
            return True
    return False


def _is_import(stmt) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom))
                                                             for s in stmt.body)


def _name_of(plan: _Plan) -> str:
    return ", ".join(k for k, v in (("autocast", plan.wrap), ("freeze-d", plan.freeze), ("keywords", plan.keywords),
                                    ("logits", plan.sigmoid_class or plan.nodes or plan.rename)) if v) or "edits"
