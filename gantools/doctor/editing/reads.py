"""Your reads of device values (`.item()`, `.tolist()`, `float(x)`, an `if` on a tensor), each followed forward in
your source to where its value goes: only shown (printed, logged, formatted, appended to a history) or fed back into
training (a tensor computation that reaches `.backward()` or an optimizer, an `if` or `while` that decides what runs,
a call the doctor cannot see into). A read that feeds training is not one to batch: read less often, it would change
what the loop computes; its device-side rewrite keeps the computation and drops the wait.

Static, over the syntax tree of the file at the read's line (`ast`): a value is followed through the variables it is
assigned to in its function (or the module), through tuple targets, and through a `return` to the calls of that
function in the same file."""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass

# the calls that only show or keep a number for later (a print, a logger, a progress bar, a history list)
SHOWN_CALLS = frozenset({"print", "str", "repr", "format", "append", "extend", "log", "info", "debug", "warning",
                         "add_scalar", "add_scalars", "set_postfix", "set_description", "write", "log_metrics",
                         "log_dict", "save_image", "savefig", "plot"})
# builtins whose result carries the value on (its arithmetic is still the value)
CARRIERS = frozenset({"float", "int", "round", "abs", "min", "max", "sum", "bool"})
FOLLOWED = {"item", "tolist", "float", "int", "cpu"}   # reads whose value is a number or list your code uses
DECIDES = {"bool"}                                     # a tensor in an `if`: the branch is the use
REACHES = "reaches"  # a tensor computation that reaches a backward: the one a device-side rewrite keeps whole


@dataclass(frozen=True)
class Read:
    """One read at a line: the expression read (`diff`, `(d_loss_real + torch.abs(diff))`), whether its value feeds
    training, how (in words, with the line), and the device-side rewrite of its statement ("" where none)."""

    value: str
    feeds: bool
    how: str
    rewrite: str = ""
    lines: tuple = ()  # the first and last of your lines the rewrite replaces


def follow_sites(sites: list) -> None:
    """Each value-read site of a report (`DoctorReport.sync_sites`) followed in its file: `reads`, the expressions it
    reads; `feeds`, where one of them feeds training ({"how", "rewrite"}), or None. A site in no file (a notebook
    cell) is left as it is."""
    sources: dict = {}
    for site in sites:
        at = site_file(site["where"]) if site.get("method") in FOLLOWED | DECIDES else None
        if at is None:
            continue
        if at[0] not in sources:
            try:
                with open(at[0], encoding="utf-8") as f:
                    sources[at[0]] = f.read()
            except (OSError, UnicodeDecodeError):  # a file the doctor cannot read: its reads stay as they were seen
                sources[at[0]] = ""
        found = reads_at(sources[at[0]], at[1], site["method"])
        feeding = [x for x in found if x.feeds]
        site["reads"] = [x.value for x in found if not x.feeds]
        site["feeds"] = ({"how": feeding[0].how, "rewrite": feeding[0].rewrite, "lines": sorted(set(feeding[0].lines))}
                         if feeding else None)


def site_file(where: str) -> tuple[str, int] | None:
    """(absolute path, line) of a sync site's FILE:LINE (as `frames.shown` writes it), None for a notebook cell or a
    file no longer there."""
    file, _, line = where.rpartition(":")
    if not line.isdigit() or not os.path.isfile(file):
        return None
    return os.path.abspath(file), int(line)


def reads_at(source: str, line: int, method: str) -> list:
    """Each read of `method` (as the hooks record it: item, tolist, float, bool, ...) on `line`, followed.

    Args:
        source: the file's source.
        line: the line the read ran at.
        method: the Tensor method the hooks saw called.

    Returns:
        A `Read` per read found on the line; empty where the line holds none the doctor can follow.
    """
    if method not in FOLLOWED | DECIDES:
        return []
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    flow = _Flow(tree, source)
    return [flow.read(node) for node in flow.reads(line, method)]


