"""One run of your script for `--try`: with a set of fixes applied at run time (`fixes.Applied`), `warmup`
iterations left out, then `steps` iterations timed with the device synchronised at each one's end, and every scalar
you call `backward()` on kept on the device (read once, after the run) for the quality guard. Nothing else is
hooked but what finds G and D (removed once both are found) and a thin wrapper on `backward()`, so the times are
your loop's own; the CPU time other processes took while they were timed is read too (`measuring.load`). The
script's output is kept, not printed."""
from __future__ import annotations

import contextlib
import inspect
import io
import math
import os
import signal
import statistics
import threading
import traceback
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.optim import optimizer as _optim
from torch.utils.data import dataloader as _dataloader

from ...errors import ScriptInterrupted, ScriptMeasured, ScriptTimeout
from ...measuring.load import LoadWindow
from ...measuring.protocol import IterationClock
from ...core.process import ProcessSnapshot, on_interrupt
from ..fixes import fix as fixing
from ..fixes.catalogue import FIXES, Applied, Context

_FIXES_FILES = {os.path.realpath(inspect.getsourcefile(m))  # the fixes and their mechanisms
                for m in (Applied, fixing, *{type(f) for f in FIXES})}


@dataclass
class Trial:
    """What one run measured: milliseconds per iteration, and the losses of each iteration in the order your code
    called backward on them."""

    fixes: tuple
    outcome: str
    times_ms: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    images_per_iteration: float | None = None  # None: not known (the diagnosis found no batch size)
    traceback: str = ""
    output: str = ""
    ours: bool = False                    # it raised inside gantools' own fix code, not in the script
    samples: torch.Tensor | None = None   # images from G after the run, when asked for (`samples=`)
    load: dict | None = None              # other processes' CPU time over the timed iterations (`Load.describe`)

    @property
    def measured(self) -> bool:
        return self.outcome == "measured"

    @property
    def iterations_per_sec(self) -> float:
        return 1e3 / (statistics.median(self.times_ms) if self.times_ms else float("nan"))

    @property
    def images_per_sec(self) -> float | None:
        return None if self.images_per_iteration is None else self.images_per_iteration * self.iterations_per_sec

    @property
    def rate(self) -> float:
        """What runs are compared by: images/s, else iterations/s (runs of one loop: the same ratios)."""
        return self.iterations_per_sec if self.images_per_iteration is None else self.images_per_sec

    @property
    def finite(self) -> bool:
        return all(math.isfinite(v) for row in self.losses for v in row)


class _Pace:
    """Marks an iteration at each step of the optimizer that paces the loop (its place in construction order, as the
    diagnosis saw it), times the measured ones and collects the losses."""

    def __init__(self, device: torch.device, pacer: int, warmup: int, steps: int, on_mark=None):
        self.device, self.pacer, self.warmup, self.steps = device, pacer, warmup, steps
        self.on_mark = on_mark or (lambda: None)
        self.owner = (os.getpid(), threading.get_ident())
        self.built: list = []
        self.marks = 0
        self.clock = IterationClock(device)
        self.load_window = LoadWindow()
        self.load = None
        self.current: list = []
        self.losses: list = []
        self.interrupted = False

    def mine(self) -> bool:
        return (os.getpid(), threading.get_ident()) == self.owner

    def step_hook(self, opt, args, kwargs):
        if self.interrupted:
            raise ScriptInterrupted()
        if not self.mine() or self.pacer >= len(self.built) or opt is not self.built[self.pacer]:
            return
        self.marks += 1
        self.on_mark()
        if self.marks == self.warmup + 1:
            self.load_window.start()
            self.clock.start()
        elif self.marks > self.warmup + 1:
            self.clock.lap()
            self.losses.append(self.current)
        self.current = []
        if len(self.clock.times_ms) >= self.steps:
            self.load = self.load_window.stop()
            raise ScriptMeasured()

    def loss_seen(self, tensor) -> None:
        if self.mine() and tensor.numel() == 1 and tensor.is_floating_point():
            self.current.append(tensor.detach().reshape(()).float())


def run_trial(path: Path, args, parts: tuple, ctx: Context, pacer: int, images_per_iteration: float | None,
              warmup: int, steps: int, timeout: float | None, seed_offset: int = 0, samples: int = 0) -> Trial:
    """Run the script once with `parts` applied (see the module docstring). Ctrl-C raises KeyboardInterrupt here
    once the script has stopped; the script's own exceptions come back in `Trial.traceback`, as its own.
    `seed_offset`: every seed the script sets is moved by it (another seed of the same run); `samples`: that many
    images drawn from G (unconditional: noise shaped like its first input) after the run, for FID."""
    from ..diagnosis.script import _user_traceback, execute, ignored_here

    watchdog = _Watchdog(timeout)
    pace = _Pace(torch.device(ctx.device_type), pacer, warmup, steps, on_mark=watchdog.arm)
    out = io.StringIO()
    init = torch.optim.Optimizer.__init__

    def counted_init(opt, *a, **k):
        init(opt, *a, **k)
        if pace.mine():
            pace.built.append(opt)

    def interrupt(signum, frame):
        pace.interrupted = True  # the next optimizer step raises it where Python would ignore it (`ignored_here`)
        if not ignored_here(frame):
            raise ScriptInterrupted()

    handle = _optim.register_optimizer_step_post_hook(pace.step_hook)
    torch.optim.Optimizer.__init__ = counted_init
    drawn = None
    try:
        with ProcessSnapshot(), on_interrupt(interrupt), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(out), _workers_ended(), _seeds_moved(seed_offset), \
                Applied(parts, ctx, on_loss=pace.loss_seen, on_skipped_step=pace.step_hook) as applied:
            with watchdog:  # armed while the script runs, nowhere else
                outcome, error = execute(path, args)
            if samples and outcome == "measured":
                drawn = _draw(applied, samples)
    except ScriptInterrupted:  # the Ctrl-C landed outside the script (setting up or tearing down the run)
        raise KeyboardInterrupt() from None
    except ScriptTimeout:  # the alarm rang as the script stopped, before the watchdog was disarmed
        outcome, error = "timeout", None
    finally:
        handle.remove()
        torch.optim.Optimizer.__init__ = init
    if pace.interrupted or outcome == "interrupted":
        raise KeyboardInterrupt()
    losses = [torch.stack(row).tolist() if row else [] for row in pace.losses]  # the one read, after the run
    trial = Trial(parts, outcome, pace.clock.times_ms[:steps], losses, images_per_iteration, output=out.getvalue())
    if error is not None:
        trial.ours = _raised_in_fixes(error)
        trial.traceback = ("".join(traceback.format_exception(error)) if trial.ours
                           else _user_traceback(error, path))
    trial.samples = drawn
    trial.load = pace.load.describe() if pace.load else None
    return trial


