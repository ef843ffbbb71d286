"""Auto-tune: the workbook's loop (profile, apply the targeted fix, measure, repeat) run by gantools itself, on your
machine, with every step it took shown.

`tune(cfg, minutes)` starts from your config (the start) and keeps the best config so far (the incumbent):

1. Profile the incumbent for a few steps (`profiling.profile`, on the trainer already built for it).
2. The next candidate is the verdict's fix, if it has not been tried and is not already in place; otherwise the
   next untried change of the search space (`search_space`: every speed knob of `TrainConfig`, each value that
   applies on this device, likeliest gain first).
3. Candidate and incumbent train side by side in this process with the benchmark's protocol (`bench.interleave`:
   warm-up excluded and reported, synchronised timing, `repeats` interleaved chunks each).
4. The candidate is kept only if it is faster by more than the measured spread (`decide`, the rule). One that
   raises (out of memory, an invalid combination, any GantoolsError, a compile failure; with your own networks,
   any error of theirs) is rejected with its reason, and the loop goes on.
5. Repeat until no candidate is left, or the next one would not fit in the time budget.

Then quality, a constraint rather than an afterthought: the start and the final config each train from scratch on
the same number of images and are scored (FID, KID, classes covered: `gantools.metrics`). If the final FID is
worse than `bench.QUALITY_TARGET` (1.1) times the start's, the accepted changes are backed off, last first, one at
a time (each re-trained and scored) until it holds; the start always holds, so the final config is never worse
than 1.1x the start's FID. Last, start and final are measured against each other, interleaved: the speed-up the
result reports.

Only speed knobs change (`config.speed_knobs()`: how fast a run trains, not what it learns), plus one equivalence:
Sigmoid + BCELoss (`loss='bce-sigmoid'`) becomes BCE with logits (`'bce'`) when 16-bit precision needs it; the same
loss, computed safely. batch_size is left out by default (see `search_space`). Every other field, the loss and
every GAN setting included, stays as given: tune tunes the config it is given.

The time budget (`minutes`, wall clock): the quality phase and the final speed check are estimated from what has
been measured (each config trains `quality_images` at its measured images/s, plus its measured warm-up, plus
`SCORE_S` to score it) and reserved from the start; a candidate starts only if its own estimate (the last
measurement's wall time, plus `COMPILE_S` when it turns torch.compile on, plus a profile when the incumbent
changed) fits beside that reserve. Backing off, when quality needs it, may run past the budget (the result says
by how much): quality outranks time.

Stopping: Ctrl-C, or `stop` (a threading.Event: the widget panel's Stop button), ends tune between measurements
(a training run in progress stops after its current step); the result holds every step so far, with the incumbent
as its final config (its quality not checked).
"""
from __future__ import annotations

import contextlib
import copy
import gc
import json
import os
import shlex
import shutil
import signal
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import bench, hardware
from .checkpoint import atomic_write, ensure_writable
from .config import TrainConfig, cli_flags, knobs, scale_batch, speed_knobs
from .errors import ConfigError, GantoolsError

# Seconds to score one config (generate 2048 images, classifier features, FID and KID): 11.5 s measured on the
# 2-core CPU (2026-11-22); less on a GPU, so the reserve errs long there. Used until a score has been timed.
SCORE_S = 12.0
# Extra warm-up when a candidate first turns torch.compile on: 24 s measured for the 32 px DCGAN on the 2-core CPU
# (2026-11-22), against about 4 s without compile.
COMPILE_S = 20.0
# Profiled steps per profile: enough for a verdict (the profiler's own warm-up step comes on top), few enough to
# cost seconds.
PROFILE_STEPS, PROFILE_WARMUP = 3, 1

# Expected speed-up of each change on its own, used only to order the search space (likeliest gains first, so a short
# budget is well spent). CPU: the benchmark's single-technique rows on the 2-core CPU (README, 2026-11-21); CUDA:
# where a GPU step usually loses time, largest first (an order, not a measurement: no GPU has run this project yet).
PRIOR = {  # knob: (cpu, cuda)
    "precision": (1.53, 2.0), "sync_every_step": (1.02, 1.5), "tf32": (1.0, 1.5), "loader": (1.04, 1.3),
    "transform": (1.02, 1.3), "channels_last": (1.17, 1.2), "compile": (1.10, 1.2), "freeze_d": (1.10, 1.1),
    "cudnn_benchmark": (1.0, 1.1), "num_workers": (1.0, 1.1), "batch_size": (1.08, 1.2),
    "grad_accum_steps": (1.0, 1.1), "pin_memory": (1.0, 1.05), "optimizer_impl": (0.97, 1.05),
    "persistent_workers": (1.0, 1.02), "prefetch_factor": (1.0, 1.01),
}
OPTIMIZER_ORDER = ("fused", "foreach", "for-loop")  # fused kernels first: fewest launches


