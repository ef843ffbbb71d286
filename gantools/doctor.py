"""`gantools doctor`: your own GAN training loop, measured, and what to change in it.

Three ways in, one `DoctorReport`:

- a script, unmodified: `python -m gantools doctor [--steps N] [--warmup N] [--json PATH] [--trace PATH]
  [--timeout S] SCRIPT.py [ARGS...]` (`run_script`). It runs as `__main__` with `sys.argv = [SCRIPT.py, ARGS...]`,
  its folder first on `sys.path` and the working directory unchanged, and is stopped once the doctor has measured;
- a step function and its data: `run(step, data)`;
- your own loop with two marks: `with watch() as doc: for batch in doc.data(loader): ...; doc.end_step()`, then
  `doc.report`.

How it sees a loop it did not write (every hook and patch is removed, and sys.argv/sys.path restored, at the end):

- **Iterations.** In a script, from optimizer step hooks (`torch.optim.optimizer.register_optimizer_step_*_hook`,
  global): one iteration is the interval between two steps of the optimizer that steps least often, so a WGAN loop
  with five critic steps per generator step is counted in generator iterations. In the other forms, your marks.
- **Models.** Global module forward hooks (`torch.nn.modules.module.register_module_forward_*hook`) with a depth
  counter: each top-level call of a module that has parameters opens a profiler range. G is the model whose output
  is images and feeds another model, D the model fed by G (else the one returning one value per image). D's calls
  are split into D's step and G's step by the optimizer that steps next. Backward time is attributed through the
  autograd sequence number that ties each `evaluate_function: XBackward0` event to the forward op, inside a model's
  range, that created it. Global *full backward* hooks are not used: they wrap every module's outputs and break
  in-place ops (`LeakyReLU(inplace=True)` then raises "a view ... is being modified inplace").
- **Data wait.** Time inside DataLoader iteration (`_BaseDataLoaderIter.__next__`, patched), or inside `doc.data`.
  It is host time only: the batch's copy to the device happens in your code after it.
- **Host syncs.** `Tensor.item`, `tolist`, `__bool__`, `__float__`, `__int__`, `__repr__`, `__format__` and
  `.cpu()` of a device tensor, called from your code (not from torch's), each with its FILE:LINE; on CUDA also the
  `cuda*Synchronize` calls the profiler records.
- **Settings.** Conv/Linear output dtypes and autocast, conv input memory format, loss ops, D's last module,
  DataLoader knobs and per-image transforms, optimizer implementations, whether D's parameters receive gradients in
  G's step (post-accumulate-grad hooks), compiled modules, cudnn.benchmark, TF32, peak memory.

Measurement: `warmup` iterations are skipped; `steps` iterations are timed with nothing installed but the iteration
marks (the device synchronised at each; their median is the step time and images/s reported); then one profiler
warm-up iteration and `steps` iterations under torch.profiler, whose overhead (profiled over unprofiled step time) is
stated. The verdict is `profiling.bottleneck`, the one place that decides it. Every finding rests on numbers from this
run and is ranked by its estimated gain (Amdahl on measured shares), or says "measure it" where no model of its gain
exists.
"""
from __future__ import annotations

import contextlib
import json
import linecache
import logging
import math
import os
import re
import runpy
import signal
import statistics
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
import warnings
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn.modules import module as _module
from torch.optim import optimizer as _optim
from torch.profiler import ProfilerActivity, record_function, schedule
from torch.utils.data import DataLoader
from torch.utils.data import dataloader as _dataloader

from . import hardware
from .errors import DoctorError, ScriptError
from .profiling import PHASES as ORDER  # the trainer's phase names, in the same order
from .profiling import SYNC_EVENTS, bottleneck, compute_ms, device_time, suggested_workers

STEPS, WARMUP, TIMEOUT_S = 5, 2, 300.0
PACING_LIMIT = 64       # optimizer steps after which the loop's rhythm is decided from the optimizers seen so far
MIN_SHARE = 0.05        # a cost under 5% of the step (data wait, copies, optimizer steps) is not worth a finding
MIN_GAIN = 1.02         # a finding whose whole estimated gain is under 2% would be noise
SYNCS_PER_STEP = 1.0    # reading values at least once per iteration, on average, is a per-step sync
SYNC_METHODS = ("item", "tolist", "__bool__", "__float__", "__int__", "__repr__", "__format__", "cpu")
OTHER = "other (your code)"
_RANGE = "gantools-doctor#"  # provisional profiler range names, renamed to phases once the loop is understood
_LIBRARIES = tuple(str(Path(m.__file__).resolve().parent) + os.sep for m in (torch, sys.modules[__package__]))
_NOT_YOURS = _LIBRARIES + tuple(str(Path(p).resolve()) + os.sep for p in {sysconfig.get_paths()[k] for k in
                                                                           ("stdlib", "purelib", "platlib")})
_ACTIVE: list = []  # the doctor running now (hooks are global: one at a time)


class _Stop(BaseException):
    """The doctor has measured enough: raised from an optimizer hook to end the script. A BaseException, so the
    script's own `except Exception` cannot swallow it."""


class _Timeout(BaseException):
    """No optimizer step within the time limit."""


class _Interrupted(BaseException):
    """Ctrl-C while a script runs under the doctor (the script's own `except KeyboardInterrupt` must not hide it)."""


@dataclass
class Finding:
    """One change to make in your code, and the evidence from this run that it is worth making."""

    kind: str                 # stable: host-sync, sigmoid-bce, fp32-convolutions, per-sample-transforms, ...
    title: str
    seen: str                 # numbers from this run, FILE:LINE where known
    why: str
    change: str               # a short snippet for your code
    notebook: str
    estimated_speedup: float | None  # Amdahl from measured shares; None: measure it

    def __str__(self):
        gain = f"estimated gain up to {self.estimated_speedup:.2f}x" if self.estimated_speedup else "measure it"
        change = "\n".join("      " + line for line in self.change.splitlines())
        return (f"[{self.kind}] {self.title} ({gain})\n   seen: {self.seen}\n   why: {self.why}\n"
                f"   change, in your code:\n{change}\n   learn it: notebook {self.notebook}")


