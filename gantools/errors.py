"""The errors gantools raises for a user to read and act on. All share `GantoolsError`, so one `except` in the CLI,
the panel or a notebook tells "your input, data or run needs changing" (one clear message, exit status 2) from a bug
(a traceback). Each keeps the built-in base it always had, so older `except ValueError:` code still catches it.
`Stopped` and `ScalingCrash`, at the end, are the two gantools raises that are not the user's to fix; after them,
the three the doctor ends a script with, which never leave it."""
from __future__ import annotations


class GantoolsError(Exception):
    """Something the user can fix; the message says what is wrong and what to do."""


class ConfigError(GantoolsError, ValueError):
    """A config value (or combination) that cannot work; the message lists every problem and its fix."""


class DataError(GantoolsError, RuntimeError):
    """Data that cannot be loaded as asked: the message says where the files should be and how to get them."""


class CheckpointError(GantoolsError, RuntimeError):
    """A checkpoint that is missing, damaged, tampered with or not a gantools checkpoint."""


class OutOfMemory(GantoolsError, RuntimeError):
    """The device ran out of memory; the message says what to change (batch, accumulation, 16-bit)."""


class NonFiniteLossError(GantoolsError, FloatingPointError):
    """A loss became NaN or infinite; raised at the next log interval (checking every step would sync)."""


class QualityError(GantoolsError, RuntimeError):
    """A quality metric cannot be computed as asked (missing package or weights); the message says how to fix it."""


class DoctorError(GantoolsError, RuntimeError):
    """Bad input to `gantools doctor` (script not found, no training seen, under torchrun, ...): what to do."""


class ScriptError(DoctorError):
    """The user's own script raised under the doctor: `traceback_text` is its traceback (the doctor's frames
    removed), `report` what the doctor saw before it."""

    def __init__(self, message: str, traceback_text: str, report=None):
        super().__init__(message)
        self.traceback_text, self.report = traceback_text, report


# Not the user's to fix, so not GantoolsErrors: a stop the user asked for, and a crash of a child process.

class Stopped(KeyboardInterrupt):
    """A measurement ended early because its run was asked to stop (Ctrl-C, a Stop button): the user's interrupt,
    raised between chunks, never a half-measured result."""


class ScalingCrash(RuntimeError):
    """A process of a scaling run died of something other than a gantools error (a crash, a torch bug, a signal):
    not the user's mistake, so it is reported as a failure with what the process printed, never as bad input."""


# A script run by the doctor is ended from inside it by these: BaseExceptions, so the script's own `except Exception`
# (or `except KeyboardInterrupt`) cannot swallow them. `run_script` catches each; none reaches a user.
class ScriptMeasured(BaseException):
    """The doctor has measured enough: raised from an optimizer hook to end the script."""


class ScriptTimeout(BaseException):
    """No optimizer step within the doctor's time limit."""


class ScriptInterrupted(BaseException):
    """Ctrl-C while a script runs under the doctor."""

