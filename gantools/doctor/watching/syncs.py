"""The CUDA syncs your loop makes that the Tensor-method patches (`hooks`) do not see: `.to("cpu")`, a boolean mask
or `torch.nonzero` (their output's size is read back), a read inside torch (GradScaler.step's `.item()` of
found_inf), `torch.cuda.synchronize()`. Each is placed on the line of your code that made it (`SyncWatch`).

How: PyTorch's sync debug mode (`torch.cuda.set_sync_debug_mode("warn")`, documented, process-wide) makes each
synchronizing CUDA call warn "called a synchronizing CUDA operation" (c10's `warn_or_error_on_sync`, called by
`memcpy_and_sync` and `CUDAStream::synchronize`; in torch 2.14.1's binary, `_local_scalar_dense_cuda` calls it after
cudaMemcpyAsync + cudaStreamSynchronize). The warning is raised where the call returns to Python, so while the
doctor profiles, its `warnings.showwarning` (replaceable, by the warnings module's documentation) walks that frame's
stack out to your code: FILE:LINE, exactly. `c10::cuda::device_synchronize` does not warn (its 2.14.1 code calls no
`warn_or_error_on_sync`), so `torch.cuda.synchronize` is wrapped for the same window.

Not the profiler's stacks: with `with_stack=True` an eager op's `FunctionEvent.stack` is empty (KinetoEvent::stack
returns the TorchScript stack, else the Python one only with `_ExperimentalConfig(verbose=True)`), and the Python
tracer names each Python function by its first line, not by the line that called (pytorch/pytorch#167605); it also
adds its own cost to every profiled iteration, whose host time the verdict reads.

The profiler still counts: the `cuda*Synchronize` events that are neither gantools' own (`hardware.OWN_SYNC`) nor
inside a read the hooks counted (`analysis`); what this watch did not place is reported as not located.
"""
from __future__ import annotations

import sys
import warnings

import torch

from ...measuring import hardware
from .frames import site, yours

SYNC_WARNING = hardware.SYNC_WARNING
SYNC_OP = "a synchronizing op"        # a sync with no Python frame of torch's between it and your line
EXPLICIT = "torch.cuda.synchronize"
NOT_LOCATED = "not located"           # the profiler's syncs this watch did not place (analysis)
_OWN = hardware.synchronize.__code__  # gantools' own synchronisations all go through it
_WARNINGS_MODULES = ("warnings", "_py_warnings")


class SyncWatch:
    """From `start()` to `stop()`: PyTorch's sync debug mode on, its warnings turned into counts per FILE:LINE of
    your code in `obs.window` (`syncs`, `sites`: (source line, what it called), `located`), and
    `torch.cuda.synchronize` counted likewise. A sync is not counted when it is gantools' own (inside
    `hardware.synchronize`), when the hooks are counting it as a value read (`hooks.in_sync`), or when it is not on
    the watched thread. Other warnings go on to the `showwarning` that was there."""

    def __init__(self, obs, hooks):
        self.obs, self.hooks = obs, hooks
        self._mode = self._showwarning = self._synchronize = self._warnings = None
        self._explicit = False  # inside the wrapped torch.cuda.synchronize (should it ever warn too)

    @staticmethod
    def wanted(device) -> bool:
        """Only CUDA has device syncs to place (the sync debug mode is CUDA's)."""
        return device.type == "cuda"

    def start(self) -> "SyncWatch":
        """Switch it on; where the sync debug mode cannot be set it stays off, and the profiler's count reports
        the syncs as not located."""
        with warnings.catch_warnings():  # setting the mode warns that it is a prototype: known, and not the user's
            warnings.simplefilter("ignore")
            try:
                self._mode = torch.cuda.get_sync_debug_mode()
                torch.cuda.set_sync_debug_mode("warn")
            except (RuntimeError, AttributeError):
                return self
        self._warnings = warnings.catch_warnings()  # the filters and showwarning, put back by stop()
        self._warnings.__enter__()
        # every occurrence reaches showwarning, whatever the filters say (the default shows a line once)
        warnings.filterwarnings("always", message=SYNC_WARNING, category=UserWarning)
        self._showwarning, warnings.showwarning = warnings.showwarning, self._on_warning
        self._synchronize = torch.cuda.synchronize
        torch.cuda.synchronize = self._wrap(self._synchronize)
        return self

    def stop(self) -> None:
        if self._synchronize is None:
            return
        torch.cuda.synchronize, self._synchronize = self._synchronize, None
        self._warnings.__exit__(None, None, None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.cuda.set_sync_debug_mode(self._mode)

    def _on_warning(self, message, category, filename, lineno, file=None, line=None):
        if not str(message).startswith(SYNC_WARNING):
            return self._showwarning(message, category, filename, lineno, file, line)
        if self.hooks.in_sync or self._explicit or not self.hooks.mine():
            return None
        found = located(sys._getframe(1))
        if found is not None:
            self._count(*found)
        return None

    def _wrap(self, original):
        watch = self

        def synchronize(*args, **kwargs):
            found = located(sys._getframe(1), callee=EXPLICIT) if watch.hooks.mine() else None
            watch._explicit = True
            try:
                return original(*args, **kwargs)
            finally:
                watch._explicit = False
                if found is not None:
                    watch._count(*found)
        synchronize.__doc__ = original.__doc__
        return synchronize

    def _count(self, where: str, code: str, method: str) -> None:
        window = self.obs.window
        window.syncs[where] += 1
        window.sites.setdefault(where, (code, method))
        window.located += 1


def located(frame, callee: str | None = None):
    """(FILE:LINE, source line, what your line called) for a sync made in `frame` (the innermost Python frame when
    it happened), walking out to your code; None when it is gantools' own or no frame is yours. What your line
    called is the Python function just inside your frame (GradScaler.step), else `callee`, else `SYNC_OP`."""
    inner = None
    while frame is not None:
        code = frame.f_code
        if code is _OWN:
            return None
        if yours(code.co_filename):
            where, source = site(frame)
            return where, source, callee or _name(inner) or SYNC_OP
        if frame.f_globals.get("__name__") not in _WARNINGS_MODULES:
            inner = frame
        frame = frame.f_back
    return None


def _name(frame) -> str | None:
    """Class.method of a frame: co_qualname (Python 3.11+), else the class of its `self`."""
    if frame is None:
        return None
    code = frame.f_code
    if hasattr(code, "co_qualname"):
        return code.co_qualname
    owner = frame.f_locals.get("self") if code.co_varnames[:1] == ("self",) else None
    return f"{type(owner).__name__}.{code.co_name}" if owner is not None else code.co_name
