"""The fixes as source edits of your own files, in your names, made with libcst (a concrete syntax tree: your
formatting and comments survive) and handed back as a unified diff (`git apply` or `patch -p1`, from the folder the
doctor ran in). Your files are never written.

Where each edit goes comes from the diagnosed run: the lines that called G and D (autocast wraps those statements),
the lines of D's calls in G's step (freezing D around them), where each optimizer and DataLoader was built (a keyword
set), D's class (its final nn.Sigmoid removed), the names your code gives its models. A fix whose place cannot be
found as written (a model built dynamically, a Sigmoid kept as an attribute) is listed "apply by hand" with the lines
the diagnosis saw."""
from __future__ import annotations

import difflib
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from .frames import shown
from .fixes import AUTOCAST, CHANNELS_LAST, COMPILE, CUDNN, FREEZE_D, FUSED, LOGITS, PIN, TF32, WORKERS, Context
from .report import DoctorReport

RENAMES = {"BCELoss": "BCEWithLogitsLoss", "binary_cross_entropy": "binary_cross_entropy_with_logits"}


@dataclass
class Patch:
    """The diff of every file edited, and each fix that could not be made as an edit, with why."""

    diff: str = ""
    by_hand: list = field(default_factory=list)   # (fix, why)
    files: list = field(default_factory=list)

    def __bool__(self):
        return bool(self.diff)


@dataclass
class _Plan:
    """The edits of one file."""

    wrap: set = field(default_factory=set)            # lines of statements to run under autocast
    freeze: dict = field(default_factory=dict)        # line -> D's name, frozen around that statement
    keywords: dict = field(default_factory=dict)      # line -> (callee suffix, {keyword: value source})
    sigmoid_class: str | None = None                  # the class whose final nn.Sigmoid goes
    rename: bool = False                              # BCELoss -> BCEWithLogitsLoss
    after_assign: dict = field(default_factory=dict)  # module-level name -> statements after its last assignment
    after_imports: list = field(default_factory=list)
    autocast: str = ""                                # the `with` item's source
    done: set = field(default_factory=set)            # what was found and edited


