"""The package's shape: no import cycles (not even hidden inside functions), every module importable on its own in a
fresh interpreter, and importing gantools changes nothing global (several trainers share one process)."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gantools

PACKAGE = Path(gantools.__file__).resolve().parent
ROOT = PACKAGE.parent


def _modules() -> dict:
    """Module name -> file, for every module of the package (subpackages included)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    del found["gantools.__main__"]  # `python -m gantools`: importing it runs the CLI, as it should
    return found


def _imports(name: str, path: Path, modules: dict) -> set:
    """The package modules that `name` imports anywhere in its source (function bodies included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            bases = [alias.name for alias in node.names]
            names = []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            bases, names = [base], [alias.name for alias in node.names]
        else:
            continue
        for base in bases:
            submodules = {f"{base}.{n}" for n in names} & modules.keys()  # `from . import losses`: a module
            targets |= submodules
            if base in modules and (not names or len(submodules) < len(names)):  # names defined in `base` itself
                targets.add(base)
    targets.discard(name)
    return targets


def _cycle(graph: dict) -> list | None:
    """One import cycle of the graph, as the list of modules around it, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_even_inside_functions():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # the package's own __init__ imports its public names from everywhere; a module importing it back closes a cycle
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"


def test_the_cycle_finder_finds_a_hidden_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


# The layers, bottom first (docs/design.md draws them): a module imports its own subpackage and the layers below it,
# never one above or beside it. `errors` and `quick` are leaves every layer may read.
# `tuning` and `doctor` share a layer: neither imports the other.
LAYERS = [{"gantools.errors", "gantools.quick"}, {"gantools.measuring"}, {"gantools.core"}, {"gantools.speed"},
          {"gantools.tuning", "gantools.doctor"}, {"gantools.workbook"}, {"gantools", "gantools.cli"}]


def _home(name: str) -> str:
    """The layer entry a module belongs to: its subpackage, or itself for the top-level modules."""
    parts = name.split(".")
    package = ".".join(parts[:2])
    return package if any(package in layer for layer in LAYERS) else "gantools"


def _rank(home: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if home in layer)


def _layer_breaks(graph: dict) -> list:
    breaks = []
    for name, targets in graph.items():
        home = _home(name)
        for target in targets:
            there = _home(target)
            if there == home:
                continue
            if _rank(there) >= _rank(home):
                breaks.append(f"{name} -> {target}")
    return sorted(breaks)


def test_every_module_imports_only_its_own_layer_and_the_layers_below():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert not (stray := sorted(n for n in modules if _home(n) == "gantools" and n not in LAYERS[-1]
                                and n not in LAYERS[0])), f"modules outside every layer: {stray}"
    assert _layer_breaks(graph) == []


def test_the_layer_rule_catches_an_import_upward_and_one_beside():
    graph = {"gantools.core.trainer": {"gantools.speed.bench", "gantools.measuring.clock"},
             "gantools.doctor.trying.try_fixes": {"gantools.tuning.tuner", "gantools.speed.bench"}}
    assert _layer_breaks(graph) == ["gantools.core.trainer -> gantools.speed.bench",
                                    "gantools.doctor.trying.try_fixes -> gantools.tuning.tuner"]


# The doctor's stages, bottom first (docs/design.md): a stage imports itself and the stages below, never one above.
DOCTOR_STAGES = ["watching", "findings", "editing", "fixes", "patching", "diagnosis", "trying"]


def _stage_breaks(graph: dict) -> list:
    """'module -> target' for each import of a doctor stage from one above it (the package's own __init__ aside)."""
    def stage(name):
        parts = name.split(".")
        return parts[2] if len(parts) > 3 and parts[:2] == ["gantools", "doctor"] else None
    breaks = []
    for name, targets in graph.items():
        if (here := stage(name)) is None:
            continue
        for target in targets:
            if (there := stage(target)) is not None and DOCTOR_STAGES.index(there) > DOCTOR_STAGES.index(here):
                breaks.append(f"{name} -> {target}")
    return sorted(breaks)


def test_each_doctor_stage_imports_only_itself_and_the_stages_below():
    modules = _modules()
    assert {n.split(".")[2] for n in modules if n.startswith("gantools.doctor.") and n.count(".") > 2} \
        == set(DOCTOR_STAGES), "a doctor module outside every stage"
    assert not [n for n in modules if n.startswith("gantools.doctor.") and n.count(".") == 2
                and n.split(".")[2] not in DOCTOR_STAGES], "a doctor module outside every stage"
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _stage_breaks(graph) == []


def test_the_stage_rule_catches_a_stage_importing_one_above():
    graph = {"gantools.doctor.watching.hooks": {"gantools.doctor.fixes.fix", "gantools.doctor.watching.frames"},
             "gantools.doctor.trying.trial": {"gantools.doctor.diagnosis.script"}}
    assert _stage_breaks(graph) == ["gantools.doctor.watching.hooks -> gantools.doctor.fixes.fix"]


