"""Checkpoints that survive a crash mid-write and that load safely (`weights_only=True`: no pickled code runs)."""
from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path

import torch

REQUIRED_KEYS = ("format", "step", "batches_seen", "config", "generator", "discriminator", "opt_g", "opt_d",
                 "scaler_g", "scaler_d", "rng", "history")


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, damaged, tampered with or not a gantools checkpoint."""


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
    """Write a trainer's `state_dict()` atomically; the previous checkpoint stays until the new one is whole."""
    atomic_save(state, path)


def load_checkpoint(path: str | os.PathLike) -> dict:
    """Read a checkpoint with `weights_only=True`, turning every way it can be wrong into one clear error."""
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
