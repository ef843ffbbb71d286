"""The benchmark ladder: the tutorial's loop, each technique alone, everything together and a max-throughput preset,
measured in one process, interleaved, with quality beside speed when asked.

Protocol (`interleave`, the benchmark's use of `measuring.turns.take_turns`, how gantools measures speed;
`gantools.tuning` uses it too): every variant is built and warmed up first (warm-up time, which holds torch.compile,
is reported on its own); then the variants take turns, one chunk of steps each per repeat, so machine noise hits
them all alike. Every chunk is timed with the device synchronised; a row reports the median images/s over repeats
and its spread (min to max). Every variant trains on the same number of images, so with `quality=True` their FID,
KID and class coverage are comparable.

`run(climb=True)` (the default on CUDA) adds the climbing ladder after the rows (`climb`). Every row of both carries
its FLOPs and host figures (`figures`: launches, syncs, host reads and host ms per iteration).

`scaling()` adds the row for more than one GPU: the same training under torchrun with 1..N processes (N: the GPUs
here; on a CPU, 2 processes with gloo), each process with the preset's batch (so the global batch grows with N, the
usual "weak scaling"), and the scaling efficiency images/s(N) / (N x images/s(1)).
"""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, NotRequired, TypedDict

import torch

from ..core import distributed, techniques
from ..core.config import TrainConfig, cli_flags, preset, scale_batch
from ..errors import ConfigError, GantoolsError, ScalingCrash, Stopped
from ..measuring.clock import logged_seconds
from ..measuring.hardware import machine_info, resolve_device
from ..measuring.turns import ALTERNATE, Contender, Paired, Spread, take_turns
from ..quick import QUICK
from .climb import REFERENCE, Measuring, climb_ladder, climb_markdown, climb_rungs
from .figures import HOST_HEAD, host_cells, host_figures, host_note, ladder_rows, peaks
from .figures import flops_per_image as flops_per_image  # where the docs and tests first found it
from .keep import QUALITY_TARGET

TARGETS = {"cpu": 3.0, "gpu": 10.0}  # best preset's images/s over the reference's
MFU_TARGET = 0.25                   # max-throughput preset on one H100

SIZES = {  # a few minutes on a 2-core CPU; one GPU; and seconds anywhere, to check the machinery runs (a dry run)
    "cpu": dict(dataset="glyphs", image_size=32, channels=1, batch_size=128, ngf=64, ndf=64),
    "gpu": dict(dataset="glyphs-color", image_size=64, channels=3, batch_size=128, ngf=64, ndf=64),
    "tiny": dict(dataset="glyphs", image_size=32, channels=1, batch_size=32, ngf=8, ndf=8, nz=16),
}
# quality_images: on glyphs at 32 px, FID falls steeply for several hundred steps of batch 128 and then flattens,
# so shorter budgets compare noise (evidence: docs/benchmark.md)
PLAN = {"cpu": dict(warmup_images=128 * 3, images_per_repeat=128 * 3, repeats=5, quality_images=128 * 800),
        "gpu": dict(warmup_images=128 * 20, images_per_repeat=128 * 50, repeats=5, quality_images=128 * 3000)}
# Quick mode (GANTOOLS_QUICK=1: tests, nbval): one-step chunks, a tiny quality budget; the tiny size's plan too
QUICK_PLAN = dict(warmup_images=1, images_per_repeat=1, repeats=3, quality_images=32 * 12)
PLAN["tiny"] = QUICK_PLAN
# On CUDA a timed chunk lasts at least this long (`interleave`): a GPU runs a small GAN's step in a millisecond or two,
# and a chunk of a few steps would time the log's synchronisation and the host's jitter more than the steps
MIN_CHUNK_S = 0.5


def plan_for(device: torch.device) -> dict:
    """The measuring plan for a device: the CPU's or the GPU's, or the quick one in quick mode."""

    return dict(QUICK_PLAN if QUICK else PLAN["gpu" if device.type == "cuda" else "cpu"])


def can_compile(device: torch.device) -> bool:
    """torch.compile needs Triton on CUDA, and a C++ compiler on the CPU."""
    import shutil

    return device.type == "cuda" or any(shutil.which(c) for c in ("g++", "c++", "clang++"))


