"""The doctor's findings: one pure function per rule, over the report of this run and the machine's facts (given
as data, never queried here), each returning a `Finding` or None. `RULES` lists them; `findings` applies them all.

Each rule needs evidence from this run; a finding's gain is Amdahl's law on measured shares (`measuring.amdahl`),
or None ("measure it") where no model of its gain exists."""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from ...measuring.protocol import amdahl
from ...core.techniques import notebook
from . import names
from .compile import RULES as COMPILE_RULES
from .pipeline import decoded_once_file
from .memory import RULES as MEMORY_RULES
from ..watching.frames import shown
from ..watching.observations import NCHW
from .penalties import RULES as PENALTY_RULES
from .reads import YOUR_LOOP, host_sync, read_feeds_training
from .report import MIN_GAIN, MIN_SHARE, DoctorReport, Finding

G_BACKWARD_IN_D_STEP = "G backward (D step)"  # the phase: D's loss backpropagated into G before D's optimizer stepped


@dataclass(frozen=True)
class MachineFacts:
    """What the rules know of the machine the loop ran on (captured once by the analysis)."""

    cuda: bool = False                      # the loop ran on a CUDA device
    compute_capability: tuple | None = None  # (major, minor) of that GPU
    bf16: bool = True                       # bf16 autocast runs there (hardware.supports_bf16), else fp16
    fast16: bool = True                     # 16-bit autocast beats fp32 there (hardware.fast_16bit)
    workers: int = 1                        # DataLoader workers to suggest (profiling.suggested_workers)
    cudnn_benchmark: bool = False           # torch.backends.cudnn.benchmark
    tf32: bool = False                      # TF32 matmuls on (hardware.tf32_matmuls)
    gpu: str | None = None                  # the GPU's name
    cpus: int = 1                           # CPU cores the process may use




def _names(r: DoctorReport) -> tuple:
    """How your code names G, D and their optimizers (for the snippets)."""
    names = {role: r.models.get(role, {}).get("name", role) for role in ("G", "D")}
    opts = {o["role"]: o["name"] for o in r.optimizers.values() if o.get("role")}
    return names["G"], names["D"], opts.get("G", "optimizerG"), opts.get("D", "optimizerD")


def _built(x: dict) -> str:
    """" built at FILE:LINE" for an optimizer or DataLoader whose constructor the doctor saw in your code."""
    at = x.get("built_at")
    return f" built at {shown(at[0])}:{at[1]}" if at else ""


def _slow_loader(r: DoctorReport) -> dict | None:
    """The first DataLoader doing per-image work or without workers, when waiting for data is worth a finding."""
    loaders = [x for x in r.settings["dataloaders"] if x["per_image_work"] or x["num_workers"] == 0]
    wait = r.phases_ms.get("data wait", 0.0)
    return loaders[0] if wait / r.step_time_ms >= MIN_SHARE and loaders else None


def _data_seen(r: DoctorReport, loader: dict) -> str:
    s, step, wait = r.settings, r.step_time_ms, r.phases_ms.get("data wait", 0.0)
    for_line = f"; batches taken at {s['data_site']}" if s.get("data_site") else ""
    return (f"waiting for data {wait:.1f} ms of a {step:.1f} ms iteration ({100 * wait / step:.0f}%); "
            f"DataLoader(batch_size={loader['batch_size']}, num_workers={loader['num_workers']})"
            f"{_built(loader)} over "
            f"{loader['per_image_work'] or loader['dataset']}{for_line}")


