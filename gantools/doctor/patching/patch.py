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
import shlex
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ...errors import DoctorError
from ..fixes import catalogue
from ..fixes.catalogue import Context, by_name
from ..watching.frames import cell_label, yours
from ..watching.lightning import trainer_missed
from ..findings.report import DoctorReport
from ..editing.sources import callee


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
    """The edits of one file: each fix's own (`of`), and the templates several fixes share."""

    keywords: dict = field(default_factory=dict)      # line -> (callee suffix, {keyword: value source})
    after_assign: dict = field(default_factory=dict)  # module-level name -> statements after its last assignment
    after_imports: list = field(default_factory=list)
    edits: dict = field(default_factory=dict)         # `editing.Edit` subclass -> this file's instance
    done: set = field(default_factory=set)            # what was found and edited

    def of(self, edit_class):
        """This file's edit of that class (`editing.Edit`), made empty the first time a fix asks for it."""
        return self.edits.setdefault(edit_class, edit_class())


def make_patch(parts, report: DoctorReport, ctx: Context, root=None) -> Patch:
    """The edits for `parts` (fix names, `fixes`) as one unified diff, paths relative to `root`; by default here, or
    the folder the edited files share when one is not below here (`git apply` and `patch` refuse `..` in a path).
    Each fix plans its edits (`Fix.plan`), one pass of `_Edits` per file makes them, and each fix names what found
    nothing to edit (`Fix.missed`); a fix made whole or not at all (`Fix.whole`) that missed a part is left out, and
    a fix made only with another (`Fix.needs`: autocast with the logits change on a BCE loop) whose other is left to
    do by hand goes with it.

    Args:
        parts: the names of the fixes to make.
        report: the diagnosis (call sites, where each optimizer and DataLoader was built, D's class).
        ctx: what the fixes know of the run.
        root: the folder the diff's paths are relative to.

    Returns:
        The `Patch`: the diff, its files, its root, and the fixes to apply by hand with why.
    """
    patch = _attempt(parts, report, ctx, root)
    fixes = by_name(parts)
    dropped = {name for name, _ in patch.missed if name in {f.name for f in fixes if f.whole}}
    by_hand = {name for name, _ in patch.by_hand}
    tied = [f for f in fixes if set(f.needs(ctx)) & by_hand]  # made only with a fix left by hand
    for f in tied:
        dropped |= {f.name, *f.needs(ctx)}
    if not dropped:
        return patch
    again = _attempt(tuple(p for p in parts if p not in dropped), report, ctx, root)
    again.by_hand = [x for x in patch.by_hand if x[0] in dropped] + again.by_hand
    again.by_hand += [(f.name, f.needs_why) for f in tied]
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
            after = edit_source(before, plan)
        except (OSError, UnicodeDecodeError, SyntaxError, cst.ParserSyntaxError) as e:
            patch.by_hand.append((_name_of(plan), f"{os.path.relpath(file)}: cannot be read as Python source here "
                                                  f"({type(e).__name__}): make the changes by hand"))
            continue
        missed = [line for fix in catalogue.FIXES for line in fix.missed(plan, os.path.relpath(file))]
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
    for edit in plan.edits.values():
        edit.prepare(source)
    return wrapper.visit(_Edits(plan)).code


class _Edits(cst.CSTTransformer):
    """The one pass over a file: the shared templates' edits (keywords, statements after an assignment or the
    imports), and each fix's own (`editing.Edit`: its libcst hooks called after these, its `statement` and `block`
    on each block)."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, plan: _Plan):
        super().__init__()
        self.plan = plan
        self.edits = list(plan.edits.values())
        for edit in self.edits:
            edit.bind(plan.done, self)

    def on_visit(self, node) -> bool:
        go = super().on_visit(node)
        for edit in self.edits:
            hook = getattr(edit, f"visit_{type(node).__name__}", None)
            if hook is not None:
                hook(node)
        return go

    def on_leave(self, original, updated):
        updated = super().on_leave(original, updated)
        for edit in self.edits:
            hook = getattr(edit, f"leave_{type(original).__name__}", None)
            if hook is not None:
                updated = hook(original, updated)
        return updated

    def leave_Call(self, original, updated):
        line = self._line(original)
        if line in self.plan.keywords:
            suffix, kws = self.plan.keywords[line]
            if callee(updated).endswith(suffix):
                edited = _set_keywords(updated, kws)
                if edited is not None:
                    updated = edited
                    self.plan.done.add(f"keywords:{line}")
        return updated

    # -- statements ------------------------------------------------------------------------------------------------
    def leave_IndentedBlock(self, original, updated):
        body = self._statements(original.body, updated.body)
        return updated.with_changes(body=body or [cst.SimpleStatementLine([cst.Pass()])])

    def leave_Module(self, original, updated):
        body = self._statements(original.body, updated.body)
        body = self._after_assign(body)
        body = self._after_imports(body)
        return updated.with_changes(body=body)

    def _statements(self, originals, updated) -> list:
        groups = []
        for orig, new in zip(originals, updated, strict=True):
            group = [new]
            if isinstance(orig, cst.SimpleStatementLine):
                for edit in self.edits:
                    group = edit.statement(orig, group)
            groups.append((orig, group))
        for edit in self.edits:
            groups = edit.block(groups)
        return [s for _, group in groups for s in group]

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
    return ", ".join(sorted([e.name for e in plan.edits.values() if e] + (["keywords"] if plan.keywords else []))) \
        or "edits"


def check_patch_path(path: Path, script: Path) -> None:
    """--patch's file: refused before anything runs when it cannot be written, or is the script itself."""
    if path.resolve() == script.resolve():
        raise DoctorError(f"--patch {path}: that is your script; the doctor writes a patch to its own file and never "
                          "edits yours (e.g. --patch fixes.patch)")
    if path.is_dir():
        raise DoctorError(f"--patch {path}: a folder; give a file to write the diff to (e.g. {path}/fixes.patch)")
    if not path.parent.is_dir():
        raise DoctorError(f"--patch {path}: the folder {path.parent} does not exist; create it or choose another path")
    existed = path.exists()
    try:  # the one honest test of "can be written": opening it (root passes every permission check)
        with open(path, "a"):
            pass
    except OSError as e:
        raise DoctorError(f"--patch {path}: cannot be written here ({e.strerror}); choose a path you can write "
                          "to") from None
    if not existed:
        path.unlink()


def patch_line(path: str, patch, kept) -> str:
    """Where `--patch` wrote the kept fixes and how to apply them; or, for an empty patch, which kept fixes it could not
    write (each listed above it with its lines, "apply by hand"): "no fix was kept" only where --try kept none."""
    if not patch:
        return (f"patch: {path} is empty: --try kept {', '.join(kept)}, which the doctor could not write as an edit of "
                "your files: apply by hand (the lines above)" if kept else f"patch: {path} is empty: no fix was kept")
    p, where = path, ""
    if patch.root != str(Path.cwd().resolve()):  # the script is not below here: apply it from its folder
        p, where = os.path.abspath(p), f"cd {shlex.quote(patch.root)} && "
    p = shlex.quote(p)
    return (f"patch: {path} (edits {', '.join(patch.files)}); apply it with: {where}git apply {p}  "
            f"(or: {where}patch -p1 < {p})")