def ladder(device: torch.device, compile_variants: bool) -> dict:
    """name -> config changes from the reference. Each technique alone (`techniques.TECHNIQUES`' ladder rows, in
    their order, as they apply on `device`), then all together (in the device's 16-bit precision: bf16, or fp16
    on a GPU without fast bf16), then max throughput."""
    steps, together = {"reference (tutorial loop)": {}}, {}
    for row in techniques.rows("ladder", device, compile_variants):
        steps[row.name] = dict(row.change)
        if row.together:
            together.update(row.change)
    steps["all together"] = together
    # twice the batch; the learning rates follow (config.scale_batch: x sqrt 2, the usual rule for Adam)
    steps["max throughput (batch x2)"] = {**together, "batch_scale": 2}
    return steps


def variant(name: str, base: TrainConfig) -> TrainConfig:
    """The ladder's row `name` (e.g. 'all together') applied to `base` (normally the reference preset)."""
    dev = resolve_device(base.device)
    steps = ladder(dev, can_compile(dev))
    if name not in steps:
        raise ConfigError(f"unknown variant {name!r}; choose from {list(steps)}")
    return _apply(base, steps[name]).validate()


def _apply(base: TrainConfig, changes: dict) -> TrainConfig:
    changes = dict(changes)
    batch_scale = changes.pop("batch_scale", 1)
    return scale_batch(base, base.batch_size * batch_scale).replace(**changes)


def row_config(base: TrainConfig, changes: dict, out_dir: Path, name: str) -> TrainConfig:
    """A row's config as it is measured: `changes` on `base`, no samples or checkpoints, a folder named for it."""
    return _apply(base, changes).replace(
        sample_interval=0, checkpoint_interval=0,
        out_dir=str(out_dir / name.split(" (")[0].replace(" ", "-").replace("/", "-"))).validate()


