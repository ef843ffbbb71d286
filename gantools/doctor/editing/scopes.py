"""The device your lines run on, read from your own code, for the autocast edit (`patching`): a patch made on one
machine runs unchanged on another, so `torch.autocast`'s device type is an expression of the script's own device
choice, never the type the doctor measured on.

Why it matters: `torch.autocast(device_type, dtype=...)` takes a device *type* ('cuda', 'cpu') and changes only that
type's ops. Around a model on the GPU, `torch.autocast('cpu', ...)` leaves every CUDA op in fp32 without a word;
`torch.autocast('cuda', ...)` where CUDA is not available warns and is disabled (torch/amp/autocast_mode.py). So the
device type is written as, in this order, by Python's scoping rules read from the syntax tree:

- `device.type`, where the `device` the wrapped line sees is bound by `device = torch.device(...)` (in its function, an
  enclosing one or the module); `torch.device(device).type` where it is bound to a string or a choice of strings
  (`"cuda" if torch.cuda.is_available() else "cpu"`): torch.device takes either, and `.type` drops an index
  ("cuda:0" -> "cuda"), which torch.autocast's device type does not take;
- `self.device.type` in the methods of a class that sets `self.device = torch.device(...)`;
- `"cuda" if cuda else "cpu"` where the script keeps a flag from `torch.cuda.is_available()` (PyTorch-GAN's
  `cuda = True if torch.cuda.is_available() else False`, after which `if cuda:` moves the models with `.cuda()`);
- `x.device.type` of the tensor the wrapped line feeds to G or D (`netD(real)`), a name bound before that line;
- none: the edit is then listed by hand (a `device` parameter could be a string, an index or None)."""
from __future__ import annotations

import ast

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
SCOPES = (*FUNCTIONS, ast.ClassDef, ast.Lambda)
DEVICE_KEPT = {"detach", "view", "reshape", "flatten", "float", "contiguous"}  # methods whose result is on x's device


def autocast_items(source: str, lines, models=()) -> dict:
    """The `with` item for each line to wrap: `torch.autocast(<your device's type>, dtype=torch.bfloat16)`, or None
    where your code names no device the doctor can read.

    Args:
        source: the file's source.
        lines: the lines to wrap (G's and D's calls).
        models: the names your code calls G and D by (`netD`, `self.D`), for a tensor's device.

    Returns:
        {line: the item's source, or None}.
    """
    tree = ast.parse(source)
    return {line: (f"torch.autocast({device}, dtype=torch.bfloat16)"
                   if (device := device_type_of(tree, line, models)) else None) for line in lines}


def device_type_of(tree: ast.Module, line: int, models=()) -> str | None:
    """The expression of the device type `line` runs on, from the script's own device choice (module docstring);
    None where there is none to read."""
    around = sorted((n for n in ast.walk(tree) if isinstance(n, (*FUNCTIONS, ast.ClassDef))
                     and n.lineno <= line <= (n.end_lineno or n.lineno)), key=lambda n: -n.lineno)  # innermost first
    scopes = [*(n for n in around if not isinstance(n, ast.ClassDef)), tree]
    return (_named_device(scopes, line) or _self_device(around) or _cuda_flag(scopes, line)
            or _fed_tensor(tree, scopes, line, set(models)))


def _named_device(scopes: list, line: int) -> str | None:
    """`device.type` (or `torch.device(device).type` for a string) when the nearest binding of `device` that `line`
    sees is an assignment of a device (made before the line, in the line's own scope); None for anything else (a
    parameter, a loop variable, an annotation...)."""
    for i, scope in enumerate(scopes):
        if "device" in _parameters(scope):
            return None
        bindings = _bindings(scope, "device")
        if bindings is None:
            return None
        if not bindings:
            continue
        if i == 0 and min(n for n, _ in bindings) >= line:
            return None  # bound after the line: the line sees no device yet
        kinds = {_device_kind(value) for _, value in bindings}
        if None in kinds:
            return None
        return "device.type" if kinds == {"device"} else "torch.device(device).type"
    return None


def _self_device(around: list) -> str | None:
    """`self.device.type` where `line` is in a method of a class whose every `self.device = ...` is a torch.device."""
    method = next((n for n in around if not isinstance(n, ast.ClassDef)), None)
    owner = next((n for n in around if isinstance(n, ast.ClassDef)), None)
    if method is None or owner is None or method not in owner.body or not method.args.args \
            or method.args.args[0].arg != "self":
        return None
    assigned = [node.value for node in ast.walk(owner) if isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Attribute) and t.attr == "device" and isinstance(t.value, ast.Name) and t.value.id == "self"
        for t in node.targets)]
    return "self.device.type" if assigned and all(_device_kind(v) == "device" for v in assigned) else None