class _Flow:
    """Where values go in one file: each node's parent, each scope's loads of a name, each function's calls."""

    def __init__(self, tree: ast.Module, source: str):
        self.tree, self.parent, self.texts, self.stored = tree, {}, {}, {}
        self.lines = [line.encode() for line in source.splitlines(keepends=True)]  # ast's columns count bytes
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node

    def text(self, node) -> str:
        """`node`'s source as written."""
        if isinstance(node, ast.Name):
            return node.id
        if node not in self.texts:
            lines = self.lines[node.lineno - 1:node.end_lineno]
            if len(lines) == 1:
                code = lines[0][node.col_offset:node.end_col_offset]
            else:
                code = lines[0][node.col_offset:] + b"".join(lines[1:-1]) + lines[-1][:node.end_col_offset]
            self.texts[node] = code.decode()
        return self.texts[node]

    def reads(self, line: int, method: str) -> list:
        calls = [n for n in ast.walk(self.tree) if isinstance(n, ast.Call) and n.lineno == line and _reads(n, method)]
        if calls or method not in DECIDES:
            return calls
        return [n for n in ast.walk(self.tree) if isinstance(n, (ast.If, ast.While, ast.IfExp, ast.Assert))
                and n.test.lineno == line]

    def read(self, node) -> Read:
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            return Read(self.text(node.test), True, f"decides the `{_keyword(node)}` at line {node.lineno}",
                        _BRANCH)
        value = node.args[0] if isinstance(node.func, ast.Name) else node.func.value
        how = self.follow(node, set())
        if how is None:
            return Read(self.text(value), False, "only shown")
        return Read(self.text(value), True, how, *(self.rewrite(node) if how.startswith(REACHES) else ("", ())))

    # -- following a value up its expression, then through the names that hold it ------------------------------------
    def follow(self, node, seen: set) -> str | None:
        """How the value of `node` feeds training (words, with the line), or None when it is only shown."""
        while True:
            parent = self.parent.get(node)
            done, how = self._ends(parent, node, seen)
            if done:
                return how
            method = isinstance(parent, ast.Attribute) and getattr(self.parent.get(parent), "func", None) is parent
            node = self.parent[parent] if method else parent  # `x.mean()`: the call's value is x's, carried on

    def _ends(self, parent, node, seen: set) -> tuple:
        """(True, how it feeds or None) where the value's path ends at `parent`; (False, None) where it goes on."""
        if parent is None or isinstance(parent, (ast.Expr, ast.JoinedStr, ast.FormattedValue)) or _formatting(parent):
            return True, None
        if isinstance(parent, (ast.If, ast.While, ast.IfExp, ast.Assert)) and parent.test is node:
            return True, f"decides the `{_keyword(parent)}` at line {parent.lineno}"
        if isinstance(parent, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            return True, self._assigned(parent, seen)
        if isinstance(parent, ast.Tuple) and _unpacked(self.parent.get(parent), parent):
            statement = self.parent[parent]  # `a, b = x.item(), y.item()`: each value to its own name
            return True, self._assigned(statement, seen, statement.targets[0].elts[parent.elts.index(node)])
        if isinstance(parent, ast.Return):
            return True, self._returned(parent, seen)
        if isinstance(parent, ast.Call):
            verdict = self._called(parent, node)
            return verdict is not _ON, (None if verdict is _ON else verdict)
        call = self.parent.get(parent)
        if isinstance(parent, ast.Attribute) and parent.attr == "backward" and getattr(call, "func", None) is parent:
            return True, f"{REACHES} `{self.text(call)}` at line {call.lineno}"
        if isinstance(parent, (ast.stmt, ast.comprehension, ast.Lambda)):
            return True, f"used at line {parent.lineno}, where the doctor cannot tell it is only shown"
        return False, None

    def _called(self, call: ast.Call, arg):
        name = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")
        if name in SHOWN_CALLS:
            return None
        if name in CARRIERS or call.func is arg:
            return _ON
        return f"passed to `{self.text(call.func)}(...)` at line {call.lineno}"

    def _assigned(self, statement, seen: set, only=None) -> str | None:
        targets = [only] if only is not None else (statement.targets if isinstance(statement, ast.Assign)
                                                   else [statement.target])
        for target in targets:
            for name in _names(target):
                if isinstance(name, ast.Subscript) and _optimizer_setting(self.text(name)):
                    return f"sets `{self.text(name)}` at line {statement.lineno}"
                how = self._loads(name, statement, seen)
                if how:
                    return how
        return None

    def _loads(self, target, statement, seen: set) -> str | None:
        """How any later (or loop-carried) load of `target` in its scope feeds training."""
        key = (self.text(_base(target)), id(statement))
        if key in seen:
            return None
        seen.add(key)
        text, scope = self.text(_base(target)), self.scope(statement)
        stores = self.stores(scope, text)
        for load in self.loads(scope, text):
            if "." not in text and not self.reaches(statement, load, stores):
                continue
            how = self.follow(load, seen)
            if how:
                if f"(through `{text}`" in how:
                    return how
                return how.replace(" (through ", f" (through `{text}`, ", 1) if how.endswith(")") and " (through " \
                    in how else f"{how} (through `{text}`)"
        return None

    def _returned(self, statement: ast.Return, seen: set) -> str | None:
        function = self.scope(statement)
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) or ("return", function.name) in seen:
            return None
        seen.add(("return", function.name))
        for call in ast.walk(self.tree):
            if isinstance(call, ast.Call) and _called_name(call) == function.name:
                how = self.follow(call, seen)
                if how:
                    return how
        return None

    def scope(self, node):
        while node is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            node = self.parent.get(node)
        return node

    def loads(self, scope, text: str) -> list:
        """The loads of the name (or `self.x`) `text` in `scope`, nested functions and classes not entered (the
        whole file for an attribute: a method may read what another sets)."""
        todo, found = list(ast.iter_child_nodes(scope if "." not in text else self.tree)), []
        while todo:
            node = todo.pop()
            if "." not in text and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load) \
                    and self.text(node) == text:
                found.append(node)
                continue
            todo.extend(ast.iter_child_nodes(node))
        return sorted(found, key=lambda n: (n.lineno, n.col_offset))

    def stores(self, scope, text: str) -> list:
        """Where each binding of the name `text` in `scope` takes effect: the end of its statement."""
        if (scope, text) in self.stored:
            return self.stored[scope, text]
        ends = []
        for node in ast.walk(scope):
            if isinstance(node, ast.Name) and node.id == text and isinstance(node.ctx, ast.Store) \
                    and self.scope(node) is scope:
                statement = node
                while not isinstance(statement, ast.stmt):
                    statement = self.parent[statement]
                ends.append(_end(statement) if not isinstance(statement, (ast.For, ast.While, ast.With))
                            else (statement.lineno, statement.col_offset))
        self.stored[scope, text] = sorted(ends)
        return self.stored[scope, text]

    def reaches(self, statement, load, stores: list) -> bool:
        """Whether the value `statement` binds is the one `load` reads: no other binding between them, in order or
        around a loop that holds both."""
        bound, at = _end(statement), (load.lineno, load.col_offset)
        if at > bound:
            return not any(bound < s < at for s in stores)
        loop = self.parent.get(statement)
        while loop is not None and not (isinstance(loop, (ast.For, ast.While)) and _start(loop) <= at):
            loop = self.parent.get(loop)
        if loop is None:
            return False
        return not any(bound < s <= _end(loop) for s in stores) and not any(_start(loop) <= s < at for s in stores
                                                                            if s != (loop.lineno, loop.col_offset))

    # -- the rewrite ------------------------------------------------------------------------------------------------
    def rewrite(self, read: ast.Call) -> tuple:
        """The read's statement with the value kept on the device (`x.detach()`, no wait), and a Python clamp of its
        target on the next line (`k = min(max(k, 0), 1)`) made the tensor's own (`.clamp(0, 1)`); with the first and
        last of your lines it replaces. ("", ()) where the statement is not one assignment."""
        statement = read
        while statement is not None and not isinstance(statement, ast.stmt):
            statement = self.parent.get(statement)
        if not isinstance(statement, ast.Assign) or len(statement.targets) != 1 \
                or not isinstance(statement.targets[0], (ast.Name, ast.Attribute)):
            return "", ()
        value = read.args[0] if isinstance(read.func, ast.Name) else read.func.value
        kept = f"{self.text(value)}.detach()"
        start, end = self.text(statement.value), self.text(read)
        new = start.replace(end, kept, 1)
        target = self.text(statement.targets[0])
        clamp = self._clamp(statement, target)
        if clamp:
            low, high, after = clamp
            return f"{target} = ({new}).clamp({low}, {high})", (statement.lineno, after.end_lineno)
        return f"{target} = {new}", (statement.lineno, statement.end_lineno)

    def _clamp(self, statement: ast.Assign, target: str) -> tuple | None:
        """(low, high, that statement) when the statement after `statement` is `target = min(max(target, low),
        high)` (or max of min)."""
        body = getattr(self.parent.get(statement), "body", [])
        after = body[body.index(statement) + 1] if statement in body and body.index(statement) + 1 < len(body) else None
        if not (isinstance(after, ast.Assign) and len(after.targets) == 1 and self.text(after.targets[0]) == target):
            return None
        outer = after.value
        if not (isinstance(outer, ast.Call) and _called_name(outer) in ("min", "max") and len(outer.args) == 2):
            return None
        inner, bound = outer.args
        if not (isinstance(inner, ast.Call) and {_called_name(inner), _called_name(outer)} == {"min", "max"}
                and len(inner.args) == 2 and self.text(inner.args[0]) == target):
            return None
        low, high = (inner.args[1], bound) if _called_name(inner) == "max" else (bound, inner.args[1])
        return self.text(low), self.text(high), after


