"""Every performance technique gantools knows, once, in the workbook's teaching order.

Each `Technique` is one speed field of `TrainConfig` (batch_size included): the config change that turns it on, the
notebook that teaches it, the devices it applies to and the tuner's prior. The benchmark ladder (`bench.ladder`),
`gantools check`'s rows (`check.techniques`), tune's priors and search order (`tuning.PRIOR`, `search_space`), the
widget panel's controls (`panel.TECHNIQUES`) and the profiler verdict's notebook (`profiling.diagnose`) are all
read from `TECHNIQUES`, in its order: a technique added here shows up in each of them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..measuring import hardware

BOTH = ("cpu", "cuda")


@dataclass(frozen=True)
class Row:
    """A named config change that exercises a technique: a row of the benchmark ladder or of `gantools check`.
    `devices` narrows the technique's own; `needs` names what the machine must have besides: "compile" (a compiler
    torch.compile can use) or "bf16" (fast bf16: `hardware.supports_bf16`; validation refuses it elsewhere);
    `together` puts the change into the ladder's 'all together' (not pinned memory, which the device loader leaves
    nothing to do). A row that sets a 16-bit precision joins 'all together' only where that precision is the
    device's own (`hardware.autocast_precision`): bf16, or fp16 on a GPU without fast bf16 (`rows` decides it)."""

    name: str
    change: dict
    devices: tuple | None = None
    needs: str | None = None
    together: bool = True


@dataclass(frozen=True)
class Technique:
    """One speed field: what it is called, the notebook that teaches it, the devices it applies to, tune's prior
    (expected speed-up on its own as (cpu, cuda), only to order the search space: likeliest gains first), its rows
    in the benchmark ladder and in `gantools check`, and the fields the widget panel shows for it."""

    knob: str
    name: str
    notebook: str
    prior: tuple
    devices: tuple = BOTH
    ladder: tuple = ()
    checks: tuple = ()
    panel: tuple = ()


MIXED_PRECISION, DATA_LOADING = "02_mixed_precision.ipynb", "03_data_loading.ipynb"
OPTIMIZERS, ALL_TOGETHER = "04_optimizers_and_accumulation.ipynb", "05_all_together.ipynb"
YOUR_OWN_GAN = "06_your_own_gan.ipynb"  # the doctor's findings about a hand-written loop (host syncs, D's grads)