def decode_per_item(r: DoctorReport, facts: MachineFacts) -> Finding | None:
    """A data-bound loop whose dataset opens and decodes an image file for every item, every epoch."""
    wait = r.phases_ms.get("data wait", 0.0)
    loader = next((x for x in r.settings["dataloaders"] if x.get("decode")), None)
    if loader is None or wait / r.step_time_ms < MIN_SHARE:
        return None
    decode = loader["decode"]
    if decode["keep"] == 0 and decode["random"] and decode["steps"][0] in decode["random"]:
        change = (f"# decoding once cannot keep your {decode['steps'][0]}: it draws from the full-size image each "
                  "epoch; decode in workers\n"
                  + names.with_workers(r, facts.workers, "persistent_workers=True, pin_memory=True"))
    else:
        by_hand = (f"# by hand: --try cannot apply it while your script runs ({decode['run_time']})\n"
                   if decode["run_time"] else "")
        change = by_hand + decoded_once_file(r, loader)
    return Finding(
        "decode-per-item", "every image file is opened and decoded again for each item, every epoch",
        _data_seen(r, loader) + ("" if "decode" in (loader["per_image_work"] or "") else f"; {decode['how']}"),
        "decoding a PNG or JPEG and resizing it costs far more than the model's step at GAN sizes, and the loop "
        "repeats it every epoch for the same images"
        + (", in the training process itself (num_workers=0)" if loader["num_workers"] == 0 else "")
        + "; decoded once into a uint8 tensor file, a batch is one index and one copy",
        change, notebook("transform"), amdahl(r.step_time_ms, wait))


def per_sample_transforms(r: DoctorReport, facts: MachineFacts) -> Finding | None:
    loader = _slow_loader(r)
    if loader is None or not loader["per_image_work"] or loader.get("decode"):
        return None
    workers = facts.workers
    return Finding(
        "per-sample-transforms", "every image is decoded and transformed on the host, one at a time",
        _data_seen(r, loader),
        "each image goes through PIL and torchvision transforms in Python on every epoch, "
        + ("in the training process itself (num_workers=0), so the model waits for it"
           if loader["num_workers"] == 0 else "and the workers do not keep up with the step"),
        _decoded_once(r, workers) if not loader["not_decodable_once"] else
        (f"# decoding once would change your data ({loader['not_decodable_once']}): decode in workers\n"
         + names.with_workers(r, workers, "persistent_workers=True, pin_memory=True")),
        notebook("transform"), amdahl(r.step_time_ms, r.phases_ms.get("data wait", 0.0)))


def _decoded_once(r: DoctorReport, workers: int) -> str:
    """The images decoded once and indexed on the device, in your names (your DataLoader's dataset and batch size,
    your batch's name, your device)."""
    real, where = names.images(r)
    device = names.device(r)
    dataset, batch_size, bound = names.loader_parts(r)
    return ("# once, before training: the images decoded a single time, kept as uint8 on the device\n"
            f"{bound}images = torch.stack([(x * 127.5 + 127.5).round().to(torch.uint8) for x, _ in "
            f"{dataset}]).to({device})\n"
            "# each step, instead of the DataLoader's batch: a batch by indexing, normalised on the device\n"
            f"idx = torch.randint(len(images), ({batch_size},), device={device})\n"
            f"{real} = images[idx].float().div_(127.5).sub_(1){where}\n"
            "# too big for the device? keep the DataLoader but decode in workers:\n"
            f"# {names.with_workers(r, workers, 'persistent_workers=True, pin_memory=True')}")


def _pinned(r: DoctorReport) -> str:
    real, where = names.images(r)
    source = real if real != "real" else f"{names.yours(r).get('batch', 'data')}[0]"
    return (f"{names.loader_call(r, 'pin_memory=True')}\n"
            f"{real} = {source}.to({names.device(r)}, non_blocking=True){where}")


def no_workers(r: DoctorReport, facts: MachineFacts) -> Finding | None:
    loader = _slow_loader(r)
    if loader is None or loader["per_image_work"] or loader.get("decode"):
        return None
    return Finding(
        "no-workers", "the DataLoader loads batches in the training process", _data_seen(r, loader),
        "with num_workers=0 every batch is assembled while the model waits; worker processes prepare "
        "the next batches in parallel with the step",
        names.with_workers(r, facts.workers, "persistent_workers=True"),
        notebook("num_workers"), amdahl(r.step_time_ms, r.phases_ms.get("data wait", 0.0)))


def too_many_workers(r: DoctorReport, facts: MachineFacts) -> Finding | None:
    crowded = [x for x in r.settings["dataloaders"] if x["num_workers"] > max(facts.cpus, 1)]
    if not crowded:
        return None
    x = crowded[0]
    return Finding(
        "too-many-workers", "the DataLoader starts more workers than the machine has cores",
        f"DataLoader(num_workers={x['num_workers']}){_built(x)} on {facts.cpus} CPU cores",
        "each worker is a process competing with the training process (and with each other) for the same cores; "
        "past one per core they add start-up time and memory, not batches",
        names.with_workers(r, facts.workers, "persistent_workers=True"),
        notebook("num_workers"), None)


