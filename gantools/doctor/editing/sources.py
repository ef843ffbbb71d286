"""Your source, read for an edit that must keep what it computes: one file's calls, bindings and name loads, each
with its scope, and a value followed back to the call that made it (or the parameter it arrived as), through the
variables of its function and through shape-only ops (view, squeeze, indexing, .float(): they commute with any
elementwise function, a sigmoid included), and through a tuple unpacked (`validity, label = discriminator(x)`: one of
the values a call returns, a `Part`); a function's calls and the argument each passes at one of its parameters."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import libcst as cst
from libcst.metadata import (ExpressionContext, ExpressionContextProvider, MetadataWrapper, ParentNodeProvider,
                             PositionProvider)

MOVES = frozenset({"cuda", "to", "cpu"})  # a module moved (`adversarial_loss.cuda()`): still the same object
SHAPE_OPS = frozenset({"view", "view_as", "reshape", "reshape_as", "squeeze", "unsqueeze", "flatten", "float",
                       "double", "contiguous", "to", "type_as", "detach", "clone", "cpu", "cuda"})


def callee(call: cst.Call) -> str:
    """The called expression as written (`netD`, `self.criterion`, `F.binary_cross_entropy`)."""
    try:
        return cst.Module([]).code_for_node(call.func)
    except Exception:
        return ""


def node_key(node, where) -> tuple:
    """A node by its type and place, the same in every parse of the same source."""
    return type(node).__name__, where.start.line, where.start.column, where.end.line, where.end.column


@dataclass(eq=False)
class Bind:
    """A name (or `self.x`) bound in a scope: where the binding statement ends, and its value if it is one
    expression (None: a loop variable, a parameter...); `param`: the cst.Param it is, if one; `index`: where the name
    is one target of a tuple unpacked from `value` (`a, b = f(x)`), its place there."""

    end: tuple
    value: object
    param: object = None
    index: int | None = None


@dataclass(frozen=True)
class Part:
    """One of the values a call returns as a tuple, unpacked (`validity, label = discriminator(x)`: `validity` is
    Part(the call, 0)): a two-headed D's outputs are told apart by it."""

    call: cst.Call
    index: int


