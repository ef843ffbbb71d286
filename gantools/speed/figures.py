"""A ladder row's figures besides its speed: the FLOPs of its training step per image and the peaks they are read
against (MFU: the GPU's published bf16 peak; everywhere, a large matmul measured on the spot), and its host figures
(`iteration_budget`: what one iteration asks of the device, and the host's time to ask it), which say whether a
GPU waits for its host. `bench` and `climb` fill their rows with them and draw their columns."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from ..core.config import TrainConfig
from ..errors import GantoolsError
from ..measuring.hardware import autocast_precision, fast_bf16
from . import iteration_budget

# bf16 dense tensor-core peaks (FLOP/s), the MFU denominator; matched against the CUDA device name
PEAK_BF16 = {"H200": 989e12, "H100 SXM": 989e12, "H100 80GB HBM3": 989e12, "H100 PCIe": 756e12, "H100": 756e12,
             "A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10": 125e12, "RTX 4090": 165e12}


def matmul_peak(device: torch.device, dtype=torch.bfloat16, n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of a large square matmul measured here: the denominator for a CPU's utilisation, which has no
    published per-core peak to look up. Synchronised; the best of `repeats`."""
    from ..measuring.hardware import synchronize

    n, inner = (8192, 20) if device.type == "cuda" else (n, 1)  # a GPU needs more work per timing than a launch
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    a @ b
    best = math.inf
    for _ in range(repeats):
        synchronize(device)
        t = time.perf_counter()
        for _ in range(inner):
            a @ b
        synchronize(device)
        best = min(best, (time.perf_counter() - t) / inner)
    return 2 * n**3 / best


def flops_per_image(trainer) -> float:
    """FLOPs of one training step of this trainer's own config (D and G, forward and backward; a frozen D computes
    no weight gradients in G's step) per image, counted by FlopCounterMode, without training it: the step runs on
    a snapshot of its state (`Trainer.unchanged`), on the eager networks. Eager because a compiled network under
    FlopCounterMode (a TorchDispatchMode) is not compiled: dynamo skips a frame run under a dispatch mode and then
    skips that code object for good (pytorch/pytorch#190286; #140909: compiled models fall back to eager after
    being counted), and the DCGAN's forward code is shared by every variant. Compiling changes no matmul or
    convolution, which is all FlopCounterMode counts."""
    from torch.utils.flop_counter import FlopCounterMode

    from ..core.loaders import prepare_batch

    # one batch straight from the dataset: iterating the trainer's loader could restart its persistent workers
    items = [trainer.dataset[i] for i in range(trainer.cfg.batch_size // trainer.world.size)]
    images = torch.stack([item[0] if isinstance(item, (tuple, list)) else item for item in items])
    batch = prepare_batch(images, trainer.device, channels_last=trainer.cfg.channels_last)
    if trainer.cfg.conditional:  # with its labels
        batch = (batch, torch.as_tensor([int(item[1]) for item in items], device=trainer.device))
    with trainer.unchanged(), trainer.stepper.eager():
        with FlopCounterMode(display=False) as counter:
            trainer.train_step(*[batch] * trainer.cfg.d_steps)  # a step: d_steps D steps, one G step
    return counter.get_total_flops() / (len(images) * trainer.cfg.d_steps)  # per real image, as images/s counts


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16.items() if key in name), None)


def peaks(dev: torch.device) -> dict:
    """The published bf16 peak (CUDA) and the matmuls measured here: fp32's, and the device's 16-bit precision's
    where it is fast."""
    half = autocast_precision(dev)  # a GPU without fast bf16 has fast fp16
    matmul = {"fp32": matmul_peak(dev, torch.float32)}
    # emulated bf16 is never the peak, and its matmul takes minutes: the CPU's real answer (imported by name, so the
    # test suite's pin of `hardware.fast_bf16` does not make a CPU without it spend those minutes)
    if dev.type == "cuda" or fast_bf16(dev):
        matmul[half] = matmul_peak(dev, torch.bfloat16 if half == "bf16" else torch.float16)
    return {"peak_bf16_flops": peak_flops(dev), "measured_matmul_flops": matmul}


