"""What fed each model call, for counting the real images of a loop without a DataLoader: a model's output (G's
images, a view or a detached copy of them), a batch joined with `torch.cat` from a model's output and data (its data
rows count), a tensor with gradients made in your loop (a penalty's mix of real and fake), a batch the model was fed
already in this iteration, or new data.

Tensors are matched by their storage, held by weak reference and only for the current iteration: memory freed and
handed to a new batch at the same address (the CPU allocator and CUDA's caching allocator both do that) is not the
freed tensor's, and nothing is kept alive that your loop let go."""
from __future__ import annotations

import weakref

import torch

from .frames import compiling
from .observations import AGAIN, DATA, DERIVED, MADE


class Feeds:
    """The tensors this iteration's model calls made or were fed; `fed(model, x)` tells what fed a call."""

    def __init__(self):
        self.made: dict = {}  # id(storage) -> (weakref to it, the model whose output it holds, its rows of data)
        self.data: dict = {}  # (id(storage), offset, id(model)) -> weakref to it: the data fed this iteration
        self.with_grad: dict = {}  # id(tensor) -> (weakref to it, the model): inputs that require grad (a penalty's)

    def new_iteration(self) -> None:
        self.made.clear()
        self.data.clear()
        self.with_grad.clear()

    def output(self, model, out: torch.Tensor) -> None:
        """A model's call returned `out`."""
        storage = storage_of(out)
        if storage is not None:
            self.made[id(storage)] = (weakref.ref(storage), model, 0)

    def joined(self, parts, out, dim: int) -> None:
        """`out = torch.cat(parts, dim)`: where a part is a model's output, the batch is that model's, holding the
        rows of the parts that are data (joined along the batch: `dim` 0)."""
        parts = [t for t in parts if isinstance(t, torch.Tensor)]
        made = [self._maker(t) for t in parts]
        producer = next((m for m, _ in made if m is not None), None)
        storage = storage_of(out) if producer is not None else None
        if storage is None:
            return
        rows = 0
        if dim == 0:
            rows = sum(r if m is not None else t.shape[0] for t, (m, r) in zip(parts, made, strict=True)
                       if t.dim() > 0 and (m is not None or not t.requires_grad))
        self.made[id(storage)] = (weakref.ref(storage), producer, rows)

    def count(self, model, x: torch.Tensor, window) -> None:
        """`model` called on the batch `x`: its rows counted in the window by what fed them, and the model whose
        output it holds noted as feeding it."""
        producer, rows = self.fed(model, x)
        if x.requires_grad:
            self.with_grad[id(x)] = (weakref.ref(x), model)
        if producer is not None and producer is not model:
            model.fed_by[producer] += 1
        window.inputs.update({(model, kind): n for kind, n in rows.items()})
        if rows.get(DATA):
            window.data_sizes[(model, rows[DATA])] += 1

    def fed(self, model, x: torch.Tensor) -> tuple:
        """What fed `model` the batch `x`: (the model whose output it holds or None, {kind: rows}) with kinds from
        `observations.FED_KINDS`."""
        producer, rows = self._maker(x)
        if producer is not None:
            return producer, {MADE: x.shape[0] - rows, DATA: rows}
        if x.requires_grad:
            return None, {DERIVED: x.shape[0]}
        storage = storage_of(x)
        if storage is None:
            return None, {DATA: x.shape[0]}
        key = (id(storage), x.storage_offset(), id(model))
        seen = self.data.get(key)
        self.data[key] = weakref.ref(storage)
        return None, {AGAIN if seen is not None and seen() is storage else DATA: x.shape[0]}

    def fed_with_grad(self, x: torch.Tensor):
        """The model this iteration fed `x` (the very tensor, one that requires grad), or None."""
        entry = self.with_grad.get(id(x))
        return entry[1] if entry is not None and entry[0]() is x else None

    def _maker(self, x: torch.Tensor) -> tuple:
        """(the model whose output `x` holds, the rows of data in it), or (None, 0)."""
        storage = storage_of(x)
        entry = self.made.get(id(storage)) if storage is not None else None
        if entry is None or entry[0]() is not storage:
            return None, 0
        return entry[1], entry[2]


def storage_of(x: torch.Tensor):
    """The tensor's storage (one Python object per storage while it lives), or None where it has none to share."""
    try:
        return x.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def wrap_cat(hooks, original):
    """`torch.cat`, telling `hooks.feeds` what each batch it joins holds (while the full hooks are on)."""
    def cat(tensors, *args, **kwargs):
        out = original(tensors, *args, **kwargs)
        if (not compiling() and hooks.full and hooks.mine() and isinstance(out, torch.Tensor)
                and isinstance(tensors, (list, tuple))):
            dim = kwargs.get("dim", args[0] if args else 0)
            hooks.feeds.joined(tensors, out, dim if isinstance(dim, int) and dim >= 0 else -1)
        return out
    cat.__name__, cat.__doc__, cat.__wrapped__ = original.__name__, original.__doc__, original
    return cat