class Source(cst.CSTVisitor):
    """One file, parsed once: its calls, bindings and name loads, and the names in `watched` (as names or attributes,
    outside imports), each with its scope (the function, class or lambda it is in; None for the module)."""

    METADATA_DEPENDENCIES = (PositionProvider, ParentNodeProvider, ExpressionContextProvider)

    def __init__(self, path: str, watched=frozenset()):
        super().__init__()
        self.path, self.watched = path, watched
        wrapper = MetadataWrapper(cst.parse_module(Path(path).read_text(encoding="utf-8")))
        self.scopes, self.scope_of = [None], {}
        self.calls, self.loads, self.named, self.augmented, self.binds = [], [], [], [], {}
        self.functions, self.classes = {}, {}
        self.module = wrapper.module
        self.pos = wrapper.resolve(PositionProvider)
        self.parent = wrapper.resolve(ParentNodeProvider)
        self.context = wrapper.resolve(ExpressionContextProvider)
        wrapper.module.visit(self)

    def key(self, node) -> tuple:
        return node_key(node, self.pos[node])

    def line(self, node) -> int:
        return self.pos[node].start.line

    def lines(self, node) -> range:
        return range(self.pos[node].start.line, self.pos[node].end.line + 1)

    def _enter(self, node):
        self.scopes.append(node)

    def visit_FunctionDef(self, node):
        self.scope_of[node] = self.scopes[-1]  # the scope it is defined in, where its callers are
        if self.scopes[-1] is None:
            self.functions[node.name.value] = node
        self._enter(node)

    def leave_FunctionDef(self, node):
        self.scopes.pop()

    def visit_ClassDef(self, node):
        self.classes.setdefault(node.name.value, node)
        self._enter(node)

    def leave_ClassDef(self, node):
        self.scopes.pop()

    def visit_Lambda(self, node):
        self._enter(node)

    def leave_Lambda(self, node):
        self.scopes.pop()

    def visit_ImportAlias(self, node):
        return False  # an imported name is not a use of it

    def visit_Call(self, node):
        self.scope_of[node] = self.scopes[-1]
        self.calls.append(node)

    def visit_Attribute(self, node):
        self._name(node, node.attr.value)
        node.value.visit(self)  # `nn.BCELoss`: the attribute's own Name is not a second name
        return False

    def visit_Name(self, node):
        parent = self.parent[node]
        if not (isinstance(parent, cst.Arg) and parent.keyword is node):  # `f(pred=x)`: `pred` names no value here
            self._name(node, node.value)

    def _name(self, node, leaf: str):
        scope = self.scopes[-1]
        self.scope_of[node] = scope
        if leaf in self.watched:
            self.named.append(node)
        context = self.context.get(node)
        if context == ExpressionContext.LOAD:
            self.loads.append(node)
        elif context == ExpressionContext.STORE:
            if isinstance(self.parent[node], cst.AugAssign):  # `x += ...` reads x too
                self.augmented.append(node)
            param = self.parent[node] if isinstance(self.parent[node], cst.Param) else None
            end = (self.pos[node].end.line, self.pos[node].end.column) if param else self._statement_end(node)
            value, index = self._value(node)
            self.binds.setdefault((scope, code(node)), []).append(Bind(end, value, param, index))

    def _value(self, target) -> tuple:
        """The value bound to `target`, and its place where the target is one of a tuple's (None otherwise)."""
        parent = self.parent[target]
        if isinstance(parent, cst.AssignTarget):
            return self.parent[parent].value, None
        if isinstance(parent, cst.AnnAssign) and parent.target is target:
            return parent.value, None
        if isinstance(parent, cst.Element) and not isinstance(parent, cst.StarredElement):
            unpacked = self.parent[parent]
            holder = self.parent.get(unpacked)
            if (isinstance(unpacked, (cst.Tuple, cst.List)) and isinstance(holder, cst.AssignTarget)
                    and not any(isinstance(e, cst.StarredElement) for e in unpacked.elements)):
                return self.parent[holder].value, [e.value for e in unpacked.elements].index(target)
        return None, None

    def _statement_end(self, node) -> tuple:
        while not isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement, cst.Module)):
            node = self.parent[node]
        if isinstance(node, cst.BaseCompoundStatement):  # a for loop's target, a with's `as`: bound at the header
            return (self.pos[node].start.line, 10 ** 6)
        end = self.pos[node].end
        return (end.line, end.column)

    # -- following values -------------------------------------------------------------------------------------------
    def resolve(self, node) -> Bind | None:
        """The binding a load of a name reads: the last one in its scope that ends before it."""
        start = self.pos[node].start
        before = [b for b in self.binds.get((self.scope_of[node], code(node)), []) if b.end < (start.line,
                                                                                                start.column)]
        return before[-1] if before else None

    def producer(self, node):
        """The call whose result `node` is, through shape-only ops and the variables holding it; else None."""
        made = self.origin(node)
        return made if isinstance(made, cst.Call) else None

    def origin(self, node, depth=0):
        """The call whose result `node` is, the `Part` of one it is unpacked from, or the parameter (a cst.Param) it
        arrived as, through shape-only ops and the variables holding it; else None."""
        node = peel(node)
        if isinstance(node, cst.Call):
            return node
        if isinstance(node, (cst.Name, cst.Attribute)) and node in self.scope_of and depth < 20:
            bind = self.resolve(node)
            return self.held(bind, depth + 1) if bind is not None else None
        return None

    def held(self, bind: Bind, depth=0):
        """What a binding holds, as `origin` says it: a call, a `Part` of one, a parameter, or None."""
        if bind.value is None:
            return bind.param
        made = self.origin(bind.value, depth)
        if bind.index is None:
            return made
        return Part(made, bind.index) if isinstance(made, cst.Call) else None

    def chain_top(self, node):
        """The outermost shape-only op over `node` (`output.view(-1).float()` for `output`)."""
        while True:
            parent = self.parent.get(node)
            if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in SHAPE_OPS:
                call = self.parent.get(parent)
                if isinstance(call, cst.Call) and call.func is parent:
                    node = call
                    continue
            if isinstance(parent, cst.Subscript) and parent.value is node:
                node = parent
                continue
            return node


def move_of(src: Source, node):
    """The call that moves `node` to a device (`node.cuda()`, `node.to(device)`), if one does: a module moved is the
    same object, returned."""
    attribute = src.parent.get(node)
    if isinstance(attribute, cst.Attribute) and attribute.value is node and attribute.attr.value in MOVES:
        call = src.parent.get(attribute)
        if isinstance(call, cst.Call) and call.func is attribute:
            return call
    return None


def handed(src: Source, x, name: str) -> bool:
    """A load `x` of the module `name` that hands it on: other than a call of it, or a move of it kept as it is (a
    statement of its own, `adversarial_loss.cuda()`, or assigned back to the same name)."""
    parent = src.parent[x]
    if isinstance(parent, cst.Call) and parent.func is x:
        return False
    moved = move_of(src, x)
    holder = src.parent.get(moved) if moved is not None else None
    if isinstance(holder, cst.Expr):
        return False
    return not (isinstance(holder, cst.Assign) and len(holder.targets) == 1 and code(holder.targets[0].target) == name)


def unpacked(src: Source, call) -> bool:
    """`a, b = call`: each value it returns bound to a name of its own."""
    holder = src.parent.get(call)
    targets = holder.targets if isinstance(holder, cst.Assign) and holder.value is call else ()
    return len(targets) == 1 and isinstance(targets[0].target, (cst.Tuple, cst.List)) and all(
        isinstance(e, cst.Element) and not isinstance(e, cst.StarredElement)
        and isinstance(e.value, (cst.Name, cst.Attribute)) for e in targets[0].target.elements)


