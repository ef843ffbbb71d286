"""Your script's own names for what the findings' snippets speak of, read from its source at the lines the doctor saw
(`report.settings["names"]`): the DataLoader's variable, the batch your loop takes, the device it names, and your
lines that call G and D. A snippet then says `dataloader.dataset` and `imgs` where your script does, or which of
your lines to change, never a tutorial's `dataset` and `real` (`findings.rules` reads these; a fact not found is
left out, and the snippet says "your line N" instead)."""
from __future__ import annotations

import ast
from pathlib import Path

from ..watching.frames import shown
from .reads import site_file
from .scopes import device_type_of


WORKER_FLAGS = ("--n_cpu", "--workers", "--num_workers", "--num-workers", "--n_workers", "--n-cpu")


def your_names(report) -> dict:
    """What the snippets can call things in this script.

    Args:
        report: the diagnosis so far (its DataLoaders, the line where batches are taken, the models' call sites).

    Returns:
        {"loader": the DataLoader's variable, "loader_line": FILE:LINE, "batch": the name a batch is bound to,
        "batch_is_tuple": whether the loop unpacks it, "device_type" and "device": your own device choice,
        "calls": {"G": [[FILE:LINE, code]...], "D": [...]}, "g_step_d_call": [FILE:LINE, code],
        "workers_flag": your flag for DataLoader workers}, each only where found.
    """
    names, files = {}, _Files()
    loader = next((x for x in report.settings.get("dataloaders", []) if x.get("built_at")), None)
    if loader:
        file, line = loader["built_at"]
        names["loader_line"] = f"{files.shown(file)}:{line}"
        bound = files.bound_at(file, line)
        if bound:
            names["loader"] = bound
    if loader:
        flag = files.workers_flag(loader["built_at"][0])
        if flag:
            names["workers_flag"] = flag
    at = site_file(report.settings.get("data_site") or "")
    if at:
        names.update(files.batch_at(*at))
    names.update(_device(report, files, at))
    names["calls"] = {role: [[f"{files.shown(f)}:{n}", files.code(f, n)] for f, n in
                             report.models.get(role, {}).get("call_sites", [])[:4] if files.code(f, n)]
                      for role in ("G", "D")}
    in_g_step = [(f, n) for f, n, opt, _ in report.models.get("D", {}).get("steps_after_call", []) if opt == "G"]
    if in_g_step and files.code(*in_g_step[0]):
        names["g_step_d_call"] = [f"{files.shown(in_g_step[0][0])}:{in_g_step[0][1]}", files.code(*in_g_step[0])]
    return names


def _device(report, files, at) -> dict:
    """{"device_type": the expression of the device type your lines run on (`scopes.device_type_of`: your own device
    choice, never the machine the doctor ran on), "device": that device as `.to()` takes it}, read at your first line
    that calls D (else where batches are taken); {} where your code names none."""
    models = tuple(report.models.get(role, {}).get("name") for role in ("G", "D") if report.models.get(role))
    calls = report.models.get("D", {}).get("call_sites", [])
    where = tuple(calls[0]) if calls else at
    if not where or files.source(where[0]) is None:
        return {}
    kind = device_type_of(files.tree(where[0]), where[1], models)
    if not kind:
        return {}
    device = kind.removesuffix(".type") if kind.endswith(".type") else kind  # a type string is a device too
    return {"device_type": kind, "device": device}


class _Files:
    """Each file read and parsed once."""

    def __init__(self):
        self.sources, self.trees = {}, {}

    def source(self, file: str) -> str | None:
        if file not in self.sources:
            try:
                self.sources[file] = Path(file).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                self.sources[file] = None
        return self.sources[file]

    def tree(self, file: str):
        if file not in self.trees:
            try:
                self.trees[file] = ast.parse(self.source(file) or "")
            except SyntaxError:
                self.trees[file] = ast.parse("")
        return self.trees[file]

    def code(self, file: str, line: int) -> str:
        """The statement at `line` as one line of code: a statement written over several lines is written again on
        one (`ast.unparse`), so a snippet that shows it parses; a compound statement's header line as it is."""
        simple = [n for n in ast.walk(self.tree(file)) if isinstance(n, ast.stmt) and n.lineno <= line <= n.end_lineno
                  and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For, ast.While,
                                         ast.If, ast.With, ast.Try))]
        if simple:
            innermost = min(simple, key=lambda n: n.end_lineno - n.lineno)
            if innermost.end_lineno > innermost.lineno:
                return ast.unparse(innermost)
        lines = (self.source(file) or "").splitlines()
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""

    @staticmethod
    def shown(file: str) -> str:
        return shown(file)

    def bound_at(self, file: str, line: int) -> str | None:
        """The variable (or `self.x`) the statement at `line` assigns, when it assigns one."""
        for node in ast.walk(self.tree(file)):
            if isinstance(node, ast.Assign) and node.lineno <= line <= node.end_lineno and len(node.targets) == 1 \
                    and isinstance(node.targets[0], (ast.Name, ast.Attribute)):
                return ast.unparse(node.targets[0])
        return None

    def workers_flag(self, file: str) -> dict | None:
        """Your script's own flag for DataLoader workers (`--n_cpu`, `--workers`, `--num_workers`), as your code
        reads it (`opt.n_cpu`), and whether anything reads it: {"flag", "read_as", "used"}; None where there is no
        such flag."""
        tree = self.tree(file)
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument" and call.args
                    and isinstance(call.args[0], ast.Constant) and call.args[0].value in WORKER_FLAGS):
                continue
            dest = call.args[0].value.lstrip("-").replace("-", "_")
            parsed = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                      and getattr(n.value.func, "attr", "") == "parse_args" and len(n.targets) == 1
                      and isinstance(n.targets[0], ast.Name)]
            if not parsed:
                return None
            holder = parsed[0].targets[0].id
            used = any(isinstance(n, ast.Attribute) and n.attr == dest and isinstance(n.value, ast.Name)
                       and n.value.id == holder for n in ast.walk(tree))
            return {"flag": call.args[0].value, "read_as": f"{holder}.{dest}", "used": used}
        return None

    def batch_at(self, file: str, line: int) -> dict:
        """The name a `for` loop at `line` binds each batch to: `imgs` of `for i, (imgs, _) in
        enumerate(dataloader)`, `data` of `for i, data in ...` (then not a tuple: the images are `data[0]`)."""
        for node in ast.walk(self.tree(file)):
            if isinstance(node, ast.For) and node.lineno == line:
                target = node.target
                if isinstance(node.iter, ast.Call) and getattr(node.iter.func, "id", "") == "enumerate" \
                        and isinstance(target, ast.Tuple) and len(target.elts) == 2:
                    target = target.elts[1]
                if isinstance(target, ast.Tuple) and target.elts and isinstance(target.elts[0], ast.Name):
                    return {"batch": target.elts[0].id, "batch_is_tuple": True}
                if isinstance(target, ast.Name):
                    return {"batch": target.id, "batch_is_tuple": False}
        return {}