# The priors. CPU: the benchmark's single-technique rows on the 2-core CPU (docs); CUDA: where a GPU step usually
# loses time, largest first (an order, not a measurement). The order of this list is the order everywhere; among
# equal priors it decides what tune tries first.
TECHNIQUES = (
    Technique("precision", "16-bit autocast", MIXED_PRECISION, (1.53, 2.0),
              ladder=(Row("bf16 autocast", {"precision": "bf16", "loss": "bce"}, needs="bf16"),
                      Row("fp16 + GradScaler", {"precision": "fp16", "loss": "bce"}, ("cuda",))),
              checks=(Row("bf16 autocast", {"precision": "bf16"}, needs="bf16"),
                      Row("fp16 autocast + GradScaler", {"precision": "fp16"}, ("cuda",))),
              panel=("precision",)),
    Technique("transform", "on-device normalisation", DATA_LOADING, (1.02, 1.3),
              ladder=(Row("on-device normalisation", {"transform": "on-device", "num_workers": 0}),)),
    Technique("loader", "device-resident data", DATA_LOADING, (1.04, 1.3),
              ladder=(Row("device-resident data", {"loader": "device", "transform": "on-device", "num_workers": 0}),),
              checks=(Row("device loader", {"loader": "device"}),),
              panel=("loader",)),
    # pinning only helps copies to a GPU (refused on a CPU); workers are worth checking everywhere
    Technique("num_workers", "DataLoader worker processes", DATA_LOADING, (1.0, 1.1),
              checks=(Row("DataLoader, 2 workers", {"num_workers": 2, "persistent_workers": True}, ("cpu",)),
                      Row("DataLoader, 2 workers, pinned",
                          {"num_workers": 2, "persistent_workers": True, "pin_memory": True}, ("cuda",))),
              panel=("num_workers",)),
    Technique("pin_memory", "pinned memory", DATA_LOADING, (1.0, 1.05), ("cuda",),
              ladder=(Row("pinned memory", {"pin_memory": True}, together=False),),
              panel=("pin_memory",)),
    Technique("persistent_workers", "workers kept between epochs", DATA_LOADING, (1.0, 1.02),
              panel=("persistent_workers",)),
    Technique("prefetch_factor", "batches prefetched per worker", DATA_LOADING, (1.0, 1.01)),
    Technique("optimizer_impl", "fused or foreach optimizer kernels", OPTIMIZERS, (0.97, 1.05),
              ladder=(Row("fused Adam", {"optimizer_impl": "fused"}),),
              # with fp16 `check` counts the host syncs in the optimizer steps: GradScaler.step reads found_inf back
              # (.item()) for every optimizer but a fused one, so the fused row must have none
              checks=(Row("Adam fused", {"optimizer_impl": "fused"}),
                      Row("Adam foreach", {"optimizer_impl": "foreach"}),
                      *(Row(f"fp16 + Adam {impl}", {"optimizer_impl": impl, "precision": "fp16"}, ("cuda",))
                        for impl in ("fused", "foreach", "for-loop"))),
              panel=("optimizer", "optimizer_impl")),
    Technique("grad_accum_steps", "gradient accumulation", OPTIMIZERS, (1.0, 1.1),
              checks=(Row("accumulation, 2 micro-batches", {"grad_accum_steps": 2}),),
              panel=("grad_accum_steps",)),
    Technique("sync_every_step", "no per-step .item()", ALL_TOGETHER, (1.02, 1.5),
              ladder=(Row("no per-step .item()", {"sync_every_step": False}),)),
    Technique("channels_last", "channels_last", ALL_TOGETHER, (1.17, 1.2),
              ladder=(Row("channels_last", {"channels_last": True}),),
              checks=(Row("channels_last", {"channels_last": True}),),
              panel=("channels_last",)),
    Technique("compile", "torch.compile", ALL_TOGETHER, (1.10, 1.2),
              ladder=(Row("torch.compile", {"compile": "default"}, needs="compile"),),
              checks=(Row("compile default", {"compile": "default"}, needs="compile"),
                      Row("compile reduce-overhead", {"compile": "reduce-overhead"}, ("cuda",)),
                      Row("compile max-autotune", {"compile": "max-autotune"}, ("cuda",))),
              panel=("compile",)),
    Technique("freeze_d", "D frozen in G's step", ALL_TOGETHER, (1.10, 1.1),
              ladder=(Row("D frozen in G step", {"freeze_d": True}),)),
    Technique("tf32", "TF32", ALL_TOGETHER, (1.0, 1.5), ("cuda",),
              ladder=(Row("TF32", {"tf32": True}),),
              checks=(Row("TF32 + cudnn.benchmark", {"tf32": True, "cudnn_benchmark": True}),)),
    Technique("cudnn_benchmark", "cudnn.benchmark", ALL_TOGETHER, (1.0, 1.1), ("cuda",)),
    # the ladder's batch row is its max-throughput preset ('all together' with batch x2), built in bench.ladder
    Technique("batch_size", "a larger batch", ALL_TOGETHER, (1.08, 1.2), panel=("batch_size",)),
)


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
    with `together` decided for this device (a 16-bit row only with the device's own 16-bit precision). `fast_bf16`
    answers `hardware.supports_bf16` for a device that is not here (the rows a GPU would run, listed on a CPU)."""
    bf16 = hardware.supports_bf16(device) if fast_bf16 is None else fast_bf16
    have = {None: True, "compile": compile_ok, "bf16": bf16}
    own = ("fp32", "bf16" if bf16 else "fp16")
    return [dataclasses.replace(row, together=row.together and row.change.get("precision", "fp32") in own)
            for t in TECHNIQUES for row in getattr(t, kind)
            if device.type in (row.devices or t.devices) and have[row.needs]]


def panel_fields() -> tuple[str, ...]:
    """The config fields the widget panel shows a control for, in order."""
    return tuple(name for t in TECHNIQUES for name in t.panel)
