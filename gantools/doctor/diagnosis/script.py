"""`run_script`: a training script run unmodified under the doctor, as `__main__` with `sys.argv = [SCRIPT.py,
ARGS...]`, its folder first on `sys.path` and the working directory unchanged, and stopped once the doctor has
measured. The process's state is restored after it; Ctrl-C and a time limit end it with a report of what was seen;
its own exceptions come back with its own traceback (the doctor's frames removed)."""
from __future__ import annotations

import contextlib
import logging
import os
import runpy
import signal
import sys
import threading
import traceback
from pathlib import Path


from ...measuring import protocol as measuring
from ...errors import DoctorError, ScriptError, ScriptInterrupted, ScriptMeasured, ScriptTimeout
from ...core.process import ProcessSnapshot, on_interrupt
from .analysis import default_trace
from ..watching.frames import DOCTOR_DIR, GANTOOLS_DIR
from ..findings.report import DoctorReport
from ..watching.schedule import STEPS, WARMUP
from .watch import Watch

TIMEOUT_S = 300.0


def check_script(path, several: bool = False) -> Path:
    """The script must be an existing .py file: said before anything runs. Under torchrun only the processes that
    `ranks` runs (`several`) may diagnose it: each needs the others' results for the report."""
    from ...core import distributed

    path = Path(path)
    if distributed.world().distributed and not several:
        raise DoctorError("under torchrun the doctor runs in every process: start it with torchrun "
                          "(torchrun --nproc_per_node N -m gantools doctor SCRIPT.py [ARGS...]) or let it start them "
                          "(python -m gantools doctor --nproc N SCRIPT.py [ARGS...])")
    if not path.is_file():
        what = "a folder, not a script" if path.is_dir() else "no such file"
        raise DoctorError(f"{path}: {what}. Give the path of your training script: "
                          "python -m gantools doctor [OPTIONS] SCRIPT.py [ARGS...]")
    if path.suffix != ".py":
        raise DoctorError(f"{path}: not a Python script (.py). The doctor runs a training script: "
                          "python -m gantools doctor [OPTIONS] SCRIPT.py [ARGS...]")
    return path


def run_script(path, args=(), steps: int = STEPS, warmup: int = WARMUP, trace=None,
               timeout: float | None = TIMEOUT_S, on_close=None) -> DoctorReport:
    """Run a training script under the doctor (see the module docstring) and return the report. Raises
    `ScriptError` when the script raises (its own traceback attached), `DoctorError` when no optimizer steps within
    `timeout` seconds; KeyboardInterrupt (Ctrl-C) ends the run and the report says what was seen. `on_close(watch)`,
    if given, reads the `Watch` once the script has stopped (one process of several: `ranks`)."""
    path = check_script(path, several=on_close is not None)
    trace = Path(trace or default_trace(str(path))).resolve()  # absolute: the script may change directory
    doc = Watch(steps, warmup, trace, source=str(path), by_optimizer=True)
    with ProcessSnapshot(), doc, on_interrupt(_interrupt(doc)), _watchdog(doc, timeout):
        doc.hooks.add_step_hook(_interrupt_if_asked(doc))
        outcome, error = execute(path, args)
    if on_close is not None:
        on_close(doc)
    if outcome == "raised" and doc.interrupted:  # the same Ctrl-C ended the script's DataLoader workers
        outcome, error = "interrupted", None
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


def execute(path: Path, args) -> tuple[str, BaseException | None]:
    """Run the script as `__main__` with `sys.argv = [SCRIPT.py, ARGS...]` and its folder first on `sys.path` (the
    caller restores both: `ProcessSnapshot`); the modules it imported from its folder are forgotten after it, so the
    next run imports them afresh. Returns how it ended: ("measured" | "ended" | "exited with status N" |
    "interrupted" | "timeout" | "raised", its exception when it raised)."""
    folder = str(path.resolve().parent)
    modules = set(sys.modules)
    sys.argv = [str(path), *args]
    sys.path.insert(0, folder)
    try:
        # absolute: a script that changes directory keeps its sites
        runpy.run_path(str(path.resolve()), run_name="__main__")
    except ScriptMeasured:
        return "measured", None
    except SystemExit as e:
        return ("ended" if e.code in (None, 0) else f"exited with status {e.code}"), None
    except (ScriptInterrupted, KeyboardInterrupt):
        return "interrupted", None
    except ScriptTimeout:
        return "timeout", None
    except Exception as e:
        return "raised", e
    finally:
        for name in set(sys.modules) - modules:  # modules imported from the script's folder: its own
            file = getattr(sys.modules[name], "__file__", None) or ""
            if file.startswith(folder + os.sep):
                del sys.modules[name]
    return "ended", None


def _training_steps(doc: Watch) -> int:
    if doc.schedule.pacer is not None:
        return doc.schedule.pacer.steps
    counts = [o.steps for o in doc.obs.optimizers.values()]
    built = len({id(o) for o in doc.obs.constructed})
    return min(counts) if counts and len(counts) >= built else 0


def _interrupt(doc: Watch):
    """Ctrl-C raises the doctor's own interrupt, which a script's `except KeyboardInterrupt` cannot hide
    (`process.on_interrupt` calls this once, in the main process; a second Ctrl-C acts as usual)."""
    def callback(signum, frame):
        doc.interrupted = True  # remembered: the raise below can land where Python ignores it
        if ignored_here(frame):
            return  # raising here would be printed and ignored; the next optimizer step raises it instead
        raise ScriptInterrupted()
    return callback


@contextlib.contextmanager
def _watchdog(doc: Watch, timeout: float | None):
    """A timer that raises when no optimizer has stepped within `timeout` seconds (SIGALRM: the main thread of a
    POSIX process only; elsewhere nothing watches)."""
    if not timeout or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(signum, frame):
        if not doc.obs.optimizers:
            raise ScriptTimeout()
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    doc.hooks.add_step_hook(lambda *a: signal.setitimer(signal.ITIMER_REAL, 0))  # a step came: the job is done
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# logging's at-fork callbacks, run in the parent around every fork (a DataLoader starting its workers): an exception
# raised in one is printed as "Exception ignored in" with a traceback, and lost (os.register_at_fork)
_AT_FORK = ("_acquireLock", "_releaseLock")


def ignored_here(frame) -> bool:
    """Whether an exception raised in `frame` would be printed as "Exception ignored" and lost: inside logging's
    at-fork callbacks (a DataLoader starting its workers) or inside a `__del__` (a DataLoader iterator shutting its
    workers down) anywhere up the stack."""
    if frame is not None and frame.f_code.co_name in _AT_FORK and frame.f_code.co_filename == logging.__file__:
        return True
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _interrupt_if_asked(doc: Watch):
    """An optimizer step hook that raises the interrupt a Ctrl-C asked for, when its own raise was lost: a signal
    landing in an at-fork callback (a DataLoader starting its workers) is printed as "Exception ignored" and the
    script goes on."""
    def hook(*args):
        if doc.interrupted:
            raise ScriptInterrupted()
    return hook


def _raised_in_doctor(error: BaseException) -> bool:
    """Whether the innermost frame of the error is the doctor's own code (a hook, or the measuring it runs), not the
    script or a library."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.realpath(tb.tb_frame.f_code.co_filename).startswith(
        (DOCTOR_DIR, os.path.realpath(measuring.__file__)))


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