def _cuda_flag(scopes: list, line: int) -> str | None:
    """`"cuda" if NAME else "cpu"` for the flag `line` sees whose every binding is a test of
    `torch.cuda.is_available()` (`cuda = torch.cuda.is_available()`, `cuda = True if torch.cuda.is_available() else
    False`, `use_cuda = not args.no_cuda and torch.cuda.is_available()`): where it is true the script moves its
    models to the GPU, where false it keeps them on the CPU. Several such flags: the one named `cuda`, else none."""
    shadowed: set = set()
    for i, scope in enumerate(scopes):
        names = {t.id for node in _own_nodes(scope) if isinstance(node, ast.Assign) and _is_flag(node.value)
                 for t in node.targets if isinstance(t, ast.Name)} - shadowed
        flags = []
        for name in sorted(names):
            bindings = _bindings(scope, name)
            if bindings and all(_is_flag(v) for _, v in bindings) and (i > 0 or min(n for n, _ in bindings) < line):
                flags.append(name)
        if flags:
            name = flags[0] if len(flags) == 1 else "cuda" if "cuda" in flags else None
            return f'"cuda" if {name} else "cpu"' if name else None
        shadowed |= _parameters(scope) | _stored(scope)
    return None


def _fed_tensor(tree: ast.Module, scopes: list, line: int, models: set) -> str | None:
    """`x.device.type` where the statement at `line` calls G or D (by the names your code calls them) with a first
    argument `x` (or `x.detach()`: `_tensor_named`), a plain name bound before the line (a parameter of its function,
    or assigned earlier in its scope or the module's): the device of the very tensor the model computes on."""
    statement = next((n for n in ast.walk(tree) if isinstance(n, ast.stmt) and not isinstance(n, ast.Module)
                      and not hasattr(n, "body") and n.lineno <= line <= (n.end_lineno or n.lineno)), None)
    if statement is None or not models:
        return None
    for call in (n for n in ast.walk(statement) if isinstance(n, ast.Call)):
        name = _tensor_named(call.args[0]) if ast.unparse(call.func) in models and call.args else None
        if name and any(name in _parameters(s) or any(n < line for n in _store_lines(s, name)) for s in scopes):
            return f"{name}.device.type"
    return None


def _tensor_named(arg) -> str | None:
    """`x` for an argument `x`, or `x` through methods that keep its device (`fake.detach()`); never through `.to`,
    `.cuda` or `.type`, whose result is on another device than `x`."""
    while isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and arg.func.attr in DEVICE_KEPT:
        arg = arg.func.value
    return arg.id if isinstance(arg, ast.Name) else None


def _parameters(scope) -> set:
    if not isinstance(scope, FUNCTIONS):
        return set()
    args = scope.args
    return {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a}


def _own_nodes(scope):
    """Every node of the scope's own body, nested functions, classes and lambdas not entered."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, SCOPES):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def _stored(scope) -> set:
    return {n.id for n in _own_nodes(scope) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _store_lines(scope, name: str) -> list:
    return [n.lineno for n in _own_nodes(scope) if isinstance(n, ast.Name) and n.id == name
            and isinstance(n.ctx, ast.Store)]


def _bindings(scope, name: str) -> list | None:
    """(line, value) for each binding of `name` in the scope's own body, when every one is a plain `name = value`;
    None when another kind binds it (a loop, a `with`, an annotation, a tuple, a `global`)."""
    stores, values = [], {}
    for node in _own_nodes(scope):
        if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return None
        if isinstance(node, ast.Assign):
            values.update((id(t), node.value) for t in node.targets if isinstance(t, ast.Name))
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            stores.append(node)
    if any(id(n) not in values for n in stores):
        return None
    return [(n.lineno, values[id(n)]) for n in stores]


def _device_kind(value) -> str | None:
    """"device" for `torch.device(...)`, "string" for a string or a choice between devices and strings, else None."""
    if isinstance(value, ast.Call) and ast.unparse(value.func) == "torch.device":
        return "device"
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return "string"
    if isinstance(value, ast.IfExp):
        kinds = {_device_kind(value.body), _device_kind(value.orelse)}
        return None if None in kinds else "device" if kinds == {"device"} else "string"
    return None


def _is_flag(value) -> bool:
    """A truth value that is `torch.cuda.is_available()`'s, alone, as `True if ... else False`, or and-ed with
    others (`not args.no_cuda and torch.cuda.is_available()`)."""
    if isinstance(value, ast.Call):
        return ast.unparse(value) == "torch.cuda.is_available()"
    if isinstance(value, ast.IfExp):
        return _is_flag(value.test) and [ast.unparse(value.body), ast.unparse(value.orelse)] == ["True", "False"]
    if isinstance(value, ast.BoolOp) and isinstance(value.op, ast.And):
        return any(_is_flag(v) for v in value.values)
    return False
