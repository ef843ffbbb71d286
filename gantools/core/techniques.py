"""Every performance technique gantools knows, once, in the workbook's teaching order.

Each `Technique` is one speed field of `TrainConfig` (batch_size and the lazy penalties' interval included: these two
change what is learned, and tune's quality phase holds them to FID): the config changes that turn it on, the notebook
that teaches it, the devices it applies to, the values the tuner may try (`candidates`), its rows in the benchmark
ladder and in `gantools check`, the profiler's fix it proposes, and the tuner's prior. The benchmark ladder
(`bench.ladder`), `gantools check`'s rows (`check.techniques`), tune's priors and search space (`tuning.PRIOR`,
`search_space`), the widget panels' controls (`panel.CONTROL_FIELDS`, `panel.PROFILE_FIELDS`) and the profiler's
verdict (`profiling.diagnose`) are all read from `TECHNIQUES`, in its order: a technique added here shows up in each.

core may not import speed/: what only speed/ knows (whether torch.compile has a compiler here, what `gantools check`
validated) reaches a technique as values of `Where`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from ..measuring import hardware
from .config import TrainConfig, optimizer_kernels, scale_batch
from .losses import LAZY_INTERVAL

BOTH = ("cpu", "cuda")


@dataclass(frozen=True)
class Row:
    """A named config change that exercises a technique: a row of the benchmark ladder or of `gantools check`.
    `devices` narrows the technique's own; `needs` names what the machine must have besides: "compile" (a compiler
    torch.compile can use) or "bf16" (bf16 runs: `hardware.supports_bf16`; validation refuses it elsewhere);
    `together` puts the change into the ladder's 'all together' (not pinned memory, which the device loader leaves
    nothing to do). A row that sets a 16-bit precision joins 'all together' only where that precision is the
    device's own and fast (`hardware.autocast_precision`, `hardware.fast_bf16`): bf16, fp16 on a GPU without fast
    bf16, none on a CPU without native bf16 (`rows` decides it)."""

    name: str
    change: dict
    devices: tuple | None = None
    needs: str | None = None
    together: bool = True


def _never(technique: str) -> bool:
    return False


@dataclass(frozen=True, kw_only=True)
class Where:
    """Where a technique is tried or proposed, besides the config: the device and what the caller measured about it.
    `compile_ok`: torch.compile can build here (`bench.can_compile`); `validated`: a `gantools check` row name ->
    whether it passed on this device (`check.validated`); `main_thread`: not a background thread (where CUDA graphs
    are refused); `own_dataset`, `cpu_tensors`: a dataset of your own, and whether it returns CPU tensors
    (`data.returns_cpu_tensors`); `cores`: CPU cores for workers; `workers`: the DataLoader workers a fix suggests;
    `host_syncs`: host syncs per step the profile counted."""

    device: torch.device
    compile_ok: bool = True
    validated: Callable[[str], bool] = _never
    main_thread: bool = True
    own_dataset: bool = False
    cpu_tensors: bool = True
    cores: int = 1
    workers: int = 1
    host_syncs: float = 0.0

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


@dataclass(frozen=True)
class Offer:
    """A value of a field the tuner may try, or (with `why`) one it leaves out here and the reason. `exact` is the
    whole change, taken as it is rather than completed to a valid config (a larger batch brings its scaled learning
    rates)."""

    field: str
    value: object
    why: str | None = None
    exact: dict | None = None

    @property
    def change(self) -> dict:
        return {self.field: self.value}

    @property
    def label(self) -> str:
        """`compile=default` as the skipped list names it; the field alone where no value applies."""
        return self.field if self.value is None else f"{self.field}={self.value}"


@dataclass(frozen=True, kw_only=True)
class Fix:
    """The profiler verdict's proposal: the config change, the words for it, and whether removing the bottleneck
    bounds its gain (`bounded` False: no model of its gain, measure it)."""

    change: dict
    text: str
    bounded: bool = True


def _none(cfg: TrainConfig, where: Where) -> list:
    return []


def _no_fix(bottleneck: str, cfg: TrainConfig, where: Where) -> Fix | None:
    return None


@dataclass(frozen=True)
class Technique:
    """One speed field: what it is called, the notebook that teaches it, the devices it applies to, tune's prior
    (expected speed-up on its own as (cpu, cuda), only to order the search space: likeliest gains first), its rows
    in the benchmark ladder and in `gantools check`, the fields the widget panel and the profile panel show for it,
    the values tune may try from a config (`candidates(cfg, where)`: `Offer`s) and the fix it is for a profiler
    verdict (`fix(bottleneck, cfg, where)`: a `Fix`, or None where it is not this config's fix)."""

    knob: str
    name: str
    notebook: str
    prior: tuple
    devices: tuple = BOTH
    ladder: tuple = ()
    checks: tuple = ()
    panel: tuple = ()
    profiled: tuple = ()
    candidates: Callable[[TrainConfig, Where], list] = _none
    fix: Callable[[str, TrainConfig, Where], Fix | None] = _no_fix


MIXED_PRECISION, DATA_LOADING = "02_mixed_precision.ipynb", "03_data_loading.ipynb"
OPTIMIZERS, ALL_TOGETHER = "04_optimizers_and_accumulation.ipynb", "05_all_together.ipynb"
YOUR_OWN_GAN = "06_your_own_gan.ipynb"  # the doctor's findings about a hand-written loop (host syncs, D's grads)
GAN_VARIANTS = "07_gan_variants.ipynb"  # the GAN family at its papers' settings; R1 and its lazy form (exercises)
MEMORY, COMPILER = "08_memory.ipynb", "09_compiler.ipynb"

OPTIMIZER_ORDER = ("fused", "foreach", "for-loop")  # fused kernels first: fewest launches
GRAPH_MODES = ("max-autotune", "reduce-overhead")  # torch.compile's modes that use CUDA graphs on CUDA
NOT_CPU_TENSORS = "your dataset's tensors are not on the CPU: "
FOLDER_MEMMAP = "folder cache, memory-mapped loader"  # check's rows over a folder decoded once (dataset='folder')
FOLDER_AUTO = "folder cache, loader='auto'"


def _precision(cfg: TrainConfig, where: Where) -> list:
    """16-bit autocast from fp32: the device's own 16-bit precision (`hardware.autocast_precision`); fp16 never on
    a CPU, and bf16 there only where it is fast (`hardware.fast_16bit`: native bf16)."""
    if cfg.precision != "fp32":
        return []
    if where.cuda:
        return [Offer("precision", hardware.autocast_precision(where.device))]
    slow = None if hardware.fast_16bit(where.device) else "no native bf16 on this CPU: emulated, slower than fp32"
    return [Offer("precision", "fp16", "fp16 needs CUDA (GradScaler and fast fp16 kernels)"),
            Offer("precision", "bf16", slow)]


def _transform(cfg: TrainConfig, where: Where) -> list:
    """On-device normalisation (for a folder: decoded once into the cache, `data.CachedFolder`), except for your own
    dataset, which brings its own transforms."""
    why = "your own dataset brings its own transforms" if where.own_dataset else None
    return [Offer("transform", "on-device", why)]


def _loader(cfg: TrainConfig, where: Where) -> list:
    """The whole dataset on the device; for a folder's cache, which may not fit there, loader='auto' instead (the
    device where it fits, else memory-mapped batches: `loaders.choose_loader`)."""
    if cfg.dataset != "folder" or where.own_dataset:
        return [Offer("loader", "device")]
    return [Offer("loader", "device", "a folder's cache may not fit the device: loader='auto' puts it there where it "
                                      "fits"), Offer("loader", "auto")]


def _num_workers(cfg: TrainConfig, where: Where) -> list:
    """Workers doubled (from 0: 2) up to the cores, and halved; only for a dataset of CPU tensors."""
    if cfg.loader != "dataloader":
        return []
    n = cfg.num_workers
    return [Offer("num_workers", value, None if where.cpu_tensors or not value else
                  NOT_CPU_TENSORS + "a forked worker cannot use CUDA")
            for value in sorted({min(where.cores, 2 * n if n else 2), n // 2})]


def _pin_memory(cfg: TrainConfig, where: Where) -> list:
    """Pinned memory: only for copies to a GPU, of CPU tensors."""
    if cfg.loader != "dataloader":
        return []
    why = ("pinned memory only helps copies to a GPU" if not where.cuda else None if where.cpu_tensors else
           NOT_CPU_TENSORS + "only CPU tensors can be pinned")
    return [Offer("pin_memory", True, why)]


def _compile(cfg: TrainConfig, where: Where) -> list:
    """compile default (or off, from a compiled config); on CUDA also the CUDA-graph modes, only where `gantools
    check` validated them and not in a background thread, where CUDA graphs are refused."""
    if not where.compile_ok:
        return [Offer("compile", None, "torch.compile needs a C++ compiler on the CPU")]
    offers = [Offer("compile", "default" if cfg.compile == "off" else "off")]
    for mode in GRAPH_MODES if where.cuda else ():
        if cfg.compile == mode:
            continue
        # CUDA graphs (both modes use them: config.uses_cuda_graphs), measured interleaved with another trainer in
        # this process: CUDA graph trees support "arbitrary trees of CUDA graph operations, not just sequences", and
        # non-graph code between graphs (module docstring of torch/_inductor/cudagraph_trees.py); each step starts
        # its own generation (step.TrainStep).
        why = ("not validated by `python -m gantools check` on this GPU" if not where.validated(f"compile {mode}")
               else None if where.main_thread else "CUDA graphs are refused in a background thread")
        offers.append(Offer("compile", mode, why))
    return offers


def _cuda_graphs(cfg: TrainConfig, where: Where) -> list:
    """The whole step in one CUDA graph, on a GPU, from the main thread, where the config allows a capture
    (`validation._cuda_graph_problems` says what rules it out)."""
    from .validation import capture_problems

    problems = capture_problems(cfg)
    why = ("CUDA graphs need a CUDA GPU" if not where.cuda else
           "CUDA graphs are refused in a background thread" if not where.main_thread else
           problems[0] if problems else None)
    return [Offer("cuda_graphs", True, why)]


def _optimizer_impl(cfg: TrainConfig, where: Where) -> list:
    """Each optimizer implementation other than the one built ('auto' may already be fused:
    `config.optimizer_kernels`)."""
    built = optimizer_kernels(cfg.optimizer_impl, where.device)
    return [Offer("optimizer_impl", impl) for impl in OPTIMIZER_ORDER if impl != built]


def _tf32(cfg: TrainConfig, where: Where) -> list:
    """TF32 on an Ampere or newer GPU."""
    ampere = where.cuda and torch.cuda.get_device_capability(where.device)[0] >= 8
    return [Offer("tf32", True, None if ampere else "TF32 needs an Ampere or newer GPU")]


def _batch_size(cfg: TrainConfig, where: Where) -> list:
    """batch_size x2 with the learning rates scaled by sqrt 2 (`config.scale_batch`)."""
    bigger = scale_batch(cfg, cfg.batch_size * 2)
    return [Offer("batch_size", cfg.batch_size * 2,
                  exact={"batch_size": bigger.batch_size, "lr_g": bigger.lr_g, "lr_d": bigger.lr_d})]


def _lazy_penalties(cfg: TrainConfig, where: Where) -> list:
    """R1 and R2 taken lazily where either runs at every D step: both that do, every `LAZY_INTERVAL` D steps and
    weighted by it (StyleGAN2's lazy regularisation; `losses.ZeroCentredPenalty`), in one change, as R3GAN runs them
    at one gamma. Not a pure speed knob: it changes what is computed (the penalty pulls as hard on average, not at
    every step), so tune keeps it only as it keeps any change, faster by more than the spread, and its quality phase
    holds it to FID like every kept change, backing it off if it costs quality."""
    change = {f"{r}_interval": LAZY_INTERVAL for r in ("r1", "r2")
              if getattr(cfg, f"{r}_gamma") > 0 and getattr(cfg, f"{r}_interval") == 1}
    return [Offer(next(iter(change)), LAZY_INTERVAL, exact=change)] if change else []


def _graphs_text(where: Where) -> tuple[str, str]:
    """The compile mode for a GPU left idle, and its words: reduce-overhead (CUDA graphs) only where `gantools check`
    ran it on this GPU with this torch and it passed (gantools' own tests run on a CPU, so not recommended blind)."""
    if where.validated("compile reduce-overhead"):
        return "reduce-overhead", ("CUDA graphs via torch.compile mode='reduce-overhead' "
                                   "(validated here by gantools check)")
    return "default", ("torch.compile (mode='reduce-overhead', CUDA graphs, once `python -m gantools check` has "
                       "validated it on this machine)")


FOLDER_CACHE = "decode the folder once (gantools prepare / transform='on-device')"
READ_CACHE = "loader='auto': the whole cache on the device where it fits, else memory-mapped batches"
NO_DATALOADER = {"num_workers": 0, "pin_memory": None, "persistent_workers": False, "prefetch_factor": None}


def _fix_transform(bottleneck: str, cfg: TrainConfig, where: Where) -> Fix | None:
    """Per-image PIL transforms out of the step: for a folder that means decoding it once into the cache
    (`data.CachedFolder`) and reading the cache without a DataLoader (`_fix_loader`'s change, in the same step)."""
    if bottleneck != "data-bound" or cfg.transform != "per-sample":
        return None
    if cfg.dataset == "folder":
        return Fix(change={"transform": "on-device", "loader": "auto", **NO_DATALOADER},
                   text=f"{FOLDER_CACHE}, then read it with {READ_CACHE}")
    return Fix(change={"transform": "on-device", "num_workers": 0, "persistent_workers": False,
                       "prefetch_factor": None},
               text="drop per-image PIL transforms: copy uint8 batches and normalise them on the device")


def _fix_loader(bottleneck: str, cfg: TrainConfig, where: Where) -> Fix | None:
    """A folder's cache read by a DataLoader still costs Python per image: loader='auto' holds it on the device, or
    gathers each batch in one index_select (`loaders.choose_loader`), with no DataLoader knobs left."""
    if bottleneck != "data-bound" or cfg.transform == "per-sample":
        return None
    if cfg.loader == "memmap":
        return Fix(change={"loader": "auto"}, text="hold the images on the device where they fit: loader='auto'")
    if cfg.loader != "dataloader":  # no DataLoader, nothing per image: what waits is the gather and its copy
        return Fix(change={}, text="nothing to change in the loader: the images are gathered with no DataLoader and "
                                   "nothing per image; larger batches spread the gather over more images")
    if cfg.dataset != "folder":
        return None
    return Fix(change={"loader": "auto", **NO_DATALOADER}, text=f"read the folder's cache with {READ_CACHE}")


def _fix_workers(bottleneck: str, cfg: TrainConfig, where: Where) -> Fix | None:
    """Workers for a data-bound DataLoader; none for the loaders that have no workers (device, memmap, auto)."""
    if bottleneck != "data-bound" or cfg.loader != "dataloader":
        return None
    if cfg.num_workers == 0:
        return Fix(change={"num_workers": where.workers, "persistent_workers": True},
                   text=f"decode in {where.workers} DataLoader worker processes, kept alive between epochs")
    return Fix(change={"num_workers": cfg.num_workers * 2, "persistent_workers": True},
               text="more DataLoader workers, or a dataset decoded once and held on the device")


def _fix_precision(bottleneck: str, cfg: TrainConfig, where: Where) -> Fix | None:
    """16-bit for a compute-bound fp32 step: the device's own (validation refuses bf16 on a GPU before Ampere);
    Sigmoid + BCELoss is unsafe under autocast, so the fix moves to logits too."""
    if bottleneck != "compute-bound" or cfg.precision != "fp32":
        return None
    if not hardware.fast_16bit(where.device):  # emulated bf16 runs slower than fp32
        return None
    half = hardware.autocast_precision(where.device)
    return Fix(change={"precision": half, **({"loss": "bce"} if cfg.loss == "bce-sigmoid" else {})},
               text="bf16 autocast" if half == "bf16" else "fp16 autocast + GradScaler (no fast bf16 on this GPU)")


def _fix_sync(bottleneck: str, cfg: TrainConfig, where: Where) -> Fix | None:
    """The per-step reads are the fix only where the config makes them: syncs it does not make (a GradScaler's, your
    own networks') are no reason to propose sync_every_step=False when it is already off."""
    if bottleneck != "host-overhead-bound" or not cfg.sync_every_step or where.host_syncs < 1:
        return None
    return Fix(change={"sync_every_step": False},
               text=f"remove per-step host syncs (.item()), then {_graphs_text(where)[1]}, or a larger batch")


def _fix_channels_last(bottleneck: str, cfg: TrainConfig, where: Where) -> Fix | None:
    if bottleneck != "compute-bound":
        return None
    return Fix(change={"channels_last": True}, text="channels_last, then torch.compile", bounded=False)


def _fix_compile(bottleneck: str, cfg: TrainConfig, where: Where) -> Fix | None:
    if bottleneck == "host-overhead-bound":
        mode, text = _graphs_text(where)
        return Fix(change={"compile": mode}, text=f"{text}, or a larger batch")
    if bottleneck == "memory-bound":
        return Fix(change={"compile": "default"}, text="torch.compile to fuse elementwise ops, channels_last")
    return None


# The priors. CPU: the benchmark's single-technique rows on a CPU (evidence: docs/benchmark.md); CUDA: where a GPU
# step usually loses time, largest first (an order, not a measurement). The order of this list is the order
# everywhere; among equal priors it decides what tune tries first.
TECHNIQUES = (
    Technique("precision", "16-bit autocast", MIXED_PRECISION, (1.53, 2.0), candidates=_precision, fix=_fix_precision,
              ladder=(Row("bf16 autocast", {"precision": "bf16", "loss": "bce"}, needs="bf16"),
                      Row("fp16 + GradScaler", {"precision": "fp16", "loss": "bce"}, ("cuda",))),
              checks=(Row("bf16 autocast", {"precision": "bf16"}, needs="bf16"),
                      Row("fp16 autocast + GradScaler", {"precision": "fp16"}, ("cuda",))),
              panel=("precision",), profiled=("precision", "loss")),  # bce-sigmoid is fp32 only
    Technique("transform", "on-device normalisation", DATA_LOADING, (1.02, 1.3), candidates=_transform,
              fix=_fix_transform, profiled=("transform",),
              ladder=(Row("on-device normalisation", {"transform": "on-device", "num_workers": 0}),)),
    Technique("loader", "device-resident data", DATA_LOADING, (1.04, 1.3), candidates=_loader, fix=_fix_loader,
              ladder=(Row("device-resident data", {"loader": "device", "transform": "on-device", "num_workers": 0}),),
              # a folder's cache (check writes its images as files, `check.run`), read without a DataLoader
              checks=(Row("device loader", {"loader": "device"}),
                      Row(FOLDER_MEMMAP, {"loader": "memmap", "dataset": "folder"}),
                      Row(FOLDER_AUTO, {"loader": "auto", "dataset": "folder"}, ("cuda",))),
              panel=("loader",)),
    # pinning only helps copies to a GPU (refused on a CPU); workers are worth checking everywhere
    Technique("num_workers", "DataLoader worker processes", DATA_LOADING, (1.0, 1.1), candidates=_num_workers,
              fix=_fix_workers, profiled=("num_workers",),
              checks=(Row("DataLoader, 2 workers", {"num_workers": 2, "persistent_workers": True}, ("cpu",)),
                      Row("DataLoader, 2 workers, pinned",
                          {"num_workers": 2, "persistent_workers": True, "pin_memory": True}, ("cuda",))),
              panel=("num_workers",)),
    Technique("pin_memory", "pinned memory", DATA_LOADING, (1.0, 1.05), ("cuda",), candidates=_pin_memory,
              ladder=(Row("pinned memory", {"pin_memory": True}, together=False),),
              panel=("pin_memory",)),
    Technique("persistent_workers", "workers kept between epochs", DATA_LOADING, (1.0, 1.02),
              candidates=lambda cfg, where: [Offer("persistent_workers", True)] if cfg.num_workers > 0 else [],
              panel=("persistent_workers",)),
    Technique("prefetch_factor", "batches prefetched per worker", DATA_LOADING, (1.0, 1.01),
              candidates=lambda cfg, where: [Offer("prefetch_factor", 4)]
              if cfg.num_workers > 0 and cfg.prefetch_factor is None else []),
    Technique("optimizer_impl", "fused or foreach optimizer kernels", OPTIMIZERS, (0.97, 1.05),
              candidates=_optimizer_impl,
              ladder=(Row("fused Adam", {"optimizer_impl": "fused"}),),
              # with fp16 `check` counts the host syncs in the optimizer steps: GradScaler.step reads found_inf back
              # (.item()) for every optimizer but a fused one, so the fused row must have none
              checks=(Row("Adam fused", {"optimizer_impl": "fused"}),
                      Row("Adam foreach", {"optimizer_impl": "foreach"}),
                      *(Row(f"fp16 + Adam {impl}", {"optimizer_impl": impl, "precision": "fp16"}, ("cuda",))
                        for impl in ("fused", "foreach", "for-loop"))),
              panel=("optimizer", "optimizer_impl")),
    Technique("grad_accum_steps", "gradient accumulation", OPTIMIZERS, (1.0, 1.1),
              # fewer micro-batches: more never speeds a step up
              candidates=lambda cfg, where: [Offer("grad_accum_steps", cfg.grad_accum_steps // 2)]
              if cfg.grad_accum_steps > 1 else [],
              checks=(Row("accumulation, 2 micro-batches", {"grad_accum_steps": 2}),),
              panel=("grad_accum_steps",)),
    Technique("sync_every_step", "no per-step .item()", ALL_TOGETHER, (1.02, 1.5), fix=_fix_sync,
              candidates=lambda cfg, where: [Offer("sync_every_step", False)], profiled=("sync_every_step",),
              ladder=(Row("no per-step .item()", {"sync_every_step": False}),)),
    Technique("channels_last", "channels_last", ALL_TOGETHER, (1.17, 1.2), fix=_fix_channels_last,
              candidates=lambda cfg, where: [Offer("channels_last", not cfg.channels_last)],
              profiled=("channels_last",),
              ladder=(Row("channels_last", {"channels_last": True}),),
              checks=(Row("channels_last", {"channels_last": True}),),
              panel=("channels_last",)),
    Technique("compile", "torch.compile", COMPILER, (1.10, 1.2), candidates=_compile, fix=_fix_compile,
              ladder=(Row("torch.compile", {"compile": "default"}, needs="compile"),),
              checks=(Row("compile default", {"compile": "default"}, needs="compile"),
                      Row("compile reduce-overhead", {"compile": "reduce-overhead"}, ("cuda",)),
                      Row("compile max-autotune", {"compile": "max-autotune"}, ("cuda",))),
              panel=("compile",)),
    # one graph of the whole step: a climbing rung on a GPU (bench), not a one-at-a-time row (the reference's
    # DataLoader, .item() calls and foreach Adam each rule a capture out)
    Technique("cuda_graphs", "whole-step CUDA graphs", COMPILER, (1.0, 2.0), ("cuda",), candidates=_cuda_graphs,
              checks=(Row("whole-step CUDA graphs", {"cuda_graphs": True, "loader": "device"}, ("cuda",)),),
              panel=("cuda_graphs",)),
    Technique("freeze_d", "D frozen in G's step", ALL_TOGETHER, (1.10, 1.1),
              candidates=lambda cfg, where: [Offer("freeze_d", True)],
              ladder=(Row("D frozen in G step", {"freeze_d": True}),)),
    Technique("tf32", "TF32", ALL_TOGETHER, (1.0, 1.5), ("cuda",), candidates=_tf32,
              ladder=(Row("TF32", {"tf32": True}),),
              checks=(Row("TF32 + cudnn.benchmark", {"tf32": True, "cudnn_benchmark": True}),)),
    Technique("cudnn_benchmark", "cudnn.benchmark", ALL_TOGETHER, (1.0, 1.1), ("cuda",),
              candidates=lambda cfg, where: [Offer("cudnn_benchmark", True,
                                                   None if where.cuda else "cuDNN is CUDA's")]),
    # the ladder's batch row is its max-throughput preset ('all together' with batch x2), built in bench.ladder
    Technique("batch_size", "a larger batch", ALL_TOGETHER, (1.08, 1.2), panel=("batch_size",),
              candidates=_batch_size),
    # R2's interval comes with R1's (`LAZY_FIELDS`); the prior: the r3gan preset's profile on a CPU, where R1 and R2
    # (their gradient and its backward) are a large share of the step (evidence: docs/tune.md), and on CUDA an order
    Technique("r1_interval", "lazy R1 and R2", GAN_VARIANTS, (1.5, 1.5), candidates=_lazy_penalties),
)
LAZY_FIELDS = ("r1_interval", "r2_interval")  # the fields the lazy technique turns


def by_knob(knob: str) -> Technique:
    """The technique that turns `knob`."""
    found = next((t for t in TECHNIQUES if t.knob == knob), None)
    if found is None:
        raise KeyError(f"no technique turns {knob!r}; the techniques: {', '.join(t.knob for t in TECHNIQUES)}")
    return found


def notebook(knob: str) -> str:
    """The notebook that teaches `knob`, as the verdict and the doctor name it: '03_data_loading'."""
    return by_knob(knob).notebook.removesuffix(".ipynb")


def priors() -> dict[str, tuple]:
    """knob: (cpu, cuda), in the list's order: tune's `PRIOR`."""
    return {t.knob: t.prior for t in TECHNIQUES}


def rows(kind: str, device: torch.device, compile_ok: bool, fast_bf16: bool | None = None) -> list[Row]:
    """The benchmark's (`kind='ladder'`) or the check's (`kind='checks'`) rows that apply on `device`, in order, each
    with `together` decided for this device (a 16-bit row only with the device's own fast 16-bit precision: none on
    a CPU without native bf16, `hardware.fast_bf16`). `fast_bf16` answers `hardware.supports_bf16` and
    `hardware.fast_bf16` for a device that is not here (the rows a GPU would run, listed on a CPU)."""
    bf16 = hardware.supports_bf16(device) if fast_bf16 is None else fast_bf16
    fast = hardware.fast_bf16(device) if fast_bf16 is None else fast_bf16
    have = {None: True, "compile": compile_ok, "bf16": bf16}
    own = ("fp32", ("bf16" if fast else "fp32") if bf16 else "fp16")  # a CPU without native bf16: fp32 together
    return [dataclasses.replace(row, together=row.together and row.change.get("precision", "fp32") in own)
            for t in TECHNIQUES for row in getattr(t, kind)
            if device.type in (row.devices or t.devices) and have[row.needs]]


def panel_fields(panel: str = "panel") -> tuple[str, ...]:
    """The config fields a widget panel shows a control for, in order.

    Args:
        panel: "panel" (the training panel's) or "profiled" (the profile panel's: the fields whose change a profile
            shows).
    Returns:
        The fields, in the list's order.
    """
    return tuple(name for t in TECHNIQUES for name in getattr(t, panel))


def fix(bottleneck: str, cfg: TrainConfig, where: Where) -> Fix:
    """The profiler's fix for `bottleneck` in `cfg`: the first technique, in the list's order, that is one.

    Args:
        bottleneck: a `profiling.bottleneck` name.
        cfg: the profiled config.
        where: the profiled device, and what the profile counted (`host_syncs`) and the caller knows.
    Returns:
        The `Fix`.
    """
    found = next((f for t in TECHNIQUES if (f := t.fix(bottleneck, cfg, where)) is not None), None)
    if found is None:
        raise KeyError(f"no technique fixes a {bottleneck} step")
    return found