def decide(incumbent_runs: list, candidate_runs: list, final: bool = True) -> tuple[bool | None, float, tuple, str]:
    """Keep the candidate or not: the rule, a sequential sign test on paired ratios.

    Each repeat of an interleaved measurement times the incumbent and the candidate back to back, so repeat r gives
    one paired ratio rho_r = candidate images/s / incumbent images/s, in which machine noise common to both
    cancels. The speed-up is the median of the rho_r; the spread shown is their range [min rho, max rho].

    First measurement (`final=False`, the plan's repeats, 5): kept if the whole range lies above 1 (it won every
    repeat; a change that does nothing passes by chance 1 time in 32); not kept if it is not faster on the median;
    otherwise undecided (None): faster on the median but it lost a repeat, which on a noisy machine (paired ratios
    vary by about +-5% on the 2-core CPU here) is what a real 5% gain does one time in two. The caller then measures
    as many repeats again and asks once more (`final=True`): kept if faster on the median and it won at least 80% of
    all the repeats (8 of 10), i.e. the range without its lowest and highest fifth lies above 1. A change that does
    nothing is kept about 1 time in 14 over both stages (and then costs nothing: its median was above 1); one 5%
    faster about 8 times in 10, against 3 in 10 for "won all 5".

    Returns (kept or None, speed-up, spread, why)."""
    ratios = [c / i for c, i in zip(candidate_runs, incumbent_runs)]
    ratio, spread = statistics.median(ratios), (min(ratios), max(ratios))
    shown = f"{ratio:.2f}x ({spread[0]:.2f}-{spread[1]:.2f})"
    wins, n = sum(r > 1 for r in ratios), len(ratios)
    if spread[0] > 1:
        return True, ratio, spread, f"kept: {shown}, faster in all {n} repeats"
    if ratio <= 1:
        return False, ratio, spread, f"not kept: {shown}, not faster"
    if not final:
        return None, ratio, spread, f"undecided: {shown}, faster in {wins} of {n} repeats"
    if wins >= 0.8 * n:
        return True, ratio, spread, f"kept: {shown}, faster in {wins} of {n} repeats"
    return False, ratio, spread, f"not kept: {shown}, faster in only {wins} of {n} repeats: within the noise"


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


def _complete(cfg: TrainConfig, change: dict) -> dict:
    """The change plus what it needs to be a valid config, minus what is already so. 16-bit precision under
    Sigmoid + BCELoss needs BCE with logits (the same loss); the device loader leaves no DataLoader knobs; workers
    kept alive between epochs come with workers."""
    change = dict(change)
    new = cfg.replace(**change)
    if new.precision != "fp32" and new.loss == "bce-sigmoid":
        change["loss"] = "bce"
    if new.loader == "device":
        change.update(transform="on-device", num_workers=0, pin_memory=None, persistent_workers=False,
                      prefetch_factor=None)
    elif new.num_workers == 0:
        change.update(persistent_workers=False, prefetch_factor=None)
    elif "num_workers" in change and cfg.num_workers == 0:
        change.setdefault("persistent_workers", True)
    return {k: v for k, v in change.items() if getattr(cfg, k) != v}


def _allowed(change: dict, cfg: TrainConfig, space: tuple) -> bool:
    """Only speed knobs (and batch_size when in the space) may change, plus bce-sigmoid -> bce; at least one
    field of the change must be in the space."""
    fine = set(speed_knobs()) | set(space)
    ok = all(k in fine or (k == "loss" and cfg.loss == "bce-sigmoid" and v == "bce") for k, v in change.items())
    return ok and any(k in space for k in change)