def make_patch(parts, report: DoctorReport, ctx: Context, root=None) -> Patch:
    """The edits for `parts` (fix parts, `fixes`) as one unified diff, paths relative to `root` (default: here)."""
    parts = set(parts)
    plans: dict = defaultdict(_Plan)
    patch = Patch()
    g, d = report.models.get("G", {}), report.models.get("D", {})
    script = os.path.abspath(report.source)
    if AUTOCAST in parts:
        if not ctx.bf16:
            patch.by_hand.append((AUTOCAST, "fp16 needs a GradScaler per network around each backward and step: "
                                            "see notebook 02; --try measured it at run time"))
        else:
            for file, line in g.get("call_sites", []) + d.get("call_sites", []):
                plans[file].wrap.add(line)
    if LOGITS in parts:
        file = d.get("defined_in")
        if file:
            plans[file].sigmoid_class = d["class"]
        for file in {script, file} - {None}:
            plans[file].rename = True
    if FREEZE_D in parts:
        for file, line in ctx.g_step_sites:
            plans[file].freeze[line] = d.get("name", "")
    if FUSED in parts:
        for o in report.optimizers.values():
            if o["implementation"].startswith("for-loop") and o.get("built_at"):
                file, line = o["built_at"]
                kw = "fused" if _takes_fused(o["class"]) else "foreach"
                plans[file].keywords[line] = (o["class"], {kw: "True"})
    if parts & {WORKERS, PIN}:
        for loader in report.settings.get("dataloaders", []):
            if loader.get("built_at"):
                file, line = loader["built_at"]
                kw = {}
                if WORKERS in parts:
                    kw.update(num_workers=str(ctx.workers), persistent_workers=str(ctx.workers > 0))
                if PIN in parts or (WORKERS in parts and ctx.device_type == "cuda"):
                    kw["pin_memory"] = "True"
                plans[file].keywords[line] = ("DataLoader", kw)
    for part, lines in ((CHANNELS_LAST, "{m} = {m}.to(memory_format=torch.channels_last)"),
                        (COMPILE, "{m}.compile()")):
        if part in parts:
            for m in (g, d):
                if m.get("name"):
                    plans[script].after_assign.setdefault(m["name"], []).append(lines.format(m=m["name"]))
    if CUDNN in parts:
        plans[script].after_imports.append("torch.backends.cudnn.benchmark = True")
    if TF32 in parts:
        plans[script].after_imports += ['torch.set_float32_matmul_precision("high")',
                                        "torch.backends.cudnn.allow_tf32 = True"]
    root = Path(root or os.getcwd()).resolve()
    for file, plan in sorted(plans.items()):
        path = Path(file)
        if not Path(shown(file)).is_file():  # a notebook cell (IPython keeps each in a temporary file): not yours to patch
            continue
        if not path.is_file():
            patch.by_hand.append((_name_of(plan), f"{file} is not a file the doctor can read"))
            continue
        before = path.read_text()
        plan.autocast = _autocast_item(before, ctx)
        after = edit_source(before, plan)
        _missed(plan, parts, file, patch)
        if after != before:
            rel = os.path.relpath(path.resolve(), root)
            patch.files.append(rel)
            patch.diff += "".join(difflib.unified_diff(before.splitlines(keepends=True),
                                                       after.splitlines(keepends=True), f"a/{rel}", f"b/{rel}"))
    return patch


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
    def visit_ClassDef(self, node):
        self.classes.append(node.name.value)

    def leave_ClassDef(self, original, updated):
        self.classes.pop()
        return updated

    def _in_d(self) -> bool:
        return bool(self.classes) and self.classes[-1] == self.plan.sigmoid_class

    def leave_List(self, original, updated):
        return updated.with_changes(elements=self._without_sigmoid(updated.elements)) if self._in_d() else updated

    def leave_Tuple(self, original, updated):
        return updated.with_changes(elements=self._without_sigmoid(updated.elements)) if self._in_d() else updated

    def _without_sigmoid(self, items) -> list:
        """Arguments or elements without the nn.Sigmoid() among them; the line break before the closing bracket
        moves to the item now last, so the bracket keeps its place and indentation."""
        items = list(items)
        kept = [x for x in items if not _is_sigmoid(x.value)]
        if len(kept) == len(items):
            return items
        self.plan.done.add(LOGITS + ":sigmoid")
        if kept and items[-1] not in kept:
            last, gone = kept[-1], items[-1]
            closing = (gone.whitespace_after_arg if isinstance(gone, cst.Arg) else
                       gone.comma.whitespace_after if isinstance(gone.comma, cst.Comma) else None)
            if isinstance(closing, cst.ParenthesizedWhitespace) and isinstance(last.comma, cst.Comma):
                after = last.comma.whitespace_after
                if isinstance(after, cst.ParenthesizedWhitespace):  # its own line's comment stays with it
                    closing = closing.with_changes(first_line=after.first_line, empty_lines=after.empty_lines)
                kept[-1] = last.with_changes(comma=last.comma.with_changes(whitespace_after=closing))
            elif not isinstance(closing, cst.ParenthesizedWhitespace):  # all on one line: no trailing comma
                kept[-1] = last.with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return kept

    def leave_Call(self, original, updated):
        if self._in_d() and not _callee(updated).endswith(".append"):
            updated = updated.with_changes(args=self._without_sigmoid(updated.args))
        if self.plan.rename:
            f = updated.func
            name = f.attr if isinstance(f, cst.Attribute) else f if isinstance(f, cst.Name) else None
            if name is not None and name.value in RENAMES:
                self.plan.done.add(LOGITS + ":loss")
                new = name.with_changes(value=RENAMES[name.value])
                updated = updated.with_changes(func=f.with_changes(attr=new) if isinstance(f, cst.Attribute) else new)
        line = self._line(original)
        if line in self.plan.keywords:
            suffix, kws = self.plan.keywords[line]
            if _callee(updated).endswith(suffix):
                updated = _set_keywords(updated, kws)
                self.plan.done.add(f"keywords:{line}")
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
        out, run = [], []

        def flush():
            if run:
                out.append(cst.With(items=[cst.WithItem(cst.parse_expression(self.plan.autocast))],
                                    body=cst.IndentedBlock(body=[s.with_changes(leading_lines=[]) if i == 0 else s
                                                                 for i, s in enumerate(run)]),
                                    leading_lines=run[0].leading_lines if isinstance(run[0], cst.SimpleStatementLine)
                                    else []))
                run.clear()
        for orig, new in zip(originals, updated):
            if not isinstance(orig, cst.SimpleStatementLine):
                flush()
                out.append(new)
                continue
            if self._in_d() and _appends_sigmoid(new):
                self.plan.done.add(LOGITS + ":sigmoid")
                continue
            lines = self._lines(orig)
            group = [new]
            frozen = [self.plan.freeze[x] for x in lines if x in self.plan.freeze]
            name = _callee_named(new, frozen[0]) if frozen else None
            if name:
                self.plan.done.add(FREEZE_D)
                group = [cst.parse_statement(f"{name}.requires_grad_(False)  # no weight gradients for {name} "
                                             "in G's step\n").with_changes(leading_lines=new.leading_lines),
                         new.with_changes(leading_lines=[]),
                         cst.parse_statement(f"{name}.requires_grad_(True)  # (the graph is recorded: "
                                             "gradients still flow through it to G)\n")]
            if self.plan.wrap & set(lines):
                self.plan.done.add(AUTOCAST)
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


