"""`run_script`: a training script run unmodified under the doctor, as `__main__` with `sys.argv = [SCRIPT.py,
ARGS...]`, its folder first on `sys.path` and the working directory unchanged, and stopped once the doctor has
measured. The process's state is restored after it; Ctrl-C and a time limit end it with a report of what was seen;
its own exceptions come back with its own traceback (the doctor's frames removed)."""
from __future__ import annotations

import logging
import os
import runpy
import signal
import sys
import threading
import traceback
from pathlib import Path

import torch

from .. import hardware
from ..errors import DoctorError, ScriptError
from .analysis import default_trace
from .frames import DOCTOR_DIR, GANTOOLS_DIR
from .report import DoctorReport
from .schedule import STEPS, WARMUP, Stop
from .watch import Watch

TIMEOUT_S = 300.0


class _Timeout(BaseException):
    """No optimizer step within the time limit."""


class _Interrupted(BaseException):
    """Ctrl-C while a script runs under the doctor (the script's own `except KeyboardInterrupt` must not hide it)."""


def check_script(path) -> Path:
    """The script must be an existing .py file: said before anything runs."""
    from .. import distributed

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
    saved = _process_state()
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
            except Stop:
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
        _restore_process_state(saved, folder)
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


def _process_state() -> tuple:
    """What a script may change in the process and `_restore_process_state` puts back."""
    return (sys.argv[:], sys.path[:], set(sys.modules), torch.get_rng_state(), torch.get_num_threads(),
            torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark, os.getcwd(),
            hardware._matmul_precision(),
            torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None)


def _restore_process_state(saved: tuple, folder: str) -> None:
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


def _training_steps(doc: Watch) -> int:
    if doc.schedule.pacer is not None:
        return doc.schedule.pacer.steps
    counts = [o.steps for o in doc.obs.optimizers.values()]
    built = len({id(o) for o in doc.obs.constructed})
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
    doc.hooks.add_step_hook(_interrupt_if_asked(doc))
    if timeout and hasattr(signal, "setitimer"):
        def alarm(signum, frame):
            if not doc.obs.optimizers:
                raise _Timeout()
        previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        # a step came: the watchdog's job is done
        doc.hooks.add_step_hook(lambda *a: signal.setitimer(signal.ITIMER_REAL, 0))
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
    return tb is not None and os.path.realpath(tb.tb_frame.f_code.co_filename).startswith(DOCTOR_DIR)


def _user_traceback(error: BaseException, path: Path) -> str:
    """The script's traceback as Python would print it running the script directly: the doctor's frames (and
    runpy's) removed."""
    te = traceback.TracebackException.from_exception(error)
    script = str(path.resolve())
    frames = list(te.stack)
    start = next((i for i, f in enumerate(frames) if os.path.abspath(f.filename) == script), 0)
    kept = [f for f in frames[start:]  # runpy's frozen frames show up when the script does not even compile
            if not os.path.realpath(f.filename).startswith(GANTOOLS_DIR) and not f.filename.startswith("<frozen")]
    te.stack = traceback.StackSummary.from_list(kept)
    return "".join(te.format())