def _raised_in_fixes(error: BaseException) -> bool:
    """Whether the error comes from gantools' own fix code (a frame in a fix's module or its mechanisms'),
    not from the script."""
    tb = error.__traceback__
    while tb is not None:
        if os.path.realpath(tb.tb_frame.f_code.co_filename) in _FIXES_FILES:
            return True
        tb = tb.tb_next
    return False


class NotScorable(Exception):
    """G cannot be sampled without knowing more than its noise (a conditional G's labels)."""


@torch.no_grad()
def _draw(applied: Applied, n: int) -> torch.Tensor:
    """n images from G as the run left it, from standard normal noise shaped like its first call's input, in the
    mode the script trained it in (the same procedure for every run compared)."""
    g, shapes = applied.models.get("G"), applied.g_inputs
    if g is None or len(shapes) != 1:
        raise NotScorable("G takes more than noise (a conditional G's labels?)" if g is not None
                          else "G was not called in the run")
    device = next(g.parameters()).device
    out = [g(torch.randn(min(256, n - done), *shapes[0][1:], device=device)).float().cpu()
           for done in range(0, n, 256)]
    return torch.cat(out).clamp(-1, 1)


@contextlib.contextmanager
def _seeds_moved(offset: int):
    """Every seed the script sets moved by `offset` (0: untouched), for another seed of the same run: torch's
    manual_seed (CPU and all CUDA devices: `torch.manual_seed` seeds both), `torch.cuda.manual_seed[_all]`
    (scripts often call them too), Python's `random.seed` and numpy's `np.random.seed`."""
    if not offset:
        yield
        return
    import random
    import sys
    targets = [(torch, "manual_seed"), (torch.random, "manual_seed"), (torch.cuda, "manual_seed"),
               (torch.cuda, "manual_seed_all"), (random, "seed")]
    if "numpy" in sys.modules:
        targets.append((sys.modules["numpy"].random, "seed"))
    originals = [(owner, name, getattr(owner, name)) for owner, name in targets]
    for owner, name, original in originals:
        setattr(owner, name, _moved(original, offset))
    try:
        yield
    finally:
        for owner, name, original in reversed(originals):
            setattr(owner, name, original)


def _moved(seed_function, offset: int):
    def seeded(*args, **kwargs):
        if args and isinstance(args[0], int):
            args = (args[0] + offset, *args[1:])
        for key in ("seed", "a"):
            if isinstance(kwargs.get(key), int):
                kwargs[key] += offset
        return seed_function(*args, **kwargs)
    return seeded


@contextlib.contextmanager
def _workers_ended():
    """DataLoader workers started in the run are shut down when it ends. Left to the garbage collector, a stopped
    script's workers were found to be joined much later, each after its 5 s join timeout, inside the next run."""
    started = weakref.WeakSet()
    init = _dataloader._MultiProcessingDataLoaderIter.__init__

    def tracked(it, *args, **kwargs):
        started.add(it)
        init(it, *args, **kwargs)
    _dataloader._MultiProcessingDataLoaderIter.__init__ = tracked
    try:
        yield
    finally:
        _dataloader._MultiProcessingDataLoaderIter.__init__ = init
        for it in list(started):
            it._shutdown_workers()


class _Watchdog:
    """Ends the run (as a timeout) when no iteration has ended for `seconds`: the first one counts from the start, so
    a slow set-up gets as long as the diagnosis gave it, and a fix that hangs the loop does not hang the doctor.
    SIGALRM, in the main thread only; re-armed at each iteration's end, disarmed when the script stops."""

    def __init__(self, seconds: float | None):
        self.on = bool(seconds) and hasattr(signal, "setitimer") and \
            threading.current_thread() is threading.main_thread()
        self.seconds, self.previous = seconds, None

    def arm(self) -> None:
        if self.on:
            signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __enter__(self):
        if self.on:
            self.previous = signal.signal(signal.SIGALRM, _alarm)
            self.arm()
        return self

    def __exit__(self, *exc):
        if self.on:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
        return False


def _alarm(signum, frame):
    raise ScriptTimeout()
