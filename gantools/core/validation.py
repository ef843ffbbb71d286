"""Every value check of a TrainConfig, one function per group of fields; `TrainConfig.validate` runs them (after the
type checks) and lists every problem at once. Each check adds a message that names the field and what to change."""
from __future__ import annotations

import math
import os
from dataclasses import fields

import torch

from . import distributed
from .r3gan import IMAGE_SIZES as R3GAN_SIZES
from .r3gan import stage_count
from ..measuring import hardware


class _Problems:
    """The problems found so far, and the checks many fields share: each adds its message when the value fails,
    and says whether it passed (later checks that assume the value is sane then skip)."""

    def __init__(self, cfg):
        self.cfg, self.found = cfg, []
        self.knobs = {f.name: f.metadata["knob"] for f in fields(cfg)}

    def add(self, message: str) -> None:
        self.found.append(message)

    def default(self, name: str):
        """A field's default value (what leaving it out gives)."""
        return getattr(type(self.cfg)(), name)

    def choice(self, name: str) -> bool:
        allowed = self.knobs[name].choices
        if getattr(self.cfg, name) not in allowed:
            self.add(f"{name}={getattr(self.cfg, name)!r}: choose one of {', '.join(map(str, allowed))}")
            return False
        return True

    def at_least(self, name: str, low) -> bool:
        if getattr(self.cfg, name) < low:
            self.add(f"{name}={getattr(self.cfg, name)}: must be >= {low}")
            return False
        return True

    def finite_at_least(self, name: str, low) -> bool:
        if not math.isfinite(getattr(self.cfg, name)):
            self.add(f"{name}={getattr(self.cfg, name)}: must be a finite number")
            return False
        return self.at_least(name, low)


def penalised(c) -> bool:
    """Whether a config penalises D's input gradient: wgan-gp's penalty, R1 or R2 (`losses.penalties` builds them;
    here, below the config, so that validation and `config.discriminator_norm` ask one place)."""
    return c.loss == "wgan-gp" or c.r1_gamma > 0 or c.r2_gamma > 0


def value_problems(c) -> list[str]:
    """Every impossible value or combination of a TrainConfig whose types are right.

    Args:
        c: the TrainConfig.

    Returns:
        one message per problem, in the order of the fields' groups; empty when the config is sound.
    """
    p, world = _Problems(c), distributed.world()
    device = _device_problems(p, c, world)
    _data_problems(p, c, device)
    _model_problems(p, c)
    _architecture_problems(p, c)
    _schedule_problems(p, c, world)
    _numerics_problems(p, c, device)
    _optimisation_problems(p, c)
    _family_problems(p, c)
    _output_problems(p, c)
    _cuda_graph_problems(p, c, device, world)
    return p.found


def _device_problems(p: _Problems, c, world) -> torch.device | None:
    """The device the config names, checked against this machine and torchrun; None when it is unusable."""
    device = None
    try:
        device = distributed.device(c.device, world)
        if device.type not in ("cpu", "cuda"):
            p.add(f"device={c.device!r}: gantools runs on cpu or cuda")
            device = None
        elif device.type == "cuda" and not torch.cuda.is_available():
            p.add(f"device={c.device!r}: no CUDA GPU is visible to PyTorch; use device='cpu' (or 'auto')")
            device = None
        elif device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
            p.add(f"device={c.device!r}: only {torch.cuda.device_count()} GPU(s) visible" +
                     (f" on this machine, but torchrun started process LOCAL_RANK={world.local_rank} here: "
                      f"--nproc_per_node must not exceed the GPUs per machine" if c.device in ("auto", "cuda") else ""))
            device = None
        elif world.distributed and device.type == "cuda" and c.device not in ("auto", "cuda"):
            p.add(f"device={c.device!r} would put every torchrun process on one GPU: use device='cuda' (or "
                     f"'auto'), and each process takes its own, cuda:LOCAL_RANK")
            device = None
    except RuntimeError:
        p.add(f"device={c.device!r}: not a device name; use auto, cpu, cuda or cuda:N")
    return device


def _data_problems(p: _Problems, c, device) -> None:
    if p.choice("dataset") and c.dataset == "folder":
        if not c.data_path:
            p.add("dataset='folder' needs data_path (a folder of image files)")
        elif not os.path.isdir(c.data_path):
            p.add(f"data_path={c.data_path!r}: no such folder")
    elif c.data_path:
        p.add(f"data_path is only used with dataset='folder' (dataset={c.dataset!r}); remove it")
    if c.dataset == "glyphs-color" and c.channels != 3:
        p.add("dataset='glyphs-color' is 3-channel: set channels=3")
    p.choice("image_size")
    p.choice("channels")
    _device_loader_problems(p, c)
    p.choice("transform")
    _worker_problems(p, c, device)


