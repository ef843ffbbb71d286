"""The doctor's findings about a DistributedDataParallel loop, in `rules`' style (one pure function per rule over the
report, returning a `Finding` or None), read from `report.settings["ddp"]`: what every process showed (`ddp`,
gathered by `ranks`). Gains are Amdahl's law on the measured collective times, or None ("measure it")."""
from __future__ import annotations

from ...core.techniques import notebook
from ...measuring.protocol import amdahl
from .report import DoctorReport, Finding
from .rules import MIN_GAIN, MIN_SHARE

DDP_DOCS = "docs/torchrun.md"  # the page on several processes (it points on to notebooks/10_several_gpus)


def _gain(step: float, saved_ms: float) -> float | None:
    gain = amdahl(step, min(max(saved_ms, 0.0), step))
    return gain if gain >= MIN_GAIN else None


def all_reduce_wait(r: DoctorReport, ddp: dict) -> Finding | None:
    """The step waits for gradient all-reduces that did not overlap backward."""
    exposed, step = ddp.get("exposed_ms"), r.step_time_ms
    if exposed is None or exposed / step < MIN_SHARE:
        return None
    return Finding(
        "ddp-all-reduce-wait", "the step waits for the gradient all-reduce after backward",
        f"{ddp['all_reduces_per_iteration']:g} all-reduces per iteration take {ddp['all_reduce_ms']:.1f} ms; "
        f"{100 * (ddp['overlap'] or 0):.0f}% of that ran while backward still computed, {exposed:.1f} ms after it "
        f"({100 * exposed / step:.0f}% of a {step:.1f} ms iteration) on {ddp['world_size']} processes over "
        f"{ddp.get('backend')}",
        "DDP all-reduces each bucket of gradients as soon as backward has filled it, but the last buckets (the "
        "first layers) are only ready when backward ends, and optimizer.step() waits for them. Fewer, larger "
        "exchanges per image (a bigger batch per process, or accumulation with no_sync) spread that wait over more "
        "work; smaller buckets start sooner",
        "# more images per all-reduce: a larger per-process batch, or accumulate micro-batches under no_sync()\n"
        "netD = DDP(discriminator, ..., gradient_as_bucket_view=True)  # no copy between buckets and .grad\n"
        "# GPUs over NCCL: halve the bytes sent (gradients averaged in bf16)\n"
        "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
        "netD.register_comm_hook(None, default_hooks.bf16_compress_hook)",
        DDP_DOCS, _gain(step, exposed))


def accumulation_without_no_sync(r: DoctorReport, ddp: dict) -> Finding | None:
    """Several backward passes per optimizer step into a DDP module that never entered no_sync(): one all-reduce
    each, where the last one alone is needed."""
    models = [m for m in ddp["models"] if not m["no_sync_seen"] and (m["backward_passes_per_step"] or 0) > 1.5]
    if not models:
        return None
    weight = {m["name"]: m["parameters"] * (m["backward_passes_per_step"] or 1) for m in ddp["models"]}
    spared = sum(m["parameters"] * (m["backward_passes_per_step"] - 1) for m in models) / max(sum(weight.values()), 1)
    seen = "; ".join(f"{m['backward_passes_per_step']:g} backward passes reach {m['name']}'s parameters per "
                     f"optimizer step (called at {', '.join(m['called_at'][:3])})" for m in models)
    name = models[0]["name"]
    return Finding(
        "ddp-no-sync", f"each backward all-reduces {' and '.join(m['name'] + chr(39) + 's' for m in models)} "
                       "gradients, not only the last before the step",
        f"{seen}; {' and '.join(m['name'] + '.no_sync()' for m in models)} never entered; "
        f"{ddp.get('all_reduces_per_iteration', 0):g} all-reduces per iteration in all, "
        f"{ddp.get('all_reduce_ms', 0.0):.1f} ms",
        "DDP averages the gradients over the processes at every backward of a forward run outside no_sync(), so a "
        "step that accumulates k backward passes exchanges its gradients k times; only the sum at the step needs "
        "averaging. DDP decides at the forward, so the forward goes inside the block too. The estimate assumes the "
        "all-reduce wait scales with the gradient bytes exchanged",
        "import contextlib\n"
        f"for k, micro in enumerate(micro_batches):  # or the backward calls of one step, as in D's real/fake halves\n"
        f"    last = k == len(micro_batches) - 1\n"
        f"    with {name}.no_sync() if not last else contextlib.nullcontext():  # no all-reduce before the last\n"
        f"        output = {name}(micro)  # the forward inside: DDP decides at the forward\n"
        "        loss = criterion(output, label) / len(micro_batches)\n"
        "        loss.backward()\n"
        "optimizer.step()",
        notebook("grad_accum_steps"), _gain(r.step_time_ms, (ddp.get("exposed_ms") or 0.0) * spared))


