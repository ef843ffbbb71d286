"""The device your lines see, for the autocast edit (`patching`): `torch.autocast(device.type, ...)` where the name
`device` in scope is bound to a `torch.device(...)`, by Python's scoping rules read from the syntax tree."""
from __future__ import annotations

import ast


def autocast_item(source: str, device_type: str, lines) -> str:
    """`torch.autocast(device.type, ...)` where the `device` each wrapped line sees is bound by `device =
    torch.device(...)` (in its function, an enclosing one or the module), `self.device.type` in the methods of a class
    that sets `self.device = torch.device(...)`, else the device type measured, as a literal (a `device` parameter or
    string could be anything).

    Args:
        source: the file's source.
        device_type: the device type the diagnosis ran on ("cuda", "cpu").
        lines: the lines to wrap.

    Returns:
        The `with` item's source.
    """
    tree = ast.parse(source)
    seen = {_device_expression(tree, line) for line in lines}
    device = seen.pop() if len(seen) == 1 and None not in seen else repr(device_type)
    return f"torch.autocast({device}, dtype=torch.bfloat16)"


def _device_expression(tree: ast.Module, line: int) -> str | None:
    """`device.type` when the nearest binding of `device` that `line` sees is `device = torch.device(...)` (made before
    the line, in the line's own scope); `self.device.type` when no `device` is bound there and `line` is in a method of
    a class setting `self.device = torch.device(...)`; None otherwise (a parameter, a string, a loop variable...)."""
    around = sorted((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.lineno <= line <= (n.end_lineno or n.lineno)), key=lambda n: -n.lineno)  # innermost first
    for i, scope in enumerate([*(n for n in around if not isinstance(n, ast.ClassDef)), tree]):
        if not isinstance(scope, ast.Module):
            args = scope.args
            named = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a]
            if "device" in named:
                return None
        bindings = _bindings(scope, "device")
        if bindings is None:
            return None
        if bindings:
            return "device.type" if i > 0 or min(bindings) < line else None
    method = next((n for n in around if not isinstance(n, ast.ClassDef)), None)
    owner = next((n for n in around if isinstance(n, ast.ClassDef)), None)
    if method is None or owner is None or method not in owner.body or not method.args.args \
            or method.args.args[0].arg != "self":
        return None
    assigned = [node.value for node in ast.walk(owner) if isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Attribute) and t.attr == "device" and isinstance(t.value, ast.Name) and t.value.id == "self"
        for t in node.targets)]
    return "self.device.type" if assigned and all(_is_torch_device(v) for v in assigned) else None


def _bindings(scope, name: str) -> list | None:
    """The lines where the scope's own body (nested functions and classes not entered) binds `name`, when every
    binding is `name = torch.device(...)`; None when another kind binds it (a loop, a `with`, an annotation, a
    tuple, a `global`)."""
    lines, good, todo = [], set(), list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return None
        if isinstance(node, ast.Assign) and _is_torch_device(node.value):
            good.update(id(t) for t in node.targets if isinstance(t, ast.Name))
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            lines.append((node.lineno, id(node)))
        todo.extend(ast.iter_child_nodes(node))
    if any(key not in good for _, key in lines):
        return None
    return [n for n, _ in lines]


def _is_torch_device(value) -> bool:
    return isinstance(value, ast.Call) and ast.unparse(value.func) == "torch.device"
