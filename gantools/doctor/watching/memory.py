"""The doctor's memory measure of your loop: the last warm-up iteration (optimizer state exists by then) watched for
its peak tensor memory and the parts it is made of: weights, gradients and optimizer state (what a run holds between
iterations, `measuring.memory.held_tensors`), the activations autograd saves for backward (by network, and how many
of them are 32-bit; a batch D saves for its backward among them), and the rest (temporaries, outputs, noise,
autocast's 16-bit copies of the weights). On a GPU the peak is the caching allocator's count
and the room beside it the GPU's free memory; elsewhere the ops' own count (`LiveTensorBytes`), with no room: a CPU
swaps rather than refuse, so what fits there is a choice, not a measure (`speed.batch_fit`).

Where torch.compile has compiled code in this process, the ops' count and the saved-tensor hooks are left out: the
doctor counts those only where the step runs as written (under a dispatch mode dynamo skips the frame, so a CPU
count would be of the uncompiled step: pytorch/pytorch#190286), so there only a GPU's allocator peak is measured.
On a GPU, what was allocated when the watch starts is taken off and the run's own weights and state put back (as
`measuring.memory.step_peak_bytes` does): a tensor of the last iteration still referenced then (its `fake`) and freed
before the peak makes the peak read a little low."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...measuring.memory import LiveTensorBytes, SavedActivations, held_bytes
from ...speed.batch_fit import MARGIN
from .observations import Observations

MB = 2**20
OUTSIDE = "your loop"  # activations saved outside any network's forward (a loss, a penalty's mix)


@dataclass
class IterationMemory:
    """One iteration's memory (MB): its peak, the parts (each at its own most, so they need not all be live at the
    peak), the activations by (network or None, 32-bit) at their peak, and the room a GPU had beside the peak."""
    peak_mb: float | None
    parts_mb: dict
    activations_by: dict = field(default_factory=dict)
    room_mb: float | None = None
    counted_by: str = ""
    left_out: str = ""

    def describe(self) -> dict:
        """As the report's `settings["memory"]`, the networks named by their roles (after `Observations.classify`)."""
        by_net: dict = {}
        fp32 = 0
        for (model, wide), n in self.activations_by.items():
            name = OUTSIDE if model is None else (model.role or model.name)
            by_net[name] = by_net.get(name, 0) + n / MB
            fp32 += n if wide else 0
        total = sum(self.activations_by.values())
        parts = {k: round(v, 2) for k, v in self.parts_mb.items() if v is not None}
        return {"peak_mb": None if self.peak_mb is None else round(self.peak_mb, 2), "parts_mb": parts,
                "largest": max(parts, key=parts.get) if parts else None,
                "activations_by_network_mb": {k: round(v, 2) for k, v in by_net.items() if round(v, 2)},
                "activations_32bit_share": round(fp32 / total, 3) if total else None,
                "room_mb": None if self.room_mb is None else round(self.room_mb, 1),
                "counted_by": self.counted_by, "left_out": self.left_out}


class MemoryWatch:
    """Started at one iteration mark, stopped at the next (`Schedule`), in the loop's own thread."""

    def __init__(self, obs: Observations, running, compiled: bool):
        """`running()`: the network whose forward runs now (a `Model`, or None); `compiled`: torch.compile has
        compiled code in this process (or a module of this loop compiled in place)."""
        self.device, self.compiled = obs.device_in_use(), compiled
        self.modules = [m.module for m in obs.models.values() if m.module is not None]
        self.optimizers = [o.opt for o in obs.optimizers.values()]
        self.saved = None if compiled else SavedActivations(label=running, weights=self._weights())
        self.live = None
        self._cuda = self.device.type == "cuda"

    def _weights(self) -> list:
        """The parameters and buffers the run holds: the networks' and, for a network written as a function, the
        optimizers' own (each storage counts once: `held_bytes`)."""
        tensors = [t for m in self.modules for t in (*m.parameters(), *m.buffers())]
        return tensors + [p for o in self.optimizers for g in o.param_groups for p in g["params"]]

    def start(self) -> "MemoryWatch":
        if self._cuda:  # as `measuring.memory.step_peak_bytes` counts a step, here across two marks
            torch.cuda.synchronize(self.device)
            self.own = held_bytes((*self.modules, *self.optimizers), self.device)
            self.before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif not self.compiled:
            self.live = LiveTensorBytes(self.device, (*self.modules, *self.optimizers, *self._weights()))
            self.live.__enter__()
        if self.saved is not None:
            self.saved.start()
        return self

    def stop(self, measure: bool = True) -> IterationMemory | None:
        """Unhook everything `start` installed, whatever happens; then, where `measure`, the iteration's memory (not
        after an error in your loop: on a GPU after a device-side assert every CUDA call would raise again)."""
        try:
            if self.saved is not None:
                self.saved.stop()
        finally:
            if self.live is not None:
                self.live.__exit__(None, None, None)
        return self._measured() if measure else None

    def _measured(self) -> IterationMemory:
        peak, room, counted_by = None, None, "tensors counted op by op"
        if self._cuda:
            torch.cuda.synchronize(self.device)
            most = torch.cuda.max_memory_allocated(self.device)
            peak = (self.own + most - self.before) / MB
            free, _ = torch.cuda.mem_get_info(self.device)
            # what this process's tensors could reach: the GPU's free memory and the allocator's cached blocks
            room = peak + MARGIN * max(free + torch.cuda.memory_reserved(self.device) - most, 0) / MB
            counted_by = "the CUDA allocator's count"
        elif self.live is not None:
            peak = self.live.peak / MB
        trained = [p for o in self.optimizers for g in o.param_groups for p in g["params"]]
        parts = {"weights": held_bytes(self._weights(), self.device) / MB,
                 "gradients": held_bytes(trained, self.device) / MB,  # one per trained weight, when all exist
                 "optimizer state": held_bytes(self.optimizers, self.device) / MB,
                 "activations": None if self.saved is None else self.saved.peak / MB}
        if peak is not None:
            parts["the rest"] = max(peak - sum(v for v in parts.values() if v), 0.0)
        left_out = "" if not self.compiled else (
            "torch.compile has compiled code in this process: activations are counted only where the step runs as "
            "written" + ("" if self._cuda else ", and so is a CPU's peak"))
        return IterationMemory(peak, parts, dict(self.saved.at_peak) if self.saved else {}, room,
                               counted_by if peak is not None else "", left_out)
