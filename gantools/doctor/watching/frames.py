"""Which code is yours: the frames, FILE:LINE sites and names the doctor reports come from your code, never from
torch's, gantools' or the standard library's."""
from __future__ import annotations

import functools
import linecache
import os
import sys
import sysconfig
from pathlib import Path

import torch
from torch import nn

GANTOOLS_DIR = str(Path(__file__).resolve().parents[2]) + os.sep  # gantools' own frames: the package, not the checkout
DOCTOR_DIR = str(Path(__file__).resolve().parents[1]) + os.sep
LIBRARIES = (str(Path(torch.__file__).resolve().parent) + os.sep, GANTOOLS_DIR)
NOT_YOURS = LIBRARIES + tuple(str(Path(p).resolve()) + os.sep for p in {sysconfig.get_paths()[k] for k in
                                                                        ("stdlib", "purelib", "platlib")})


@functools.lru_cache(maxsize=8)
def _installed_dirs(path: tuple) -> tuple:
    """The folders on sys.path that hold installed packages (an `*.dist-info` inside): what sysconfig does not name,
    Debian's /usr/lib/python3/dist-packages, a user site, a `pip install --target` folder on PYTHONPATH."""
    found = []
    for entry in path:
        try:
            folder = Path(entry or ".").resolve()
            if folder.is_dir() and next(folder.glob("*.dist-info"), None) is not None:
                found.append(str(folder) + os.sep)
        except OSError:
            continue
    return tuple(found)


def yours(filename: str) -> bool:
    return not filename.startswith(NOT_YOURS + _installed_dirs(tuple(sys.path))) and not filename.startswith("<frozen")


def site(frame) -> tuple[str, str]:
    """(FILE:LINE, source line) of the first frame in your code, walking out from `frame`."""
    first = frame
    while frame is not None and not yours(frame.f_code.co_filename):
        frame = frame.f_back
    frame = frame or first
    filename = frame.f_code.co_filename
    return f"{shown(filename)}:{frame.f_lineno}", linecache.getline(filename, frame.f_lineno).strip()


def location(frame) -> tuple[str, int] | None:
    """(absolute file, line) of the first frame in your code, walking out from `frame`: where a source edit goes."""
    while frame is not None and not yours(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None or frame.f_code.co_filename.startswith("<"):
        return None
    return os.path.abspath(frame.f_code.co_filename), frame.f_lineno


def cell_label(filename: str) -> str | None:
    """A notebook cell's name (In[5]): IPython runs each cell from a temporary file it names so in tracebacks; None
    for a file that is not a cell."""
    ipython = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    label = getattr(getattr(ipython, "compile", None), "format_code_name", lambda name: None)(filename)
    return label[1] if label else None


def shown(filename: str) -> str:
    """A notebook cell as IPython names it in tracebacks (In[5]), a file relative to here when it is below."""
    label = cell_label(filename)
    if label:
        return label
    relative = os.path.relpath(filename)
    return filename if filename.startswith("<") or relative.startswith("..") else relative


def name_in_frames(obj, frame) -> str | None:
    """The name your code gives `obj`: a local or global bound to it in the first of your frames that has one; else
    an attribute of a frame's `self` (`self.G`, `self.opt_d`: a loop written as a trainer class's method) or of a
    local or global that is a module or an object of a class of yours (`gan.generator`). Never raises: a naming
    heuristic must not break your script."""
    frames = []
    while frame is not None:
        if yours(frame.f_code.co_filename):
            frames.append(frame)
        frame = frame.f_back
    for f in frames:
        for scope in (f.f_locals, f.f_globals):
            for name, value in scope.items():
                if _is(value, obj) and name.isidentifier() and not name.startswith("_") and name != "self":
                    return name
    for f in frames:
        try:
            name = _attribute_name(obj, f)
        except Exception:  # your objects' own __getattr__ and friends
            name = None
        if name:
            return name
    return None


def _attribute_name(obj, frame) -> str | None:
    me = frame.f_locals.get("self")
    if me is not None:
        name = _attribute_naming(me, obj)
        if name:
            return f"self.{name}"
    for scope in (frame.f_locals, frame.f_globals):
        for owner, value in list(scope.items()):
            if not owner.isidentifier() or owner.startswith("_") or owner == "self" or not (
                    isinstance(value, nn.Module) or _of_your_class(value)):
                continue
            name = _attribute_naming(value, obj)
            if name:
                return f"{owner}.{name}"
    return None


def _is(value, obj) -> bool:
    return value is obj or _wraps(value, obj)


def _of_your_class(value) -> bool:
    """An instance of a class your code defines (its methods' code is in your files)."""
    return any(yours(f.__code__.co_filename) for f in vars(type(value)).values() if hasattr(f, "__code__"))


def _attribute_naming(owner, obj) -> str | None:
    """The attribute of `owner` bound to `obj`, read from its instance dict (never through your class's __getattr__;
    an nn.Module keeps its submodules in _modules there)."""
    if owner is obj:
        return None
    try:
        own = object.__getattribute__(owner, "__dict__")
    except (AttributeError, TypeError):
        return None
    attributes = {**(own.get("_modules") or {}), **own}
    return next((name for name, value in attributes.items()
                 if _is(value, obj) and name.isidentifier() and not name.startswith("_")), None)


def _wraps(value, obj) -> bool:
    """`value` is an optimizer wrapping `obj`: Accelerate's `prepare` returns an AcceleratedOptimizer that holds the
    optimizer your code built as `.optimizer`, Lightning's `self.optimizers()` a LightningOptimizer that holds it as
    `._optimizer`, so your name is bound to the wrapper while the step hooks see the optimizer inside it."""
    if not isinstance(value, torch.optim.Optimizer):
        return False
    own = vars(value)
    return own.get("optimizer") is obj or own.get("_optimizer") is obj


def first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (list, tuple)):
        for item in x:
            t = first_tensor(item)
            if t is not None:
                return t
    if isinstance(x, dict):
        return first_tensor(list(x.values()))
    return None


def compiling() -> bool:
    """Inside a graph torch.compile is tracing the hooks do nothing: dynamo folds this to True there, so they add
    neither graph breaks nor ops (a compiled model is still timed as a whole, from outside)."""
    return torch.compiler.is_compiling()


def is_leaf(module: nn.Module) -> bool:
    return next(module.children(), None) is None
