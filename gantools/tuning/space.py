"""tune's search space: every change of the speed knobs (and the lazy penalties' intervals) worth trying from a
config on a device, likeliest gain first (`techniques.TECHNIQUES`' priors, in its order), each completed to a valid
config."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..speed import bench
from ..core import techniques
from ..core.config import TrainConfig, speed_knobs
from ..errors import ConfigError

PRIOR = techniques.priors()  # knob: (cpu, cuda), the expected speed-up of each change on its own


def default_space(batch_size: bool = False) -> tuple[str, ...]:
    """The fields tune may change unless told otherwise: every speed knob, and the zero-centred penalties' intervals
    (lazy R1 and R2: a change of what is computed, which only the quality phase keeps); batch_size only when asked
    (`search_space` says why). Pass `config.speed_knobs()` as the space to keep every GAN setting as given."""
    return (*speed_knobs(), *techniques.LAZY_FIELDS, *(("batch_size",) if batch_size else ()))


@dataclass
class Candidate:
    """One change to try: the fields it sets (what it needs to be valid included), where it came from, and its
    expected gain (`PRIOR`, to order the search space)."""

    change: dict
    source: str
    prior: float = 1.0

    @property
    def label(self) -> str:
        return describe(self.change)


def describe(change: dict) -> str:
    """`precision=bf16, loss=bce`: a change as a reader writes it."""
    return ", ".join(f"{k}={v}" for k, v in change.items()) or "(no change)"


def complete(cfg: TrainConfig, change: dict) -> dict:
    """The change plus what it needs to be a valid config, minus what is already so. 16-bit precision under
    Sigmoid + BCELoss needs BCE with logits (the same loss); the loaders that hold uint8 images in one tensor (device,
    memmap, auto) leave no DataLoader knobs and no per-image transform; workers kept alive between epochs come with
    workers."""
    change = dict(change)
    new = cfg.replace(**change)
    if new.precision != "fp32" and new.loss == "bce-sigmoid":
        change["loss"] = "bce"
    if new.loader != "dataloader":
        change.update(transform="on-device", **techniques.NO_DATALOADER)
    elif new.num_workers == 0:
        change.update(persistent_workers=False, prefetch_factor=None)
    elif "num_workers" in change and cfg.num_workers == 0:
        change.setdefault("persistent_workers", True)
    return {k: v for k, v in change.items() if getattr(cfg, k) != v}


def checkpointed(cfg: TrainConfig, cand: Candidate) -> Candidate | None:
    """`cand` again with activation checkpointing on for both networks, after it ran out of memory without it:
    memory, not speed, was its limit, and checkpointing trades compute for memory (what it costs is in what is then
    measured). None where the change leaves checkpointing on already, or the pair is invalid (with torch.compile)."""
    if cfg.replace(**cand.change).activation_checkpointing != "off":
        return None
    change = complete(cfg, {**cand.change, "activation_checkpointing": "both"})
    try:
        cfg.replace(**change).validate()
    except ConfigError:
        return None
    return Candidate(change, f"{cand.source}; out of memory without activation checkpointing", cand.prior)


def allowed(change: dict, cfg: TrainConfig, space: tuple, cpu_tensors: bool = True) -> bool:
    """Only speed knobs and the fields in the space may change, plus bce-sigmoid -> bce; at least one field of the
    change must be in the space. With a dataset whose tensors are not on the CPU (`cpu_tensors`
    False: `data.returns_cpu_tensors`), never workers or pinned memory (`loaders.make_loader` says why)."""
    fine = set(speed_knobs()) | set(space)
    ok = all(k in fine or (k == "loss" and cfg.loss == "bce-sigmoid" and v == "bce") for k, v in change.items())
    if not cpu_tensors and (change.get("num_workers") or change.get("pin_memory")):
        return False
    return ok and any(k in space for k in change)


def search_space(cfg: TrainConfig, device: torch.device, space=None, own_dataset: bool = False,
                 main_thread: bool = True, cpu_tensors: bool = True) -> tuple[list, list]:
    """Every change of the fields in `space` worth trying from `cfg` on `device`: each technique's candidates
    (`techniques.TECHNIQUES`, which say what each offers and why a value is left out here), likeliest gain first
    (`PRIOR`; among equals, the list's order), each completed to a valid config (`complete`). batch_size is out of
    the default space: a bigger batch means fewer optimizer steps per image, so it changes what is learned, and the
    quality check would then most likely spend the budget undoing it (evidence: docs/benchmark.md).

    Args:
        cfg: the config to start from.
        device: where it trains.
        space: the fields tune may change (default: `default_space()`).
        own_dataset: a dataset of your own (it brings its own transforms).
        main_thread: False in a background thread, where CUDA graphs are refused.
        cpu_tensors: whether the dataset returns CPU tensors (workers and pinning need them: `loaders.make_loader`).
    Returns:
        (candidates, skipped): the `Candidate`s, and (field=value, reason) for each value left out here.
    """
    from ..speed import check

    space = tuple(space if space is not None else default_space())
    where = techniques.Where(device=device, compile_ok="compile" not in space or bench.can_compile(device),
                             validated=lambda name: check.validated(name, device), main_thread=main_thread,
                             own_dataset=own_dataset, cpu_tensors=cpu_tensors, cores=os.cpu_count() or 1)
    side = 1 if where.cuda else 0
    candidates, skipped = [], []
    for t in techniques.TECHNIQUES:
        if t.knob not in space:
            continue
        for offer in t.candidates(cfg, where):
            if offer.why:
                skipped.append((offer.label, offer.why))
            elif getattr(cfg, offer.field) != offer.value:
                full = offer.exact or complete(cfg, {offer.field: offer.value})
                if full and allowed(offer.change if offer.exact else full, cfg, space):
                    candidates.append(Candidate(full, "search space", t.prior[side]))
    candidates.sort(key=lambda cand: -cand.prior)  # stable: the list's order among equals
    return candidates, skipped
