"""The doctor's findings about memory, read from `report.settings["memory"]` (one warm-up iteration measured by
`watching.memory`): a batch far below what the GPU has room for, and activations that dominate a peak near the GPU's
limit. Both need a GPU's room to judge: a CPU swaps rather than refuse, so there the report shows the parts and
judges nothing. Neither finding is a speed-up the doctor can estimate (None: measure it); notebook 08 measures both
levers on the tutorial's GAN."""
from __future__ import annotations

import math

from ...core.techniques import MEMORY
from . import names
from .report import DoctorReport, Finding

FAR = 4        # a batch at least this many times smaller than what fits is far below it
TIGHT = 0.75   # a peak at this share of the room or more: memory is the limit
STEP_UP = 8    # the most the change multiplies a batch by: more changes training too much to take in one step
LEARN = MEMORY.removesuffix(".ipynb")


def _memory(r: DoctorReport) -> dict:
    m = r.settings.get("memory") or {}
    return m if m.get("peak_mb") and m.get("room_mb") else {}


def fits_at_least(m: dict, batch: int) -> int | None:
    """About how large a batch fits, from one measured batch: weights and optimizer state are live whatever the
    batch; the rest of the peak (gradients among it, at most all of them) is taken to grow with it in proportion, as
    memory does in the batch (`speed.batch_fit`). An estimate: the allocator's rounding and a library's workspace
    are not in it, so `largest_batch` tries a batch for real."""
    parts = m["parts_mb"]
    fixed = parts.get("weights", 0.0) + parts.get("optimizer state", 0.0)
    growing = m["peak_mb"] - fixed
    if growing <= 0 or m["room_mb"] <= m["peak_mb"]:
        return None
    return math.floor(batch * (m["room_mb"] - fixed) / growing)


def batch_below_memory(r: DoctorReport, facts) -> Finding | None:
    m = _memory(r)
    if not (facts.cuda and m and r.batch_size):
        return None
    fits = fits_at_least(m, r.batch_size)
    if fits is None or fits < FAR * r.batch_size:
        return None
    k = min(2 ** int(math.log2(fits / r.batch_size)), STEP_UP)  # a power of two times yours, within what fits
    return Finding(
        "batch-below-memory", "the batch uses a small part of the GPU's memory",
        f"batch {r.batch_size}: peak {m['peak_mb']:.0f} MB of the {m['room_mb']:.0f} MB this process could reach "
        f"on the GPU ({100 * m['peak_mb'] / m['room_mb']:.0f}%); weights and optimizer state need "
        f"{m['parts_mb'].get('weights', 0.0) + m['parts_mb'].get('optimizer state', 0.0):.0f} MB whatever the "
        f"batch, and if the rest grows with it, a batch of about {fits} fits",
        "a small batch gives each kernel little work: a GAN of this size can then be bound by launching kernels "
        "rather than by computing, and a larger batch trains more images per launch (the verdict above says which "
        "bounds this loop). It also means fewer optimizer steps per image, so it changes what is learned: scale "
        "the learning rates and check quality at equal images",
        f"{names.loader_call(r, f'batch_size={k * r.batch_size}')}  # {k}x: about {fits} fit\n"
        + "".join(f"for group in {o['name']}.param_groups:  # sqrt({k}): a larger batch's usual correction\n"
                  f"    group['lr'] *= {math.sqrt(k):.3g}\n" for o in r.optimizers.values() if o.get("role"))
        + "# then compare samples and FID at equal images\n"
        "# the largest batch that fits, tried for real: gantools.speed.batch_fit.largest_batch (gantools' trainer)",
        LEARN, None)


def _forward(r: DoctorReport) -> str:
    """G's forward under the `with`: your line that calls it, where the doctor read it."""
    lines = names.call_lines(r, "G")
    if not lines:
        return f"    fake = {names.model(r, 'G')}(noise)  # each forward and its loss; backward and steps outside\n"
    return (f"    {lines[0][1]}  # your line {lines[0][0]}; each forward and its loss "
            f"(lines {names.line_numbers(names.call_lines(r, 'G', 'D'))}); backward and steps outside\n")


def activation_memory(r: DoctorReport, facts) -> Finding | None:
    m = _memory(r)
    parts = m.get("parts_mb", {})
    acts = parts.get("activations")
    if not (facts.cuda and acts and m["largest"] == "activations" and m["peak_mb"] >= TIGHT * m["room_mb"]):
        return None
    by = ", ".join(f"{name} {mb:.0f} MB" for name, mb in m["activations_by_network_mb"].items())
    wide = m["activations_32bit_share"] or 0.0
    scaler = "" if facts.bf16 else ("# fp16: a torch.amp.GradScaler('cuda') per network: "
                                    "scaler.scale(loss).backward(), scaler.step(opt); scaler.update()\n")
    half = ("# 16-bit autocast stores the activations of convolutions and matmuls at half the bytes:\n"
            f"with torch.autocast('cuda', dtype=torch.{'bfloat16' if facts.bf16 else 'float16'}):\n"
            + _forward(r) + scaler
            if wide >= 0.5 and not r.settings.get("autocast") else "")
    return Finding(
        "activation-memory", "activations saved for backward fill most of the GPU's memory",
        f"peak {m['peak_mb']:.0f} MB of the {m['room_mb']:.0f} MB this process could reach; activations saved for "
        f"backward {acts:.0f} MB at their most ({by}), {100 * wide:.0f}% of them 32-bit; weights "
        f"{parts.get('weights', 0.0):.0f} MB, optimizer state {parts.get('optimizer state', 0.0):.0f} MB",
        "memory is the limit here and activations are most of it: they grow with the batch, and two levers shrink "
        "them without changing the model: 16-bit activations (half the bytes each) and activation checkpointing "
        "(keep each block's input, recompute the block in backward: less memory for one more forward's time). "
        "Notebook 08 measures both",
        f"{half}from torch.utils.checkpoint import checkpoint\n"
        "# in a network's forward, per block; the recomputation updates BatchNorm's running statistics a second\n"
        "# time (pytorch/pytorch#96136): gantools.core.activation_checkpointing keeps them exact\n"
        "# x = checkpoint(block, x, use_reentrant=False)  # block: a part of your network, x: its input",
        LEARN, None)


RULES = (batch_below_memory, activation_memory)