def _device_loader_problems(p: _Problems, c) -> None:
    """What the loaders that hold uint8 images in one tensor (device, memmap, auto) cannot do: there is no
    DataLoader to tune, and no per-image transform."""
    if p.choice("loader") and c.loader != "dataloader":
        if c.transform == "per-sample":
            p.add(f"loader={c.loader!r} keeps uint8 images and normalises them on the device: use "
                  "transform='on-device'")
        if c.num_workers or c.pin_memory or c.persistent_workers or c.prefetch_factor is not None:
            p.add("num_workers, pin_memory, persistent_workers and prefetch_factor are DataLoader knobs; "
                  f"with loader={c.loader!r} set them to 0/False/None")
    if c.data_budget_mb is not None and p.finite_at_least("data_budget_mb", 0) and c.loader != "auto":
        p.add(f"data_budget_mb only decides loader='auto' (loader={c.loader!r}); remove it or set loader='auto'")


def _worker_problems(p: _Problems, c, device) -> None:
    """The DataLoader's knobs that only mean something with worker processes, or with a GPU to copy to."""
    if p.at_least("num_workers", 0) and c.num_workers == 0:
        if c.persistent_workers:
            p.add("persistent_workers=True needs num_workers > 0")
        if c.prefetch_factor is not None:
            p.add("prefetch_factor needs num_workers > 0 (or leave it None)")
    if c.prefetch_factor is not None:
        p.at_least("prefetch_factor", 1)
    if c.pin_memory and device is not None and device.type != "cuda":
        p.add("pin_memory=True only helps copies to a GPU; set it False on the CPU")


def _model_problems(p: _Problems, c) -> None:
    p.at_least("nz", 1)
    p.at_least("ngf", 1)
    p.at_least("ndf", 1)
    if p.choice("d_norm") and c.d_norm == "batch" and penalised(c):
        p.add("d_norm='batch' with a gradient penalty (loss='wgan-gp', r1_gamma or r2_gamma > 0): BatchNorm mixes "
              "the images of a batch, so no image's input gradient is its own; use d_norm='layer' (or 'none', or "
              "'auto')")


def _architecture_problems(p: _Problems, c) -> None:
    """What R3GAN's networks cannot do: other sizes, a normalisation, labels, DCGAN's checkpointed blocks, a
    Sigmoid; and fp32 stages where there are none (another architecture, more than it has)."""
    if not p.choice("architecture"):
        return
    _fp32_stages_problems(p, c)
    if c.architecture != "r3gan":
        return
    sizes = " or ".join(map(str, R3GAN_SIZES))
    if c.image_size not in R3GAN_SIZES and c.image_size in p.knobs["image_size"].choices:
        p.add(f"architecture='r3gan' is built for {sizes} px, not image_size={c.image_size}: use image_size=32 or "
              "64, or architecture='dcgan'")
    if c.d_norm not in ("auto", "none"):
        p.add(f"d_norm={c.d_norm!r} with architecture='r3gan': its D has no normalisation layers (the paper removes "
              "them), so there is none to choose; leave d_norm='auto'")
    if c.conditional:
        p.add("conditional=True with architecture='r3gan': R3GAN's networks here take no labels; set "
              "conditional=False, or use architecture='dcgan' for a conditional run")
    if c.activation_checkpointing != "off":
        p.add(f"activation_checkpointing={c.activation_checkpointing!r} cuts the DCGAN's layers into blocks; "
              "architecture='r3gan' has none to cut: set activation_checkpointing='off'")
    if c.loss == "bce-sigmoid":
        p.add("loss='bce-sigmoid' needs D to end in a Sigmoid, but architecture='r3gan' gives logits: use "
              "loss='rpgan' (R3GAN's) or 'bce'")


def _fp32_stages_problems(p: _Problems, c) -> None:
    """fp32 stages where there are none: another architecture than R3GAN, or more stages than its size has."""
    if p.at_least("fp32_stages", 0) and c.fp32_stages:  # in fp32 a no-op: a resume may turn 16-bit off
        if c.architecture != "r3gan":
            p.add(f"fp32_stages={c.fp32_stages} keeps R3GAN's lowest-resolution stages in fp32; "
                  f"architecture={c.architecture!r} has no such stages: set fp32_stages=0, or architecture='r3gan'")
        elif c.image_size in R3GAN_SIZES and c.fp32_stages > stage_count(c.image_size):
            n = stage_count(c.image_size)
            p.add(f"fp32_stages={c.fp32_stages}: R3GAN at {c.image_size} px has {n} stages (4 x 4 up to "
                  f"{c.image_size} x {c.image_size}), so at most fp32_stages={n}")


