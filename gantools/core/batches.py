"""Iterating a run's loader: endless batches from a data position (`BatchStream`), and DataLoader workers shut down
outside the garbage collector (`worker_safe`).

A DataLoader iterator with workers that becomes garbage inside a reference cycle (a Trainer dropped in a notebook or
a test) is collected by `gc`, which first runs the weakref callbacks of its multiprocessing queues: they stop the
queues' feeder threads, so the iterator's own shutdown, run just after, can no longer send its workers the stop
signal and waits for each worker's timeout. So every live iterator is held here (never garbage), and one whose
consumer was collected is shut down by the next loader that starts, outside the collector, at once.
"""
from __future__ import annotations

import gc

from torch.utils.data import DataLoader


class BatchStream:
    """A loader's batches, endless, starting exactly at a data position (epoch and batch within it, from the count
    of batches read). The position is counted here, batch by batch: a run's `batches_seen` only moves once a step is
    done, and a step of several D steps can cross the end of an epoch."""

    def __init__(self, loader, position: int):
        """
        Args:
            loader: a HostLoader or DeviceLoader (anything with `set_position(epoch, batch)` and a length).
            position: how many batches the run has read so far.
        """
        self._batches = self._from(loader, position)

    @staticmethod
    def _from(loader, position: int):
        while True:
            epoch, batch = divmod(position, len(loader))
            loader.set_position(epoch, batch)
            for real in loader:
                position += 1
                yield real

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._batches)

    def close(self) -> None:
        """End the loader's iteration (its DataLoader workers with it)."""
        self._batches.close()

_LIVE_WORKERS: list = []   # [iterator, still consumed?]
_COLLECTING = [False]


def _note_collection(phase: str, info: dict) -> None:
    _COLLECTING[0] = phase == "start"


def _watch_collections() -> None:
    """Follow the garbage collector from the first loader with workers on, not from import: importing gantools
    changes nothing global."""
    if _note_collection not in gc.callbacks:
        gc.callbacks.append(_note_collection)


def worker_safe(loader: DataLoader):
    """Iterate `loader`; with workers, keep its iterator out of the garbage collector's reach (see the module's
    docstring)."""
    _LIVE_WORKERS[:] = [entry for entry in _LIVE_WORKERS if entry[1]]  # dropped here: shut down by refcount, now
    it = iter(loader)
    if not loader.num_workers:
        yield from it
        return
    _watch_collections()
    entry = [it, True]
    _LIVE_WORKERS.append(entry)
    try:
        yield from it
    finally:
        entry[1] = False
        if not _COLLECTING[0]:  # closed or finished in plain code: let it go now
            _LIVE_WORKERS.remove(entry)