def workers_restart(r: DoctorReport, facts: MachineFacts) -> Finding | None:
    step = r.step_time_ms
    batches_per_iteration = r.images_per_step / r.batch_size if r.images_per_step and r.batch_size else 1.0
    for x in r.settings["dataloaders"]:
        ms, batches = x.get("epoch_start_ms"), x.get("batches_per_epoch")
        if not (x["num_workers"] > 0 and not x["persistent_workers"] and ms and batches):
            continue
        per_iteration = ms * batches_per_iteration / batches
        gain = amdahl(step, min(per_iteration, step))
        if gain < MIN_GAIN:
            continue
        return Finding(
            "workers-restart", "the DataLoader starts its workers again every epoch",
            f"DataLoader(num_workers={x['num_workers']}, persistent_workers=False){_built(x)}: each epoch's start "
            f"takes {ms:.0f} ms to its first batch, over {batches} batches an epoch: {per_iteration:.1f} ms per "
            f"iteration ({100 * per_iteration / step:.0f}% of a {step:.1f} ms iteration)",
            "without persistent workers every epoch's iterator starts new worker processes, which (with spawn, the "
            "default on macOS and Windows) import torch and your script again, and the loop waits for their first "
            "batches; persistent workers start once",
            names.loader_call(r, f"num_workers={x['num_workers']}, persistent_workers=True"),
            notebook("num_workers"), gain)
    return None


def pin_memory(r: DoctorReport, facts: MachineFacts) -> Finding | None:
    s, step = r.settings, r.step_time_ms
    h2d = s.get("h2d_copy_ms", 0.0)
    if not (facts.cuda and h2d / step >= MIN_SHARE and any(not x["pin_memory"] for x in s["dataloaders"])):
        return None
    return Finding(
        "pin-memory", "batches are copied to the GPU from pageable memory",
        f"host-to-device copies {h2d:.1f} ms per iteration ({100 * h2d / step:.0f}%), pin_memory=False",
        "a copy from pageable memory is staged through a pinned buffer and cannot overlap with compute",
        _pinned(r),
        notebook("pin_memory"), None)


def _bce_ops(r: DoctorReport) -> dict:
    return {k: v for k, v in r.settings.get("loss_ops_per_iteration", {}).items()
            if k == "aten::binary_cross_entropy"}


def sigmoid_bce(r: DoctorReport, facts: MachineFacts) -> Finding | None:
    bce = _bce_ops(r)
    if not bce:
        return None
    s, d = r.settings, _names(r)[1]
    cls = r.models.get("D", {})
    defined = (f", class {cls['class']} in {shown(cls['defined_in'])}" if cls.get("defined_in") else "")
    path, head = s.get("d_final_sigmoid"), s.get("d_sigmoid_output")
    where = (f"; {d}'s output {head} comes from nn.Sigmoid ({d}.{path}{defined})"
             if path and head is not None else f"; {d} ends in nn.Sigmoid ({d}.{path}{defined})" if path else "")
    change = (f"remove the nn.Sigmoid() of the head that makes its output {head} ({d}.{path}); that output is "
              "logits now" if path and head is not None else
              "remove the final nn.Sigmoid(); it returns logits now" if path else
              "take off the sigmoid it applies to what it returns; it returns logits now")
    return Finding(
        "sigmoid-bce", "D's probabilities go into BCELoss",
        f"aten::binary_cross_entropy {sum(bce.values()):g} times per iteration{where}",
        "a sigmoid rounds to exactly 1.0 in 16-bit for logits above about 6, and log(1 - p) becomes log(0) "
        "(BCELoss clamps it to -100: no gradient); BCELoss is refused under autocast on CUDA. "
        "BCEWithLogitsLoss computes the same loss from logits, stably, in one op",
        f"# {d}: {change}\n"
        "# your BCE loss on its output: nn.BCELoss() becomes nn.BCEWithLogitsLoss(),\n"
        "# F.binary_cross_entropy becomes F.binary_cross_entropy_with_logits\n"
        f"# where you report {d}'s probabilities (D(x), an accuracy): its output read through .sigmoid()",
        notebook("precision"), None)


