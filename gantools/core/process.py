"""Process-wide state, in one place: what gantools sets for a block and puts back after (TF32 and cudnn.benchmark,
the global RNG's stream for a run's modules), the one-at-a-time lock that guards it, a snapshot of everything a
user's script may change, and the one Ctrl-C handler train, tune and the doctor share. Importing gantools changes
none of it: every change here is made inside a block and undone at its end."""
from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import sys
import threading

import torch

from ..errors import CheckpointError, ConfigError
from ..measuring.torch_versions import legacy_conv_tf32, matmul_precision, precision_settings, set_conv_tf32


# -- TF32 and cuDNN ------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def backend_flags(tf32: bool | None = None, cudnn_benchmark: bool | None = None):
    """TF32 (matmuls and cuDNN convolutions) and cudnn.benchmark set for the block only, then restored exactly:
    a Trainer applies them for the duration of its fit() and sampling, so two trainers in one process (the
    benchmark interleaves its variants) each run with their own settings and the process keeps its own. None
    leaves a setting as it is. `hardware.tf32_matmuls` and `hardware.backend_flags_now` read what this sets.

    Matmul TF32 goes through `torch.set_float32_matmul_precision("high"/"highest")`, the documented switch in every
    torch we support, and the process's own precision is put back with it. cuDNN's goes through the legacy flag
    (`cudnn.allow_tf32`) unless the process already used the per-backend API. Why not the per-backend strings
    (`matmul.fp32_precision = "tf32"`): in torch 2.9-2.11 the legacy getters raise once legacy and new writes
    disagree ("you have used mix of the legacy and new APIs", aten/src/ATen/Context.cpp), and inductor still read
    the legacy getters while compiling, so one such write made every later torch.compile fail
    (pytorch/pytorch#189955, #179445, #166387). And a legacy `matmul.allow_tf32` write after the common
    `torch.set_float32_matmul_precision("high")` makes `get_float32matmul_precision()` itself raise, which
    max-autotune reads. Restoring writes the per-backend strings back exactly ("none" = inherit), so the process
    ends as it began."""
    saved_strings = [(obj, obj.fp32_precision) for obj in precision_settings()]
    saved_benchmark = torch.backends.cudnn.benchmark
    saved_matmul = matmul_precision() if tf32 is not None else None
    conv_legacy = legacy_conv_tf32() if tf32 is not None else None
    if tf32 is not None:
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        set_conv_tf32(tf32, legacy=conv_legacy is not None)
    if cudnn_benchmark is not None:
        torch.backends.cudnn.benchmark = cudnn_benchmark
    try:
        yield
    finally:
        if tf32 is not None:
            if saved_matmul is not None:
                torch.set_float32_matmul_precision(saved_matmul)
            if conv_legacy is not None:
                set_conv_tf32(conv_legacy, legacy=True)
            for obj, value in saved_strings:
                obj.fp32_precision = value
        torch.backends.cudnn.benchmark = saved_benchmark


# -- one at a time ---------------------------------------------------------------------------------------------------
# Held by whoever has applied its settings (TF32, cuDNN, the global RNG's stream) to the process. Reentrant: the same
# thread may nest (a callback scoring another trainer); another thread is refused, not interleaved (its save/restore
# would leave the process with the other one's settings).
_PROCESS_STATE = threading.RLock()


@contextlib.contextmanager
def exclusive(message: str | None = None):
    """The block holds the process-wide settings; when another thread holds them, ConfigError(`message`) at once
    (never a wait: the other may be a run that goes on for hours)."""
    if not _PROCESS_STATE.acquire(blocking=False):
        raise ConfigError(message or "another gantools run is using this process's process-wide settings (TF32, "
                                     "cuDNN, the RNG) right now, in another thread: two at once would run with "
                                     "each other's. Stop it first, then run this one")
    try:
        yield
    finally:
        _PROCESS_STATE.release()