@dataclass
class DoctorReport:
    """What the doctor measured in your loop. Times are milliseconds per iteration. It has the fields
    `profiling.compare` and `display.plot_phases` read (phases_ms, step_time_ms, images_per_sec, device), so the
    fix-measure loop works on your own code: `compare(before, after)`."""

    source: str
    device: str
    complete: bool = False
    note: str = ""                       # why the report is partial, when it is
    steps: int = 0                       # profiled iterations
    iterations_seen: int = 0
    step_time_ms: float = float("nan")   # profiled, host wall time per iteration
    unprofiled_step_time_ms: float = float("nan")  # timed without the profiler, device synchronised
    images_per_step: float = 0.0         # real images per iteration
    images_source: str = ""
    batch_size: int = 0
    phases_ms: dict = field(default_factory=dict)
    device_busy_ms: float = 0.0
    compute_share: float = 0.0           # of busy time, in convolutions and matmuls
    host_syncs_per_step: float = 0.0     # value reads in your code (a GPU wait each)
    sync_sites: list = field(default_factory=list)  # {"where", "code", "method", "per_step"}
    top_ops: list = field(default_factory=list)
    peak_mem_mb: float = 0.0
    models: dict = field(default_factory=dict)      # role or name -> what it is
    optimizers: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    verdict: dict = field(default_factory=dict)     # bottleneck, evidence
    findings: list = field(default_factory=list)
    trace_path: str | None = None

    @property
    def images_per_sec(self) -> float:
        return self.images_per_step / (self.unprofiled_step_time_ms / 1e3) if self.unprofiled_step_time_ms else 0.0

    @property
    def overhead(self) -> float:
        """Profiled step time over unprofiled: what the profiler (and the doctor's hooks) cost."""
        return self.step_time_ms / self.unprofiled_step_time_ms

    def kinds(self) -> list:
        return [f.kind for f in self.findings]

    def to_dict(self) -> dict:
        """Everything above as plain JSON values (what `--json` writes); numbers not measured are null."""
        d = asdict(self)
        d.update(images_per_sec=self.images_per_sec, overhead=self.overhead,
                 machine=hardware.machine_info(self.device))
        return _jsonable(d)

    def save_json(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    def __str__(self):
        lines = [f"gantools doctor: {self.source} on {self.device}"]
        lines += ["  " + line for line in _describe_loop(self)]
        if not self.complete:
            lines.append(f"  incomplete: {self.note}")
        timed = self.settings.get("timed_iterations_ms") or []
        if self.unprofiled_step_time_ms == self.unprofiled_step_time_ms:  # not NaN: the timed window finished
            lines.append(f"  {self.unprofiled_step_time_ms:.1f} ms per iteration (median of {len(timed)} timed "
                         f"without the profiler, device synchronised; {min(timed):.0f}-{max(timed):.0f}), "
                         f"{self.images_per_sec:.0f} images/s")
        if not self.phases_ms:
            return "\n".join(lines)
        lines.append(f"  {self.steps} profiled iterations: {self.step_time_ms:.1f} ms each (profiler overhead "
                     f"{self.overhead:.2f}x)")
        v = self.verdict
        first = f" (try first: finding 1, {self.findings[0].kind})" if self.findings else ""
        lines += ["", f"verdict: {v['bottleneck']}{first}",
                  "  evidence: " + ", ".join(f"{k} {_fmt(val)}" for k, val in v["evidence"].items()), "",
                  "where an iteration's time goes (profiled, ms per iteration):"]
        lines += [f"  {name:<22} {ms:8.2f} ms  {100 * ms / self.step_time_ms:5.1f}%" for name, ms in
                  self.phases_ms.items()]
        syncs = "; ".join(f"{s['where']} {s['code']} ({s['per_step']:g}/it)" for s in self.sync_sites[:4])
        lines.append(f"  host syncs in your code: {self.host_syncs_per_step:.1f} per iteration"
                     + (f": {syncs}" if syncs else ""))
        lines.append(f"  device busy {self.device_busy_ms:.1f} ms, convolutions and matmuls "
                     f"{100 * self.compute_share:.0f}% of it; peak memory {self.peak_mem_mb:.0f} MB")
        lines += ["", "findings, ranked by estimated gain:" if self.findings else
                  "findings: none. Nothing in this run is worth changing by the doctor's rules."]
        for i, f in enumerate(self.findings, 1):
            lines.append(f"{i}. {f}")
        if self.trace_path:
            lines += ["", f"trace (open in https://ui.perfetto.dev): {self.trace_path}"]
        return "\n".join(lines)


def _jsonable(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value if value is None or isinstance(value, (str, int, bool)) else str(value)


def _fmt(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _describe_loop(r: DoctorReport) -> list:
    out = []
    g, d = r.models.get("G"), r.models.get("D")
    if g and d:
        out.append(f"the loop: {g['name']} ({g['class']}, {g['parameters'] / 1e6:.2f}M parameters) feeds "
                   f"{d['name']} ({d['class']}, {d['parameters'] / 1e6:.2f}M)")
    elif r.models:
        out.append("models: " + ", ".join(f"{m['name']} ({m['class']})" for m in r.models.values()))
    if r.settings.get("iteration"):
        out.append(f"one iteration = {r.settings['iteration']}")
    if r.optimizers:
        out.append("optimizers: " + "; ".join(
            f"{o['name']} ({o['class']}, {o['implementation']}) steps " + (f"{o['role']} " if o["role"] else "")
            + (f"{o['steps_per_iteration']:g}x per iteration" if o["steps_per_iteration"] is not None
               else "(its rhythm not measured)") for o in r.optimizers.values()))
    if r.images_per_step:
        out.append(f"{r.images_per_step:g} real images per iteration ({r.images_source})")
    return out


# -- what the hooks record -------------------------------------------------------------------------------------

class _Model:
    def __init__(self, module: nn.Module, name: str):
        inner = getattr(module, "_orig_mod", module)
        self.module, self.name, self.cls = module, name, type(inner).__name__
        self.compiled = type(module).__name__ == "OptimizedModule"
        params = list(module.parameters())
        self.parameters, self.param_ids = sum(p.numel() for p in params), {id(p) for p in params}
        self.calls, self.out_shape, self.role, self.last_module = 0, None, None, None
        self.fed_by, self.sites = Counter(), Counter()
        self.sigmoid_path = None  # where a final nn.Sigmoid sits inside it

    def describe(self) -> dict:
        return {"name": self.name, "class": self.cls, "parameters": self.parameters, "compiled": self.compiled,
                "output_shape": list(self.out_shape or ()), "last_module": self.last_module,
                "called_at": [w for w, _ in self.sites.most_common(3)]}


class _Optimizer:
    def __init__(self, opt: torch.optim.Optimizer, name: str):
        self.opt, self.name, self.cls = opt, name, type(opt).__name__
        self.param_ids = {id(p) for group in opt.param_groups for p in group["params"]}
        self.steps = 0
        self.window_steps = 0
        self.role = self.model = None
        self.grads_from = Counter()  # model -> gradients accumulated into its parameters before this optimizer stepped

    def implementation(self, device: torch.device) -> str:
        d = self.opt.defaults
        if d.get("fused"):
            return "fused"
        if d.get("foreach"):
            return "foreach"
        if d.get("foreach") is False or "foreach" not in d:
            return "for-loop"
        # foreach=None: torch picks foreach for params on CUDA (optimizer._default_to_fused_or_foreach), else a loop
        return "foreach (default)" if device.type == "cuda" else "for-loop (default here)"


class _Call:
    __slots__ = ("model", "next_opt")

    def __init__(self, model: _Model):
        self.model, self.next_opt = model, None


def _first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (list, tuple)):
        for item in x:
            t = _first_tensor(item)
            if t is not None:
                return t
    if isinstance(x, dict):
        return _first_tensor(list(x.values()))
    return None


def _yours(filename: str) -> bool:
    return not filename.startswith(_NOT_YOURS) and not filename.startswith("<frozen")


def _site(frame) -> tuple[str, str]:
    """(FILE:LINE, source line) of the first frame in your code, walking out from `frame`."""
    first = frame
    while frame is not None and not _yours(frame.f_code.co_filename):
        frame = frame.f_back
    frame = frame or first
    filename = frame.f_code.co_filename
    return f"{_shown(filename)}:{frame.f_lineno}", linecache.getline(filename, frame.f_lineno).strip()


def _shown(filename: str) -> str:
    """A notebook cell as IPython names it in tracebacks (In[5]), a file relative to here when it is below."""
    ipython = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    label = getattr(getattr(ipython, "compile", None), "format_code_name", lambda name: None)(filename)
    if label:
        return label[1]
    relative = os.path.relpath(filename)
    return filename if filename.startswith("<") or relative.startswith("..") else relative


def _name_in_frames(obj, frame) -> str | None:
    """The name your code gives `obj`: a local or global bound to it in the first of your frames that has one."""
    while frame is not None:
        if _yours(frame.f_code.co_filename):
            for scope in (frame.f_locals, frame.f_globals):
                for name, value in scope.items():
                    if value is obj and not name.startswith("_") and name != "self":
                        return name
        frame = frame.f_back
    return None


def _compiling() -> bool:
    """Inside a graph torch.compile is tracing the hooks do nothing: dynamo folds this to True there, so they add
    neither graph breaks nor ops (a compiled model is still timed as a whole, from outside)."""
    return torch.compiler.is_compiling()


def _is_leaf(module: nn.Module) -> bool:
    return next(module.children(), None) is None


# -- the doctor attached to a loop --------------------------------------------------------------------------------

class Watch:
    """The doctor attached to a running loop (see the module docstring). Use `watch()`, `run()` or `run_script()`;
    after the loop, `report` holds the `DoctorReport`."""

    def __init__(self, steps: int = STEPS, warmup: int = WARMUP, trace=None, source: str = "your loop",
                 by_optimizer: bool = False, iteration: str = "one pass of your loop, up to doc.end_step()"):
        if steps < 1 or warmup < 0:
            raise DoctorError(f"steps={steps}, warmup={warmup}: the doctor needs steps >= 1 and warmup >= 0")
        self.steps, self.warmup, self.timed = steps, warmup, steps
        self.trace_request, self.source, self.by_optimizer = trace, source, by_optimizer
        self.iteration = iteration
        self.owner = (os.getpid(), threading.get_ident())  # DataLoader workers are forked with the hooks: not theirs
        self.device: torch.device | None = None
        self.report: DoctorReport | None = None
        self.marks = -1            # iteration marks seen; mark 0 starts the first warm-up iteration
        self.stage = "pacing" if by_optimizer else "warmup"
        self.full = False          # module hooks, value-read patches and grad hooks active
        self.profiling = False     # ranges are being recorded
        self.prof = None
        self.depth, self.top, self.in_data, self.in_sync = 0, None, False, False
        self.models: dict[int, _Model] = {}
        self.paramless: set = set()
        self.leaf: dict[int, bool] = {}
        self.optimizers: dict[int, _Optimizer] = {}
        self.constructed: list = []       # optimizers built while the doctor watched (script mode)
        self.order: list = []             # optimizer steps before the rhythm is decided
        self.pacer: _Optimizer | None = None
        self.pending_calls: list = []
        self.pending_grads: Counter = Counter()
        self.ranges: dict[int, object] = {}  # range id -> _Call or _Optimizer
        self.next_range = 0
        self.open_opt_range = None
        self.recent_outputs: dict[int, _Model] = {}
        self._last_leaf_name = None  # the last leaf module run inside the current top-level call
        self.data_site = None        # where your loop takes its batches
        self.loaders: list = []
        self.losses: Counter = Counter()  # loss modules called at the top level
        self.conv_shapes = defaultdict(set)  # conv module -> input shapes seen (fixed shapes suit cudnn.benchmark)
        self.window = self._window()
        self.timed_ms, self.timed_list, self.peak_mem_mb = float("nan"), [], 0.0
        self.profiled = 0
        self._handles, self._grad_handles, self._patches = [], [], []
        self._light_handles = []
        self.interrupted = False  # a Ctrl-C came (run_script's signal handler)

    def _mine(self) -> bool:
        """True in the process and thread the doctor watches (hooks are global: forked workers inherit them)."""
        return (os.getpid(), threading.get_ident()) == self.owner

    @staticmethod
    def _window() -> dict:
        return {"images_loader": 0, "batches": 0, "batch_sizes": Counter(), "inputs": Counter(),
                "syncs": Counter(), "sites": {}, "dtypes": Counter(), "formats": Counter()}

    # -- install / remove ---------------------------------------------------------------------------------------
    def __enter__(self) -> "Watch":
        if _ACTIVE:
            raise DoctorError("the doctor is already watching a loop in this process: one at a time")
        _ACTIVE.append(self)
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        # torch warns that global module hooks fire once more for a torch.compile'd module: true, and handled here
        warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
        try:
            self._install_light()
            self._set_full(True)
        except BaseException:
            self._remove_all()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        """Stop the profiler, remove every hook and patch, and build `report` from what was measured."""
        if self in _ACTIVE:
            try:
                self._stop_profiler()
            finally:
                self._remove_all()
            self.report = self._analyse()

    def _install_light(self):
        self._light_handles = [_optim.register_optimizer_step_pre_hook(self._opt_pre),
                               _optim.register_optimizer_step_post_hook(self._opt_post)]
        self._patch(_dataloader._BaseDataLoaderIter, "__next__", self._wrap_next)
        self._patch(DataLoader, "__iter__", self._wrap_iter)
        self._patch(torch.optim.Optimizer, "__init__", self._wrap_optimizer_init)

    def _patch(self, owner, name, make):
        own = name in owner.__dict__
        original = getattr(owner, name)
        setattr(owner, name, make(original))
        self._patches.append((owner, name, original, own))

    def _unpatch(self, keep_light: bool) -> None:
        kept = []
        for owner, name, original, own in reversed(self._patches):
            if keep_light and owner is not torch.Tensor:
                kept.append((owner, name, original, own))
                continue
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
        self._patches = kept[::-1]

    def _set_full(self, on: bool) -> None:
        """Module hooks, value-read patches and grad hooks: on for warm-up and profiling, off while timing."""
        if on == self.full:
            return
        self.full = on
        if on:
            self._handles = [_module.register_module_forward_pre_hook(self._pre),
                             _module.register_module_forward_hook(self._post)]
            for name in SYNC_METHODS:
                self._patch(torch.Tensor, name, lambda original, n=name: self._wrap_read(n, original))
            for m in self.models.values():
                self._hook_grads(m)
        else:
            for h in self._handles + self._grad_handles:
                h.remove()
            self._handles, self._grad_handles = [], []
            self._unpatch(keep_light=True)
            self.depth, self.top = 0, None

    def _remove_all(self) -> None:
        for h in self._light_handles + self._handles + self._grad_handles:
            h.remove()
        self._light_handles, self._handles, self._grad_handles = [], [], []
        self._unpatch(keep_light=False)
        self.full = self.profiling = False
        if self in _ACTIVE:
            _ACTIVE.remove(self)
            self._warnings.__exit__(None, None, None)

    # -- iteration marks ------------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.stage == "done"

    def mark(self) -> None:
        """The end of one iteration (and the start of the next)."""
        if self.done:
            return
        self.marks += 1
        b, w, t, n = self.marks, self.warmup, self.timed, self.steps
        self.recent_outputs.clear()
        if w < b <= w + t:  # one timed iteration ends: synchronised, so GPU work is inside the iteration it belongs to
            hardware.synchronize(self._device())
            now = time.perf_counter()
            self.timed_list.append(1e3 * (now - self._t0))
            self._t0 = now
        if b == w:  # warm-up over: time `timed` iterations with nothing installed but the marks
            self._set_full(False)
            self.stage = "timed"
            hardware.synchronize(self._device())
            self._t0 = time.perf_counter()
        elif b == w + t:  # the median: an epoch's start or a busy neighbour in one iteration does not move it
            self.timed_ms = statistics.median(self.timed_list)
            self._set_full(True)
            self._start_profiler()
        elif b == w + t + 1:  # the profiler's warm-up iteration is over: the counted window starts
            self.prof.step()
            self.window = self._window()
            self.profiled = 0
            for o in self.optimizers.values():
                o.window_steps, o.grads_from = 0, Counter()
            hardware.reset_peak_memory(self._device())
        elif b > w + t + 1:
            self.profiled += 1
            if b == w + t + 1 + n:
                hardware.synchronize(self._device())
                self.peak_mem_mb = hardware.peak_memory_mb(self._device())
                self.prof.step()  # the last active step: the trace is complete
                self._stop_profiler()
                self.stage = "done"
                self._set_full(False)
            else:
                self.prof.step()

    def _device(self) -> torch.device:
        if self.device is None:
            for m in self.models.values():
                p = next(m.module.parameters(), None)
                if p is not None:
                    self.device = p.device
                    break
            else:
                for o in self.optimizers.values():
                    for group in o.opt.param_groups:
                        if group["params"]:
                            self.device = group["params"][0].device
                            break
        return self.device or torch.device("cpu")

    def _start_profiler(self) -> None:
        self.stage = "profiling"
        cuda = self._device().type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self.prof = torch.profiler.profile(activities=activities,
                                           schedule=schedule(wait=0, warmup=1, active=self.steps, repeat=1))
        self.prof.start()
        self.profiling = True

    def _stop_profiler(self) -> None:
        if self.prof is not None and self.profiling:
            self.profiling = False
            self.prof.stop()

    def _range(self, obj):
        self.next_range += 1
        self.ranges[self.next_range] = obj
        rf = record_function(f"{_RANGE}{self.next_range}")
        rf.__enter__()
        return rf

    # -- hooks ----------------------------------------------------------------------------------------------------
    def _model(self, module: nn.Module, frame) -> _Model | None:
        key = id(module)
        m = self.models.get(key)
        if m is None and key not in self.paramless:
            if next(module.parameters(), None) is None:
                self.paramless.add(key)
                return None
            m = self.models[key] = _Model(module, _name_in_frames(module, frame) or type(module).__name__)
            self._hook_grads(m)
        return m

    def _hook_grads(self, m: _Model) -> None:
        def seen(param, model=m):
            if self.full:
                self.pending_grads[model] += 1
        for p in m.module.parameters():
            if p.requires_grad:
                self._grad_handles.append(p.register_post_accumulate_grad_hook(seen))

    def _pre(self, module, args):
        if _compiling() or not self._mine():
            return
        self.depth += 1
        if self.depth > 1:
            return
        frame = sys._getframe(1)
        m = self._model(module, frame)
        if m is None:
            if "Loss" in type(module).__name__:
                self.losses[type(module).__name__] += 1
            return
        m.calls += 1
        if m.calls <= 16:  # where your code calls it (the first calls are enough)
            m.sites[_site(frame)[0]] += 1
        x = _first_tensor(args)
        if x is not None and x.dim() > 0:
            producer = self.recent_outputs.get(x.data_ptr())
            if producer is not None and producer is not m:
                m.fed_by[producer] += 1
            self.window["inputs"][(m, producer is not None)] += x.shape[0]  # images fed in, made by a model or not
        call = _Call(m)
        self.pending_calls.append(call)
        self.top = (call, self._range(call) if self.profiling else None, x)

    def _post(self, module, args, output):
        if _compiling() or not self._mine():
            return
        self.depth -= 1
        key = id(module)
        leaf = self.leaf.get(key)
        if leaf is None:
            leaf = self.leaf[key] = _is_leaf(module)
        if leaf and self.depth > 0:
            self._leaf_seen(module, args, output)
        if self.depth or self.top is None:
            return
        call, rf, x = self.top
        self.top = None
        if rf is not None:
            rf.__exit__(None, None, None)
        m = call.model
        out = _first_tensor(output)
        if out is not None:
            m.out_shape = tuple(out.shape)
            self.recent_outputs[out.data_ptr()] = m
        m.last_module = self._last_leaf_name
        self._last_leaf_name = None

    def _leaf_seen(self, module, args, output):
        self._last_leaf_name = type(module).__name__
        if isinstance(module, (nn.modules.conv._ConvNd, nn.Linear)) and isinstance(output, torch.Tensor):
            device_type = output.device.type
            autocast = torch.is_autocast_enabled(device_type) if device_type in ("cpu", "cuda") else False
            self.window["dtypes"][(str(output.dtype).replace("torch.", ""), autocast)] += 1
            x = _first_tensor(args)
            if x is not None and x.dim() == 4 and isinstance(module, nn.modules.conv._ConvNd):
                cl = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
                self.window["formats"]["channels_last" if cl else "contiguous (NCHW)"] += 1
                self.conv_shapes[id(module)].add(tuple(x.shape))

    def _opt_pre(self, opt, args, kwargs):
        if not self._mine():
            return
        if self.depth:  # a forward that raised never closed its hooks: start clean
            self.depth, self.top = 0, None
        o = self._optimizer(opt)
        self.open_opt_range = self._range(o) if self.profiling else None

    def _opt_post(self, opt, args, kwargs):
        if not self._mine():
            return
        if self.open_opt_range is not None:
            self.open_opt_range.__exit__(None, None, None)
            self.open_opt_range = None
        o = self._optimizer(opt)
        o.steps += 1
        o.window_steps += 1
        for call in self.pending_calls:
            call.next_opt = o
        self.pending_calls = []
        for m, n in self.pending_grads.items():
            o.grads_from[m] += n
        self.pending_grads = Counter()
        if self.by_optimizer:
            self._pace(o)

    def _optimizer(self, opt) -> _Optimizer:
        o = self.optimizers.get(id(opt))
        if o is None:
            o = self.optimizers[id(opt)] = _Optimizer(opt, _name_in_frames(opt, sys._getframe(1))
                                                      or type(opt).__name__)
        return o

    def _pace(self, o: _Optimizer) -> None:
        """Script mode: decide which optimizer marks iterations (the one stepping least often, once every optimizer
        built has stepped and one has stepped twice), then mark an iteration at each of its steps."""
        if self.pacer is None:
            self.order.append(o)
            counts = Counter(self.order)
            built = {id(opt) for opt in self.constructed} or set(self.optimizers)
            everyone = all(i in {id(k.opt) for k in counts} for i in built)
            if (max(counts.values()) >= 2 and everyone) or len(self.order) >= PACING_LIMIT:
                last = {k: i for i, k in enumerate(self.order)}
                self.pacer = min(counts, key=lambda k: (counts[k], -last[k]))
                self.stage = "warmup"
                _say(f"found the training loop: one iteration = one step of {self.pacer.name}; now {self.warmup} "
                     f"warm-up, {self.timed} timed, then 1 + {self.steps} profiled iterations")
            return
        if o is self.pacer:
            self.mark()
            if self.done:
                raise _Stop()

    def _wrap_optimizer_init(self, original):
        doctor = self

        def __init__(opt, *args, **kwargs):
            original(opt, *args, **kwargs)
            doctor.constructed.append(opt)
        return __init__

    def _wrap_iter(self, original):
        doctor = self

        def __iter__(loader):
            if loader not in doctor.loaders:
                doctor.loaders.append(loader)
            return original(loader)
        return __iter__

    def _wrap_next(self, original):
        doctor = self

        def __next__(it):
            if doctor.in_data or not doctor._mine():
                return original(it)
            doctor.data_site = doctor.data_site or _site(sys._getframe(1))[0]
            return doctor._fetch(lambda: original(it))
        return __next__

    def _fetch(self, get):
        """Fetch a batch as data wait (a labelled range while profiling) and count its images."""
        self.in_data = True
        rf = record_function("data wait") if self.profiling else contextlib.nullcontext()
        try:
            with rf:
                batch = get()
        finally:
            self.in_data = False
        x = _first_tensor(batch)
        if x is not None and x.dim() > 0:
            self.window["images_loader"] += x.shape[0]
            self.window["batches"] += 1
            self.window["batch_sizes"][x.shape[0]] += 1
        return batch

    def _wrap_read(self, name, original):
        doctor = self

        def read(tensor, *args, **kwargs):
            if (_compiling() or doctor.in_sync or doctor.in_data or not doctor.full
                    or not doctor._mine()
                    or (name == "cpu" and tensor.device.type == "cpu")):
                return original(tensor, *args, **kwargs)
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(_LIBRARIES):  # torch reading its own tensors: not your sync
                return original(tensor, *args, **kwargs)
            if tensor.device.type == "cpu" and doctor._device().type != "cpu":  # a host value: no device wait
                return original(tensor, *args, **kwargs)
            doctor.in_sync = True
            rf = record_function("host sync") if doctor.profiling and doctor.depth == 0 else contextlib.nullcontext()
            try:
                with rf:
                    return original(tensor, *args, **kwargs)
            finally:
                doctor.in_sync = False
                where, code = _site(caller)
                doctor.window["syncs"][where] += 1
                doctor.window["sites"].setdefault(where, (code, name.strip("_")))
        read.__name__ = name
        return read

    # -- the two marks of the watch() form ------------------------------------------------------------------------
    def data(self, iterable):
        """Your loop's data, timed as data wait. Ends the loop once the doctor has measured; re-iterates a
        re-iterable source (a DataLoader: a new epoch) when it runs out first."""
        if self.marks < 0:
            self.mark()
        self.data_site = _site(sys._getframe(1))[0]
        it = iter(iterable)
        one_shot, fresh = it is iterable, True  # an iterator (a generator, say) cannot start over
        while not self.done:
            try:
                batch = self._fetch(lambda: next(it))
                fresh = False
            except StopIteration:
                if fresh or one_shot:  # empty, or used up: nothing more to read
                    return
                it, fresh = iter(iterable), True
                continue
            yield batch

    def end_step(self) -> None:
        """Mark the end of one iteration of your loop."""
        self.mark()

    # -- the report -----------------------------------------------------------------------------------------------
    def _classify(self) -> None:
        models = list(self.models.values())
        images = [m for m in models if m.out_shape and len(m.out_shape) == 4 and m.out_shape[-1] > 1
                  and m.out_shape[-2] > 1]
        fed = Counter()
        for m in models:
            for producer, n in m.fed_by.items():
                if producer in images:
                    fed[(producer, m)] += n
        if fed:
            g, d = max(fed, key=fed.get)
        else:
            scalar = [m for m in models if m.out_shape and math.prod(m.out_shape[1:]) == 1]
            g = max(images, key=lambda m: m.calls) if images else None
            d = max(scalar, key=lambda m: m.calls) if scalar else None
        for m, role in ((g, "G"), (d, "D")):
            if m is not None:
                m.role = role
        for o in self.optimizers.values():
            shared = {m: len(o.param_ids & m.param_ids) for m in models}
            owners = [m for m, k in shared.items() if k]
            if len(owners) == 1:  # an optimizer over one model's parameters
                o.role, o.model = owners[0].role or owners[0].name, owners[0].name
        if d is not None:
            d.sigmoid_path = _final_sigmoid(d.module)

    def _analyse(self) -> DoctorReport:
        self._classify()
        device = self._device()
        report = DoctorReport(self.source, str(device), iterations_seen=max(self.marks, 0))
        report.models = {m.role or m.name: m.describe() for m in self.models.values()}
        n = max(self.profiled, 1)
        report.optimizers = {
            o.role or o.name: {"name": o.name, "class": o.cls, "implementation": o.implementation(device),
                               "role": o.role, "model": o.model,
                               "steps_per_iteration": round(o.window_steps / n, 2) if self.profiled else None,
                               "settings": {k: v for k, v in o.opt.defaults.items() if k in ("lr", "betas",
                                                                                            "weight_decay")}}
            for o in self.optimizers.values()}
        report.unprofiled_step_time_ms = self.timed_ms
        report.settings = self._settings(device)
        report.settings["timed_iterations_ms"] = [round(ms, 2) for ms in self.timed_list]
        if self.pacer is not None:
            report.settings["iteration"] = f"one step of {self.pacer.name}" + (
                f" ({self.pacer.role}'s optimizer)" if self.pacer.role else "")
        elif not self.by_optimizer:
            report.settings["iteration"] = self.iteration
        w = self.window
        if w["images_loader"]:
            report.images_per_step = w["images_loader"] / n
            report.batch_size = w["batch_sizes"].most_common(1)[0][0]
            batches = w["batches"] / n
            report.images_source = (f"{batches:g} batch{'es' if batches != 1 else ''} of {report.batch_size} per "
                                    "iteration from your data")
        if self.stage != "done" or not self.profiled:
            report.note = report.note or self._incomplete_note()
            if w["images_loader"] == 0:
                report.images_per_step = 0.0
            return report
        self._profile_into(report)
        report.complete = True
        report.settings["data_site"] = self.data_site
        report.findings = _findings(report)
        return report

    def _incomplete_note(self) -> str:
        needed = self.warmup + self.timed + 1 + self.steps
        if self.by_optimizer and self.pacer is None:
            return ("the loop ended before the doctor could tell its rhythm (it needs every optimizer to step, "
                    "and one to step twice)")
        return (f"the doctor had seen {max(self.marks, 0)} of the {needed} iterations it measures ({self.warmup} "
                f"warm-up, {self.timed} timed, 1 + {self.steps} profiled): run it longer, or lower --warmup/--steps")

    def _profile_into(self, r: DoctorReport) -> None:
        prof, n = self.prof, self.profiled
        events = prof.events()
        steps = [e for e in events if e.name.startswith("ProfilerStep")]
        r.steps = n
        r.step_time_ms = sum(e.cpu_time_total for e in steps) / 1e3 / max(len(steps), 1)
        phases: dict = defaultdict(float)
        seq: dict = {}
        for e in events:
            if e.name.startswith(_RANGE):
                label = self._label(self.ranges.get(int(e.name[len(_RANGE):])))
                phases[label] += e.cpu_time_total / 1e3
                if "forward" in label:
                    stack = list(e.cpu_children)
                    while stack:
                        c = stack.pop()
                        if c.sequence_nr >= 0:
                            seq[(c.thread, c.sequence_nr)] = label.replace("forward", "backward")
                        stack.extend(c.cpu_children)
            elif e.name in ("data wait", "host sync"):
                phases[e.name] += e.cpu_time_total / 1e3
        backward = sorted((e for e in events if e.name.startswith("autograd::engine::evaluate_function")),
                          key=lambda e: e.time_range.start)
        # A backward node's event carries the sequence number and the forward thread of the op that made it
        # (ATen's record_function.h: forwardThreadId "used alongside with sequence number to correlate backward
        # functions with the forward ones"; FunctionEvent.fwd_thread, .sequence_nr). On CUDA the backward runs on
        # the autograd engine's device thread, so the match is on (fwd_thread, sequence_nr), not on the thread.
        last = {}
        for e in backward:  # AccumulateGrad has no sequence number: it belongs to the node run just before it
            label = seq.get((e.fwd_thread, e.sequence_nr)) if e.sequence_nr >= 0 else None
            label = label or (last.get(e.thread) if "AccumulateGrad" in e.name else None)
            if label:
                phases[label] += e.cpu_time_total / 1e3
                last[e.thread] = label
        per_step = {k: v / n for k, v in phases.items()}
        ordered = {k: per_step[k] for k in ORDER if k in per_step}
        ordered.update({k: v for k, v in per_step.items() if k not in ordered})
        ordered[OTHER] = max(r.step_time_ms - sum(ordered.values()), 0.0)
        r.phases_ms = ordered
        cuda = self._device().type == "cuda"
        averages = prof.key_averages()
        wait = ordered.get("data wait", 0.0)
        busy, h2d, ops = device_time(averages, n, r.step_time_ms, wait, cuda,
                                     skip=lambda k: k.startswith(_RANGE) or k in ORDER)
        compute = compute_ms(ops)
        r.device_busy_ms, r.top_ops = busy, ops[:10]
        r.compute_share = compute / max(busy, 1e-9)
        by_name = {e.key: e for e in averages}
        counts = {k: by_name[k].count / n for k in by_name if "binary_cross_entropy" in k and "backward" not in k}
        r.settings["loss_ops_per_iteration"] = counts
        r.settings["h2d_copy_ms"] = h2d
        if cuda:
            r.settings["cuda_syncs_per_iteration"] = sum(by_name[k].count for k in SYNC_EVENTS if k in by_name) / n
        r.peak_mem_mb = self.peak_mem_mb
        w = self.window
        r.host_syncs_per_step = sum(w["syncs"].values()) / n
        r.sync_sites = [{"where": where, "code": w["sites"][where][0], "method": w["sites"][where][1],
                         "per_step": round(count / n, 2)} for where, count in w["syncs"].most_common()]
        if not r.images_per_step:
            self._images_without_loader(r)
        v = bottleneck(r.step_time_ms, wait, busy, r.compute_share, cuda)
        evidence = {"step ms": r.step_time_ms, "data wait share": wait / r.step_time_ms}
        if cuda:
            evidence["GPU idle share"] = 1 - busy / r.step_time_ms
        evidence["conv/matmul share of busy"] = r.compute_share
        evidence["heaviest ops"] = ", ".join(name for name, _ in ops[:3])
        r.verdict = {"bottleneck": v, "evidence": evidence}
        try:
            r.trace_path = self._export_trace()
        except OSError as e:  # the measurements stand without the trace: say why there is none
            r.note = (r.note + " " if r.note else "") + f"no trace written ({e})"

    def _images_without_loader(self, r: DoctorReport) -> None:
        """No DataLoader and no doc.data(): the real images are what D was fed that no model made; failing that
        (real and fake concatenated, say), G's batch, one per iteration."""
        d = next((m for m in self.models.values() if m.role == "D"), None)
        g = next((m for m in self.models.values() if m.role == "G"), None)
        n = max(self.profiled, 1)
        real = self.window["inputs"].get((d, False), 0) if d is not None else 0
        if real:
            r.images_per_step = real / n
            r.batch_size = d.out_shape[0] if d.out_shape else 0
            r.images_source = "no DataLoader seen: the images D was fed that G did not make"
        elif g is not None and g.out_shape:
            r.batch_size = r.images_per_step = g.out_shape[0]
            r.images_source = "no DataLoader seen: G's batch, one per iteration assumed"

    def _label(self, obj) -> str:
        if isinstance(obj, _Optimizer):
            return f"{obj.role} optimizer step" if obj.role in ("G", "D") else f"{obj.name} step"
        if isinstance(obj, _Call):
            m = obj.model
            if m.role == "G":
                return "G forward"
            if m.role == "D":
                g_step = obj.next_opt is not None and obj.next_opt.role == "G"
                return "D forward (G step)" if g_step else "D forward"
            return f"{m.name} forward"
        return OTHER

    def _export_trace(self) -> str | None:
        """The chrome trace for Perfetto, with the provisional range names replaced by phases."""
        path = Path(self.trace_request) if self.trace_request else default_trace(self.source)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "trace.json"
            self.prof.export_chrome_trace(str(raw))
            trace = json.loads(raw.read_text())
        for event in trace.get("traceEvents", []):
            name = event.get("name", "")
            if isinstance(name, str) and name.startswith(_RANGE):
                event["name"] = self._label(self.ranges.get(int(name[len(_RANGE):])))
        path.write_text(json.dumps(trace))
        return str(path)

    def _settings(self, device: torch.device) -> dict:
        s: dict = {"device": str(device)}
        n, w = max(self.profiled, 1), self.window  # per profiled iteration
        s["conv_linear_outputs"] = {f"{dtype}{' (autocast)' if ac else ''}": c / n
                                    for (dtype, ac), c in w["dtypes"].items()}
        s["autocast"] = any(ac for _, ac in w["dtypes"])
        s["conv_input_formats"] = {k: c / n for k, c in w["formats"].items()}
        s["fixed_conv_shapes"] = all(len(v) == 1 for v in self.conv_shapes.values())
        s["loss_modules"] = dict(self.losses)
        d = next((m for m in self.models.values() if m.role == "D"), None)
        s["d_last_module"] = d.last_module if d else None
        s["d_final_sigmoid"] = d.sigmoid_path if d else None
        s["compiled"] = [m.name for m in self.models.values() if m.compiled]
        s["dataloaders"] = [_describe_loader(loader) for loader in self.loaders]
        g_opt = next((o for o in self.optimizers.values() if o.role == "G"), None)
        s["d_grads_in_g_step"] = (g_opt.grads_from.get(d, 0) / max(self.profiled, 1)) if g_opt and d else 0
        if device.type == "cuda":
            s["cudnn_benchmark"] = torch.backends.cudnn.benchmark
            s["tf32"] = hardware.tf32_matmuls()
            s["gpu"] = torch.cuda.get_device_name(device)
        return s


def _final_sigmoid(module: nn.Module) -> str | None:
    """The dotted path of a Sigmoid that is the last module registered in `module`, if there is one."""
    leaves = [(name, m) for name, m in module.named_modules() if _is_leaf(m)]
    if leaves and isinstance(leaves[-1][1], nn.Sigmoid):
        return leaves[-1][0]
    return None


def _dataset_chain(dataset) -> list:
    """The dataset and the datasets it wraps (Subset, ConcatDataset, ...)."""
    chain, todo = [], [dataset]
    while todo and len(chain) < 16:
        ds = todo.pop(0)
        chain.append(ds)
        if hasattr(ds, "dataset"):
            todo.append(ds.dataset)
        todo.extend(getattr(ds, "datasets", []) or [])
    return chain


def _per_image_work(dataset) -> str | None:
    """What the dataset does to each image on the host (PIL decoding, torchvision transforms), if anything."""
    from .data import ImageFolderDataset, ImageTensorDataset

    for ds in _dataset_chain(dataset):
        transform = getattr(ds, "transform", None)
        if isinstance(ds, ImageTensorDataset) and ds._pipeline is not None:
            return f"{type(ds).__name__} with transform='per-sample' ({_short(ds._pipeline)})"
        if isinstance(ds, ImageFolderDataset):
            return f"{type(ds).__name__}: a PIL decode per image" + (
                f", then {_short(ds._pipeline)}" if ds._pipeline is not None else "")
        if transform is not None and not isinstance(transform, str):
            decode = ", a PIL decode per image" if hasattr(ds, "loader") else ""
            return f"{type(ds).__name__}{decode} with transform={_short(transform)}"
        if hasattr(ds, "loader") and hasattr(ds, "samples"):  # torchvision DatasetFolder without a transform
            return f"{type(ds).__name__}: a PIL decode per image"
    return None


def _short(transform) -> str:
    inner = getattr(transform, "transforms", None)  # torchvision's Compose: the names of its steps
    if isinstance(inner, (list, tuple)):
        return f"{type(transform).__name__}({', '.join(type(t).__name__ for t in inner)})"
    text = " ".join(repr(transform).split())
    return text if len(text) <= 100 else text[:97] + "..."


def _steps_of(transform) -> list:
    inner = getattr(transform, "transforms", None)  # torchvision's Compose, nested
    return [t for part in inner for t in _steps_of(part)] if isinstance(inner, (list, tuple)) else [transform]


def _not_decodable_once(dataset) -> str | None:
    """Why decoding the images once into uint8 on the device would change the data (None when it would not):
    random augmentation would be frozen, and a Normalize other than (0.5, 0.5) does not map back to 0-255."""
    for ds in _dataset_chain(dataset):
        for transform in (getattr(ds, "transform", None), getattr(ds, "_pipeline", None)):
            if transform is None or isinstance(transform, str):
                continue
            for t in _steps_of(transform):
                name = type(t).__name__
                if name.startswith("Random") or name in ("AutoAugment", "RandAugment", "TrivialAugmentWide",
                                                         "AugMix", "ColorJitter"):
                    return f"{name} draws new augmentation every epoch"
                if name == "Normalize" and not all(abs(float(v) - 0.5) < 1e-6 for v in (*t.mean, *t.std)):
                    return f"Normalize(mean={list(t.mean)}, std={list(t.std)}) is not the [-1, 1] scaling"
    return None


def _describe_loader(loader) -> dict:
    ds = loader.dataset
    return {"dataset": type(ds).__name__, "batch_size": loader.batch_size, "num_workers": loader.num_workers,
            "pin_memory": loader.pin_memory, "persistent_workers": loader.persistent_workers,
            "per_image_work": _per_image_work(ds), "not_decodable_once": _not_decodable_once(ds)}


def default_trace(source: str) -> Path:
    stem = re.sub(r"\W+", "_", Path(source).stem)  # a script's name, or your step function's
    return Path("runs") / "doctor" / f"{stem}-trace.json"


def _say(message: str) -> None:
    print(f"gantools doctor: {message}", file=sys.stderr, flush=True)


# -- findings -----------------------------------------------------------------------------------------------------

def _amdahl(step_ms: float, removed_ms: float) -> float:
    return step_ms / max(step_ms - removed_ms, 1e-9)


def _findings(r: DoctorReport) -> list:
    """Each rule needs evidence from this run; findings are ranked by estimated gain (unknown gains last)."""
    s, step = r.settings, r.step_time_ms
    names = {role: r.models.get(role, {}).get("name", role) for role in ("G", "D")}
    opts = {o["role"]: o["name"] for o in r.optimizers.values() if o.get("role")}
    g, d = names["G"], names["D"]
    opt_g, opt_d = opts.get("G", "optimizerG"), opts.get("D", "optimizerD")
    cuda = r.device.startswith("cuda")
    found = []
    wait = r.phases_ms.get("data wait", 0.0)
    loaders = [x for x in s["dataloaders"] if x["per_image_work"] or x["num_workers"] == 0]
    for_line = f"; batches taken at {s['data_site']}" if s.get("data_site") else ""
    if wait / step >= MIN_SHARE and loaders:
        loader = loaders[0]
        seen = (f"waiting for data {wait:.1f} ms of a {step:.1f} ms iteration ({100 * wait / step:.0f}%); "
                f"DataLoader(batch_size={loader['batch_size']}, num_workers={loader['num_workers']}) over "
                f"{loader['per_image_work'] or loader['dataset']}{for_line}")
        if loader["per_image_work"]:
            found.append(Finding(
                "per-sample-transforms", "every image is decoded and transformed on the host, one at a time", seen,
                "each image goes through PIL and torchvision transforms in Python on every epoch, "
                + ("in the training process itself (num_workers=0), so the model waits for it"
                   if loader["num_workers"] == 0 else "and the workers do not keep up with the step"),
                ("# once, before training: the images decoded a single time, kept as uint8 on the device\n"
                 "images = torch.stack([(x * 127.5 + 127.5).round().to(torch.uint8) for x, _ in dataset]).to(device)\n"
                 "# each step: a batch by indexing, normalised on the device (no PIL, no workers)\n"
                 "idx = torch.randint(len(images), (batch_size,), device=device)\n"
                 "real = images[idx].float().div_(127.5).sub_(1)\n"
                 "# too big for the device? keep the DataLoader but decode in workers:\n"
                 f"# DataLoader(dataset, ..., num_workers={suggested_workers()}, persistent_workers=True, "
                 "pin_memory=True)")
                if not loader["not_decodable_once"] else
                (f"# decoding once would change your data ({loader['not_decodable_once']}): decode in workers\n"
                 f"DataLoader(dataset, ..., num_workers={suggested_workers()}, persistent_workers=True, "
                 "pin_memory=True)"),
                "03_data_loading", _amdahl(step, wait)))
        else:
            found.append(Finding(
                "no-workers", "the DataLoader loads batches in the training process", seen,
                "with num_workers=0 every batch is assembled while the model waits; worker processes prepare "
                "the next batches in parallel with the step",
                f"DataLoader(dataset, ..., num_workers={suggested_workers()}, persistent_workers=True)",
                "03_data_loading", _amdahl(step, wait)))
    h2d = s.get("h2d_copy_ms", 0.0)
    if cuda and h2d / step >= MIN_SHARE and any(not x["pin_memory"] for x in s["dataloaders"]):
        found.append(Finding(
            "pin-memory", "batches are copied to the GPU from pageable memory",
            f"host-to-device copies {h2d:.1f} ms per iteration ({100 * h2d / step:.0f}%), pin_memory=False",
            "a copy from pageable memory is staged through a pinned buffer and cannot overlap with compute",
            "DataLoader(dataset, ..., pin_memory=True)\nreal = data[0].to(device, non_blocking=True)",
            "03_data_loading", None))
    if r.host_syncs_per_step >= SYNCS_PER_STEP:
        sites = "; ".join(f"{x['where']} `{x['code']}` ({x['method']}, {x['per_step']:g}/it)"
                          for x in r.sync_sites[:5])
        sync_ms = r.phases_ms.get("host sync", 0.0)
        if cuda:
            idle = 1 - r.device_busy_ms / step
            gain = step / max(r.device_busy_ms, 1e-9) if idle > 0.1 else _amdahl(step, sync_ms)
            cost = f"the GPU sits idle {100 * idle:.0f}% of the iteration"
        else:
            gain = None
            cost = (f"on this CPU they cost {sync_ms:.2f} ms (no device to wait for); on a GPU each one waits for "
                    "all queued work")
        found.append(Finding(
            "host-sync", f"your code reads values from the device {r.host_syncs_per_step:g} times per iteration",
            f"{sites}; {cost}",
            "every read (.item(), .tolist(), printing or comparing a tensor) makes the host wait until the device "
            "has finished all queued work; meanwhile no new kernels are queued, so the GPU idles between steps",
            "# keep the numbers on the device, read them once every N iterations\n"
            "stats = torch.zeros(3, device=device)  # before the loop\n"
            "stats += torch.stack([errD.detach(), errG.detach(), D_x.detach()])  # D_x = output.mean(), no .item()\n"
            "if i % 50 == 0:\n"
            "    print((stats / 50).tolist()); stats.zero_()  # one sync per 50 iterations",
            "06_your_own_gan", gain if gain is None or gain >= MIN_GAIN else None))
    bce = {k: v for k, v in s.get("loss_ops_per_iteration", {}).items() if k == "aten::binary_cross_entropy"}
    if bce:
        where = f"; {d} ends in nn.Sigmoid ({d}.{s['d_final_sigmoid']})" if s.get("d_final_sigmoid") else ""
        found.append(Finding(
            "sigmoid-bce", "D's probabilities go into BCELoss",
            f"aten::binary_cross_entropy {sum(bce.values()):g} times per iteration{where}",
            "a sigmoid rounds to exactly 1.0 in 16-bit for logits above about 6, and log(1 - p) becomes log(0) "
            "(BCELoss clamps it to -100: no gradient); BCELoss is refused under autocast on CUDA. "
            "BCEWithLogitsLoss computes the same loss from logits, stably, in one op",
            f"# {d}: remove the final nn.Sigmoid(); it returns logits now\n"
            "criterion = nn.BCEWithLogitsLoss()\n"
            "D_x = output.sigmoid().mean()  # where you report D's probabilities",
            "02_mixed_precision", None))
    compute_ms = r.compute_share * r.device_busy_ms
    fp32 = {k: v for k, v in s["conv_linear_outputs"].items() if k == "float32"}
    gain16 = _amdahl(step, compute_ms / 2)
    if fp32 and not s["autocast"] and gain16 >= MIN_GAIN:
        first = (f"# first drop {d}'s Sigmoid and use nn.BCEWithLogitsLoss (BCELoss refuses autocast)\n"
                 if bce else "")
        bf16 = hardware.supports_bf16(torch.device(r.device))  # a GPU before Ampere: fp16, with a GradScaler
        found.append(Finding(
            "fp32-convolutions", "convolutions and matmuls run in fp32",
            f"{sum(fp32.values()):g} Conv/Linear outputs per iteration in float32, autocast off; convolutions and "
            f"matmuls take {compute_ms:.1f} ms of a {step:.1f} ms iteration ({100 * compute_ms / step:.0f}%)",
            "autocast runs them in 16-bit (half the bytes, and the fast units of recent CPUs and GPUs) while "
            "keeping sensitive ops in fp32; the estimate assumes it halves their time",
            f"{first}with torch.autocast(device.type, dtype=torch.{'bfloat16' if bf16 else 'float16'}):  "
            f"# each forward and its loss\n    output = {d}(real).view(-1)\n"
            "    errD_real = criterion(output.float(), label)\n"
            + ("errD_real.backward()  # backward and optimizer steps stay outside" if bf16 else
               "scalerD.scale(errD_real).backward()  # fp16: one torch.amp.GradScaler('cuda') per network\n"
               f"scalerD.step({opt_d}); scalerD.update()"),
            "02_mixed_precision", gain16))
    grads = s.get("d_grads_in_g_step", 0)
    d_bwd = r.phases_ms.get("D backward (G step)", 0.0)
    if grads and d_bwd > 0 and _amdahl(step, d_bwd / 2) >= MIN_GAIN:
        found.append(Finding(
            "d-grads-in-g-step", f"{d} computes weight gradients in G's step",
            f"{grads:g} of {d}'s parameter gradients accumulated per iteration before {opt_g} stepped; "
            f"D backward (G step) takes {d_bwd:.1f} ms ({100 * d_bwd / step:.0f}%)",
            f"G's loss must flow back through {d} to reach {g}, but {d}'s own weight gradients are thrown away "
            f"({opt_d} zeroes them before using them); freezing {d} skips them. The estimate assumes they are half "
            f"of {d}'s backward there",
            f"{d}.requires_grad_(False)  # G's step: gradients flow through {d} to {g}, none stored for {d}\n"
            f"output = {d}(fake).view(-1)\nerrG = criterion(output, label)\nerrG.backward()\n{opt_g}.step()\n"
            f"{d}.requires_grad_(True)",
            "06_your_own_gan", _amdahl(step, d_bwd / 2)))
    opt_ms = sum(ms for k, ms in r.phases_ms.items() if k.endswith("optimizer step"))
    loops = [o for o in r.optimizers.values() if o["implementation"].startswith("for-loop")]
    if loops and opt_ms / step >= MIN_SHARE:
        found.append(Finding(
            "optimizer-for-loop", "the optimizers update one parameter at a time",
            f"{', '.join(o['name'] for o in loops)}: {loops[0]['implementation']}; optimizer steps take "
            f"{opt_ms:.1f} ms ({100 * opt_ms / step:.0f}%)",
            "the for-loop implementation launches several small ops per parameter; fused (or foreach) updates all "
            "parameters in a few kernels",
            "\n".join(f"# {o['name']}: add {_faster_impl(o['class'])} to its constructor, keeping your other "
                      f"arguments\n{o['name']} = optim.{o['class']}(..., {_faster_impl(o['class'])})"
                      for o in loops),
            "04_optimizers_and_accumulation", None))
    nchw = s["conv_input_formats"].get("contiguous (NCHW)", 0)
    heavy = r.compute_share >= 0.5
    if nchw and heavy and not any(f.kind == "fp32-convolutions" for f in found):
        found.append(Finding(
            "channels-last", "convolutions read NCHW tensors",
            f"{nchw:g} convolution inputs per iteration in NCHW; convolutions and matmuls are "
            f"{100 * r.compute_share:.0f}% of the busy time",
            "cuDNN's and oneDNN's fastest 16-bit convolution kernels work on channels_last (NHWC); NCHW inputs are "
            "converted, or a slower kernel runs",
            f"{g} = {g}.to(memory_format=torch.channels_last)\n{d} = {d}.to(memory_format=torch.channels_last)\n"
            "real = real.contiguous(memory_format=torch.channels_last)",
            "05_all_together", None))
    if cuda and heavy and not s.get("cudnn_benchmark") and s["fixed_conv_shapes"]:
        found.append(Finding(
            "cudnn-benchmark", "cuDNN picks convolution algorithms by heuristics",
            f"torch.backends.cudnn.benchmark is False; every convolution saw one input shape; convolutions are "
            f"{100 * r.compute_share:.0f}% of the busy time",
            "with fixed shapes, benchmark mode times the candidate algorithms once and keeps the fastest",
            "torch.backends.cudnn.benchmark = True  # before the loop", "05_all_together", None))
    ampere = cuda and torch.cuda.get_device_capability(torch.device(r.device))[0] >= 8
    if ampere and fp32 and not s["autocast"] and not s.get("tf32"):
        # the documented switch on every torch version; not `matmul.fp32_precision = "tf32"`, which breaks
        # torch.compile on torch 2.9-2.11 (see hardware.backend_flags)
        snippet = ('torch.set_float32_matmul_precision("high")  # TF32 matmuls\n'
                   "torch.backends.cudnn.allow_tf32 = True  # TF32 convolutions (PyTorch's default)")
        found.append(Finding(
            "tf32", "fp32 matmuls and convolutions run without TF32",
            f"fp32 Conv/Linear outputs, TF32 off, on {s.get('gpu')}",
            "Ampere and newer GPUs run fp32 matmuls and convolutions on tensor cores in TF32 (10-bit mantissa) "
            "several times faster; bf16 autocast (above) goes further", snippet, "05_all_together", None))
    return sorted(found, key=lambda f: -(f.estimated_speedup or 0.0))


def _faster_impl(name: str) -> str:
    """`fused=True` where the optimizer class takes it (Adam, AdamW, SGD, ...), else `foreach=True` (all built-ins)."""
    import inspect

    cls = getattr(torch.optim, name, None)
    takes = inspect.signature(cls).parameters if cls is not None else {}
    return "fused=True" if "fused" in takes else "foreach=True"


# -- the three ways in ----------------------------------------------------------------------------------------------

@contextlib.contextmanager
def watch(steps: int = STEPS, warmup: int = WARMUP, trace=None, source: str = "your loop", **kw):
    """Wrap your own loop: `for batch in doc.data(loader): ...; doc.end_step()`; the loop ends once the doctor has
    measured (`warmup` + `steps` timed + 1 + `steps` profiled iterations); then `doc.report`."""
    doc = Watch(steps, warmup, trace, source, **kw)
    with doc:
        yield doc


def run(step, data, steps: int = STEPS, warmup: int = WARMUP, trace=None) -> DoctorReport:
    """Diagnose a step function: `step(batch)` is called on batches of `data` (re-iterated when it runs out) until
    the doctor has measured."""
    name = getattr(step, "__name__", "step")
    with watch(steps, warmup, trace, source=name, iteration=f"one call of {name}") as doc:
        for batch in doc.data(data):
            step(batch)
            doc.end_step()
    return doc.report


def check_script(path) -> Path:
    """The script must be an existing .py file: said before anything runs."""
    from . import distributed

    path = Path(path)
    if distributed.world().distributed:
        raise DoctorError("the doctor runs as one process: start it without torchrun "
                          "(python -m gantools doctor SCRIPT.py [ARGS...])")
    if not path.is_file():
        what = "a folder, not a script" if path.is_dir() else "no such file"
        raise DoctorError(f"{path}: {what}. Give the path of your training script: "
                          "python -m gantools doctor [OPTIONS] SCRIPT.py [ARGS...]")
    if path.suffix != ".py":
        raise DoctorError(f"{path}: not a Python script (.py). The doctor runs a training script: "
                          "python -m gantools doctor [OPTIONS] SCRIPT.py [ARGS...]")
    return path


def run_script(path, args=(), steps: int = STEPS, warmup: int = WARMUP, trace=None,
               timeout: float | None = TIMEOUT_S) -> DoctorReport:
    """Run a training script under the doctor (see the module docstring) and return the report. Raises
    `ScriptError` when the script raises (its own traceback attached), `DoctorError` when no optimizer steps within
    `timeout` seconds; KeyboardInterrupt (Ctrl-C) ends the run and the report says what was seen."""
    path = check_script(path)
    saved = (sys.argv[:], sys.path[:], set(sys.modules), torch.get_rng_state(), torch.get_num_threads(),
             torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark, os.getcwd(),
             hardware._matmul_precision(),
             torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None)
    folder = str(path.resolve().parent)
    trace = Path(trace or default_trace(str(path))).resolve()  # absolute: the script may change directory
    doc = Watch(steps, warmup, trace, source=str(path), by_optimizer=True)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {}
    outcome, error = "ended", None
    try:
        with doc:
            if main_thread:
                previous = _install_signals(doc, timeout)
            sys.argv = [str(path), *args]
            sys.path.insert(0, folder)
            try:
                runpy.run_path(str(path), run_name="__main__")
            except _Stop:
                outcome = "measured"
            except SystemExit as e:
                outcome = "ended" if e.code in (None, 0) else f"exited with status {e.code}"
            except (_Interrupted, KeyboardInterrupt):
                outcome = "interrupted"
            except _Timeout:
                outcome = "timeout"
            except Exception as e:  # after a Ctrl-C, the same Ctrl-C ended the script's DataLoader workers
                outcome, error = ("interrupted", None) if doc.interrupted else ("raised", e)
            finally:
                if main_thread:
                    _restore_signals(previous)
    finally:
        sys.argv[:], sys.path[:] = saved[0], saved[1]
        for name in set(sys.modules) - saved[2]:  # modules imported from the script's folder: its own
            file = getattr(sys.modules[name], "__file__", None) or ""
            if file.startswith(folder + os.sep):
                del sys.modules[name]
        torch.set_rng_state(saved[3])
        torch.set_num_threads(saved[4])
        torch.use_deterministic_algorithms(saved[5])
        torch.backends.cudnn.benchmark = saved[6]
        os.chdir(saved[7])  # a script's os.chdir must not move where --json and --trace land
        if saved[8] is not None:
            torch.set_float32_matmul_precision(saved[8])
        if saved[9] is not None:
            torch.cuda.set_rng_state_all(saved[9])
    report = doc.report
    seen = _training_steps(doc)
    if outcome == "raised" and _raised_in_doctor(error):  # a bug of ours, not the script's: shown as one
        raise error
    if outcome == "raised":
        raise ScriptError(f"the doctor saw {seen} training steps before it", _user_traceback(error, path), report)
    if outcome == "timeout":
        raise DoctorError(f"no optimizer step within {timeout:g} s of starting {path}: is this a training script? "
                          "(the doctor counts iterations at optimizer.step(); if its set-up takes longer, raise "
                          "--timeout)")
    if outcome != "measured":
        why = {"interrupted": "interrupted (Ctrl-C)", "ended": "your script ended"}.get(outcome,
                                                                                          f"your script {outcome}")
        report.note = f"{why} after {seen} training steps: {report.note or 'before the doctor finished'}"
        report.complete = False
        report.settings["outcome"] = outcome
    return report


def _training_steps(doc: Watch) -> int:
    if doc.pacer is not None:
        return doc.pacer.steps
    counts = [o.steps for o in doc.optimizers.values()]
    built = len({id(o) for o in doc.constructed})
    return min(counts) if counts and len(counts) >= built else 0


def _install_signals(doc: Watch, timeout: float | None) -> dict:
    """Ctrl-C raises the doctor's own interrupt (a script's `except KeyboardInterrupt` cannot hide it); a timer
    raises when no optimizer has stepped within `timeout` seconds (SIGALRM: the main thread only)."""
    previous = {signal.SIGINT: signal.getsignal(signal.SIGINT)}
    owner = os.getpid()

    def interrupt(signum, frame):
        if os.getpid() != owner:  # a forked DataLoader worker inherited this handler (a terminal's Ctrl-C reaches
            return  # the whole process group): it carries on, and ends when the interrupted script's loader shuts
            # its workers down (or, at worst, when torch's watchdog sees the parent gone). Ending it here instead
            # raced with the parent still reading from it ("worker exited unexpectedly") and with multiprocessing's
            # fd-sharing thread, which prints a traceback when its listener closes under it.
        signal.signal(signal.SIGINT, previous[signal.SIGINT])  # a second Ctrl-C acts as usual
        doc.interrupted = True  # remembered: the raise below can land where Python ignores it (see run_script)
        if frame is not None and frame.f_code.co_name in _AT_FORK and frame.f_code.co_filename == logging.__file__:
            return  # raising here would be printed and ignored; the next optimizer step raises it instead
        raise _Interrupted()

    signal.signal(signal.SIGINT, interrupt)
    doc._light_handles.append(_optim.register_optimizer_step_post_hook(_interrupt_if_asked(doc)))
    if timeout and hasattr(signal, "setitimer"):
        def alarm(signum, frame):
            if not doc.optimizers:
                raise _Timeout()
        previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        doc._light_handles.append(_optim.register_optimizer_step_post_hook(
            lambda *a: signal.setitimer(signal.ITIMER_REAL, 0)))  # a step came: the watchdog's job is done
    return previous


# logging's at-fork callbacks, run in the parent around every fork (a DataLoader starting its workers): an exception
# raised in one is printed as "Exception ignored in" with a traceback, and lost (os.register_at_fork)
_AT_FORK = ("_acquireLock", "_releaseLock")


def _interrupt_if_asked(doc: Watch):
    """An optimizer step hook that raises the interrupt a Ctrl-C asked for, when its own raise was lost: a signal
    landing in an at-fork callback (a DataLoader starting its workers) is printed as "Exception ignored" and the
    script goes on."""
    def hook(*args):
        if doc.interrupted:
            raise _Interrupted()
    return hook


def _restore_signals(previous: dict) -> None:
    if signal.SIGALRM in previous:
        signal.setitimer(signal.ITIMER_REAL, 0)
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _raised_in_doctor(error: BaseException) -> bool:
    """Whether the innermost frame of the error is the doctor's own code (a hook), not the script or a library."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == os.path.abspath(__file__)


def _user_traceback(error: BaseException, path: Path) -> str:
    """The script's traceback as Python would print it running the script directly: the doctor's frames (and
    runpy's) removed."""
    te = traceback.TracebackException.from_exception(error)
    script = str(path.resolve())
    frames = list(te.stack)
    start = next((i for i, f in enumerate(frames) if os.path.abspath(f.filename) == script), 0)
    kept = [f for f in frames[start:]  # runpy's frozen frames show up when the script does not even compile
            if not f.filename.startswith(_LIBRARIES[1]) and not f.filename.startswith("<frozen")]
    te.stack = traceback.StackSummary.from_list(kept)
    return "".join(te.format())
