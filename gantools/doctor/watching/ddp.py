"""What one process of a DistributedDataParallel loop shows the doctor beside the single-process diagnosis: each DDP
wrapper your code built (where, and with which settings), whether its `no_sync()` was ever entered, how many backward
passes reach its parameters per optimizer step, the DataLoaders' samplers, a fingerprint of the first batches (to tell
whether every process reads the same images), and, from the profiler, the collectives of a step: gradient
all-reduces (how long, how much of them ran while backward still computed) and DDP's buffer broadcasts.

`DDPWatch` records while the script runs; `rank_facts` reads it, with the `Watch`, into plain values each process
hands to rank 0 (`ranks`); `describe` is the report's lines about them."""
from __future__ import annotations

import hashlib
import sys

from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import dataloader as _dataloader

from .frames import location, shown

FINGERPRINTS = 8  # first batches compared across processes
# profiler events of the collectives: the host op each launch records (c10d::...), the backend's own work (gloo's,
# on its worker threads), and NCCL's kernels on a GPU
ALL_REDUCE = ("c10d::allreduce_",)
ALL_REDUCE_WORK = ("gloo:all_reduce", "nccl:all_reduce")
BROADCAST_WORK = ("gloo:broadcast", "nccl:broadcast")
BACKWARD = "autograd::engine::evaluate_function"


class DDPWatch:
    """Patches `DistributedDataParallel.__init__` and `.no_sync` and the DataLoader iterator's `__next__` while a
    script runs (installed before the doctor's own hooks, removed after them)."""

    def __init__(self):
        self.built: list = []       # (DDP module, (file, line) of your code that built it)
        self.no_sync: dict = {}     # id(DDP module) -> (file, line) where your code first entered its no_sync()
        self.fingerprints: list = []
        self._patches: list = []

    def __enter__(self) -> "DDPWatch":
        self._patch(DistributedDataParallel, "__init__", self._wrap_init)
        self._patch(DistributedDataParallel, "no_sync", self._wrap_no_sync)
        self._patch(_dataloader._BaseDataLoaderIter, "__next__", self._wrap_next)
        return self

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._patches):
            setattr(owner, name, original)
        self._patches = []
        return False

    def _patch(self, owner, name, make):
        original = owner.__dict__[name]
        setattr(owner, name, make(original))
        self._patches.append((owner, name, original))

    def _wrap_init(self, original):
        def __init__(module, *args, **kwargs):
            original(module, *args, **kwargs)
            self.built.append((module, location(sys._getframe(1))))
        return __init__

    def _wrap_no_sync(self, original):
        def no_sync(module):
            self.no_sync.setdefault(id(module), location(sys._getframe(1)))
            return original(module)
        return no_sync

    def _wrap_next(self, original):
        def __next__(it):
            batch = original(it)
            if len(self.fingerprints) < FINGERPRINTS:
                self.fingerprints.append(_fingerprint(batch))
            return batch
        return __next__


def _fingerprint(batch) -> str | None:
    """A short hash of a batch's first tensor, when it is on the host (no device read, no op in the profile)."""
    from .frames import first_tensor

    x = first_tensor(batch)
    if x is None or x.device.type != "cpu":
        return None
    try:
        return hashlib.blake2b(x.detach().contiguous().numpy().tobytes(), digest_size=8).hexdigest()
    except (RuntimeError, TypeError):  # a dtype numpy cannot hold
        return None


def _at(where) -> str | None:
    return f"{shown(where[0])}:{where[1]}" if where else None


def _batchnorms(module: nn.Module) -> tuple[int, int]:
    """(BatchNorm layers with per-process statistics, SyncBatchNorm layers) inside a module."""
    plain = sync = 0
    for m in module.modules():
        if isinstance(m, nn.SyncBatchNorm):
            sync += 1
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            plain += 1
    return plain, sync


def _backward_passes(obs, model) -> float | None:
    """Backward passes that reached the model's parameters per step of the optimizer over them (gradients
    accumulated in the profiled window, divided by the parameters that take one)."""
    trainable = sum(1 for p in model.module.parameters() if p.requires_grad)
    for o in obs.optimizers.values():
        if o.param_ids & model.param_ids and o.window_steps and trainable:
            return round(o.grads_from.get(model, 0) / (trainable * o.window_steps), 2)
    return None


def _model_facts(watch: DDPWatch, obs) -> list:
    by_module = {id(m.module): m for m in obs.models.values()}
    out = []
    for module, built_at in watch.built:
        model = by_module.get(id(module))
        plain, sync = _batchnorms(module.module)
        out.append({"name": model.name if model else type(module.module).__name__,
                    "role": model.role if model else None, "class": type(module.module).__name__,
                    "built_at": _at(built_at), "parameters": sum(p.numel() for p in module.parameters()),
                    "find_unused_parameters": bool(module.find_unused_parameters),
                    "broadcast_buffers": bool(module.broadcast_buffers), "batchnorm": plain, "sync_batchnorm": sync,
                    "no_sync_at": _at(watch.no_sync.get(id(module))) if id(module) in watch.no_sync else None,
                    "no_sync_seen": id(module) in watch.no_sync,
                    "backward_passes_per_step": _backward_passes(obs, model) if model else None,
                    "called_at": [w for w, _ in model.sites.most_common(4)] if model else []})
    return out