def _schedule_problems(p: _Problems, c, world) -> None:
    ok_b = p.at_least("batch_size", 1)
    ok_k = p.at_least("grad_accum_steps", 1)
    parts = world.size * c.grad_accum_steps if ok_k else 1
    if ok_b and ok_k and c.batch_size % parts:
        fix = f"try batch_size={parts * max(1, c.batch_size // parts)}"
        if world.distributed:
            micro = f", each in grad_accum_steps={c.grad_accum_steps} micro-batches" if c.grad_accum_steps > 1 else ""
            p.add(f"batch_size={c.batch_size} is the global batch, shared by the {world.size} processes torchrun "
                     f"started{micro}: it must be divisible by {parts} so every process gets an equal share ({fix}, "
                     f"or a --nproc_per_node that divides it)")
        else:
            p.add(f"batch_size={c.batch_size} is not divisible by grad_accum_steps={c.grad_accum_steps}: "
                     f"each micro-batch must have the same size ({fix})")
    if ok_b and ok_k and parts > 1 and not c.drop_last:
        p.add("grad_accum_steps > 1 and torchrun need drop_last=True so every batch splits into equal parts")
    p.at_least("steps", 1)


def _numerics_problems(p: _Problems, c, device) -> None:
    if p.choice("precision") and device is not None:
        if c.precision == "fp16" and device.type == "cpu":
            p.add("precision='fp16' needs a CUDA GPU (GradScaler and fast fp16 kernels); on the CPU use 'bf16'")
        if c.precision == "bf16" and not hardware.supports_bf16(device):
            p.add("precision='bf16' is not supported on this GPU (needs Ampere or newer); use 'fp16'")
    if c.sync_batchnorm and device is not None and device.type != "cuda":
        p.add("sync_batchnorm=True needs CUDA GPUs (PyTorch's SyncBatchNorm runs on NCCL, not on the CPU): "
                 "set it False (each process then normalises over its own share of the batch)")
    if p.choice("compile") and c.compile == "reduce-overhead" and device is not None and device.type != "cuda":
        p.add("compile='reduce-overhead' uses CUDA graphs: on the CPU use compile='default'")
    if p.choice("activation_checkpointing") and c.activation_checkpointing != "off" and c.compile != "off":
        p.add(f"activation_checkpointing={c.activation_checkpointing!r} with compile={c.compile!r}: torch.compile "
              "chooses what to recompute itself and supports a checkpoint's own recomputation context only for "
              "selective checkpointing (pytorch/pytorch#143176): use one of the two")


def _optimisation_problems(p: _Problems, c) -> None:
    p.choice("optimizer")
    p.choice("optimizer_impl")
    for name in ("lr_g", "lr_d"):
        v = getattr(c, name)
        if not (math.isfinite(v) and v > 0):
            p.add(f"{name}={v}: must be a positive number (DCGAN uses 2e-4)")
    if not all(0 <= b < 1 for b in c.betas):
        p.add(f"betas={tuple(c.betas)}: each beta must be in [0, 1)")
    if not (math.isfinite(c.weight_decay) and c.weight_decay >= 0):
        p.add(f"weight_decay={c.weight_decay}: must be >= 0")
    p.choice("lr_schedule")
    if p.at_least("warmup_steps", 0) and c.steps >= 1 and c.warmup_steps >= c.steps:
        p.add(f"warmup_steps={c.warmup_steps} is as long as the run (steps={c.steps}): the learning rates would "
              "never reach lr_g and lr_d; warm up for fewer steps than the run has")
    if p.choice("loss") and c.loss == "bce-sigmoid" and c.precision != "fp32":
        p.add("loss='bce-sigmoid' (Sigmoid + BCELoss) is unsafe under autocast: use loss='bce' "
                 "(BCE with logits) with fp16/bf16")