EACH_ALONE = """
import importlib, os, sys, traceback
import torch, libcst  # the slow third-party imports, done once; each gantools module is then imported in a fork with
# no gantools module in it, as many forks at a time as there are cores
failed, running = [], {}


def wait_one():
    pid, status = os.wait()
    if status:
        failed.append(running[pid])
    del running[pid]


for name in sys.argv[1:]:
    if len(running) >= (os.cpu_count() or 1):
        wait_one()
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    running[pid] = name
while running:
    wait_one()
print("failed:", " ".join(sorted(failed)))
"""


@pytest.mark.slow
def test_every_module_imports_on_its_own_in_a_fresh_interpreter():
    """Each module first, in a process where no gantools module was imported before it: a module that works only
    after another one set things up (an import cycle broken by order) fails here."""
    names = sorted(_modules())
    done = subprocess.run([sys.executable, "-c", EACH_ALONE, *names], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "failed:", done.stdout + done.stderr[-3000:]


GLOBAL_STATE = """
import gc, json, logging, os, signal, sys, warnings
import torch
def state():
    return dict(
        environ=dict(os.environ), gc_callbacks=len(gc.callbacks), signals=[str(signal.getsignal(s)) for s in
        (signal.SIGINT, signal.SIGTERM)], cudnn_benchmark=torch.backends.cudnn.benchmark,
        deterministic=torch.are_deterministic_algorithms_enabled(), matmul=torch.get_float32_matmul_precision(),
        threads=torch.get_num_threads(), rng=torch.get_rng_state().sum().item(), argv=sys.argv,
        default_dtype=str(torch.get_default_dtype()), grad=torch.is_grad_enabled(), cwd=os.getcwd(),
        warning_filters=len(warnings.filters))
before = state()
import importlib
for name in sys.argv[1:]:
    importlib.import_module(name)
after = state()
changed = {k: [before[k], after[k]] for k in before if before[k] != after[k]}
if "environ" in changed:  # only the variables that changed
    changed["environ"] = {k: [before["environ"].get(k), after["environ"].get(k)]
                          for k in before["environ"].keys() | after["environ"].keys()
                          if before["environ"].get(k) != after["environ"].get(k)}
print(json.dumps(changed, default=str))
"""


@pytest.mark.slow
def test_importing_gantools_changes_nothing_global():
    names = sorted(_modules())
    done = subprocess.run([sys.executable, "-c", GLOBAL_STATE, *names], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "{}", f"changed by importing gantools: {done.stdout}"


# Units a reader can hold (docs/design.md): limits every module, class and function of the package keeps.
MODULE_LINES, CLASS_LINES, FUNCTION_LINES = 500, 300, 60


def _oversized(path: Path, source: str) -> list:
    """'where: lines' for the module, each class and each function of `source` over its limit."""
    found = [f"{path}: {n} lines"] if (n := len(source.splitlines())) > MODULE_LINES else []
    for node in ast.walk(ast.parse(source)):
        limit = (CLASS_LINES if isinstance(node, ast.ClassDef) else
                 FUNCTION_LINES if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
        if limit and (n := node.end_lineno - node.lineno + 1) > limit:
            found.append(f"{path}:{node.lineno} {node.name}: {n} lines")
    return found


def test_no_module_class_or_function_is_over_its_size_limit():
    found = [f for path in sorted(PACKAGE.rglob("*.py")) for f in _oversized(path.relative_to(ROOT), path.read_text())]
    assert found == []


def test_the_size_limits_catch_a_long_function_and_a_long_module():
    long_function = "def f():\n" + "    x = 1\n" * FUNCTION_LINES
    assert _oversized(Path("m.py"), long_function) == [f"m.py:1 f: {FUNCTION_LINES + 1} lines"]
    assert _oversized(Path("m.py"), "x = 1\n" * (MODULE_LINES + 1)) == [f"m.py: {MODULE_LINES + 1} lines"]
    assert _oversized(Path("m.py"), "def f():\n    return 1\n") == []


def _phase_labels() -> dict:
    """'file:line' -> the label, for every string literal the package passes to `phase(...)` or `label_phase(...)`."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                    and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("phase", "label_phase")):
                found[f"{path.relative_to(ROOT)}:{node.lineno}"] = node.args[0].value
    return found


def test_every_phase_the_step_labels_is_one_the_profiler_and_doctor_know():
    """One vocabulary of phases: the trainer labels, the profiler's table and the doctor's attribution read the same
    names (`measuring.protocol.PHASES`)."""
    from gantools.measuring.protocol import PHASES

    labels = _phase_labels()
    assert len(set(labels.values())) >= 8, labels
    assert {where: label for where, label in labels.items() if label not in PHASES} == {}