def _fp32_outputs(r: DoctorReport) -> dict:
    return {k: v for k, v in r.settings["conv_linear_outputs"].items() if k == "float32"}


def fp32_convolutions(r: DoctorReport, facts: MachineFacts) -> Finding | None:
    step = r.step_time_ms
    compute = r.compute_share * r.device_busy_ms
    fp32 = _fp32_outputs(r)
    gain16 = amdahl(step, compute / 2)
    if not (fp32 and not r.settings["autocast"] and gain16 >= MIN_GAIN and facts.fast16):
        return None  # a CPU without native bf16 emulates it, slower than fp32: nothing to propose
    _, d, _, opt_d = _names(r)
    first = (f"# first drop {d}'s Sigmoid and use nn.BCEWithLogitsLoss (BCELoss refuses autocast)\n"
             if _bce_ops(r) else "")
    lines = names.call_lines(r, "G", "D")
    bf16 = facts.bf16  # a GPU before Ampere: fp16, with a GradScaler
    # GradScaler.step reads found_inf back (.item(), a host sync) for every optimizer but a fused one
    # (torch/amp/grad_scaler.py, pytorch/pytorch#80167)
    unfused = [o for o in r.optimizers.values() if o.get("role") and not o["implementation"].startswith("fused")
               and faster_impl(o["class"]) == "fused=True"]
    fused = ("\n# fused optimizers: GradScaler.step then reads nothing back (with any other, a host sync per step)"
             + "".join(f"\n{o['name']} = torch.optim.{o['class']}(..., fused=True)" for o in unfused)
             ) if unfused else ""
    return Finding(
        "fp32-convolutions", "convolutions and matmuls run in fp32",
        f"{sum(fp32.values()):g} Conv/Linear outputs per iteration in float32, autocast off; convolutions and "
        f"matmuls take {compute:.1f} ms of a {step:.1f} ms iteration ({100 * compute / step:.0f}%)",
        "autocast runs them in 16-bit (half the bytes, and the fast units of recent CPUs and GPUs) while "
        "keeping sensitive ops in fp32; the estimate assumes it halves their time",
        first + (_autocast_yours(r, lines, bf16) if lines else
                 f"with torch.autocast(device.type, dtype=torch.{'bfloat16' if bf16 else 'float16'}):  "
                 f"# each forward and its loss\n    output = {d}(real).view(-1)\n"
                 "    errD_real = criterion(output.float(), label)\n")
        + ("# backward and optimizer steps stay outside" if bf16 else
           "# fp16: one torch.amp.GradScaler('cuda') per network, your backward and step through it:\n"
           "scaler_d = torch.amp.GradScaler('cuda')  # before the loop\n"
           f"# scaler_d.scale(<{d}'s loss>).backward(); scaler_d.step({opt_d}); scaler_d.update(){fused}"),
        notebook("precision"), gain16)


def _autocast_yours(r: DoctorReport, lines: list, bf16: bool) -> str:
    """Your own lines that call G or D, the first shown under the `with` (each goes under one, with its loss)."""
    where, code = lines[0]
    dtype = "bfloat16" if bf16 else "float16"
    return (f"with torch.autocast({names.device_type(r)}, dtype=torch.{dtype}):  # around each of your lines that "
            f"call G or D, with its loss: lines {names.line_numbers(lines)}\n    {code}  # your line {where}\n")


def _channels_last_batch(r: DoctorReport) -> str:
    real, where = names.images(r)
    if real == "real" and names.yours(r).get("batch"):
        return f"# your batch's images, {names.yours(r)['batch']}[0]: .contiguous(memory_format=torch.channels_last)"
    return f"{real} = {real}.contiguous(memory_format=torch.channels_last){where}"