def _loader_facts(obs) -> list:
    out = []
    for loader in obs.loaders:
        sampler = loader.sampler
        inner = getattr(loader.batch_sampler, "sampler", None)
        kinds = {type(s).__name__ for s in (sampler, inner) if s is not None}
        at = obs.built_at.get(id(loader))
        out.append({"built_at": _at(at), "sampler": type(sampler).__name__,
                    "distributed": any("Distributed" in k for k in kinds), "images": _length(loader.dataset)})
    return out


def _length(dataset) -> int | None:
    try:
        return len(dataset)
    except TypeError:
        return None


def _union(intervals: list) -> list:
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def _overlap(a: list, b: list) -> float:
    """Microseconds that two unions of intervals share."""
    total = 0.0
    for start, end in a:
        for s, e in b:
            total += max(0.0, min(end, e) - max(start, s))
    return total


def collectives(events, steps: int, cuda: bool) -> dict:
    """Per profiled iteration: gradient all-reduces launched, their time (the backend's work on the host: gloo; the
    NCCL kernels' on a GPU), the share of it spent while backward still computed on the host (gloo only: a GPU's
    overlap is in the trace), and DDP's buffer broadcasts."""
    steps = max(steps, 1)
    launched = sum(1 for e in events if e.name in ALL_REDUCE)
    if cuda:
        work = [e for e in events if "allreduce" in e.name.lower().replace("_", "") and e.device_type.name == "CUDA"]
        casts = [e for e in events if "broadcast" in e.name.lower() and e.device_type.name == "CUDA"]
    else:
        work = [e for e in events if e.name in ALL_REDUCE_WORK]
        casts = [e for e in events if e.name in BROADCAST_WORK]
    spans = _union([(e.time_range.start, e.time_range.end) for e in work])
    busy = sum(end - start for start, end in spans)
    out = {"all_reduces_per_iteration": launched / steps, "all_reduce_ms": busy / 1e3 / steps,
           "broadcasts_per_iteration": len(casts) / steps,
           "broadcast_ms": sum(e.time_range.elapsed_us() for e in casts) / 1e3 / steps}
    if not cuda:
        backward = _union([(e.time_range.start, e.time_range.end) for e in events if e.name.startswith(BACKWARD)])
        shared = _overlap(spans, backward)
        out["overlap"] = shared / busy if busy else None
        out["exposed_ms"] = (busy - shared) / 1e3 / steps
    return out


def rank_facts(watch: DDPWatch, doc) -> dict:
    """What this process hands to rank 0: its DDP wrappers, loaders, first batches and collectives, with its step
    time and images."""
    from torch import distributed as dist

    obs, sched = doc.obs, doc.schedule
    facts = {"backend": dist.get_backend() if dist.is_available() and dist.is_initialized() else None,
             "models": _model_facts(watch, obs), "loaders": _loader_facts(obs),
             "fingerprints": list(watch.fingerprints)}
    if sched.session is not None and sched.session.prof is not None and sched.profiled:
        cuda = obs.device_in_use().type == "cuda"
        facts.update(collectives(sched.session.prof.events(), sched.profiled, cuda))
    return facts


def describe(ddp: dict) -> list:
    """The report's lines about the processes: how many, the collectives' share of a step, each DDP wrapper."""
    lines = [f"{ddp['world_size']} processes ({ddp.get('backend') or 'no process group'}); rank 0's numbers below, "
             "each process's step: " + ", ".join(f"rank {r} {ms:.1f} ms" for r, ms in enumerate(ddp["step_ms"]))]
    if "all_reduce_ms" in ddp:
        step = ddp["step_ms"][0]
        overlap = ddp.get("overlap")
        lines.append(f"gradient all-reduce: {ddp['all_reduces_per_iteration']:g} per iteration, "
                     f"{ddp['all_reduce_ms']:.1f} ms ({100 * ddp['all_reduce_ms'] / step:.0f}% of the profiled "
                     "step)" + ("" if overlap is None else
                                f", {100 * overlap:.0f}% of it while backward computed, "
                                f"{ddp['exposed_ms']:.1f} ms after ({100 * ddp['exposed_ms'] / step:.0f}%)"))
        if ddp["broadcasts_per_iteration"]:
            lines.append(f"buffer broadcasts: {ddp['broadcasts_per_iteration']:g} per iteration, "
                         f"{ddp['broadcast_ms']:.1f} ms ({100 * ddp['broadcast_ms'] / step:.0f}%)")
    for m in ddp["models"]:
        lines.append(f"DDP({m['name']}){' built at ' + m['built_at'] if m['built_at'] else ''}: "
                     f"find_unused_parameters={m['find_unused_parameters']}, "
                     f"broadcast_buffers={m['broadcast_buffers']}, {m['batchnorm']} BatchNorm, "
                     f"{m['sync_batchnorm']} SyncBatchNorm; "
                     + (f"{m['backward_passes_per_step']:g} backward passes per optimizer step"
                        if m["backward_passes_per_step"] is not None else "its optimizer not seen stepping")
                     + (f", no_sync() at {m['no_sync_at'] or 'a library line'}" if m["no_sync_seen"]
                        else ", no_sync() never entered"))
    return lines
