"""The host budget of a training iteration: how many times Python asks the device for something, counted exactly
on any device. A GPU runs a small GAN's kernels in microseconds each; when the host needs as long to issue each one
(a few microseconds of Python and dispatcher per op), the GPU waits for the host, and no faster kernel helps. So the
count of what the host issues per iteration is what a CPU can tell about a GPU's speed, without a GPU.

Every ATen op an iteration runs passes the dispatcher once, where a `TorchDispatchMode` sees it, on a CPU as on a
GPU, and sorts it:

- **launches**: ops that run a kernel (on a GPU, one launch each; a foreach or fused optimizer op launches a few,
  one per chunk of its tensor list, and counts once here);
- **views**: ops that only make a new view of the same memory (`view`, `detach`, slicing): host work, no kernel;
- **allocations**: `empty`-like ops, which reserve memory without running a kernel;
- **syncs**: ops that wait for the device to finish, because their result goes to Python or its size depends on
  the data (`.item()`, `nonzero`, a boolean mask, a copy to the host);
- **CPU reads**: the same reads of a tensor that lives on the host by design (foreach Adam's `step` counters are
  CPU tensors on a GPU: `torch/optim/adam.py` reads them with `.item()` for its bias corrections), which cost host
  time but never wait for the device;
- **host-to-device copies**: a copy from host memory to the device (on a GPU only; a CPU has no such copy);
- **autocast casts**: the 16-bit copies of weights and inputs autocast makes (a subset of the launches).

Profiler annotations (`record_function`, the `profiler::` namespace) are not counted. Where a count is taken on a
CPU for a GPU (`as_on_gpu`), `.item()` of a tensor that would be on the GPU counts as a sync, and of one that
would stay on the host as a CPU read (`host_tensors` names those).

Compiled code (torch.compile) runs its kernels outside the dispatcher: the counts of a compiled iteration hold the
ops that still run eagerly (the optimizer, the metric sums) and the compiled graphs' calls are in
`compile_counts`' records (graphs, breaks, recompiles) instead.
"""
from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

KINDS = ("launches", "views", "allocations", "syncs", "cpu_reads", "h2d_copies", "autocast_casts")
_ATEN = torch.ops.aten
# ops whose result is read on the host: they wait for the device (nonzero and friends size their output by it)
_READS = {_ATEN._local_scalar_dense.default, _ATEN.nonzero.default, _ATEN.equal.default, _ATEN.is_nonzero.default,
          _ATEN.masked_select.default, _ATEN._unique2.default, _ATEN.unique_consecutive.default,
          _ATEN.bincount.default, _ATEN.repeat_interleave.Tensor}
_VIEWS = {_ATEN._unsafe_view.default}  # a view in all but name (reshape's copy-free path)
# ops that reserve memory or read metadata without running a kernel
_NO_KERNEL = {_ATEN.empty.memory_format, _ATEN.empty_strided.default, _ATEN.empty_like.default,
              _ATEN.lift_fresh.default, _ATEN.set_.source_Storage_storage_offset, _ATEN.resize_.default,
              _ATEN.is_same_size.default, _ATEN._has_compatible_shallow_copy_type.default,
              _ATEN.sym_size.int, _ATEN.sym_stride.int, _ATEN.sym_numel.default}
_HALF = (torch.float16, torch.bfloat16)
_TORCH = str(Path(torch.__file__).parent)
_PACKAGE = Path(__file__).resolve().parents[1]  # gantools/


@dataclass
class HostBudget:
    """The counts of an iteration (per iteration: totals over `iterations` divided by it), and where each op came
    from: `sites` maps (kind, op, 'file:function') to its count over all iterations, `lines` one source line per site
    ('file:line'), so a change that adds an op says which line added it."""

    iterations: int = 0
    totals: Counter = field(default_factory=Counter)
    sites: Counter = field(default_factory=Counter)
    lines: dict = field(default_factory=dict)

    def per_iteration(self) -> dict:
        """kind -> count per iteration (every kind of `KINDS`, and `dispatches`, all ops together), rounded to
        0.1 (a lazy penalty or a log read may fall on some iterations only)."""
        n = max(1, self.iterations)
        counts = {kind: round(self.totals[kind] / n, 1) for kind in (*KINDS, "dispatches")}
        return {k: int(v) if float(v).is_integer() else v for k, v in counts.items()}

    def note(self, kind: str, op: str, where: tuple[str, str]) -> None:
        """Count one op the dispatcher does not see (a CUDA graph's replay): `where` is (site, line)."""
        key = (kind, op, where[0])
        self.totals[kind] += 1
        self.totals["dispatches"] += 1
        self.sites[key] += 1
        self.lines.setdefault(key, where[1])

    def where(self, kind: str) -> list[tuple[str, str, int]]:
        """(op, source line, count over all iterations) for one kind, most frequent first."""
        rows = [(op, self.lines[(k, op, site)], n) for (k, op, site), n in self.sites.items() if k == kind]
        return sorted(rows, key=lambda row: -row[2])