def d_grads_in_g_step(r: DoctorReport, facts: MachineFacts) -> Finding | None:
    step = r.step_time_ms
    grads = r.settings.get("d_grads_in_g_step", 0)
    d_bwd = r.phases_ms.get("D backward (G step)", 0.0)
    if not (grads and d_bwd > 0 and amdahl(step, d_bwd / 2) >= MIN_GAIN):
        return None
    g, d, opt_g, opt_d = _names(r)
    call = names.yours(r).get("g_step_d_call")
    where, code = call if call else ("", "")
    return Finding(
        "d-grads-in-g-step", f"{d} computes weight gradients in G's step",
        f"{grads:g} of {d}'s parameter gradients accumulated per iteration before {opt_g} stepped; "
        f"D backward (G step) takes {d_bwd:.1f} ms ({100 * d_bwd / step:.0f}%)",
        f"G's loss must flow back through {d} to reach {g}, but {d}'s own weight gradients are thrown away "
        f"({opt_d} zeroes them before using them); freezing {d} skips them. The estimate assumes they are half "
        f"of {d}'s backward there",
        f"{d}.requires_grad_(False)  # G's step: gradients flow through {d} to {g}, none stored for {d}\n"
        + (f"{code}  # your line {where}\n{d}.requires_grad_(True)  # (the graph is recorded: gradients still flow "
           f"through it to {g})" if call else
           f"output = {d}(fake).view(-1)\nerrG = criterion(output, label)\nerrG.backward()\n{opt_g}.step()\n"
           f"{d}.requires_grad_(True)"),
        YOUR_LOOP, amdahl(step, d_bwd / 2))


def g_grads_in_d_step(r: DoctorReport, facts: MachineFacts) -> Finding | None:
    """G's weight gradients computed in D's step (`d_grads_in_g_step`'s mirror): fakes that reach D's loss with their
    graph back to G."""
    step = r.step_time_ms
    grads = r.settings.get("g_grads_in_d_step", 0)
    g_bwd = r.phases_ms.get(G_BACKWARD_IN_D_STEP, 0.0)
    if not (grads and g_bwd > 0 and amdahl(step, g_bwd) >= MIN_GAIN):
        return None
    g, d, opt_g, opt_d = _names(r)
    return Finding(
        "g-grads-in-d-step", f"{d}'s step backpropagates into {g}",
        f"{grads:g} of {g}'s parameter gradients accumulated per iteration before {opt_d} stepped; "
        f"{G_BACKWARD_IN_D_STEP} takes {g_bwd:.1f} ms ({100 * g_bwd / step:.0f}%)",
        f"the fakes reach {d}'s loss with their graph back to {g} (not detached, not made under torch.no_grad()), "
        f"so {d}'s backward runs on through {g}; {opt_d} steps {d} alone, and {g}'s gradients are thrown away when "
        f"{opt_g}.zero_grad() runs before {g}'s step. Detached where they enter {d}'s step, the fakes have the same "
        f"values: {d}'s gradients and losses stay as they are. The estimate assumes all of {G_BACKWARD_IN_D_STEP} "
        "goes",
        f"# {d}'s step, where {g}'s fakes enter it: {d}(<the fakes>.detach()), without their graph back to {g}",
        YOUR_LOOP, amdahl(step, g_bwd))


def optimizer_for_loop(r: DoctorReport, facts: MachineFacts) -> Finding | None:
    step = r.step_time_ms
    opt_ms = sum(ms for k, ms in r.phases_ms.items() if k.endswith("optimizer step"))
    loops = [o for o in r.optimizers.values() if o["implementation"].startswith("for-loop")]
    if not (loops and opt_ms / step >= MIN_SHARE):
        return None
    return Finding(
        "optimizer-for-loop", "the optimizers update one parameter at a time",
        f"{', '.join(o['name'] + _built(o) for o in loops)}: {loops[0]['implementation']}; optimizer steps take "
        f"{opt_ms:.1f} ms ({100 * opt_ms / step:.0f}%)",
        "the for-loop implementation launches several small ops per parameter; fused (or foreach) updates all "
        "parameters in a few kernels",
        "\n".join(f"# {o['name']}: add {faster_impl(o['class'])} to its constructor{_built(o).replace(' built', '')}, "
                  f"keeping your other arguments\n{o['name']} = torch.optim.{o['class']}(..., "
                  f"{faster_impl(o['class'])})" for o in loops),
        notebook("optimizer_impl"), None)


