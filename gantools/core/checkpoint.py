"""Checkpoints that survive a crash mid-write and that load safely (`weights_only=True`: no pickled code runs)."""
from __future__ import annotations

import errno
import os
import pickle
import tempfile
from pathlib import Path

import torch

from ..errors import CheckpointError, ConfigError

REQUIRED_KEYS = ("format", "step", "batches_seen", "config", "generator", "discriminator", "opt_g", "opt_d",
                 "scaler_g", "scaler_d", "rng", "history")


def ensure_writable(folder: str | os.PathLike) -> Path:
    """Create `folder` if needed and prove a file can be written in it (a probe file, removed at once), so an
    unwritable output folder is one clear ConfigError before any work, not a traceback at the first checkpoint."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".gantools-write-test-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        in_the_way = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        if in_the_way is not None:
            reason = f"{in_the_way} is a file, not a folder: move it away or choose another folder"
        elif e.errno == errno.EROFS:
            reason = "it is on a read-only file system: choose a folder on a writable disk"
        elif e.errno in (errno.EACCES, errno.EPERM):
            reason = "permission denied: choose a folder you can write to, or change its permissions"
        elif e.errno == errno.ENOSPC:
            reason = "the disk is full: free space or choose another disk"
        else:
            reason = e.strerror or str(e)
        raise ConfigError(f"cannot write to {folder}: {reason}") from e
    return folder


def atomic_write(path: str | os.PathLike, write) -> None:
    """`write(binary_file)` into a temp file, fsync, then rename: readers see the old file or the new one, never
    half of either."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_save(obj, path: str | os.PathLike) -> None:
    """torch.save, atomically."""
    atomic_write(path, lambda f: torch.save(obj, f))


def save_checkpoint(state: dict, path: str | os.PathLike) -> None:
    """Write a trainer's `state_dict()` atomically, so a crash mid-write leaves the previous checkpoint whole.

    Args:
        state: what `Trainer.state_dict()` returns.
        path: the file; its folder is created if missing.
    """
    atomic_save(state, path)


def load_checkpoint(path: str | os.PathLike) -> dict:
    """Read a checkpoint with `weights_only=True` (no code runs from the file), turning every way it can be wrong
    into one clear error.

    Args:
        path: the checkpoint file (a run writes <out_dir>/checkpoint.pt).
    Returns:
        The state, on the CPU, for `Trainer.load_state` (`Trainer.resume` does both).
    Raises:
        CheckpointError: no such file, a damaged one, or one that is not a gantools checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}: train first (it is written to <out_dir>/checkpoint.pt), "
                              "or give the right path")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{path} holds objects a weights-only load refuses (not written by gantools, or "
                              f"tampered with); it was not loaded. Detail: {str(e).splitlines()[0]}") from e
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{path} is damaged or truncated and cannot be read ({e}); use an earlier "
                              "checkpoint or start again") from e
    missing = [k for k in REQUIRED_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointError(f"{path} is not a gantools checkpoint (missing: {', '.join(missing)})")
    return state


def load_parts(parts: dict, state: dict) -> str | None:
    """Load a checkpoint's networks, optimizers, scalers and EMA generator into `parts` (a run's own, by checkpoint
    key: `StepParts.stateful`), in place.

    Args:
        parts: the run's parts by checkpoint key; "ema" only when the run keeps an EMA generator.
        state: the loaded checkpoint.

    Returns:
        a warning to show when the checkpoint has no EMA generator for a run that keeps one (its average starts
        afresh), else None.
    """
    try:
        parts["generator"].load_state_dict(state["generator"])
        parts["discriminator"].load_state_dict(state["discriminator"])
    except RuntimeError as e:
        raise ConfigError(f"the checkpoint's networks do not match this config's (image_size, channels, nz, "
                          f"ngf, ndf or your own modules differ): {str(e).splitlines()[0]}") from e
    for key in ("opt_g", "opt_d"):  # the moments and step counters; the run's own groups (kernels: fused,
        # capturable; hyperparameters from its config), so its counters land where its kernels keep them (torch's
        # load_state_dict would take the saved groups' flags: a fused or captured run resumed from another's state
        # would step with the other's kernels)
        parts[key].load_state_dict({"state": state[key]["state"],
                                    "param_groups": parts[key].state_dict()["param_groups"]})
    for key in ("scaler_g", "scaler_d"):
        parts[key].load_state_dict(state[key])
    ema = parts.get("ema")
    if ema is None:
        return None
    if "ema" not in state:
        ema.reset()
        return (f"the checkpoint has no EMA generator (it was trained without ema_decay): the average starts "
                f"now, from the generator of step {state['step']}")
    try:
        ema.load_state_dict(state["ema"])
    except RuntimeError as e:
        raise ConfigError(f"the checkpoint's EMA generator does not match this config's generator: "
                          f"{str(e).splitlines()[0]}") from e
    return None