def _is_sigmoid(node) -> bool:
    return isinstance(node, cst.Call) and _callee(node).split(".")[-1] == "Sigmoid"


def _appends_sigmoid(stmt) -> bool:
    """`layers.append(nn.Sigmoid())` or `layers += [nn.Sigmoid()]` (left empty once its element is removed)."""
    for small in stmt.body:
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            call = small.value
            if _callee(call).endswith(".append") and (not call.args or _is_sigmoid(call.args[0].value)):
                return True
        if isinstance(small, cst.AugAssign) and isinstance(small.value, cst.List) and not small.value.elements:
            return True
    return False


def _callee(call: cst.Call) -> str:
    try:
        return cst.Module([]).code_for_node(call.func)
    except Exception:
        return ""


def _callee_named(stmt, name: str) -> str | None:
    """The expression a statement calls D by (`netD`, `self.discriminator`), when it ends with D's name."""
    found = []

    class Find(cst.CSTVisitor):
        def visit_Call(self, node):
            callee = _callee(node)
            if callee == name or callee.endswith("." + name):
                found.append(callee)
    stmt.visit(Find())
    return found[0] if found else None


def _set_keywords(call: cst.Call, kws: dict) -> cst.Call:
    args = list(call.args)
    for k, v in kws.items():
        value = cst.parse_expression(v)
        for i, a in enumerate(args):
            if a.keyword is not None and a.keyword.value == k:
                args[i] = a.with_changes(value=value)
                break
        else:
            if args and args[-1].comma is cst.MaybeSentinel.DEFAULT:
                args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            args.append(cst.Arg(value=value, keyword=cst.Name(k),
                                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                      whitespace_after=cst.SimpleWhitespace(""))))
    return call.with_changes(args=args)


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


def _autocast_item(source: str, ctx: Context) -> str:
    """`torch.autocast(device.type, ...)` where the script has `device = torch.device(...)`, else the device type
    measured, as a literal."""
    device = "device.type" if "device = torch.device(" in source else repr(ctx.device_type)
    return f"torch.autocast({device}, dtype=torch.bfloat16)"


def _takes_fused(name: str) -> bool:
    import inspect

    import torch
    cls = getattr(torch.optim, name, None)
    return cls is not None and "fused" in inspect.signature(cls).parameters


def _name_of(plan: _Plan) -> str:
    return ", ".join(k for k, v in (("autocast", plan.wrap), ("freeze-d", plan.freeze), ("keywords", plan.keywords),
                                    ("logits", plan.sigmoid_class)) if v) or "edits"


def _missed(plan: _Plan, parts: set, file: str, patch: Patch) -> None:
    """Each planned edit that found nothing to edit, as an "apply by hand" line."""
    shown = os.path.relpath(file)
    if plan.wrap and AUTOCAST not in plan.done:
        patch.by_hand.append((AUTOCAST, f"{shown}: no plain statement at lines {sorted(plan.wrap)} to wrap in "
                                        "torch.autocast"))
    if plan.freeze and FREEZE_D not in plan.done:
        patch.by_hand.append((FREEZE_D, f"{shown}: D's call in G's step at lines {sorted(plan.freeze)} not found "
                                        "by its name: wrap it in D.requires_grad_(False) / (True)"))
    if plan.sigmoid_class and LOGITS + ":sigmoid" not in plan.done:
        patch.by_hand.append((LOGITS, f"{shown}: class {plan.sigmoid_class} builds its final nn.Sigmoid in a way "
                                      "the doctor cannot edit: remove it by hand"))
    for line, (suffix, kws) in plan.keywords.items():
        if f"keywords:{line}" not in plan.done:
            fix = FUSED if suffix != "DataLoader" else WORKERS
            patch.by_hand.append((fix, f"{shown}:{line}: add " + ", ".join(f"{k}={v}" for k, v in kws.items())
                                  + f" to the {suffix}(...) built there"))
    for name, statements in plan.after_assign.items():
        if f"assign:{name}" not in plan.done:
            patch.by_hand.append((CHANNELS_LAST if "channels_last" in statements[0] else COMPILE,
                                  f"{shown}: no module-level `{name} = ...`: add " + "; ".join(statements)))
