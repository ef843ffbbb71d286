"""`python -m gantools check`: every technique gantools offers, run for a few steps on this machine, each verified.
The first thing to run on a new GPU: gantools' own tests run on a CPU, so this is where a GPU user finds out, in a
minute or two, which techniques work with their driver, GPU and torch.

For each technique's check rows that apply on the device (`Technique.checks`, in `techniques.TECHNIQUES`' order:
`techniques.rows`; a row that sets dataset='folder' reads the check's images as PNG files decoded once into their
cache, `images_folder`: the memory-mapped loader, on CUDA also loader='auto'), the GAN variants
(WGAN-GP's gradient penalty with 2 D steps per G step, lazy R1 with an EMA generator, a conditional GAN, R3GAN:
its networks, the relativistic loss, R1 and R2; on CUDA WGAN-GP's and R3GAN's penalties also with fp16 + GradScaler
and with CUDA graphs, R3GAN's under bf16 where it is fast), on CUDA a profiled step (`PROFILE_ROW`: gantools' step makes
no host sync, so `gantools profile` must count none, its own synchronisations left out), a dataset of your own
that returns its images already on the GPU (trained with the defaults: nothing pinned, no workers) and a real
out-of-memory (`OOM_ROW`: told apart by `recovery.is_out_of_memory`, then training goes on), and DDP with
2 processes (gloo on a CPU, NCCL where 2 GPUs exist) it checks:
- every logged loss is finite, and a penalty of D (WGAN-GP's, R1, R2) was applied in the last logged steps;
- no weight gradient reaches a frozen D in G's step (a gradient hook on D's weights, told the phase of the step);
- torch.compile built no more graphs than the step needs (G once, plus once more without gradients when
  accumulating; D twice: its inputs with and without gradients, and once more under no_grad for a paired loss)
  and none after warm-up, and skipped no CUDA graphs;
- on a CPU, resuming from a checkpoint gives bit-identical weights (the EMA generator's too) and losses (on a GPU
  kernels need not be deterministic, so there it is not required);
- with a GradScaler (fp16, CUDA), the host syncs in the optimizer steps, counted and shown (`counting_syncs`): none
  with fused Adam, else GradScaler.step's `.item()` on found_inf, one per optimizer step (the fp16 rows with each
  optimizer implementation show both).

Each row that passed also carries its config's host budget (`with_host_budget`: launches, syncs and host reads per
iteration, counted by `iteration_budget.budget_of`, on a CPU as a GPU would run the config): what the technique asks
of the host, which on a GPU bounds a small model's speed before any kernel does.

Techniques that pass on a CUDA device are recorded under data/check/ (keyed by GPU name and torch version):
`validated()` reads that record, so the profiler recommends CUDA graphs only where they ran here.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import TypedDict

import torch

from ..core import distributed
from ..core import techniques as techniques_  # `techniques` is this module's function, which tests replace
from ..core.checkpoint import atomic_write, load_checkpoint
from ..core.config import TrainConfig, cli_flags, uses_cuda_graphs
from ..core.data import CachedFolder, ImageTensorDataset, data_root, render_glyphs, write_glyph_pngs
from ..errors import ConfigError
from ..measuring.hardware import SYNC_WARNING, machine_info, supports_bf16
from ..core.recovery import is_out_of_memory
from ..core.history import METRICS
from ..core.losses import LOSSES
from ..core.validation import penalised
from ..core.trainer import Trainer
from . import iteration_budget

# A DCGAN small enough that a step takes milliseconds on a CPU: the check is about whether a technique works here,
# not how fast it is (its images/s only shows it ran at a plausible speed).
BASE = dict(image_size=32, channels=1, nz=8, ngf=8, ndf=8, batch_size=16, log_interval=2, sample_interval=0,
            checkpoint_interval=0, loader="dataloader", num_workers=0)
STEPS = 2  # per segment: 2 steps, checkpoint, 2 steps; then back to the checkpoint and the same 2 steps again
# iterations counted for a row's host budget (after budget_of's 2 warm-up ones): two, so a penalty every other step
# (lazy R1) counts at its rate, and the check stays a check of minutes
BUDGET_ITERATIONS = 2
PROFILE_ROW = "profile: no host syncs in the step"
OOM_ROW = "out of memory told apart, then training again"
G_STEP_PHASES = ("D forward (G step)", "D backward (G step)", "G backward")
R3GAN_ROW = "R3GAN: rpgan, R1 + R2"
CUDA_TENSORS = "a dataset returning CUDA tensors"
R3GAN_FP32_ROW = "R3GAN, fp16 + GradScaler, 4 x 4 in fp32"
# R3GAN's networks at BASE's sizes, its loss and both penalties at one gamma, as the paper trains it; half BASE's batch,
# as its deeper networks and two double backwards make its step the check's slowest on a CPU (its rows then do not
# cross an epoch: the DCGAN rows check that)
R3GAN = {"architecture": "r3gan", "loss": "rpgan", "r1_gamma": 1.0, "r2_gamma": 1.0, "batch_size": 8}


class DeviceTensors(torch.utils.data.TensorDataset):
    """The check's images as a dataset of your own that returns them already on `device`, as one that moves each
    image to the GPU in __getitem__ does: the DataLoader must neither pin its batches (a CUDA tensor cannot be pinned)
    nor fork workers for it (`loaders.make_loader`)."""

    def __init__(self, dataset: ImageTensorDataset, device: torch.device):
        super().__init__(dataset.images.to(device), dataset.labels.to(device))


ROW_DATASETS = {CUDA_TENSORS: DeviceTensors}  # rows trained on their own dataset: name -> (images, device) -> dataset


def images_folder(work: Path, base: dict) -> dict:
    """A folder row's config fields: the check's 64 images (seed 0) written as PNGs under `work` once and decoded once
    into a cache of the check's own: no row, nor DDP's processes (each at once), builds it or leaves it in your data."""
    folder, root = work / "images", work / "data"
    if not folder.is_dir():
        write_glyph_pngs(folder, 64, base["image_size"], base["channels"])
        CachedFolder(folder, base["image_size"], base["channels"], root, say=None)
    return {"dataset": "folder", "data_path": str(folder), "data_root": str(root)}


OPTIMIZER_PHASES = ("D optimizer step", "G optimizer step")
SYNC_MODE_NOTICE = "Synchronization debug mode is a prototype feature"  # said once, when the mode is first set


def techniques(device: torch.device, compile_ok: bool, fast_bf16: bool | None = None) -> dict[str, dict]:
    """technique -> config changes from BASE, for what this device supports: fp32, every technique's check rows
    (`techniques.TECHNIQUES`, in its order), then the GAN family. `fast_bf16` as in `techniques.rows`."""
    cuda = device.type == "cuda"
    rows = {"fp32": {}}
    for row in techniques_.rows("checks", device, compile_ok, fast_bf16):
        rows[row.name] = dict(row.change)
    # the GAN family: the penalties' double backward, n_critic's data position, the EMA copy, labels in the loader
    rows["WGAN-GP, 2 D steps"] = {"loss": "wgan-gp", "d_steps": 2}
    rows["R1 lazy + EMA"] = {"r1_gamma": 1.0, "r1_interval": 2, "ema_decay": 0.9}
    rows["conditional"] = {"conditional": True}
    rows["warm-up + cosine schedule"] = {"lr_schedule": "cosine", "warmup_steps": 2}  # rates set each step, resumed
    rows["activation checkpointing"] = {"activation_checkpointing": "both"}  # recomputed blocks, BatchNorm exact
    rows[R3GAN_ROW] = R3GAN  # its residual networks, the relativistic loss, R1 and R2 every step
    if cuda:  # the penalties' AMP recipe (scaled input gradients), and their eager D beside CUDA graphs
        rows["WGAN-GP, fp16 + GradScaler"] = {"loss": "wgan-gp", "precision": "fp16"}
        rows["WGAN-GP + compile reduce-overhead"] = {"loss": "wgan-gp", "compile": "reduce-overhead"}
        rows["R3GAN, fp16 + GradScaler"] = {**R3GAN, "precision": "fp16"}
        # StyleGAN2-ADA's split: 16-bit everywhere but the 4 x 4 stage, whose fp32 region sits inside fp16 autocast
        rows[R3GAN_FP32_ROW] = {**R3GAN, "precision": "fp16", "fp32_stages": 1}
        if supports_bf16(device) if fast_bf16 is None else fast_bf16:  # as `techniques.rows` picks 16-bit rows
            rows["R3GAN, bf16 autocast"] = {**R3GAN, "precision": "bf16"}
        rows["R3GAN + compile reduce-overhead"] = {**R3GAN, "compile": "reduce-overhead"}
        rows[CUDA_TENSORS] = {}  # the defaults (pin_memory auto, no workers), on ROW_DATASETS' dataset
    return rows


def cuda_only(compile_ok: bool = True) -> list[str]:
    """The rows a CUDA GPU (with fast bf16) runs and this CPU does not: what a check here cannot speak for."""
    cpu = row_names(techniques(torch.device("cpu"), compile_ok), torch.device("cpu"), 0)
    gpu = row_names(techniques(torch.device("cuda"), compile_ok, fast_bf16=True), torch.device("cuda"), 1)
    return [name for name in gpu if name not in cpu and not name.startswith("DDP")]


def expected_graphs(cfg: TrainConfig) -> int:
    """Graphs the step needs compiled: G (and G under no_grad when accumulating, or for the D steps before the last
    of several), D on inputs without and with gradients (the D step, and the G step, where D's weights are frozen),
    and for a paired loss D under no_grad in the G step (its scores on real images, constants to G). A penalty's D
    forward runs uncompiled (losses.input_gradients)."""
    return 1 + (cfg.grad_accum_steps > 1 or cfg.d_steps > 1) + 2 + LOSSES[cfg.loss].paired


@contextlib.contextmanager
def counting_syncs(counts: list):
    """Count the synchronizing CUDA operations in the block (appended to `counts`) with torch.cuda's sync debug mode
    (`torch.cuda.set_sync_debug_mode('warn')`, documented): each `.item()`, `.cpu()`, nonzero or stream sync then warns
    "called a synchronizing CUDA operation" (c10/cuda/CUDAFunctions.cpp, warn_or_error_on_sync). The mode is
    process-wide, so the previous one is put back; other warnings are passed on."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    counts.append(sum(SYNC_WARNING in str(w.message) for w in seen))
    for w in seen:
        if SYNC_WARNING not in str(w.message) and SYNC_MODE_NOTICE not in str(w.message):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


class _Probe:
    """Tells which phase of the step is running (as the trainer labels them), counts gradients that reach D's
    weights during G's step and, with `count_syncs`, the host syncs in each optimizer step (`syncs`, one entry per
    optimizer step)."""

    def __init__(self, count_syncs: bool = False):
        self.phase, self.leaks, self.count_syncs, self.syncs = None, 0, count_syncs, []

    @contextlib.contextmanager
    def label(self, name: str):
        outer, self.phase = self.phase, name
        counted = self.count_syncs and name in OPTIMIZER_PHASES
        try:
            with counting_syncs(self.syncs) if counted else contextlib.nullcontext():
                yield
        finally:
            self.phase = outer

    def watch(self, module: torch.nn.Module) -> None:
        for p in module.parameters():
            p.register_hook(self._on_grad)

    def _on_grad(self, grad):
        if self.phase in G_STEP_PHASES:
            self.leaks += 1


def _weights(trainer: Trainer) -> dict:
    nets = {"generator": trainer.generator, "discriminator": trainer.discriminator,
            **({"ema": trainer.ema.module} if trainer.ema is not None else {})}
    return {f"{name}.{k}": v.detach().clone() for name, net in nets.items() for k, v in net.state_dict().items()}


def check_technique(cfg: TrainConfig, dataset, work: Path) -> dict:
    """Train `cfg` for 2 + 2 steps, go back to the checkpoint taken in between and train the same 2 steps again;
    verify as the module docstring says. Returns the row: ok, reason (what failed), images_per_sec, checks."""
    trainer = Trainer(cfg, dataset=dataset)
    probe = _Probe(count_syncs=trainer.scaler_d.is_enabled())
    probe.watch(trainer.discriminator)
    with trainer.instrument(label_phase=probe.label):
        trainer.fit(STEPS)
        half = trainer.save_checkpoint(work / "half.pt")
        trainer.fit(STEPS)
        first = _weights(trainer), [r["loss_g"] for r in trainer.history[-1:]]
        records = list(trainer.history)
        trainer.load_state(load_checkpoint(half))
        trainer.fit(STEPS)
    records += trainer.history[-1:]
    speed = records[-1]["images_per_sec"]  # the last 2 steps, long after warm-up (compiling, worker start-up)
    problems, checks = [], {}

    bad = [r["step"] for r in records if not all(math.isfinite(r[m]) for m in METRICS)]
    checks["finite losses"] = not bad
    if bad:
        problems.append(f"non-finite losses at step(s) {bad}")
    if penalised(cfg):  # an fp16 penalty that overflows each time is logged as 0 while its D steps are skipped
        checks["penalty applied"] = records[-1]["penalty"] > 0
        if not checks["penalty applied"]:
            problems.append("D's penalty was 0 or overflowed (its D steps skipped) in each of the last logged steps")
    checks["no gradients into frozen D"] = probe.leaks == 0
    if probe.leaks:
        problems.append(f"{probe.leaks} weight gradient(s) reached the frozen D in G's step")
    if probe.count_syncs:  # one G optimizer step per training step, after its d_steps D steps
        per_step = sum(probe.syncs) * (1 + cfg.d_steps) / max(1, len(probe.syncs))
        checks["host syncs per step (optimizer)"] = per_step
        if per_step and trainer.opt_d.defaults.get("fused"):
            problems.append(f"fused Adam synced the host {per_step:g} times per step in its GradScaler step "
                            "(expected none)")
    _compile_checks(cfg, trainer.device, records, checks, problems)
    if trainer.device.type == "cpu":
        again = _weights(trainer), [r["loss_g"] for r in trainer.history[-1:]]
        same = first[1] == again[1] and all(torch.equal(first[0][k], again[0][k]) for k in first[0])
        checks["exact resume"] = same
        if not same:
            problems.append("resuming from the checkpoint did not give identical weights and losses")
    return {"ok": not problems, "reason": "; ".join(problems) or None, "images_per_sec": speed, "checks": checks}


def _compile_checks(cfg: TrainConfig, device: torch.device, records: list, checks: dict, problems: list) -> None:
    """`check_technique`'s checks of a compiled run (none without compile), added to its `checks` and `problems`: no
    more graphs than the step needs, none compiled after warm-up, and on CUDA with CUDA graphs none skipped."""
    if cfg.compile == "off":
        return
    graphs = [r["compiled_graphs"] for r in records]
    limit = expected_graphs(cfg)
    # graphs compiled while this trainer trained: 0 when an identical model was compiled earlier in this
    # process (dynamo reuses its code); a fresh process (the CLI) compiles exactly what the step needs
    checks["compiled graphs"] = graphs[-1]
    checks["recompiles"] = graphs[-1] <= limit and graphs[-1] == graphs[0]
    if graphs[-1] > limit:
        problems.append(f"torch.compile built {graphs[-1]} graphs, more than the {limit} the step needs")
    elif graphs[-1] != graphs[0]:
        problems.append(f"torch.compile recompiled after warm-up ({graphs[0]} graphs, then {graphs[-1]})")
    skips = records[-1].get("cudagraph_skips", 0)
    if uses_cuda_graphs(cfg.compile) and device.type == "cuda":
        checks["CUDA graphs used"] = skips == 0
        if skips:
            problems.append(f"CUDA graphs were skipped for {skips} graph(s)")


def check_profile_syncs(cfg: TrainConfig, dataset) -> dict:
    """Profile 2 steps of `cfg` (fp32, no per-step reads, no log point among the profiled steps: the loss reads of a
    log are the trainer's only syncs) and the report must count no host sync. On CUDA it synchronises around every
    data wait, inside its own range; counting those, or a sync the step should not make, fails the row."""
    from ..measuring.protocol import profile_trainer  # profile()'s protocol; profiling imports check (validated)

    quiet = cfg.replace(precision="fp32", sync_every_step=False, log_interval=1000)  # logs only at each fit's end
    trainer = Trainer(quiet, dataset=dataset)
    trainer.fit(1)
    session = profile_trainer(trainer, steps=2)
    syncs, sites = session.code_syncs_per_step(), session.code_sync_sites()
    return {"ok": syncs == 0, "images_per_sec": trainer.history[-1]["images_per_sec"],
            "checks": {"host syncs per step": syncs == 0},
            "reason": None if syncs == 0 else f"the profile counted {syncs:g} host syncs per step in a step that "
                                              f"makes none: {'; '.join(sites)}"}


def check_out_of_memory(cfg: TrainConfig, dataset) -> dict:
    """A real out-of-memory on the GPU: an allocation larger than the device (the caching allocator raises
    torch.OutOfMemoryError, documented for torch.cuda) must be told apart by `recovery.is_out_of_memory`, the one
    test fit(), tune and the device loader use; then the same process must train 2 steps with finite losses (the
    failed allocation left nothing behind)."""
    device = torch.device(cfg.device)
    too_big = torch.cuda.get_device_properties(device).total_memory + 2**30
    caught = None
    try:
        torch.empty(too_big, dtype=torch.uint8, device=device)
    except Exception as e:  # noqa: BLE001 (what the device raises is the finding)
        caught = e
    told = caught is not None and is_out_of_memory(caught)
    trainer = Trainer(cfg, dataset=dataset)
    trainer.fit(STEPS)
    finite = all(math.isfinite(r[m]) for r in trainer.history for m in METRICS)
    problems = []
    if caught is None:
        problems.append(f"allocating {too_big / 2**30:.0f} GiB raised nothing")
    elif not told:
        problems.append(f"{type(caught).__name__} was not classified as out of memory: {str(caught)[:120]}")
    if not finite:
        problems.append("non-finite losses after the out-of-memory")
    return {"ok": not problems, "reason": "; ".join(problems) or None,
            "images_per_sec": trainer.history[-1]["images_per_sec"],
            "checks": {"out of memory told apart": told, "finite losses after": finite}}


def check_ddp(device: torch.device, folder: dict, work: Path, timeout: float = 300) -> dict:
    """2 processes under torchrun train the base config through the CLI on the check's images as PNGs decoded once
    (`folder`: `images_folder`'s fields): every rank must finish, and rank 0's history must hold finite losses. (D's
    freezing and exact resume are the single-process code; tests/test_distributed.py checks DDP on the CPU.)"""
    cfg = TrainConfig(**BASE, **folder, device=device.type, steps=2 * STEPS, out_dir=str(work / "ddp"))
    command = distributed.launch_command(2, "-m", "gantools", "train", "--quiet", *cli_flags(cfg))
    env = {**os.environ, **({} if device.type == "cuda" else {"OMP_NUM_THREADS": "1"})}  # 2 CPU processes, 1 core each
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        return {"ok": False, "reason": f"torchrun exited with status {done.returncode}: {tail}",
                "images_per_sec": None, "checks": {"finished": False}}
    records = json.loads((work / "ddp" / "history.json").read_text())
    finite = all(math.isfinite(r[m]) for r in records for m in METRICS)
    steps = records[-1]["step"] if records else 0
    ok = finite and steps == cfg.steps
    reason = None if ok else (f"rank 0 logged {steps} of {cfg.steps} steps" if finite else "non-finite losses")
    speed = records[-1]["images_per_sec"] if records else None
    return {"ok": ok, "reason": reason, "images_per_sec": speed, "checks": {"finished": True, "finite losses": finite}}


def row_names(plan: dict, device: torch.device, gpus: int) -> list:
    """The rows of a check: the techniques, on CUDA the profiled step (on a CPU there is no host sync to count) and
    a real out-of-memory, then DDP (last)."""
    ddp = "DDP, 2 processes (NCCL)" if gpus >= 2 else "DDP, 2 processes (gloo, CPU)"
    return [*plan, *([PROFILE_ROW, OOM_ROW] if device.type == "cuda" else []), ddp]


class CheckRow(TypedDict):
    """One technique checked: whether it passed, why not, its speed, each check by name, the seconds it took."""

    technique: str
    ok: bool
    reason: str | None
    images_per_sec: float | None
    checks: dict
    seconds: float
    host_budget: dict | None  # `iteration_budget.budget_of` of its config; None for DDP and for a failed row


class CheckResult(TypedDict):
    """What `run` returns and `python -m gantools check` writes as JSON."""

    machine: dict
    device: str
    torch: str
    date: str
    ok: bool
    rows: list[CheckRow]
    cuda_only_not_run: list


def run(device: str = "auto", progress=print, only=None, save_to=None, skip=None) -> CheckResult:
    """Check every technique (or those named in `only`, less those in `skip`) on `device`. Never raises for a
    technique that fails: its row says FAILED and why. A bad `device` is a ConfigError before anything runs. With
    `save_to`, the rows so far are written there after each one (`"partial": true`), so a check stopped midway keeps
    them; the caller saves the finished result."""
    from .bench import can_compile

    base = TrainConfig(**BASE, device=device).validate()
    dev = distributed.device(base.device, distributed.World())
    dataset = ImageTensorDataset(*render_glyphs(64, 32, 1, seed=0))  # 4 batches of 16: runs cross an epoch
    plan = techniques(dev, can_compile(dev))
    gpus = torch.cuda.device_count() if dev.type == "cuda" else 0
    names = row_names(plan, dev, gpus)
    ddp_name = names[-1]
    unknown = (set(only or ()) | set(skip or ())) - set(names)
    if unknown:
        raise ConfigError(f"unknown technique(s) {sorted(unknown)}; choose from {names}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="gantools-check-") as tmp:
        for i, name in enumerate(names):
            if (only and name not in only) or (skip and name in skip):
                continue
            work = Path(tmp) / f"t{i}"
            t0 = time.perf_counter()
            cfg, data = None, dataset  # the row's one-process config, whose host budget is counted
            try:
                if name == ddp_name:
                    row = check_ddp(dev if gpus >= 2 else torch.device("cpu"), images_folder(Path(tmp), BASE), work)
                elif name == PROFILE_ROW:
                    cfg = base.replace(out_dir=str(work)).validate()
                    row = check_profile_syncs(cfg, dataset)
                elif name == OOM_ROW:
                    cfg = base.replace(out_dir=str(work)).validate()
                    row = check_out_of_memory(cfg, dataset)
                else:  # a folder row (dataset='folder') reads the check's images as files, decoded once
                    files = images_folder(Path(tmp), BASE) if plan[name].get("dataset") == "folder" else {}
                    cfg = base.replace(**{**plan[name], **files}, out_dir=str(work)).validate()
                    data = (ROW_DATASETS[name](dataset, dev) if name in ROW_DATASETS else
                            None if files else dataset)  # None: the trainer reads the folder's cache
                    row = check_technique(cfg, data, work)
                row = with_host_budget(row, cfg, data, work)
            except Exception as e:  # a technique that crashes is a FAILED row, not the end of the check
                row = {"ok": False, "reason": _error_reason(e), "images_per_sec": None, "checks": {},
                       "host_budget": None}
            rows.append({"technique": name, **row, "seconds": round(time.perf_counter() - t0, 1)})
            progress(f"{name}: {'ok' if row['ok'] else 'FAILED'} ({rows[-1]['seconds']} s)")
            if save_to:
                save({**_result(dev, rows), "partial": True}, save_to)
    result = _result(dev, rows)
    if dev.type == "cuda" and not only and not skip:
        record(result)
    return result


def _error_reason(e: Exception) -> str:
    """An exception as a row's reason: its kind and first line."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    kind = "OutOfMemory" if is_out_of_memory(e) else type(e).__name__  # cuDNN's and cuBLAS's too
    return f"{kind}: {first}"[:300]


def with_host_budget(row: dict, cfg: TrainConfig | None, dataset, work: Path) -> dict:
    """`row` with its config's host budget (`iteration_budget.budget_of`, over `BUDGET_ITERATIONS` iterations of a
    trainer of its own; a compiled config's ops counted on its eager networks, its graphs beside them): what one
    iteration of the technique asks of the device, on a CPU counted as a GPU would run it. None for a row that
    failed (its config would only fail again) or that runs several processes (DDP). A count that fails fails the
    row: on a GPU this is where a user learns that counting, or the eager form, breaks there."""
    if cfg is None or not row["ok"]:
        return {**row, "host_budget": None}
    try:
        budget = iteration_budget.budget_of(cfg.replace(out_dir=str(work / "host-budget")), BUDGET_ITERATIONS,
                                            dataset=dataset)
    except Exception as e:  # the row says what broke
        return {**row, "ok": False, "reason": f"host budget not counted: {_error_reason(e)}", "host_budget": None}
    return {**row, "host_budget": budget}


def _result(dev: torch.device, rows: list) -> CheckResult:
    from .bench import can_compile

    return {"machine": machine_info(dev), "device": str(dev), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "ok": all(r["ok"] for r in rows), "rows": rows,
            "cuda_only_not_run": cuda_only(can_compile(dev)) if dev.type == "cpu" else []}


def table(result: dict) -> str:
    """The rows as an aligned text table: technique, images/s, the host budget per iteration (counted as a GPU runs
    it, on a CPU), ok or FAILED with the reason."""
    width = max(len(r["technique"]) for r in result["rows"])
    m = result["machine"]
    lines = [f"gantools check on {m['device_name']} ({result['device']}), torch {result['torch']}, {result['date']}",
             f"{'technique':<{width}}  {'images/s':>9}  {iteration_budget.HEADER}  result"]
    for r in result["rows"]:
        speed = f"{r['images_per_sec']:9.0f}" if r["images_per_sec"] else f"{'-':>9}"
        budget = f"{iteration_budget.cell(r.get('host_budget')):>{len(iteration_budget.HEADER)}}"
        syncs = r["checks"].get("host syncs per step (optimizer)")
        note = f" ({syncs:g} host syncs per step in the optimizer steps)" if syncs is not None else ""
        lines.append(f"{r['technique']:<{width}}  {speed}  {budget}  "
                     f"{'ok' + note if r['ok'] else 'FAILED: ' + r['reason']}")
    failed = sum(not r["ok"] for r in result["rows"])
    lines.append("every technique works here" if not failed else f"{failed} technique(s) FAILED")
    return "\n".join(lines)


def save(result: dict, path) -> None:
    atomic_write(path, lambda f: f.write(json.dumps(result, indent=1).encode()))


def _record_path(device_name: str, root=None) -> Path:
    key = re.sub(r"[^A-Za-z0-9.]+", "-", f"{device_name}-torch-{torch.__version__}").strip("-")
    return data_root(root) / "check" / f"{key}.json"


def record(result: dict, root=None) -> Path:
    """Remember which techniques passed on this GPU with this torch (what `validated` reads)."""
    name = result["machine"]["device_name"]
    data = {"device_name": name, "torch": result["torch"], "date": result["date"],
            "techniques": {r["technique"]: r["ok"] for r in result["rows"]}}
    path = _record_path(name, root)
    atomic_write(path, lambda f: f.write(json.dumps(data, indent=1).encode()))
    return path


def validated(technique: str, device: torch.device, root=None) -> bool:
    """Whether `gantools check` ran `technique` on this GPU, with this torch, and it passed."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        path = _record_path(torch.cuda.get_device_name(device), root)
        return json.loads(path.read_text())["techniques"].get(technique) is True
    except (OSError, ValueError, KeyError, AttributeError):
        return False
