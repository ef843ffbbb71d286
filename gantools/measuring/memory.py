"""Memory measures, the same on a CPU and a GPU: the peak tensor memory of a training step (`step_peak_bytes`) and
the activations it holds for its backward pass (`saved_activation_bytes`).

A process's peak resident set is no measure of a step: it counts Python, torch and every buffer an allocator ever
kept, and never goes down, so every run in one kernel reports the same number. What a step costs is the tensors
live at its busiest moment: weights, gradients, optimizer state, the activations autograd keeps for backward and the
temporaries between them. A GPU's caching allocator counts exactly that (`torch.cuda.max_memory_allocated`, whose
peak `torch.cuda.reset_peak_memory_stats` restarts); elsewhere `LiveTensorBytes` counts it from the ops themselves.
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable, Iterable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def held_tensors(*holders) -> Iterable[torch.Tensor]:
    """The tensors a run keeps between steps: each module's parameters, their gradients and its buffers, and each
    optimizer's state (a tensor given itself is yielded as it is). A generator, so no caller keeps a reference by
    accident: a list of gradients held through a step would keep the old ones alive after `zero_grad`."""
    for holder in holders:
        if isinstance(holder, nn.Module):
            for p in holder.parameters():
                yield p
                if p.grad is not None:
                    yield p.grad
            yield from holder.buffers()
        elif isinstance(holder, torch.optim.Optimizer):
            yield from (v for state in holder.state.values() for v in state.values() if torch.is_tensor(v))
        elif torch.is_tensor(holder):
            yield holder


def _on(tensor: torch.Tensor, device: torch.device) -> bool:
    return tensor.device.type == device.type and (device.index is None or tensor.device.index == device.index)


def held_bytes(holders, device: torch.device) -> int:
    """Bytes of the storages on `device` of the tensors `holders` keep (`held_tensors`), each storage once."""
    storages = {}
    for t in held_tensors(*holders):
        if t.layout == torch.strided and _on(t, device):
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


class LiveTensorBytes(TorchDispatchMode):
    """Inside the block, the bytes of tensor storage live on one device (`now`) and the most at any moment (`peak`):
    the storages of the tensors `holders` keep (`held_tensors`) and of every tensor an op makes, each from the op
    that makes it until it is freed. A dispatch mode sees the ops autocast and autograd run (bf16 copies, backward's
    gradients, optimizer state), after autocast has cast them, so 16-bit activations count at their 16-bit size.
    A storage is freed when its last tensor is: torch keeps one Python object per live storage, so a weak
    reference to it lives exactly as long as the storage (torch.distributed._tools.mem_tracker counts the same way).
    What kernels allocate and free inside one op (a convolution's workspace) is not seen; on a GPU the allocator
    counts that too. Each op costs some microseconds of Python: measure one step, not a run."""

    def __init__(self, device: torch.device, holders=()):
        super().__init__()
        self.device = device
        self._sizes: dict[int, int] = {}  # id(storage) -> its bytes
        self._refs: dict[int, weakref.ref] = {}
        self.now = self.peak = 0
        for t in held_tensors(*holders):
            self._count(t)

    def _count(self, tensor) -> None:
        if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided or not _on(tensor, self.device):
            return  # a sparse tensor has no one storage to count
        storage = tensor.untyped_storage()
        key, size = id(storage), storage.nbytes()
        ref = self._refs.get(key)
        if ref is not None and ref() is storage:  # known: a view, an in-place op, or `out=` resizing it
            self.now += size - self._sizes[key]
        else:
            self._refs[key] = weakref.ref(storage, lambda r, key=key: self._free(key, r))
            self.now += size
        self._sizes[key] = size
        self.peak = max(self.peak, self.now)

    def _free(self, key: int, ref: weakref.ref) -> None:
        if self._refs.get(key) is ref:
            self.now -= self._sizes.pop(key)
            del self._refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            self._count(t)
        return out


def step_peak_bytes(step: Callable[[], object], device: torch.device, holders=()) -> int:
    """Run `step()` and return the most bytes of tensor memory its run held on `device` at any one moment: the
    tensors `holders` keep between steps (weights, gradients, optimizer state: see `held_tensors`) and everything the
    step makes (activations kept for backward, new gradients and optimizer state, temporaries), until freed.

    On CUDA: the caching allocator's count of bytes in tensors, `max_memory_allocated`, after
    `reset_peak_memory_stats` has set its peak to what is allocated now (PyTorch's documented way to measure "the
    peak allocated memory usage of each iteration in a training loop"). That count covers every tensor on the GPU,
    other runs' and a dataset kept there included, so what was allocated before the step is taken off and the
    holders' own bytes put back: the run's memory, not the kernel's. Elsewhere: `LiveTensorBytes` around the step.
    Either way memory held elsewhere (another run's networks, a dataset) does not count, and a second run in the same
    process measures only its own step."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        own, before = held_bytes(holders, device), torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return own + torch.cuda.max_memory_allocated(device) - before
    with LiveTensorBytes(device, holders) as live:
        step()
    return live.peak


class _Held:
    """What autograd keeps in place of a saved tensor while the hooks count it: freed with the graph that saved it.
    It holds the tensor detached (the same storage): the tensor itself would hold its `grad_fn`, and an op that saves
    its own output (tanh, ReLU) would then close a cycle through the graph that the garbage collector cannot break,
    keeping a graph never run backward alive for good (pytorch/pytorch#115255). Autograd reattaches the graph when it
    unpacks."""
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor.detach()


class SavedActivations:
    """Inside the block, the bytes autograd holds for backward (`now`) and the most at any one moment (`peak`): the
    activations a step needs memory for. Each storage counts once however many tensors view it, and for as long as
    any graph still holds it (a graph is let go by its backward, or when nothing refers to it any more). Weights are
    left out: they are held whether or not a graph is (`weights`: their storages, a frozen network's included; by
    default any leaf tensor that requires grad). `label()`, when given, names who saves each tensor (the network
    running, say): `at_peak` then holds the bytes per (label, 32-bit floating point or not) at the peak. Entered and
    left as a context manager, or with `start()` and `stop()` where the two ends are in different calls. A lock
    keeps the count whole where backward packs and frees on autograd's device threads (a penalty's double
    backward)."""

    def __init__(self, label: Callable[[], object] | None = None, weights=None):
        self.label = label
        self._weights = None if weights is None else {t.untyped_storage().data_ptr() for t in weights}
        self._live: dict = {}  # storage key -> [bytes, graphs' references to it, (label, 32 bits)]
        self._by: dict = {}
        self.now = self.peak = 0
        self.at_peak: dict = {}
        self._lock = threading.RLock()  # re-entered where the collector frees a graph inside a pack
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _release(self, key) -> None:
        with self._lock:
            entry = self._live[key]
            entry[1] -= 1
            if entry[1] == 0:
                self.now -= entry[0]
                self._by[entry[2]] -= entry[0]
                del self._live[key]

    def _is_weight(self, tensor: torch.Tensor) -> bool:
        """A weight, or (given `weights`) autocast's 16-bit copy of a trained one: a weight's size whatever the batch,
        so not an activation (the peak still counts it)."""
        if self._weights is None:
            return tensor.is_leaf and tensor.requires_grad
        if tensor.untyped_storage().data_ptr() in self._weights:
            return True
        cast = (tensor if tensor._base is None else tensor._base).grad_fn  # a view of the copy (the transpose)
        if cast is None or not type(cast).__name__.startswith("ToCopyBackward"):
            return False
        sources = (getattr(fn, "variable", None) for fn, _ in cast.next_functions if fn is not None)
        return any(w is not None and w.untyped_storage().data_ptr() in self._weights for w in sources)

    def _pack(self, tensor: torch.Tensor):
        if self._is_weight(tensor):
            return tensor
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        with self._lock:
            if key in self._live:
                self._live[key][1] += 1
            else:
                who = (self.label() if self.label else None, tensor.is_floating_point() and tensor.element_size() >= 4)
                self._live[key] = [storage.nbytes(), 1, who]
                self._by[who] = self._by.get(who, 0) + storage.nbytes()
                self.now += storage.nbytes()
                if self.now > self.peak:
                    self.peak, self.at_peak = self.now, dict(self._by)
        held = _Held(tensor)
        weakref.finalize(held, self._release, key)
        return held

    @staticmethod
    def _unpack(packed):
        return packed.tensor if isinstance(packed, _Held) else packed

    def start(self) -> "SavedActivations":
        self._hooks.__enter__()
        return self

    def stop(self) -> None:
        self._hooks.__exit__(None, None, None)

    def __enter__(self) -> "SavedActivations":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def saved_activation_bytes(fn: Callable[[], object]) -> int:
    """Run `fn()` and return the most bytes that autograd held for backward at any one moment (`SavedActivations`):
    the activations a step needs memory for."""
    with SavedActivations() as saved:
        fn()
    return saved.peak