class _Counting(TorchDispatchMode):
    """Sorts every op dispatched inside it into `HostBudget`'s kinds (see the module docstring)."""

    def __init__(self, budget: HostBudget, device: torch.device, host_tensors: set[int], as_on_gpu: bool):
        super().__init__()
        self.budget, self.device, self.host_tensors, self.as_on_gpu = budget, device, host_tensors, as_on_gpu
        self.in_autocast = [False]  # set by _AutocastWatch around each torch call

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace != "profiler":
            for kind in self._kinds(func, args, kwargs):
                self._note(kind, func)
            self.budget.totals["dispatches"] += 1
        return func(*args, **kwargs)

    def _kinds(self, func, args, kwargs) -> tuple[str, ...]:
        if func in _READS or _masked(func, args):
            return (self._read_kind(args[0]),)
        if func.is_view or func in _VIEWS:
            return ("views",)
        if func in _NO_KERNEL:
            return ("allocations",)
        kinds = ["launches"]
        if func in (_ATEN._to_copy.default, _ATEN.copy_.default):
            kinds += self._copy_kinds(func, args, kwargs)
        return tuple(kinds)

    def _read_kind(self, tensor) -> str:
        """A read of a device tensor waits for the device; of a host tensor it does not."""
        on_host = (id(tensor) in self.host_tensors if self.as_on_gpu
                   else isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu"
                   and self.device.type != "cpu")
        return "cpu_reads" if on_host else "syncs"

    def _copy_kinds(self, func, args, kwargs) -> list[str]:
        source = args[1] if func is _ATEN.copy_.default else args[0]
        target_device = (args[0].device if func is _ATEN.copy_.default
                         else torch.device(kwargs.get("device") or source.device))
        kinds = []
        if source.device.type == "cpu" and target_device.type != "cpu":
            kinds.append("h2d_copies")
        if source.device.type != "cpu" and target_device.type == "cpu":
            kinds.append("syncs")  # to the host (.cpu(), .tolist()): the host waits for the copy
        dtype = kwargs.get("dtype")
        if (func is _ATEN._to_copy.default and dtype in _HALF and source.dtype == torch.float32
                and self.in_autocast[0]):
            kinds.append("autocast_casts")
        return kinds

    def _note(self, kind: str, func) -> None:
        site, line = _caller()
        key = (kind, str(func.overloadpacket.__name__), site)
        self.budget.totals[kind] += 1
        self.budget.sites[key] += 1
        self.budget.lines.setdefault(key, line)


def _masked(func, args) -> bool:
    """Indexing with a boolean mask: its output's size is the mask's count of True, read back to the host."""
    if func is not _ATEN.index.Tensor:
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None)


class _AutocastWatch(TorchFunctionMode):
    """Tells `_Counting` whether the torch call in progress runs under autocast. Inside a dispatch mode autocast's
    state cannot be read (its dispatch key is excluded below it), so it is read here, one level up, at each torch
    function call; an explicit cast (`x.to(torch.bfloat16)`) is the user's own, not autocast's."""

    _EXPLICIT = {torch.Tensor.to, torch.Tensor.half, torch.Tensor.bfloat16, torch.Tensor.type}

    def __init__(self, flag: list, device_type: str):
        super().__init__()
        self.flag, self.device_type = flag, device_type

    def __torch_function__(self, func, types, args=(), kwargs=None):
        saved = self.flag[0]
        self.flag[0] = func not in self._EXPLICIT and torch.is_autocast_enabled(self.device_type)
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.flag[0] = saved


def _caller() -> tuple[str, str]:
    """('file:function', 'file:line') of the first frame outside torch and this module: the line in gantools or
    in the user's code that asked for the op."""
    frame = sys._getframe(3)
    while frame is not None and _inside_torch(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return "?", "?"
    name = _short(frame.f_code.co_filename)
    return f"{name}:{frame.f_code.co_name}", f"{name}:{frame.f_lineno}"


def _inside_torch(filename: str) -> bool:
    return (filename.startswith(_TORCH) or filename == __file__ or filename.startswith("<")
            or filename.endswith(("/contextlib.py", "/functools.py")))


def _short(path: str) -> str:
    """A path in the gantools package from the package on (gantools/core/step.py), else the file's name."""
    try:
        return f"gantools/{Path(path).resolve().relative_to(_PACKAGE).as_posix()}"
    except ValueError:
        return Path(path).name


class counting:
    """`with counting(device) as budget: ...` counts every op the block dispatches into `budget` (a HostBudget;
    set `budget.iterations` to the iterations the block ran for per-iteration figures).

    Args:
        device: the device the counted code trains on.
        host_tensors: tensors that live on the host on a GPU (read with `.item()`, they cost no sync there).
        as_on_gpu: count on a CPU what a GPU would do: a read counts as a sync unless of `host_tensors`.
    """

    def __init__(self, device: torch.device, host_tensors=(), as_on_gpu: bool = False):
        self.budget = HostBudget()
        device = torch.device(device)
        self._mode = _Counting(self.budget, device, {id(t) for t in host_tensors}, as_on_gpu)
        self._watch = _AutocastWatch(self._mode.in_autocast, device.type)

    def __enter__(self) -> HostBudget:
        self._watch.__enter__()
        self._mode.__enter__()
        return self.budget

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        self._watch.__exit__(*exc)