def measurement_trainer(cfg: TrainConfig, plan: dict, **trainer_args):
    """A trainer for interleaved chunks (`interleave`): no cap on steps, a log record per chunk, no samples or
    checkpoints on the way (fit() still writes one checkpoint at its end, outside the timed steps).
    `trainer_args` go to Trainer (your own networks, dataset, callbacks)."""
    from ..core.trainer import Trainer

    return Trainer(cfg.replace(log_interval=max(1, plan["images_per_repeat"] // cfg.images_per_step), steps=10**9,
                               sample_interval=0, checkpoint_interval=0), **trainer_args)


def side_by_side(configs: dict, plan: dict | None = None, out_dir="runs/bench/side-by-side", progress=None) -> dict:
    """Configs measured against each other with the ladder's protocol (`interleave`), e.g. tune's start and final
    beside the ladder's 'all together' (`variant`). Returns name -> {images_per_sec, spread, vs_first, warmup_s};
    `side_by_side_markdown` draws it."""
    first = next(iter(configs.values()))
    plan = {**plan_for(resolve_device(first.device)), **(plan or {})}
    builders = {name: (lambda cfg=cfg, i=i: measurement_trainer(cfg.replace(out_dir=str(Path(out_dir) / f"{i}")), plan))
                for i, (name, cfg) in enumerate(configs.items())}
    measured = interleave(builders, plan["warmup_images"], plan["images_per_repeat"], plan["repeats"], progress)
    base = measured[next(iter(measured))]
    rows = {}
    for name, m in measured.items():
        ratios = m.ratios(base)
        rows[name] = {"images_per_sec": m.images_per_sec, "spread": m.spread, "vs_first": statistics.median(ratios),
                      "vs_first_spread": Paired.of(ratios), "warmup_s": m.warmup_s}
    return {"plan": plan, "date": time.strftime("%Y-%m-%d"), "machine": machine_info(first.device), "rows": rows}


def side_by_side_markdown(result: dict) -> str:
    from ..measuring.results import markdown_table

    first = next(iter(result["rows"]))
    head = ["config", "images/s", "spread", f"vs {first} (paired, spread)", "warm-up s"]
    return markdown_table(head, [[name, f"{r['images_per_sec']:.0f}", f"{r['spread'][0]:.0f}-{r['spread'][1]:.0f}",
                                  f"{r['vs_first']:.2f}x" + (f" ({r['vs_first_spread'][0]:.2f}-"
                                                             f"{r['vs_first_spread'][1]:.2f})" if r['vs_first_spread']
                                                             else " (one repeat)"),
                                  f"{r['warmup_s']:.1f}"] for name, r in result["rows"].items()])


def interleave(contenders: dict, warmup_images: int, images_per_repeat: int, repeats: int, progress=None,
               stop=None, min_chunk_s: float | None = MIN_CHUNK_S) -> dict:
    """Measure trainers against each other in one process: the benchmark's protocol, and the tuner's, by
    `turns.take_turns` in alternating order.

    `contenders`: name -> a Trainer, or a function that builds one (then its construction counts as warm-up). Each
    is warmed up first (`warmup_images`, at least one step; the time is returned apart and excluded), then they take
    turns for `repeats` rounds, one chunk of `images_per_repeat` images (at least one step) each per round. A chunk's
    images/s comes from the trainer's own synchronised step times over that chunk (`_chunk`). `stop()` is asked
    between chunks; a chunk cut short (Ctrl-C, `Trainer.stop`) also ends the measurement: both raise `Stopped`.
    A contender on CUDA gets chunks of at least `min_chunk_s` seconds at the speed of its warm-up's second half (the
    first holds what happens once: compile, a graph's capture, cudnn's search), so a fast config's chunk times its
    steps, not the log's synchronisation; on a CPU the plan's chunks stand.
    Returns name -> `turns.Measured`, its subject the warm trainer."""
    stop = stop or (lambda: False)
    chunks = {}  # name -> steps per timed chunk, decided at its warm-up

    def warm_up(name, contender):
        trainer = contender() if callable(contender) else contender
        per_step = trainer.cfg.images_per_step  # real images per step
        warm, chunks[name] = max(1, warmup_images // per_step), max(1, images_per_repeat // per_step)
        if min_chunk_s and getattr(getattr(trainer, "device", None), "type", None) == "cuda":
            speed = _warm_up_speed(trainer, warm, stop)
            chunks[name] = max(chunks[name], math.ceil(min_chunk_s * speed / per_step))
        else:
            _chunk(trainer, warm, stop)
        return trainer

    return take_turns({name: Contender(warm_up=lambda n=name, c=c: warm_up(n, c),
                                       turn=lambda trainer, n=name: _chunk(trainer, chunks[n], stop))
                       for name, c in contenders.items()}, repeats, order=ALTERNATE, progress=progress)


def _warm_up_speed(trainer, steps: int, stop) -> float:
    """Images/s of the second half of a warm-up of `steps` steps (of the whole, with one step)."""
    first = (steps + 1) // 2
    speed = _chunk(trainer, first, stop)
    return _chunk(trainer, steps - first, stop) if steps > first else speed


def prefetched(cfg: TrainConfig) -> int:
    """Batches a DataLoader's workers prepare in the background, whether or not the trainer is training: up to
    num_workers x prefetch_factor (torch's default factor: 2) are in flight at any time. None without workers or
    with the device loader."""
    if cfg.loader != "dataloader" or cfg.num_workers == 0:
        return 0
    return cfg.num_workers * (cfg.prefetch_factor or 2)


def _chunk(trainer, steps: int, stop) -> float:
    """Train `steps` steps; their images/s from the synchronised step times logged meanwhile. A DataLoader with
    workers first runs, untimed, the batches it prepared while the other contenders trained (`prefetched`), so it
    is not credited with work done in their turn."""
    lead = prefetched(trainer.cfg)
    for n in (lead, steps) if lead else (steps,):  # the timed steps come last
        if stop():
            raise Stopped("stopped between measurements")
        start, first = trainer.step, len(trainer.history)
        trainer.fit(n)
        if trainer.step - start < n:
            raise Stopped(f"stopped after {trainer.step - start} of {n} steps")
    steps, seconds = logged_seconds(trainer.history.records[first:], start)
    return steps * trainer.cfg.images_per_step / seconds


class BenchRow(TypedDict, total=False):
    """One variant of the ladder, as `run` returns it and bench.json stores it (`fid`, `kid`, ... with quality)."""

    variant: str
    changes: dict
    batch_size: int
    warmup_s: float
    images_per_sec_runs: list
    flops_per_image: float
    images_per_sec: float
    spread: Spread
    speedup: float
    peak_mem_mb: float
    tflops: float
    mfu: float | None
    matmul_share: float
    host_budget: dict | None
    host_ms: float | None
    fid: float


class BenchResult(TypedDict):
    """What `run` returns and `python -m gantools bench` writes as JSON: the machine, the protocol, the rows, and
    with a climb its rows and its best ('all together')."""

    machine: dict
    size: str
    config: dict
    plan: dict
    peak_bf16_flops: float | None
    measured_matmul_flops: dict
    date: str
    rows: list[BenchRow]
    climb: NotRequired[dict]
    partial: NotRequired[bool]


def run(size: str = "cpu", device: str = "auto", variants=None, quality: bool = False, compile: bool | None = None,
        repeats: int | None = None, out_dir="runs/bench", quality_samples: int = 2048, overrides=None,
        plan=None, progress=print, climb: bool | None = None,
        partial: Callable[[dict], None] | None = None) -> BenchResult:
    """Run the ladder (or the named `variants` of it): machine, protocol and one `BenchRow` per variant, each with its
    host figures; with `climb` (default: on CUDA) the climbing ladder after it (`climb.Climb`, under 'climb'). `partial`
    is given the result so far after each stage (marked 'partial'), so a run stopped at a time limit leaves what it
    measured. In quick mode the quick plan's one-step chunks measure the `size`'s networks."""
    dev = resolve_device(device)
    plan = _plan(size, dev, plan, repeats)
    base = preset("reference", device=str(dev), **SIZES[size]).replace(**(overrides or {}))
    compile_ok = compile if compile is not None else can_compile(dev)
    steps = _chosen(ladder(dev, compile_ok), variants)
    out_dir = Path(out_dir)
    configs = {name: row_config(base, changes, out_dir, name) for name, changes in steps.items()}
    # Each variant is built and trained with its own settings (TF32, cudnn.benchmark and its RNG live in its
    # Trainer and apply only during its own fit()), so building them all first and interleaving them is fair.
    builders = {name: (lambda cfg=cfg: measurement_trainer(cfg, plan)) for name, cfg in configs.items()}
    measured = interleave(builders, plan["warmup_images"], plan["images_per_repeat"], plan["repeats"], progress,
                          min_chunk_s=plan.get("min_chunk_s"))
    result = {"machine": machine_info(dev), "size": size, "config": base.to_dict(), "plan": plan,
              **peaks(dev), "date": time.strftime("%Y-%m-%d")}
    result["rows"] = ladder_rows(measured, steps, result)

    def emit() -> None:
        if partial is not None:
            partial({**result, "partial": True})
    emit()
    cache, climber = {}, None
    if climb if climb is not None else dev.type == "cuda":
        why = "left out (compile=False, --no-compile)" if compile is False else "no C++ compiler for torch.compile"
        climber = climb_ladder(base, plan, out_dir / "climb", climb_rungs(dev, compile_ok, why),
                               Measuring(interleave, measurement_trainer, row_config), measured[REFERENCE].subject,
                               progress, result, emit)
    for i, row in enumerate(result["rows"]):  # counted after every speed: a run cut short keeps those first
        row.update(host_figures(configs[row["variant"]], out_dir / "host" / f"{i:02d}", cache))
        emit()
    if climber is not None:
        climber.count(cache)
    if quality:
        _quality(result["rows"], {name: m.subject for name, m in measured.items()}, base, plan, quality_samples,
                 dev, progress)
    return result


def _plan(size: str, dev: torch.device, plan: dict | None, repeats: int | None) -> dict:
    """The size's plan (the quick one in quick mode) with the caller's changes; on CUDA, chunks of at least
    `MIN_CHUNK_S` (`interleave`)."""
    plan = {**(QUICK_PLAN if QUICK else PLAN[size]), **(plan or {})}
    if repeats:
        plan["repeats"] = repeats
    if dev.type == "cuda":
        plan.setdefault("min_chunk_s", MIN_CHUNK_S)
    return plan


def _chosen(steps: dict, variants) -> dict:
    """The ladder's rows named in `variants` (all without), the reference always."""
    if not variants:
        return steps
    unknown = set(variants) - set(steps)
    if unknown:
        raise ConfigError(f"unknown variant(s) {sorted(unknown)}; choose from {list(steps)}")
    return {k: v for k, v in steps.items() if k in variants or k == REFERENCE}


def _quality(rows: list, trainers: dict, base: TrainConfig, plan: dict, samples: int, dev, progress) -> None:
    """Every variant trained to the same image budget, then its FID, KID and class coverage added to its row."""
    from ..core.metrics import QualityCallback, QualityMeter

    meter = QualityMeter(base.dataset, base.image_size, base.channels, n=samples, device=dev)
    progress(f"training every variant to {plan['quality_images']} images for FID ...")
    for row in rows:
        trainer = trainers[row["variant"]]
        seen = trainer.batches_seen * trainer.cfg.batch_size  # real images
        trainer.callbacks.append(QualityCallback(meter))
        trainer.fit(max(0, plan["quality_images"] - seen) // trainer.cfg.images_per_step)
        row.update(trainer.history.quality)
        progress(f"quality of {row['variant']}: FID {row['fid']:.2f}")


def markdown(result: dict) -> str:
    m = result["machine"]
    quality = any("fid" in r for r in result["rows"])
    head = ["variant", "images/s", "spread", "vs reference", "peak tensor MB", "warm-up s", "TFLOP/s", "of matmul peak",
            "MFU", *HOST_HEAD]
    head += ["FID", "KID", "classes"] if quality else []
    peaks = result["measured_matmul_flops"]
    half = next((k for k in peaks if k != "fp32"), None)  # the device's 16-bit precision, where it is fast
    measured = (f"{peaks['fp32'] / 1e12:.2f} TFLOP/s in fp32 and {peaks[half] / 1e12:.2f} in {half} (\"of matmul "
                "peak\": a row's TFLOP/s against the faster of the two)" if half else
                f"{peaks['fp32'] / 1e12:.2f} TFLOP/s in fp32 (\"of matmul peak\": a row's TFLOP/s against it; this CPU "
                "has no native bf16, so its emulated bf16 is not measured)")
    chunks = (f", each timed chunk at least {result['plan']['min_chunk_s']:g} s" if result["plan"].get("min_chunk_s")
              else "")
    lines = [f"{m['device_name']} ({m['device']}), torch {m['torch']}, {result['date']}, preset {result['size']}: "
             f"DCGAN {result['config']['image_size']} px, {result['config']['channels']} ch, "
             f"{result['config']['dataset']}, batch {result['config']['batch_size']}, median of "
             f"{result['plan']['repeats']} interleaved repeats{chunks}. A large square matmul runs here at "
             f"{measured}; MFU is against the GPU's published bf16 dense peak.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["rows"]:
        cells = [r["variant"], f"{r['images_per_sec']:.0f}", f"{r['spread'][0]:.0f}-{r['spread'][1]:.0f}",
                 f"{r['speedup']:.2f}x", f"{r['peak_mem_mb']:.0f}", f"{r['warmup_s']:.1f}",
                 f"{r['tflops']:.2f}", f"{100 * r['matmul_share']:.0f}%",
                 f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a", *host_cells(r)]
        if quality:
            cells += [f"{r['fid']:.2f}", f"{r['kid']:.3f}", f"{r['classes_covered']}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", host_note(result), "", *_verdicts(result, quality)]
    if result.get("climb"):
        lines += ["", climb_markdown(result)]
    return "\n".join(lines)


def _verdicts(result: dict, quality: bool) -> list[str]:
    """The ladder's best against the speed target, quality against its target, and the max-throughput MFU."""
    rows = result["rows"]
    best = max(rows, key=lambda r: r["speedup"])
    cuda = result["machine"]["device"].startswith("cuda")
    target = TARGETS["gpu" if cuda else "cpu"]
    lines = [f"best: {best['variant']} at {best['speedup']:.2f}x the reference's images/s "
             f"(target {target}x: {'met' if best['speedup'] >= target else 'NOT met'})"]
    if quality:
        ref = rows[0]
        ratio = best["fid"] / ref["fid"]
        lines.append(f"quality at an equal image budget ({ref['images_trained']} images, {ref['n_samples']} samples, "
                     f"{ref['feature_space']}): best preset's FID / reference's = {ratio:.2f} "
                     f"(target <= {QUALITY_TARGET:.2f}: {'met' if ratio <= QUALITY_TARGET else 'NOT met'})")
        kept = [r for r in rows if r["fid"] <= QUALITY_TARGET * ref["fid"]]
        fastest = max(kept, key=lambda r: r["speedup"])
        lines.append(f"fastest variant that keeps quality (FID within {QUALITY_TARGET}x the reference's): "
                     f"{fastest['variant']} at {fastest['speedup']:.2f}x, FID {fastest['fid'] / ref['fid']:.2f}x")
    top = next((r for r in rows if r["variant"].startswith("max throughput")), None)
    if cuda and top is not None and top["mfu"] is not None:
        lines.append(f"max-throughput MFU {100 * top['mfu']:.1f}% (target >= {100 * MFU_TARGET:.0f}%: "
                     f"{'met' if top['mfu'] >= MFU_TARGET else 'NOT met'})")
    return lines


def scaling_config(size: str = "cpu", device: str = "auto", overrides=None) -> TrainConfig:
    """The config `scaling` trains: the reference at `size`, with every technique of 'all together' but compile,
    then `overrides`; its `batch_size` is one process's (or, keeping the global batch, all of them together)."""
    dev = resolve_device(device)
    base = preset("reference", device=dev.type, **SIZES[size]).replace(**ladder(dev, False)["all together"])
    return base.replace(**(overrides or {}))


def scaling_command(cfg: TrainConfig, processes: int) -> str:
    """The torchrun line that trains `cfg` (its `batch_size` the global batch) in `processes` processes."""
    return (f"torchrun --nproc_per_node {processes} -m gantools train --preset reference "
            + " ".join(cli_flags(cfg, preset("reference"))))


def scaling(size: str = "cpu", device: str = "auto", max_processes: int | None = None, repeats: int = 3,
            steps: int = 25, log_interval: int = 5, overrides=None, out_dir="runs/bench/scaling",
            progress=print, keep_global_batch: bool = False) -> dict:
    """Images/s of 'all together' (without compile) trained by 1..N processes under torchrun, the process counts
    interleaved over `repeats`; each run's figure is its median over log intervals after the first (warm-up), and
    each row's `paired` range its images/s over 1 process's, repeat by repeat. On a CPU the processes share the
    machine's cores (each gets cores / N threads), so there the figure measures what data parallelism costs, not
    what more hardware buys. Each process trains the preset's batch (weak scaling), or with `keep_global_batch`
    its 1/N share of it (Amdahl's strong scaling: the same training at every N, as `batch_size` means in a
    config)."""
    dev = resolve_device(device)
    gpus = torch.cuda.device_count() if dev.type == "cuda" else 0
    n_max = max_processes or (gpus if gpus else 2)
    if gpus and n_max > gpus:
        raise ValueError(f"{n_max} processes need {n_max} GPUs; {gpus} visible")
    base = scaling_config(size, dev.type, overrides)
    per_process, cores = base.batch_size, os.cpu_count() or 1
    threads = None if gpus else {n: max(1, cores // n) for n in range(1, n_max + 1)}
    runs = {n: [] for n in range(1, n_max + 1)}
    batch = {n: per_process if keep_global_batch else per_process * n for n in runs}
    for r in range(repeats):
        for n in runs:
            run_dir = Path(out_dir) / f"{n}-processes-{r}"
            cfg = base.replace(batch_size=batch[n], steps=steps, log_interval=log_interval, sample_interval=0,
                               checkpoint_interval=0, out_dir=str(run_dir)).validate()
            args = ["-m", "gantools", "train", "--preset", "reference", "--quiet",
                    *cli_flags(cfg, preset("reference"))]
            command = [sys.executable, *args] if n == 1 else distributed.launch_command(n, *args)
            env = {**os.environ, **({"OMP_NUM_THREADS": str(threads[n])} if threads else {})}
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise _child_failure(n, done)
            records = json.loads((run_dir / "history.json").read_text())
            runs[n].append(statistics.median(x["images_per_sec"] for x in records[1:] or records))
            progress(f"{n} process(es), repeat {r + 1}/{repeats}: {runs[n][-1]:.0f} images/s")
    one = statistics.median(runs[1])
    rows = [{"processes": n, "batch_per_process": batch[n] // n, "global_batch": batch[n],
             "images_per_sec": statistics.median(v), "images_per_sec_runs": v, "spread": Spread.of(v),
             "paired": Paired.of(a / b for a, b in zip(v, runs[1], strict=True)),
             "speedup": statistics.median(v) / one, "efficiency": statistics.median(v) / (n * one)}
            for n, v in runs.items()]
    return {"machine": machine_info(dev), "size": size, "config": base.to_dict(), "repeats": repeats,
            "steps": steps, "threads_per_process": threads, "keep_global_batch": keep_global_batch,
            "date": time.strftime("%Y-%m-%d"), "rows": rows}


def _child_failure(n: int, done: subprocess.CompletedProcess) -> Exception:
    """A child's own gantools error (it printed "gantools: error" and exited with 2: bad input, missing data) is
    passed on as one; anything else is a crash."""
    lines = [line for line in done.stderr.splitlines() if line.startswith("gantools: error")]
    if done.returncode == 2 and lines:
        message = lines[0].split(":", 2)[-1].strip()
        return GantoolsError(f"the {n}-process run stopped: {message}")
    return ScalingCrash(f"the {n}-process run crashed (exit status {done.returncode}); the last of what it "
                        f"printed:\n{done.stderr[-3000:]}")


def scaling_markdown(result: dict) -> str:
    m, c = result["machine"], result["config"]
    cpu = not m["device"].startswith("cuda")
    lines = [f"{m['device_name']} ({m['device']}), torch {m['torch']}, {result['date']}: all together without "
             f"compile, DCGAN {c['image_size']} px, {c['dataset']}, {c['precision']}, "
             f"{_batch_words(result)}, {result['steps']} steps a run, "
             f"median of {result['repeats']} interleaved repeats; torchrun + DistributedDataParallel "
             f"({'gloo' if cpu else 'NCCL'}).", "",
             "| processes | global batch | images/s | spread | vs 1 process | scaling efficiency |",
             "|---:|---:|---:|---|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['processes']} | {r['global_batch']} | {r['images_per_sec']:.0f} | "
                     f"{r['spread'][0]:.0f}-{r['spread'][1]:.0f} | {r['speedup']:.2f}x | "
                     f"{100 * r['efficiency']:.0f}% |")
    if cpu:
        threads = "; ".join(f"{n} process{'es' if int(n) > 1 else ''}: {t} thread{'s' if t > 1 else ''}"
                            f"{' each' if int(n) > 1 else ''}" for n, t in result["threads_per_process"].items())
        lines += ["", f"On a CPU the processes share its {m['cpu_cores']} cores ({threads}), so N processes have no "
                      "more compute than one: any speed-up comes from keeping the same cores busier (a thread per "
                      "process instead of one process splitting each op over threads), net of the gradient "
                      "all-reduces. It is not what N GPUs would buy."]
    return "\n".join(lines)


def _batch_words(result: dict) -> str:
    first = result["rows"][0]
    if result.get("keep_global_batch"):
        return f"a global batch of {first['global_batch']} shared by the processes"
    return f"{first['batch_per_process']} images per process per step"


def save(result: dict, json_path) -> None:
    Path(json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(json_path).write_text(json.dumps(result, indent=1))