def search_space(cfg: TrainConfig, device: torch.device, space=None, own_dataset: bool = False,
                 main_thread: bool = True) -> tuple[list, list]:
    """(candidates, skipped): every change of the speed knobs in `space` worth trying from `cfg` on `device`,
    likeliest gain first (`PRIOR`), each completed to a valid config (`_complete`); and the values left out because
    they do not apply here, each with its reason.

    Values per knob: 16-bit precision (bf16 where the device has it, else fp16 on CUDA; fp16 never on a CPU);
    sync_every_step off; freeze_d on; the device loader; on-device normalisation (not with your own dataset,
    which brings its own transforms); workers doubled (from 0: 2) up to the cores, and halved; workers kept alive;
    prefetch_factor 4; pinned memory (CUDA); channels_last either way; compile default (and max-autotune on CUDA;
    reduce-overhead only where `gantools check` validated it and not in a background thread, where CUDA graphs are
    refused), or off; each other optimizer implementation; cuDNN benchmark and TF32 (CUDA, TF32 on Ampere+);
    fewer accumulation micro-batches (more never speeds a step up); and, only when `space` names it, batch_size x2
    with the learning rates scaled by sqrt 2 (`config.scale_batch`). batch_size is out of the default space: a
    bigger batch means fewer optimizer steps per image, so it changes what is learned (on glyphs, x2 cost 2.78x the
    reference's FID at an equal image budget for 8% more images/s on the 2-core CPU); the quality check would then
    most likely spend the budget undoing it."""
    from .check import validated

    space = tuple(space if space is not None else speed_knobs())
    cuda, cores = device.type == "cuda", os.cpu_count() or 1
    c, values, skipped = cfg, [], []

    def offer(name, value, why=None):
        if why:
            skipped.append((f"{name}={value}", why))
        elif getattr(c, name) != value:
            values.append({name: value})

    for name in space:
        if name == "precision" and c.precision == "fp32":
            if not cuda:
                offer("precision", "fp16", "fp16 needs CUDA (GradScaler and fast fp16 kernels)")
            offer("precision", "bf16" if hardware.supports_bf16(device) else "fp16")
        elif name == "sync_every_step":
            offer(name, False)
        elif name == "freeze_d":
            offer(name, True)
        elif name == "loader":
            offer(name, "device")
        elif name == "transform":
            offer(name, "on-device", "your own dataset brings its own transforms" if own_dataset else None)
        elif name == "num_workers" and c.loader == "dataloader":
            n = c.num_workers
            for value in sorted({min(cores, 2 * n if n else 2), n // 2}):
                offer(name, value)
        elif name == "persistent_workers" and c.num_workers > 0:
            offer(name, True)
        elif name == "prefetch_factor" and c.num_workers > 0 and c.prefetch_factor is None:
            offer(name, 4)
        elif name == "pin_memory" and c.loader == "dataloader":
            offer(name, True, None if cuda else "pinned memory only helps copies to a GPU")
        elif name == "channels_last":
            offer(name, not c.channels_last)
        elif name == "compile":
            if not bench.can_compile(device):
                skipped.append(("compile", "torch.compile needs a C++ compiler on the CPU"))
                continue
            modes = ["default"] + (["max-autotune"] if cuda else [])
            for mode in modes if c.compile == "off" else ["off"]:
                offer(name, mode)
            if cuda and c.compile != "reduce-overhead":
                # Measured interleaved with another trainer in this process: CUDA graph trees support "arbitrary trees
                # of CUDA graph operations, not just sequences", and non-graph code between graphs (module docstring
                # of torch/_inductor/cudagraph_trees.py); each step starts its own generation (Trainer._train_step).
                why = ("not validated by `python -m gantools check` on this GPU" if not validated(
                    "compile reduce-overhead", device) else None if main_thread else
                    "CUDA graphs are refused in a background thread")
                offer(name, "reduce-overhead", why)
        elif name == "optimizer_impl":
            for impl in OPTIMIZER_ORDER:
                offer(name, impl)
        elif name == "cudnn_benchmark":
            offer(name, True, None if cuda else "cuDNN is CUDA's")
        elif name == "tf32":
            ampere = cuda and torch.cuda.get_device_capability(device)[0] >= 8
            offer(name, True, None if ampere else "TF32 needs an Ampere or newer GPU")
        elif name == "grad_accum_steps" and c.grad_accum_steps > 1:
            offer(name, c.grad_accum_steps // 2)
        elif name == "batch_size":
            values.append({"batch_size": c.batch_size * 2})
    prior = {name: p[1 if cuda else 0] for name, p in PRIOR.items()}
    candidates = []
    for change in values:
        name = next(iter(change))
        full = _complete(c, change)
        if name == "batch_size":
            bigger = scale_batch(c, change["batch_size"])
            full = {"batch_size": bigger.batch_size, "lr_g": bigger.lr_g, "lr_d": bigger.lr_d}
        if full and _allowed({k: v for k, v in full.items() if k not in ("lr_g", "lr_d")}, c, space):
            candidates.append(Candidate(full, "search space", prior.get(name, 1.0)))
    candidates.sort(key=lambda cand: -cand.prior)  # stable: declaration order among equals
    return candidates, skipped


@dataclass
class Step:
    """One candidate tried: the change, where it came from, what was measured and whether it was kept, and why."""

    change: dict
    source: str
    accepted: bool
    why: str
    images_per_sec: float | None = None        # the candidate's median over the repeats
    incumbent_images_per_sec: float | None = None
    ratio: float | None = None                  # speed-up over the incumbent: median of the paired ratios
    spread: tuple | None = None                 # their range
    ratio_to_start: float | None = None         # the accepted ratios so far, times this one
    warmup_s: float | None = None
    seconds: float = 0.0                        # wall time of this step (profile and measurement)
    backed_off: bool = False                    # kept, then undone by the quality check

    def to_dict(self) -> dict:
        return {"change": self.change, "images_per_sec": self.images_per_sec, "ratio_to_start": self.ratio_to_start,
                "accepted": self.accepted, "backed_off": self.backed_off, "why": self.why, "source": self.source,
                "ratio_to_incumbent": self.ratio, "spread": self.spread, "warmup_s": self.warmup_s,
                "seconds": self.seconds}


@dataclass
class TuneResult:
    """What tune found and how: `start` and `final` (each a dict with its `config`, `images_per_sec` and `fid`),
    `path` (every step), `final_config`; `python()` and `flags()` give the final config as code and as CLI flags,
    `markdown()` the path as a table, `chart()` as a figure, `save_json(path)` all of it. Built as tune goes, so
    what it holds after a stop is everything up to the stop."""

    start: dict
    final: dict
    path: list = field(default_factory=list)
    skipped: list = field(default_factory=list)   # (change, why it does not apply here)
    quality: dict = field(default_factory=dict)   # held, limit, tries (the back-off), note
    device: str = ""
    minutes: float = 0.0
    elapsed_s: float = 0.0
    stopped: bool = False
    ended: str = ""       # why the search ended
    now: str = ""         # what tune is doing now (for a live view)
    speedup: float | None = None  # final over start, measured interleaved at the end
    date: str = field(default_factory=lambda: time.strftime("%Y-%m-%d"))

    @property
    def start_config(self) -> TrainConfig:
        return self.start["config"]

    @property
    def final_config(self) -> TrainConfig:
        return self.final["config"]

    def changes(self) -> dict:
        """The fields the final config changes, from the start's values to its own."""
        a, b = self.start_config, self.final_config
        return {k: (getattr(a, k), getattr(b, k)) for k in knobs() if getattr(a, k) != getattr(b, k)}

    def python(self) -> str:
        """The final config as code: `TrainConfig(...)` with every field that differs from the defaults."""
        default, cfg = TrainConfig(), self.final_config
        args = [f"{k}={getattr(cfg, k)!r}" for k in knobs() if getattr(cfg, k) != getattr(default, k)]
        lines, line = [], "TrainConfig("
        for i, arg in enumerate(args):
            piece = arg + (", " if i < len(args) - 1 else ")")
            if len(line) + len(piece) > 110:
                lines.append(line.rstrip())
                line = " " * len("TrainConfig(")
            line += piece
        return "\n".join(lines + [line if args else "TrainConfig()"])

    def flags(self) -> str:
        """The final config as `python -m gantools train` flags (`config.cli_flags`, from the defaults)."""
        return shlex.join(cli_flags(self.final_config))

    def rows(self) -> list[dict]:
        """The path as table rows (strings), one per step."""
        return [_row(i, s) for i, s in enumerate(self.path, 1)]

    def markdown(self) -> str:
        from .display import markdown_table

        return markdown_table(list(ROW_HEAD), [list(r.values()) for r in self.rows()])

    def chart(self):
        from .display import tune_chart

        return tune_chart(self)

    def summary(self) -> str:
        """The outcome in a few lines: speed, quality, the final config as code and as flags."""
        lines = [f"search: {self.ended}" if self.ended else "search: not finished"]
        s, f = self.start, self.final
        if self.speedup is not None:
            lines.append(f"speed: start {s['images_per_sec']:.0f} images/s, final {f['images_per_sec']:.0f} images/s "
                         f"(interleaved): {self.speedup:.2f}x")
        elif f.get("images_per_sec") and s.get("images_per_sec"):
            lines.append(f"speed: start {s['images_per_sec']:.0f} images/s, final about {f['images_per_sec']:.0f} "
                         f"(from the path's ratios)")
        q = self.quality
        if q.get("note"):
            lines.append(f"quality: {q['note']}")
        if self.elapsed_s > 60 * self.minutes + 1:
            lines.append(f"time: {self.elapsed_s / 60:.1f} min, {self.elapsed_s - 60 * self.minutes:.0f} s past the "
                         f"{self.minutes:g}-minute budget (its estimates come from what was measured; backing off "
                         f"for quality is not bounded by it)")
        lines += [f"skipped here: {'; '.join(f'{c} ({why})' for c, why in self.skipped)}"] if self.skipped else []
        lines += ["final config:", "  " + self.python().replace("\n", "\n  "),
                  f"  python -m gantools train {self.flags()}"]
        return "\n".join(lines)

    def __str__(self):
        return self.markdown() + "\n\n" + self.summary()

    def to_dict(self) -> dict:
        def point(p):
            return {**p, "config": p["config"].to_dict()}

        return {"start": point(self.start), "final": point(self.final), "path": [s.to_dict() for s in self.path],
                "speedup": self.speedup, "quality": self.quality, "skipped": self.skipped, "ended": self.ended,
                "stopped": self.stopped, "device": self.device, "minutes": self.minutes,
                "elapsed_s": self.elapsed_s, "date": self.date}

    def save_json(self, path) -> Path:
        path = Path(path)
        atomic_write(path, lambda f: f.write(json.dumps(self.to_dict(), indent=1).encode()))
        return path


ROW_HEAD = ("step", "change", "from", "images/s", "vs incumbent (spread)", "vs start", "result")


def _row(i: int, s: Step) -> dict:
    why = s.why + (" (backed off: quality)" if s.backed_off else "")
    return dict(zip(ROW_HEAD, (
        str(i), describe(s.change), s.source, "n/a" if s.images_per_sec is None else f"{s.images_per_sec:.0f}",
        "n/a" if s.ratio is None else f"{s.ratio:.2f}x ({s.spread[0]:.2f}-{s.spread[1]:.2f})",
        "n/a" if s.ratio_to_start is None else f"{s.ratio_to_start:.2f}x", why)))


class StopWhen:
    """A Trainer callback: stop after the current step once `event` is set (a Stop button, Ctrl-C in tune)."""

    def __init__(self, event: threading.Event):
        self.event = event

    def on_step_end(self, trainer):
        if self.event.is_set():
            trainer.stop()


def _compile_errors() -> tuple:
    """torch.compile's own failures (dynamo and inductor), wherever this torch defines them."""
    found = []
    for module, name in (("torch._dynamo.exc", "TorchDynamoException"), ("torch._inductor.exc", "InductorError")):
        with contextlib.suppress(ImportError, AttributeError):
            found.append(getattr(__import__(module, fromlist=[name]), name))
    return tuple(found)


@contextlib.contextmanager
def _room_to_recompile():
    """Dynamo keeps at most `recompile_limit` (8) compiled versions per code object, then runs that code eagerly
    for good; every G (and every D) built during a tune shares one forward code object, and each precision,
    memory format, frozen D or batch size is a version. So a tune raises the limit for its duration, or a compile
    candidate late in the path would be measured eager. `recompile_limit` since torch 2.6 (pytorch/pytorch#143709,
    the old name `cache_size_limit` kept as an alias)."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    with config.patch(**{name: max(64, getattr(config, name))}):
        yield


def _out_of_memory(e: BaseException) -> bool:
    """Out of memory without torch.OutOfMemoryError: cuBLAS/cuDNN report a failed workspace allocation as a
    RuntimeError ("CUBLAS_STATUS_ALLOC_FAILED", cuDNN's "CUDNN_STATUS_ALLOC_FAILED" / "ALLOC_FAILED")."""
    text = str(e)
    return "out of memory" in text.lower() or "ALLOC_FAILED" in text


def _reason(e: BaseException) -> str:
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return f"{type(e).__name__}: {text[:400]}{'...' if len(text) > 400 else ''}"


@contextlib.contextmanager
def _ctrl_c_sets(event: threading.Event):
    """Ctrl-C sets `event` (tune stops between measurements; trainers stop after their step) instead of raising
    wherever it lands; a second Ctrl-C interrupts at once. Only the main thread receives signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum, frame):
        signal.signal(signal.SIGINT, previous)
        event.set()

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _Tuner:
    """The loop of this module's docstring, with its state: one incumbent trainer alive (kept warm between
    measurements), the candidates tried, the time spent."""

    def __init__(self, cfg, minutes, generator, discriminator, dataset, quality, quality_images, space, plan,
                 stop, progress, on_update, out_dir):
        from .hardware import resolve_device

        self.start_cfg = cfg.validate()
        self.device = resolve_device(cfg.device)
        if (generator is None) != (discriminator is None):
            raise ConfigError("pass both generator and discriminator, or neither (for the built-in DCGAN)")
        space = tuple(space) if space is not None else speed_knobs()
        unknown = [k for k in space if k not in speed_knobs() and k != "batch_size"]
        if unknown:
            raise ConfigError(f"tune changes only speed knobs (and batch_size when asked); not {', '.join(unknown)}: "
                              f"choose from {', '.join(speed_knobs())}, batch_size")
        if not (isinstance(minutes, (int, float)) and minutes > 0):
            raise ConfigError(f"minutes={minutes!r}: give the time budget as a positive number of minutes")
        self.space, self.minutes = space, float(minutes)
        self.own = (generator, discriminator) if generator is not None else None
        self.dataset = dataset
        self.plan = {**bench.plan_for(self.device), **(plan or {})}
        self.quality_images = self.plan["quality_images"] if quality_images is None else quality_images
        bad = [f"{k}={v!r}" for k, v in (*((k, self.plan[k]) for k in ("warmup_images", "images_per_repeat",
                                                                         "repeats")), ("quality_images",
                                                                                       self.quality_images))
               if not (isinstance(v, int) and not isinstance(v, bool) and v > 0)]
        if bad:
            raise ConfigError(f"{', '.join(bad)}: each must be a whole number > 0 (images, or rounds for repeats)")
        self.quality, self.meter = quality, None
        if quality is True and dataset is not None:
            raise ConfigError("quality=True scores against the real images of cfg.dataset, but you gave your own "
                              "dataset: pass quality=False, or quality=<function: TrainConfig -> {'fid': ...}>")
        if not (isinstance(quality, bool) or callable(quality)):
            raise ConfigError(f"quality={quality!r}: True (train and score), False (no check) or a function "
                              f"TrainConfig -> {{'fid': ...}}")
        self.stop = stop if stop is not None else threading.Event()
        self.progress, self.on_update = progress or (lambda line: None), on_update or (lambda result: None)
        self.dir = ensure_writable(Path(out_dir or Path(cfg.out_dir) / "tune"))
        self.result = TuneResult({"config": cfg, "images_per_sec": None, "fid": None},
                                 {"config": cfg, "images_per_sec": None, "fid": None}, device=str(self.device),
                                 minutes=self.minutes)
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + 60 * self.minutes
        self.tried: set = set()
        self.trials = 0
        self.measure_s = None   # wall time of the last measurement
        self.score_s = 0.0      # of scoring one config (set once the meter exists, then measured)
        self.profile_s = None   # and of the last profile
        self.warmup_s = {}      # config key -> measured warm-up seconds
        self.speed = {}         # config key -> its images/s when last measured
        self.chain = [cfg]      # the start, then the incumbent after each accepted step
        self.kept = []          # the Step that made each chain entry after the first

    # -- building and measuring -------------------------------------------------------------------------------
    def _trainer(self, cfg: TrainConfig, name: str, for_quality: bool = False):
        from .train import Trainer

        self._collect()
        g, d = (copy.deepcopy(self.own[0]), copy.deepcopy(self.own[1])) if self.own else (None, None)
        args = dict(generator=g, discriminator=d, dataset=self.dataset, callbacks=[StopWhen(self.stop)])
        if for_quality:
            return Trainer(cfg.replace(steps=max(1, self.quality_images // cfg.images_per_step), sample_interval=0,
                                       checkpoint_interval=0, out_dir=str(self.dir / name)), **args)
        self.trials += 1
        return bench.measurement_trainer(cfg.replace(out_dir=str(self.dir / "trials" / f"{self.trials:03d}")),
                                         self.plan, **args)

    def _discard(self, trainer) -> None:
        """Done with a trainer: its DataLoader workers end now (they end with their iterator) and its folder goes.
        Its memory is freed once the last reference is dropped (`_collect`, before the next trainer is built)."""
        if trainer is None:
            return
        trainer.close()
        shutil.rmtree(trainer.out_dir, ignore_errors=True)

    def _collect(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # what a discarded (or out-of-memory) candidate held goes back to the device

    def _measure(self, contenders: dict, configs: dict) -> dict:
        """`bench.interleave` over the contenders; remembers each config's speed and warm-up for the budget."""
        t = time.perf_counter()
        measured = bench.interleave(contenders, self.plan["warmup_images"], self.plan["images_per_repeat"],
                                    self.plan["repeats"], stop=self.stop.is_set)
        self.measure_s = time.perf_counter() - t
        for name, m in measured.items():
            self.warmup_s.setdefault(_key(configs[name]), m.warmup_s)
            self.speed[_key(configs[name])] = m.images_per_sec
        return measured

    def _say(self, line: str, now: str | None = None) -> None:
        if line:
            self.progress(line)
        self.result.now = now if now is not None else self.result.now
        self.result.elapsed_s = time.perf_counter() - self.t0
        self.on_update(self.result)

    # -- the budget ----------------------------------------------------------------------------------------------
    def _left(self) -> float:
        return self.deadline - time.perf_counter()

    def _quality_s(self, cfg: TrainConfig) -> float:
        """One config's quality run: its warm-up, the images at its measured speed, scoring."""
        speed = self.speed.get(_key(cfg)) or self.speed.get(_key(self.chain[0])) or 1.0
        return self.warmup_s.get(_key(cfg), 5.0) + self.quality_images / speed + self.score_s

    def _reserve(self, incumbent: TrainConfig) -> float:
        """Seconds kept for after the search: quality runs for the start and the final, and the final speed check
        (one more measurement). The final is costed at the incumbent's speed: whatever is kept next is faster."""
        if self.quality is False:
            quality = 0.0
        elif callable(self.quality):
            quality = 1.0
        else:
            quality = self._quality_s(self.chain[0]) + self._quality_s(incumbent)
        return quality + (self.measure_s or 0.0)

    def _estimate(self, cand: Candidate) -> float:
        """Seconds to measure a candidate: the last measurement's wall time (before any: both contenders' images
        at the incumbent's profiled speed, and two builds), plus `COMPILE_S` when it first turns compile on."""
        seconds = self.measure_s
        if seconds is None:
            p = self.plan
            images = p["warmup_images"] + p["repeats"] * p["images_per_repeat"]
            images = max(images, (1 + p["repeats"]) * self.start_cfg.images_per_step)  # at least a step per chunk
            seconds = 2 * images / (self.speed.get(_key(self.chain[-1])) or 1.0) + 2 * self.build_s
        # A first compile costs COMPILE_S here, and once more in the final config's quality run if it is kept.
        return seconds + (2 * COMPILE_S if cand.change.get("compile", "off") != "off" and not self.compiled else 0.0)

    # -- the loop ------------------------------------------------------------------------------------------------
    def run(self) -> TuneResult:
        r = self.result
        with _ctrl_c_sets(self.stop), _room_to_recompile():
            try:
                self._search()
                if not self.stop.is_set():
                    self._after_search(self._hold_quality, "quality")
                if not self.stop.is_set():
                    self._after_search(self._speed_check, "final speed check")
            except bench.Stopped:
                r.stopped = True
            finally:
                self._discard(getattr(self, "incumbent", None))
                shutil.rmtree(self.dir / "trials", ignore_errors=True)
        if self.stop.is_set() or r.stopped:
            r.stopped = True
            r.ended = r.ended or "stopped"  # the search's own reason stays when the stop came later
            r.quality.setdefault("note", "not checked: tune was stopped before the quality check ended, so the "
                                         "final config (the fastest so far) has no quality verdict")
        self._say(f"done in {(time.perf_counter() - self.t0) / 60:.1f} min", now="done")
        return r

    def _after_search(self, phase, name: str) -> None:
        """Run a phase after the search; its failure (an out-of-memory quality run, say) is noted in the result
        instead of losing the path found."""
        try:
            phase()
        except (GantoolsError, torch.OutOfMemoryError) as e:
            self.result.quality.setdefault("note", f"not checked: the {name} failed: {_reason(e)}")

    def _search(self) -> None:
        r, cfg = self.result, self.start_cfg
        self._say(f"tune on {self.device} for up to {self.minutes:g} min, from: {describe(_diff(cfg))}",
                  now="building the start config")
        if self.quality is True:  # before any measuring: a dataset without labels cannot be scored (QualityError)
            self._meter()
        t = time.perf_counter()
        self.incumbent = self._trainer(cfg, "start")  # the start must run: its errors are the caller's to see
        self.build_s = time.perf_counter() - t
        self.compiled = cfg.compile != "off"
        candidates, r.skipped = search_space(cfg, self.device, self.space, self.dataset is not None,
                                             threading.current_thread() is threading.main_thread())
        verdict, ratio_to_start, header = None, 1.0, False
        while True:
            if self.stop.is_set():
                raise bench.Stopped("stopped")
            inc_cfg = self.chain[-1]
            if verdict is None:  # a new incumbent: profile it (the start always), if that and the reserve fit
                if self.profile_s is not None and self.profile_s + self._reserve(inc_cfg) > self._left():
                    r.ended = (f"time: profiling the new incumbent (about {self.profile_s:.0f} s) and the reserve "
                               f"for quality and the final check (about {self._reserve(inc_cfg):.0f} s) would not "
                               f"fit in the {max(0.0, self._left()):.0f} s left")
                    break
                verdict = self._profile()
            cand = self._next(verdict, inc_cfg)
            if cand is None:
                r.ended = "no untried candidate left"
                break
            if self._estimate(cand) + self._reserve(inc_cfg) > self._left():
                r.ended = (f"time: the next candidate ({cand.label}, about {self._estimate(cand):.0f} s) and the "
                           f"reserve for quality and the final check (about {self._reserve(inc_cfg):.0f} s) would "
                           f"not fit in the {max(0.0, self._left()):.0f} s left")
                break
            if not header:
                from .display import markdown_table

                self._say("\n".join(markdown_table(list(ROW_HEAD), []).splitlines()[:2]))
                header = True
            step = self._try(cand, inc_cfg, ratio_to_start)
            r.path.append(step)
            self._say(_markdown_line(_row(len(r.path), step)))
            if step.accepted:
                ratio_to_start = step.ratio_to_start
                verdict = None  # a new incumbent: profile it
        self._say(f"search ended: {r.ended}")

    def _profile(self):
        from .profiling import profile

        self._say("", now=f"profiling the incumbent ({describe(_diff(self.chain[-1])) or 'the start'})")
        t, trainer = time.perf_counter(), self.incumbent
        before = trainer.step
        report = profile(trainer, steps=PROFILE_STEPS, warmup=PROFILE_WARMUP,
                         trace_path=self.dir / "trials" / "trace.json")
        if trainer.step - before < PROFILE_WARMUP + 1 + 2 * PROFILE_STEPS or self.stop.is_set():
            raise bench.Stopped("stopped while profiling")
        self.profile_s = time.perf_counter() - t
        self.speed.setdefault(_key(self.chain[-1]), report.images_per_sec)
        if self.result.start["images_per_sec"] is None:  # until the first interleaved measurement
            self.result.start["images_per_sec"] = report.images_per_sec
        v = report.verdict
        self._say(f"profile: {report.images_per_sec:.0f} images/s, verdict {v.bottleneck}; its fix: {describe(v.fix)}")
        return v

    def _next(self, verdict, cfg: TrainConfig) -> Candidate | None:
        fix = _complete(cfg, verdict.fix) if verdict.fix else {}
        if fix and _allowed(fix, cfg, self.space) and _key(fix) not in self.tried:
            return Candidate(fix, f"verdict: {verdict.bottleneck}")
        candidates, _ = search_space(cfg, self.device, self.space, self.dataset is not None,
                                     threading.current_thread() is threading.main_thread())
        return next((c for c in candidates if _key(c.change) not in self.tried), None)

    def _try(self, cand: Candidate, inc_cfg: TrainConfig, ratio_to_start: float) -> Step:
        """Measure one candidate against the incumbent; keep it or not."""
        self.tried.add(_key(cand.change))
        t = time.perf_counter()
        step = Step(cand.change, cand.source, False, "")
        try:
            cfg = inc_cfg.replace(**cand.change).validate()
        except ConfigError as e:
            step.why = f"rejected: {_reason(e)}"
            return step
        self._say("", now=f"measuring {cand.label} against the incumbent ({self._left():.0f} s left)")
        contenders = {"incumbent": self.incumbent, "candidate": lambda: self._trainer(cfg, "candidate")}
        measured, failure = None, None
        try:
            measured = self._measure(contenders, {"incumbent": inc_cfg, "candidate": cfg})
        except bench.Stopped:
            raise
        except (GantoolsError, torch.OutOfMemoryError, *_compile_errors()) as e:
            failure = _reason(e)
        except RuntimeError as e:  # allocation failures torch raises as plain errors (cuBLAS, cuDNN workspaces)
            if not _out_of_memory(e) and self.own is None:
                raise
            failure = _reason(e) if _out_of_memory(e) else f"your networks failed with this change: {_reason(e)}"
        except Exception as e:  # noqa: BLE001 - with your own networks, their errors under a setting reject it
            if self.own is None:
                raise
            failure = f"your networks failed with this change: {_reason(e)}"
        step.seconds = time.perf_counter() - t
        if failure is not None:
            shutil.rmtree(self.dir / "trials" / f"{self.trials:03d}", ignore_errors=True)
            self._collect()
            step.why = f"rejected: {failure}"
            return step
        inc, new = measured["incumbent"], measured["candidate"]
        kept, ratio, spread, why = decide(inc.images_per_sec_runs, new.images_per_sec_runs, final=False)
        if kept is None and self._estimate(cand) <= self._left() - self._reserve(inc_cfg):
            self._say("", now=f"{cand.label}: {why}; measuring it again")
            again = self._measure({"incumbent": inc.trainer, "candidate": new.trainer},
                                  {"incumbent": inc_cfg, "candidate": cfg})
            for name in ("incumbent", "candidate"):  # one series of paired repeats, the new ones after the first
                measured[name].images_per_sec_runs += again[name].images_per_sec_runs
            kept, ratio, spread, why = decide(inc.images_per_sec_runs, new.images_per_sec_runs)
        elif kept is None:
            kept, why = False, f"not kept: {why.removeprefix('undecided: ')}, and no time left to measure it again"
        step.seconds = time.perf_counter() - t
        step.accepted, step.why, step.ratio, step.spread = kept, why, ratio, spread
        step.images_per_sec, step.incumbent_images_per_sec = new.images_per_sec, inc.images_per_sec
        step.ratio_to_start, step.warmup_s = ratio_to_start * ratio, new.warmup_s
        if len(self.chain) == 1:
            self.result.start["images_per_sec"] = inc.images_per_sec
        if kept:  # never try to undo it later: it was just measured slower, as this candidate's incumbent
            self.tried.update(_key({k: getattr(inc_cfg, k)}) for k in cand.change)
            self.tried.add(_key({k: getattr(inc_cfg, k) for k in cand.change}))
            self._discard(self.incumbent)
            self.incumbent = new.trainer
            self.compiled = self.compiled or cfg.compile != "off"
            self.chain.append(cfg)
            self.kept.append(step)
            self.result.final = {"config": cfg, "images_per_sec": (self.result.start["images_per_sec"] *
                                                                   step.ratio_to_start), "fid": None}
        else:
            self._discard(new.trainer)
        return step

    # -- quality and the final check -------------------------------------------------------------------------------
    def _score(self, cfg: TrainConfig, name: str) -> dict:
        if callable(self.quality):
            return dict(self.quality(cfg))
        from .metrics import QualityCallback

        trainer = self._trainer(cfg, name, for_quality=True)
        trainer.callbacks.append(scorer := QualityCallback(self._meter()))
        t = time.perf_counter()
        trainer.fit()
        if trainer.step < trainer.cfg.steps:
            raise bench.Stopped("stopped during the quality check")
        self.score_s = scorer.seconds
        self.speed.setdefault(_key(cfg), trainer.history.summary()["images_per_sec"])
        images = trainer.batches_seen * trainer.cfg.batch_size
        self.progress(f"  {name}: {images:,} images in {time.perf_counter() - t:.0f} s")
        return {k: v for k, v in trainer.history.quality.items() if k in ("fid", "kid", "classes_covered",
                                                                       "images_trained", "n_samples")}

    def _meter(self):
        """The quality meter (real images' features; the classifier is trained on first use, about a minute on the
        2-core CPU, then cached), built once."""
        if self.meter is None:
            from .metrics import MIN_SAMPLES, quality_meter
            from .workbook import QUICK

            c = self.start_cfg
            self._say("", now="building the quality meter")
            n = 256 if QUICK else MIN_SAMPLES
            self.meter = quality_meter(c.dataset, c.image_size, c.channels, c.data_root, self.device, n)
            self.score_s = SCORE_S * n / MIN_SAMPLES  # until a score has been timed
        return self.meter

    def _hold_quality(self) -> None:
        r = self.result
        limit = bench.QUALITY_TARGET
        if self.quality is False:
            r.quality = {"held": None, "note": "not checked (quality=False)"}
            return
        r.quality = {"limit": limit, "images": self.quality_images, "tries": []}
        final = len(self.chain) - 1
        if final == 0:
            r.quality.update(held=True, note="nothing was kept, so the final config is the start")
            return
        self._say(f"quality: the start and the final config each train on {self.quality_images:,} images, then are "
                  f"scored", now="quality: training the start config")
        start_q = self._score(self.chain[0], "quality-start")
        r.start.update(start_q)
        while final > 0:
            cfg = self.chain[final]
            r.final = {"config": cfg, "images_per_sec": self.speed.get(_key(cfg)), "fid": None}
            self._say("", now=f"quality: training {describe(_diff(cfg, self.chain[0]))}")
            q = self._score(cfg, f"quality-{len(r.quality['tries']) + 1}")
            held = q["fid"] <= limit * start_q["fid"]
            r.quality["tries"].append({"changes": _diff(cfg, self.chain[0]), "fid": q["fid"],
                                       "ratio": q["fid"] / start_q["fid"], "held": held})
            self._say(f"  FID {q['fid']:.2f} against the start's {start_q['fid']:.2f}: "
                      f"{q['fid'] / start_q['fid']:.2f}x (limit {limit}x): {'held' if held else 'worse'}")
            if held:
                r.final = {**r.final, "config": cfg, **q}
                break
            self.kept[final - 1].backed_off = True
            final -= 1
        if final == 0:
            r.final = {**r.start}
        r.quality["held"] = True
        backed = len(self.chain) - 1 - final
        r.quality["note"] = (f"final FID {r.final['fid']:.2f} against the start's {start_q['fid']:.2f} "
                             f"({r.final['fid'] / start_q['fid']:.2f}x, limit {limit}x)" +
                             (f"; {backed} kept change(s) backed off to hold it" if backed else ""))
        if final < len(self.chain) - 1:  # the incumbent trainer no longer matches the final config
            self._discard(self.incumbent)
            self.incumbent = None
        self.chain = self.chain[:final + 1]

    def _speed_check(self) -> None:
        """Start against final, interleaved: the speed-up the result reports."""
        r = self.result
        if len(self.chain) == 1:
            r.final["images_per_sec"] = r.start["images_per_sec"]
            r.speedup = 1.0 if r.start["images_per_sec"] else None
            return
        self._say("", now="measuring the final config against the start")
        final = self.incumbent if self.incumbent is not None else (lambda: self._trainer(self.chain[-1], "final"))
        measured = self._measure({"start": lambda: self._trainer(self.chain[0], "start"), "final": final},
                                 {"start": self.chain[0], "final": self.chain[-1]})
        self.incumbent = measured["final"].trainer
        r.start["images_per_sec"] = measured["start"].images_per_sec
        r.final["images_per_sec"] = measured["final"].images_per_sec
        _, r.speedup, spread, _ = decide(measured["start"].images_per_sec_runs, measured["final"].images_per_sec_runs)
        self._discard(measured["start"].trainer)
        self._say(f"final against start, interleaved: {r.start['images_per_sec']:.0f} -> "
                  f"{r.final['images_per_sec']:.0f} images/s, {r.speedup:.2f}x ({spread[0]:.2f}-{spread[1]:.2f})")


def _key(change) -> frozenset:
    items = change.to_dict().items() if isinstance(change, TrainConfig) else change.items()
    return frozenset((k, tuple(v) if isinstance(v, list) else v) for k, v in items)


def _diff(cfg: TrainConfig, base: TrainConfig | None = None) -> dict:
    """The fields of `cfg` that differ from `base` (default: TrainConfig())."""
    base = base or TrainConfig()
    return {k: getattr(cfg, k) for k in knobs() if getattr(cfg, k) != getattr(base, k)}


def _markdown_line(row: dict) -> str:
    from .display import markdown_table

    return markdown_table(list(row), [list(row.values())]).splitlines()[-1]


def tune(cfg: TrainConfig | None = None, minutes: float = 15.0, *, generator=None, discriminator=None, dataset=None,
         quality=True, quality_images: int | None = None, space=None, plan=None,
         stop: threading.Event | None = None, progress=print, on_update=None, out_dir=None) -> TuneResult:
    """Find a faster config on this machine, keeping quality: the loop of this module's docstring.

    `cfg` (default: TrainConfig()) is the start; `generator`, `discriminator` and `dataset` as for `Trainer` (your
    own networks are deep-copied for every run, so yours are left as they are). `minutes`: the wall-clock budget.
    `quality`: True trains start and final on `quality_images` each (default: the benchmark's quality budget, 800
    steps of batch 128 on a CPU, 3000 on a GPU; tiny in quick mode) and scores them; False skips the check (say so
    where you report it); or a function `TrainConfig -> {'fid': ...}` of your own. `space`: the knobs to search
    (default: every speed knob; add 'batch_size' to let the batch grow, with the learning rates scaled by sqrt 2).
    `plan`: the measurement protocol (default: the benchmark's, `bench.PLAN`). `stop`: an Event that ends tune
    between measurements; Ctrl-C does the same. `progress(line)` gets the path table row by row and what happens;
    `on_update(result)` the result after every change (a live view: `display.LiveTune`). Runs go under
    `out_dir` (default: <cfg.out_dir>/tune): the quality runs are kept, the measurement runs removed."""
    tuner = _Tuner(cfg if cfg is not None else TrainConfig(), minutes, generator, discriminator, dataset, quality,
                   quality_images, space, plan, stop, progress, on_update, out_dir)
    return tuner.run()