def channels_last(r: DoctorReport, facts: MachineFacts) -> Finding | None:
    nchw = r.settings["conv_input_formats"].get(NCHW, 0)
    if not (nchw and r.compute_share >= 0.5 and fp32_convolutions(r, facts) is None):
        return None
    g, d = _names(r)[:2]
    return Finding(
        "channels-last", "convolutions run in NCHW",
        f"{nchw:g} convolutions per iteration run in NCHW (input and weights); convolutions and matmuls are "
        f"{100 * r.compute_share:.0f}% of the busy time",
        "cuDNN's and oneDNN's fastest 16-bit convolution kernels work on channels_last (NHWC), which a convolution "
        "runs in once its weights are (G's and D's), whatever the batch's layout",
        f"{g} = {g}.to(memory_format=torch.channels_last)\n{d} = {d}.to(memory_format=torch.channels_last)\n"
        + _channels_last_batch(r),
        notebook("channels_last"), None)


def cudnn_benchmark(r: DoctorReport, facts: MachineFacts) -> Finding | None:
    if not (facts.cuda and r.compute_share >= 0.5 and not facts.cudnn_benchmark
            and r.settings["fixed_conv_shapes"]):
        return None
    return Finding(
        "cudnn-benchmark", "cuDNN picks convolution algorithms by heuristics",
        f"torch.backends.cudnn.benchmark is False; every convolution saw one input shape; convolutions are "
        f"{100 * r.compute_share:.0f}% of the busy time",
        "with fixed shapes, benchmark mode times the candidate algorithms once and keeps the fastest",
        "torch.backends.cudnn.benchmark = True  # before the loop", notebook("cudnn_benchmark"), None)


def tf32(r: DoctorReport, facts: MachineFacts) -> Finding | None:
    ampere = facts.cuda and facts.compute_capability is not None and facts.compute_capability[0] >= 8
    if not (ampere and _fp32_outputs(r) and not r.settings["autocast"] and not facts.tf32):
        return None
    # the documented switch on every torch version; not `matmul.fp32_precision = "tf32"`, which breaks
    # torch.compile on torch 2.9-2.11 (see process.backend_flags)
    snippet = ('torch.set_float32_matmul_precision("high")  # TF32 matmuls\n'
               "torch.backends.cudnn.allow_tf32 = True  # TF32 convolutions (PyTorch's default)")
    return Finding(
        "tf32", "fp32 matmuls and convolutions run without TF32",
        f"fp32 Conv/Linear outputs, TF32 off, on {facts.gpu}",
        "Ampere and newer GPUs run fp32 matmuls and convolutions on tensor cores in TF32 (10-bit mantissa) "
        "several times faster; bf16 autocast (above) goes further", snippet, notebook("tf32"), None)


def not_judged(facts: MachineFacts) -> list:
    """What a run on this device cannot tell, so a CPU's advice is not read as a GPU's."""
    if facts.cuda:
        return [] if facts.bf16 else ["bf16 autocast (this GPU runs fp16 with a GradScaler instead)"]
    return ["pinned memory and host-to-device copies (no GPU here)",
            "the GPU cost of host syncs such as .item() (no device to wait for)",
            "fp16 with a GradScaler, cudnn.benchmark, TF32 and torch.compile (CUDA settings)"]


RULES = (decode_per_item, per_sample_transforms, no_workers, too_many_workers, workers_restart, pin_memory,
         host_sync, read_feeds_training, sigmoid_bce, fp32_convolutions, d_grads_in_g_step, g_grads_in_d_step,
         optimizer_for_loop, channels_last, cudnn_benchmark, tf32, *COMPILE_RULES,
         *MEMORY_RULES, *PENALTY_RULES)


def findings(r: DoctorReport, facts: MachineFacts) -> list:
    """Every rule's finding, ranked by estimated gain (unknown gains last; ties in `RULES`' order)."""
    found = [f for f in (rule(r, facts) for rule in RULES) if f is not None]
    return sorted(found, key=lambda f: -(f.estimated_speedup or 0.0))


def faster_impl(name: str) -> str:
    """The keyword that selects an optimizer's fastest implementation, as your code would write it.

    Args:
        name: a torch.optim class name.

    Returns:
        `fused=True` where the optimizer class takes it (Adam, AdamW, SGD, ...), else `foreach=True` (all built-ins).
    """
    cls = getattr(torch.optim, name, None)
    takes = inspect.signature(cls).parameters if cls is not None else {}
    return "fused=True" if "fused" in takes else "foreach=True"