def _family_problems(p: _Problems, c) -> None:
    if p.finite_at_least("gp_weight", 0):
        if c.loss == "wgan-gp" and c.gp_weight == 0:
            p.add("loss='wgan-gp' with gp_weight=0 has nothing keeping the critic 1-Lipschitz, so its loss is no "
                     "distance and training diverges: use gp_weight > 0 (10 in the paper)")
        elif c.loss != "wgan-gp" and c.gp_weight != p.default("gp_weight"):
            p.add(f"gp_weight is only used with loss='wgan-gp' (loss={c.loss!r}); remove it")
    for r in ("r1", "r2"):  # R1 and R2: the same penalty at real or at G's images
        gamma, interval = f"{r}_gamma", f"{r}_interval"
        if p.finite_at_least(gamma, 0) and p.at_least(interval, 1):
            if getattr(c, gamma) == 0 and getattr(c, interval) != 1:
                p.add(f"{interval} sets how often {r.upper()} runs, but {r.upper()} is off ({gamma}=0): set "
                      f"{gamma} > 0, or remove {interval}")
            if getattr(c, gamma) > 0 and c.loss == "bce-sigmoid":
                p.add(f"{gamma} penalises the gradient of D's raw output, but loss='bce-sigmoid' squashes it "
                      "through a Sigmoid: use loss='bce' (BCE with logits)")
    p.at_least("d_steps", 1)
    if not (math.isfinite(c.ema_decay) and 0 <= c.ema_decay < 1):
        p.add(f"ema_decay={c.ema_decay}: must be in [0, 1) (0: off; 0.999 averages over about the last 1000 "
                 "steps)")
    if c.conditional and c.loss == "bce-sigmoid":
        p.add("conditional=True adds a projection of the label to D's logit, but loss='bce-sigmoid' puts a "
                 "Sigmoid after it: use loss='bce' (BCE with logits)")


def _output_problems(p: _Problems, c) -> None:
    p.at_least("log_interval", 1)
    p.at_least("sample_interval", 0)
    p.at_least("checkpoint_interval", 0)
    p.at_least("max_skips", 1)
    if not c.out_dir:
        p.add("out_dir is empty: give a folder for samples and checkpoints")


def _cuda_graph_problems(p: _Problems, c, device, world) -> None:
    """cuda_graphs=True where one captured step cannot be replayed as it is (`capture_problems`)."""
    if c.cuda_graphs is not True:
        return
    if device is not None and device.type != "cuda":
        p.add(f"cuda_graphs=True: it captures CUDA work, and device={c.device!r} is {device.type} here: it needs a "
              "CUDA GPU (`gantools profile` counts the launches it would save; or set cuda_graphs=False)")
    for reason in capture_problems(c, world.distributed):
        p.add(f"cuda_graphs=True: {reason} (or set cuda_graphs=False)")


def capture_problems(c, distributed: bool = False) -> list[str]:
    """Why one captured step of config `c` could not be replayed as it is, on a GPU: each rule and its source in
    docs/cuda-graphs.md (PyTorch's CUDA-graph notes: a capture prohibits host syncs and get_state/set_state of a
    generator, and replays the same addresses, shapes and work every time). Empty: it can."""
    why = [
        (c.loader != "device", f"loader={c.loader!r}: a graph gathers its batch from device-resident data inside "
                               "the capture; use loader='device'"),
        (not c.drop_last, "drop_last=False: an epoch's last, short batch changes the shapes a graph replays; use "
                          "drop_last=True"),
        (c.compile != "off", f"compile={c.compile!r}: both capture graphs; use compile='off' with cuda_graphs, or "
                             "compile='reduce-overhead' without it"),
        (c.precision == "fp16", "precision='fp16': PyTorch's CUDA-graph notes rule GradScaler's step out of a "
                                "capture; use precision='bf16' (Ampere and newer) or 'fp32'"),
        (distributed, "under torchrun: DDP's all-reduce needs a capture of its own (its own warm-up and NCCL "
                      "settings); train one process with cuda_graphs, or several without"),
        (c.sync_every_step, "sync_every_step=True reads losses back every step, a host sync a capture prohibits"),
        (c.optimizer_impl not in ("auto", "fused"), f"optimizer_impl={c.optimizer_impl!r}: the step's optimizer "
                                                    "must be capturable fused Adam; use optimizer_impl='auto'"),
        (c.r1_interval != 1 or c.r2_interval != 1, "a lazy penalty (r1_interval or r2_interval > 1) runs on some "
                                                    "steps only, and a graph replays the same work every step"),
        (c.lr_schedule != "constant" or c.warmup_steps != 0, "a learning-rate schedule changes the rate every step, "
                                                              "and a graph replays the rate it captured"),
        (c.on_nonfinite != "stop", "on_nonfinite='skip' rolls back by replacing the optimizers' state, which the "
                                   "graph holds by address; use on_nonfinite='stop'"),
        (c.activation_checkpointing != "off", "activation checkpointing saves and restores the RNG state "
                                              "(get_state/set_state), which a capture prohibits"),
    ]
    return [reason for bad, reason in why if bad]