_ON = object()  # a call that carries the value on to its own parent
_BRANCH = ""    # an `if` on the host: no rewrite keeps the branch (the finding says what to do instead)


def _start(node) -> tuple:
    return node.lineno, node.col_offset


def _end(node) -> tuple:
    return node.end_lineno, node.end_col_offset


def _unpacked(statement, value: ast.Tuple) -> bool:
    """`a, b = x, y`: a tuple of values assigned to a tuple of as many names."""
    return (isinstance(statement, ast.Assign) and statement.value is value and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Tuple) and len(statement.targets[0].elts) == len(value.elts))


def _reads(call: ast.Call, method: str) -> bool:
    if method in ("float", "int", "bool"):
        return isinstance(call.func, ast.Name) and call.func.id == method and len(call.args) == 1
    return isinstance(call.func, ast.Attribute) and call.func.attr == method and not call.args


def _called_name(call: ast.Call) -> str:
    return call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")


def _keyword(node) -> str:
    return {ast.If: "if", ast.While: "while", ast.IfExp: "if", ast.Assert: "assert"}[type(node)]


def _formatting(node) -> bool:
    """`"..." % values`: old-style string formatting."""
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, (ast.Constant,
                                                                                                    ast.JoinedStr)) \
        and isinstance(getattr(node.left, "value", ""), str)


def _names(target) -> list:
    """The names (or attributes, subscripts) a target binds: each element of a tuple target."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for element in target.elts for n in _names(element)]
    if isinstance(target, ast.Starred):
        return _names(target.value)
    return [target]


def _base(target):
    """What a target stores into: `x` for `x`, `x[i]` and `x[i][j]`; `self.k` for `self.k`."""
    while isinstance(target, ast.Subscript):
        target = target.value
    return target


def _optimizer_setting(text: str) -> bool:
    """`g["lr"] = ...`, `optimizer.param_groups[0]["lr"] = ...`: a value an optimizer steps with."""
    return "param_groups" in text or any(f'["{k}"]' in text or f"['{k}']" in text for k in ("lr", "betas",
                                                                                           "weight_decay"))