# -- seeds and the module RNG stream -------------------------------------------------------------------------------
def derived_seed(seed: int, purpose: str) -> int:
    """A seed for one purpose of one run, unrelated to the seeds of other purposes and runs (seed + 1 for one
    would be seed for another run's other purpose)."""
    return int.from_bytes(hashlib.sha256(f"gantools/{seed}/{purpose}".encode()).digest()[:8], "little") >> 1


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def set_module_rng(state: dict | None, device: torch.device, seed: int) -> None:
    """Put a run's module stream (what modules that draw random numbers themselves, dropout, draw from) into the
    global RNG: `state` as `module_rng` read it, or, for a fresh run (None), a stream of its own from `seed`."""
    if state is None:
        fresh = derived_seed(seed, "modules")
        torch.random.default_generator.manual_seed(fresh)
        if device.type == "cuda":
            torch.cuda.default_generators[_cuda_index(device)].manual_seed(fresh)
        return
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda":
        if state.get("cuda") is not None:
            torch.cuda.set_rng_state(state["cuda"], device)
        else:  # resumed from a CPU run: a CUDA stream of its own
            torch.cuda.default_generators[_cuda_index(device)].manual_seed(derived_seed(seed, "modules"))


def module_rng(device: torch.device) -> dict:
    """The global RNG's state for `device` (and the CPU) as it is now: a run's module stream, while it is set."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


CHECKPOINT_FORMAT = 2  # 2: the run's own generator in "rng"; 1 (still read): the global RNG's states


class RunStreams:
    """A run's random streams, each its own. `noise` (a torch.Generator on the run's device) draws the noise of
    every step and the flips; seeded alike on every rank, so under torchrun all ranks draw the whole global batch's
    noise in lockstep and keep a slice. The module stream is what modules that draw random numbers themselves
    (dropout) draw from: the global RNG, which holds it inside `applied()` only."""

    def __init__(self, device: torch.device, seed: int):
        self.device, self.seed = device, seed
        self.noise = torch.Generator(device=device).manual_seed(derived_seed(seed, "noise"))
        self.modules = None  # the module stream's state at the end of the last kept block; None: fresh, from seed
        self._live = False  # inside a kept block: the stream is live in the global RNG

    @contextlib.contextmanager
    def applied(self, keep: bool, tf32: bool | None, cudnn_benchmark: bool | None, busy: str | None = None):
        """This run's settings for the block, the process's again after: TF32 and cudnn.benchmark (backend_flags),
        and the global RNG holding the module stream, under the one-at-a-time lock (`busy`: the refusal's message).
        With `keep` (training) the stream's new state is kept for the next block and the checkpoint; otherwise
        (sampling, the shape check) it is forked and left as it was, so it never shifts training."""
        cuda = [self.device] if self.device.type == "cuda" else []
        if self._live:  # nested (sampling inside fit): the outer block already holds this run's state
            with torch.random.fork_rng(devices=cuda, enabled=not keep):
                yield
            return
        with exclusive(busy), backend_flags(tf32, cudnn_benchmark), torch.random.fork_rng(devices=cuda):
            set_module_rng(self.modules, self.device, self.seed)
            self._live = keep
            try:
                yield
            finally:
                if keep:  # read while still live: the stream's new state, not the one it started from
                    self.modules = module_rng(self.device)
                self._live = False

    def state_dict(self) -> dict:
        """The checkpoint's `rng` (format 2): the noise generator's state with its device type, and the module
        stream."""
        return {"noise": self.noise.get_state(), "noise_device": self.device.type,
                "modules": module_rng(self.device) if self._live else self.modules}

    def load_state_dict(self, rng: dict, fmt: int, step: int) -> str | None:
        """The streams where the checkpoint (of format `fmt`, saved at `step`) left them; returns a warning when the
        noise stream cannot continue. Format 1 (gantools before the trainer had its own generator) drew noise and
        flips from the global RNG of the training device and saved its state as rng['cpu'] (and rng['cuda'] on a
        GPU): that state is the same kind of state as this run's generator's, so the stream continues exactly."""
        if fmt > CHECKPOINT_FORMAT:
            raise CheckpointError(f"this checkpoint has format {fmt}, written by a newer gantools (this one reads "
                                  f"up to {CHECKPOINT_FORMAT}): update gantools to resume it")
        if fmt >= 2:
            noise, noise_device, modules = rng["noise"], rng["noise_device"], rng["modules"]
        else:
            noise_device = "cuda" if "cuda" in rng else "cpu"
            noise, modules = rng[noise_device], {"cpu": rng["cpu"], "cuda": rng.get("cuda")}
        self.modules = modules
        if noise_device == self.device.type:
            self.noise.set_state(noise)
            return None
        # a CPU generator's state cannot drive a CUDA one (or the reverse): a new stream, from seed and step
        self.noise.manual_seed(derived_seed(self.seed, f"noise after step {step}"))
        return (f"this checkpoint was trained on {noise_device} and resumes on {self.device.type}: the noise "
                f"stream starts afresh (weights, optimizers and data position are restored exactly)")


# -- a user's script's changes, undone -------------------------------------------------------------------------------
class ProcessSnapshot:
    """The process state a script may change, taken at construction and put back by `restore()` (or as
    `with ProcessSnapshot(): ...`): sys.argv, sys.path, the working directory, torch's CPU RNG and, when CUDA is
    initialised, every device's CUDA RNG, torch's thread count, deterministic algorithms, cudnn.benchmark and the
    TF32 settings (the float32 matmul precision and, on torch >= 2.9, the per-backend strings: a script that used the
    new API must not leave the next run's legacy reads raising). Modules a script imported are its caller's to
    remove."""

    def __init__(self):
        self.argv, self.path, self.cwd = sys.argv[:], sys.path[:], os.getcwd()
        self.cpu_rng = torch.get_rng_state()
        # only when initialised: reading a CUDA RNG would initialise CUDA in a process that never used it
        self.cuda_rng = (torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized()
                         else None)
        self.threads = torch.get_num_threads()
        self.deterministic = torch.are_deterministic_algorithms_enabled()
        self.cudnn_benchmark = torch.backends.cudnn.benchmark
        self.matmul_precision = matmul_precision()
        self.precision_strings = [(obj, obj.fp32_precision) for obj in precision_settings()]

    def restore(self) -> None:
        sys.argv[:], sys.path[:] = self.argv, self.path
        torch.set_rng_state(self.cpu_rng)
        torch.set_num_threads(self.threads)
        torch.use_deterministic_algorithms(self.deterministic)
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
        os.chdir(self.cwd)  # a script's os.chdir must not move where the caller's files land
        if self.matmul_precision is not None:
            torch.set_float32_matmul_precision(self.matmul_precision)
        for obj, value in self.precision_strings:  # after the legacy write, as backend_flags restores
            obj.fp32_precision = value
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)

    def __enter__(self) -> "ProcessSnapshot":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


# -- Ctrl-C ----------------------------------------------------------------------------------------------------------
def _silent(*exc_info) -> None:
    """An excepthook that prints nothing (a DataLoader worker after the Ctrl-C that stops its parent)."""
@contextlib.contextmanager
def on_interrupt(callback, signals=(signal.SIGINT,)):
    """Inside the block the first of `signals` (Ctrl-C, Jupyter's interrupt) calls `callback(signum, frame)`
    (which may raise) instead of raising KeyboardInterrupt wherever it lands; it first puts that signal's previous
    handler back, so a second Ctrl-C acts as usual. Only the main thread can receive signals: elsewhere this does
    nothing. A forked child (a DataLoader worker) that inherited the handler ignores the signal: a terminal's Ctrl-C
    reaches the whole process group, and the worker ends when its parent shuts it down. From then on the child prints
    no tracebacks: its threads fail as the parent goes (multiprocessing's file-descriptor sharer, which hands batches
    to the parent, reports a broken connection through sys.excepthook), which would read as a crash after a clean
    stop. The previous handlers are back after the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def handler(signum, frame):
        if os.getpid() != owner:
            sys.excepthook = threading.excepthook = _silent
            return
        signal.signal(signum, previous[signum])
        callback(signum, frame)

    for sig in signals:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig in signals:
            signal.signal(sig, previous[sig])