def same_images_on_every_rank(r: DoctorReport, ddp: dict) -> Finding | None:
    """A DataLoader without a DistributedSampler: every process walks the whole dataset."""
    loaders = [x for x in ddp.get("loaders", []) if not x["distributed"]]
    if not loaders:
        return None
    x, n = loaders[0], ddp["world_size"]
    same = ddp.get("same_batches") or []
    identical = bool(same) and all(k == total and total for k, total in same)
    compared = (f"; the first {same[0][1]} batches of rank 0 and rank 1 were identical" if identical else
                "; the processes drew different batches (each shuffles with its own seed), from the same images"
                if same and same[0][1] else "")
    images = f" over {x['images']} images" if x["images"] else ""
    return Finding(
        "ddp-no-sampler", "every process reads the same images" if identical else
        "every process reads the whole dataset, not its own share",
        f"DataLoader{' built at ' + x['built_at'] if x['built_at'] else ''}{images} with {x['sampler']} on each of "
        f"the {n} processes, no DistributedSampler{compared}",
        f"without a DistributedSampler each of the {n} processes goes through all the images every epoch: "
        + (f"with the same seed they compute the same gradients, so the {n} processes train as one does, "
           f"{n} times over" if identical else f"an epoch is {n} passes over the data, and images repeat within a "
                                                "step") + ". The estimate is the distinct images per step gained",
        "from torch.utils.data.distributed import DistributedSampler\n"
        "sampler = DistributedSampler(dataset)  # each process its own 1/N of the images, shuffled\n"
        "dataloader = DataLoader(dataset, batch_size=..., sampler=sampler, ...)  # drop shuffle=True: the sampler "
        "shuffles\n"
        "for epoch in range(num_epochs):\n"
        "    sampler.set_epoch(epoch)  # a new order each epoch, the same split on every process",
        DDP_DOCS, float(n) if identical else None)


def find_unused_parameters(r: DoctorReport, ddp: dict) -> Finding | None:
    models = [m for m in ddp["models"] if m["find_unused_parameters"]]
    if not models:
        return None
    return Finding(
        "ddp-find-unused-parameters", "DDP searches the autograd graph for unused parameters after every forward",
        "; ".join(f"DDP({m['name']}, find_unused_parameters=True)"
                  + (f" built at {m['built_at']}" if m["built_at"] else "") for m in models),
        "with find_unused_parameters=True DDP walks the graph from the outputs after each forward to mark the "
        "parameters that will get no gradient, and cannot start an all-reduce until it knows; a GAN's G and D "
        "use all their parameters in every forward",
        "\n".join(f"{m['name']} = DDP({m['class'].lower()}, ...)  # find_unused_parameters=False, the default"
                  for m in models)
        + "\n# some parameters really unused, the same ones every step: DDP(..., static_graph=True)",
        DDP_DOCS, None)


def broadcast_buffers(r: DoctorReport, ddp: dict) -> Finding | None:
    models = [m for m in ddp["models"] if m["broadcast_buffers"] and m["batchnorm"]]
    if not models:
        return None
    ms, step = ddp.get("broadcast_ms", 0.0), r.step_time_ms
    measured = (f"; {ddp.get('broadcasts_per_iteration', 0):g} broadcasts per iteration, {ms:.1f} ms "
                f"({100 * ms / step:.0f}%)") if ms else ""
    return Finding(
        "ddp-broadcast-buffers", "DDP copies rank 0's BatchNorm statistics into every process before each forward",
        "; ".join(f"DDP({m['name']}){' built at ' + m['built_at'] if m['built_at'] else ''}: broadcast_buffers=True "
                  f"(the default) and {m['batchnorm']} BatchNorm layers" for m in models) + measured,
        "each forward of a DDP module with buffers waits for a broadcast of rank 0's running statistics; a GAN "
        "runs D two or three times per iteration. When D runs twice before one backward (real, then fake), that "
        "in-place copy also changes statistics the first forward's graph still needs: on CUDA the backward fails "
        "(\"modified by an inplace operation\"). Running statistics matter only for evaluation",
        "".join(f"{m['name']} = DDP({m['class'].lower()}, ..., broadcast_buffers=False)  # its own statistics in "
                "each process\n" for m in models)
        + "# or the same statistics everywhere, at one all-reduce per BatchNorm layer per forward:\n"
        + "".join(f"# {m['class'].lower()} = nn.SyncBatchNorm.convert_sync_batchnorm({m['class'].lower()})\n"
                  for m in models).rstrip("\n"),
        DDP_DOCS, _gain(step, ms))


DDP_RULES = (all_reduce_wait, accumulation_without_no_sync, same_images_on_every_rank, find_unused_parameters,
             broadcast_buffers)


def ddp_findings(r: DoctorReport) -> list:
    """Every DDP rule's finding for a report carrying `settings["ddp"]` (none without it)."""
    ddp = r.settings.get("ddp")
    if not ddp:
        return []
    return [f for f in (rule(r, ddp) for rule in DDP_RULES) if f is not None]