def built_path(src: Source, built) -> str | None:
    """The dotted path of the module a call builds (`nn.Sigmoid()`), where its class assigns it: `a.N` for
    `self.a = nn.Sequential(..., nn.Sigmoid())` (its N-th argument), `a` for `self.a = nn.Sigmoid()`."""
    node, index = built, None
    parent = src.parent[built]
    if isinstance(parent, cst.Arg):
        container = src.parent[parent]
        if (parent.keyword is not None or callee(container).split(".")[-1] != "Sequential"
                or any(a.star for a in container.args)):
            return None
        node, index = container, [a is parent for a in container.args].index(True)
    holder = src.parent.get(node)
    if not (isinstance(holder, cst.Assign) and len(holder.targets) == 1 and holder.value is node):
        return None
    target = holder.targets[0].target
    if not (isinstance(target, cst.Attribute) and code(target.value) == "self"):
        return None
    return target.attr.value if index is None else f"{target.attr.value}.{index}"


def code(node) -> str:
    return cst.Module([]).code_for_node(node)


def peel(node):
    """`node` without the shape-only ops around it."""
    while True:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in SHAPE_OPS:
            node = node.func.value
        elif isinstance(node, cst.Subscript):
            node = node.value
        else:
            return node


# -- functions: what they return, what their calls pass ----------------------------------------------------------------
def returned(src: Source, function, wanted, index: int | None = None):
    """The call `wanted` (a test of a call) that makes the value `function` returns (with `index`, the value at that
    place of the tuple it returns, `return validity, label`), up to shape-only ops, in its last statement and only
    return: the returned expression, or the last assignment of the variable returned (at the function's top level,
    read nowhere else in between)."""
    if function is None:
        return None
    returns = _Returns()
    function.body.visit(returns)
    last = function.body.body[-1] if function.body.body else None
    if len(returns.found) != 1 or not isinstance(last, cst.SimpleStatementLine) or returns.found[0] not in last.body:
        return None
    value = returns.found[0].value
    if index is not None:
        items = value.elements if isinstance(value, (cst.Tuple, cst.List)) else ()
        plain = len(items) > index and not any(isinstance(e, cst.StarredElement) for e in items)
        value = items[index].value if plain else None
    value = peel(value) if value is not None else None
    if isinstance(value, cst.Call) and wanted(value):
        return value
    if not isinstance(value, cst.Name):
        return None
    bind = src.resolve(value)
    statement = src.parent.get(src.parent.get(bind.value)) if bind and bind.value is not None else None
    if statement is None or statement not in function.body.body:
        return None
    between = [x for x in src.loads if code(x) == value.value and src.scope_of.get(x) is function
               and bind.end < (src.line(x), src.pos[x].start.column) and x is not value]
    made = peel(bind.value)
    return made if isinstance(made, cst.Call) and wanted(made) and not between else None


class _Returns(cst.CSTVisitor):
    """The return statements of one function (not of the functions defined inside it)."""

    def __init__(self):
        super().__init__()
        self.found = []

    def visit_Return(self, node):
        self.found.append(node)

    def visit_FunctionDef(self, node):
        return False

    def visit_Lambda(self, node):
        return False


def passed(sources: dict, src: Source, param) -> tuple:
    """What each call of the function `param` (a cst.Param of `src`) belongs to passes there: `[(Source, Call, the
    value, or None where the doctor cannot tell it)]`; and `[(Source, node, why)]` for each use of the function's name
    it cannot follow. Its calls are sought by the name they reach it by: `name(...)` in any of `sources` (a function of
    the module), `self.name(...)` in its class (a method), `name(...)` in the function around it (a nested one)."""
    function = src.parent[src.parent[param]]
    if not isinstance(function, cst.FunctionDef):
        return [], [(src, param, "a lambda's parameter: the doctor does not follow a lambda's calls")]
    name, around = function.name.value, src.scope_of.get(function)
    if function.decorators:
        return [], [(src, function, f"`{name}` is decorated, and the doctor does not follow its calls")]
    text = f"self.{name}" if isinstance(around, cst.ClassDef) else name
    calls, unfollowed = [], []
    for other in sources.values():
        for x in other.loads:
            if (x.attr.value if isinstance(x, cst.Attribute) else x.value) != name:
                continue
            call = other.parent.get(x)
            if (isinstance(call, cst.Call) and call.func is x and code(x) == text
                    and (around is None or (other is src and other.line(x) in src.lines(around)))):
                calls.append((other, call, _argument(call, function.params, param, isinstance(around, cst.ClassDef))))
            else:
                unfollowed.append((other, x, f"`{code(x)}` is used here other than as a call `{text}(...)`, and the "
                                             "doctor cannot follow what it is handed"))
    return calls, unfollowed


def _argument(call: cst.Call, params: cst.Parameters, param, bound: bool):
    """The value `call` passes at `param`, by keyword or position (after `self` where `bound`); None for a default,
    or where a `*args` or `**kwargs` hides it."""
    if any(arg.star for arg in call.args):
        return None
    keyword = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == param.name.value), None)
    if keyword is not None and param not in params.posonly_params:
        return keyword
    positional = [*params.posonly_params, *params.params]
    index = positional.index(param) - bound if param in positional else -1
    given = [a.value for a in call.args if a.keyword is None]
    return given[index] if 0 <= index < len(given) else None