def ladder_rows(measured: dict, steps: dict, result: dict) -> list[dict]:
    """A `bench.BenchRow` per measured variant (`measured`: `bench.interleave`'s, `steps`: each one's changes): its
    speed against the reference's (the first), its FLOPs per image and what share of the peaks in `result` (`peaks`)
    they reach."""
    reference = measured[next(iter(measured))].images_per_sec
    peak, fastest = result["peak_bf16_flops"], max(result["measured_matmul_flops"].values())
    rows = []
    for name, m in measured.items():
        flops = flops_per_image(m.subject)
        rows.append({"variant": name, "changes": dict(steps[name]), "batch_size": m.subject.cfg.batch_size,
                     "warmup_s": m.warmup_s, "images_per_sec_runs": m.images_per_sec_runs,
                     "flops_per_image": flops, "images_per_sec": m.images_per_sec, "spread": m.spread,
                     "speedup": m.images_per_sec / reference, "peak_mem_mb": m.subject.history[-1]["peak_mem_mb"],
                     "tflops": m.images_per_sec * flops / 1e12,
                     "mfu": m.images_per_sec * flops / peak if peak else None,
                     "matmul_share": m.images_per_sec * flops / fastest})
    return rows


def first_line(error: BaseException) -> str:
    """An error in one line, as a skipped row shows it: its first line, with the first problem it lists where that
    line is only a heading (ConfigError's 'invalid TrainConfig:')."""
    lines = [line.strip().lstrip("- ") for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]


def host_figures(cfg: TrainConfig, out_dir: Path, cache: dict) -> dict:
    """`cfg`'s host budget per iteration (`iteration_budget.budget_of`; on a CPU counted as a GPU runs the config)
    and its host ms (`iteration_budget.host_ms`), each in a trainer of its own, after the timed chunks. `cache`
    keeps them by config (its folder aside): a config both tables hold is counted once. One that cannot be counted
    (a gantools error) gets None and `host_error`, the error's first line."""
    key = json.dumps({**cfg.to_dict(), "out_dir": None}, sort_keys=True, default=str)
    if key not in cache:
        try:
            cache[key] = {"host_budget": iteration_budget.budget_of(cfg.replace(out_dir=str(out_dir / "budget"))),
                          "host_ms": iteration_budget.host_ms(cfg.replace(out_dir=str(out_dir / "host-time")))}
        except GantoolsError as e:
            cache[key] = {"host_budget": None, "host_ms": None, "host_error": first_line(e)}
    return dict(cache[key])


HOST_HEAD = ["launches/it", "syncs/it", "host reads/it", "host ms"]


def host_cells(row: dict) -> list[str]:
    """A row's launches, syncs and host reads per iteration and its host ms ('n/a' where not counted)."""
    budget, ms = row.get("host_budget"), row.get("host_ms")
    cells = [f"{budget[k]:g}" for k in ("launches", "syncs", "cpu_reads")] if budget else ["n/a"] * 3
    return cells + [f"{ms:.2f}" if ms is not None else "n/a"]


def host_note(result: dict) -> str:
    """What the host columns count, and, on a CPU, that they count what a GPU's host would issue."""
    rows = [*result["rows"], *(result.get("climb") or {}).get("rows", [])]
    as_gpu = not result["machine"]["device"].startswith("cuda") and any(
        (r.get("host_budget") or {}).get("as_on") == "cuda" for r in rows)
    return ("Host budget: launches, host syncs and host reads (.item() of a tensor kept on the host) per iteration of "
            f"each row's config{' (counted as a GPU runs it)' if as_gpu else ''}; host ms: the host's time per "
            "iteration at tiny widths, where the compute is negligible (gantools.speed.iteration_budget). A GPU "
            "runs a small GAN's kernels in microseconds each, so launches times a few microseconds each, against "
            "the GPU time of a step, says whether the GPU waits for the host.")
