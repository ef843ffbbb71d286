"""The memory a training step holds for its backward pass, measured the same way on a CPU and a GPU.

A GPU reports its peak tensor memory (`torch.cuda.max_memory_allocated`); a CPU does not, and its peak resident set
counts Python, torch and every buffer the allocator ever kept, so a saving of some megabytes disappears in it. What
gradient accumulation saves is activations: the tensors autograd keeps from each forward until its backward. Those
pass through `torch.autograd.graph.saved_tensors_hooks` on every device, so counting them there measures the saving
wherever the code runs."""
from __future__ import annotations

import weakref
from typing import Callable

import torch


class _Held:
    """What autograd keeps in place of a saved tensor while the hooks count it: freed with the graph that saved it."""
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


def saved_activation_bytes(fn: Callable[[], object]) -> int:
    """Run `fn()` and return the most bytes that autograd held for backward at any one moment: the activations a
    step needs memory for. Each storage counts once however many tensors view it, and for as long as any graph
    still holds it (a graph is let go by its backward, or when nothing refers to it any more). Parameters are left
    out: they are held whether or not a graph is, and the same in every variant of a step."""
    live: dict = {}  # storage -> [bytes, graphs' references to it]
    now = peak = 0

    def release(key) -> None:
        nonlocal now
        entry = live[key]
        entry[1] -= 1
        if entry[1] == 0:
            now -= entry[0]
            del live[key]

    def pack(tensor: torch.Tensor):
        nonlocal now, peak
        if tensor.is_leaf and tensor.requires_grad:  # a parameter
            return tensor
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        if key in live:
            live[key][1] += 1
        else:
            live[key] = [storage.nbytes(), 1]
            now += storage.nbytes()
            peak = max(peak, now)
        held = _Held(tensor)
        weakref.finalize(held, release, key)
        return held

    def unpack(packed):
        return packed.tensor if isinstance(packed, _Held) else packed

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        fn()
    return peak
