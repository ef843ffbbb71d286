"""What the notebooks share: quick mode (GANTOOLS_QUICK=1, for tests), run sizes, training several configs side by
side in one kernel, and a results log (`save_result`: what 00 measured, kept for the reader; no notebook reads
another kernel's numbers back, each measures its own start)."""
from __future__ import annotations

import json
import time
from pathlib import Path

from ..core.checkpoint import atomic_write
from ..core.config import TrainConfig, preset
from .display import LiveRuns
from ..errors import ConfigError
from ..measuring.hardware import machine_info, resolve_device
from ..measuring.turns import SAME, Contender, Paired, take_turns
from ..core.history import History
from ..core.metrics import QualityCurve
from ..quick import QUICK
from ..core.trainer import Trainer

# Quick mode: a tiny DCGAN and a handful of steps, so every notebook runs in seconds on a 2-core CPU.
QUICK_SIZE = dict(nz=16, ngf=8, ndf=8, batch_size=32, steps=12, log_interval=3, sample_interval=6)


def real_size() -> dict:
    """Meaningful runs: DCGAN at 32 px, batch 128. 800 steps is where FID on glyphs stops falling steeply and
    most classes appear (evidence: docs/benchmark.md), so quality compares fairly between runs; more on a GPU."""
    gpu = resolve_device("auto").type == "cuda"
    return dict(nz=100, ngf=64, ndf=64, batch_size=128, steps=2000 if gpu else 800, log_interval=25,
                sample_interval=200 if gpu else 100)


def runs_dir() -> Path:
    """Notebook outputs: runs/ next to the notebooks, runs/quick/ in quick mode (tests never touch real results)."""
    return Path("runs") / "quick" if QUICK else Path("runs")


def workbook_config(name: str = "default", run: str | None = None, **overrides) -> TrainConfig:
    """A preset sized for the mode (quick or real), writing to runs/<run>. Overrides win."""
    size = QUICK_SIZE if QUICK else real_size()
    values = {**size, "out_dir": str(runs_dir() / (run or name)), **overrides}
    return preset(name, **values)


def save_result(name: str, history, cfg: TrainConfig, path=None) -> dict:
    """Add one run's summary (with its config and machine) to runs/results.json, atomically."""
    path = Path(path or runs_dir() / "results.json")
    results = load_results(path)
    results[name] = {"summary": history.summary(), "config": cfg.to_dict(),
                     "machine": machine_info(cfg.device), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    atomic_write(path, lambda f: f.write(json.dumps(results, indent=1).encode()))
    return results[name]


def load_results(path=None) -> dict:
    path = Path(path or runs_dir() / "results.json")
    return json.loads(path.read_text()) if path.is_file() else {}


def baseline(path=None) -> dict:
    """The baseline summary saved by 00_baseline on this machine; a clear error if that notebook was not run."""
    results = load_results(path)
    if "baseline" not in results:
        raise FileNotFoundError(f"no baseline in {Path(path or runs_dir() / 'results.json')}: run "
                                "00_baseline.ipynb first (it measures the reference loop on this machine)")
    return results["baseline"]["summary"]


class SideBySide(dict):
    """What `train_side_by_side` returns: name -> Trainer, with the same accessors as `tutorial.Race` for the
    figures a conclusion reads."""

    def ratio(self, name: str, against: str) -> float:
        """How many times as fast `name` ran as `against` (each run's median images/s, as its summary gives it)."""
        return self[name].history.summary()["images_per_sec"] / self[against].history.summary()["images_per_sec"]

    def paired(self, name: str, against: str) -> Paired | None:
        """The round-by-round ratios (`reconcile.paired_ratios`, warm-up left out), read as their range too: what
        `conclusions.speed_verdict` decides on; None where fewer than two rounds ran."""
        from .reconcile import paired_ratios

        return Paired.of(paired_ratios(self[name], self[against]))


def train_side_by_side(configs: dict, images: int | None = None, chunk_images: int | None = None,
                       quality: bool = True, plot=True, *, steps: int | None = None,
                       chunk_steps: int | None = None, quality_points: int = 1, start=None) -> dict:
    """Train several configs to the same budget, taking turns: to the same number of real `images` (each run
    trains `chunk_images` real images, d_steps x batch_size per G step, then the next, round after round), or with
    `steps` to the same number of generator steps (`chunk_steps` per turn), the budget for runs that read different
    numbers of real images per G step (WGAN-GP's five critic batches). Taking turns lets machine noise hit every run
    alike, so their images/s compare fairly (each run's figure: the median over its chunks after the first, which
    holds warm-up). One live figure, updated in place, shows them all (`plot`: True, False, or a figure of its own,
    such as `multiples.LivePanels()`: a panel per run). With `quality`, every run is scored (FID, KID, coverage; a
    conditional run also `label_match`) at the end, and with `quality_points` > 1 also at evenly spaced rounds before
    it (`quality_curve(trainer)`: FID over the run). With `start` (a `warm.warm_start()`), every
    run starts from its own copy of that generator and discriminator. Returns name -> Trainer, as a `SideBySide`
    (`.ratio`, `.paired`: the figures a conclusion reads)."""
    per_turn, rounds, unit, chunk = _turns(configs, images, chunk_images, steps, chunk_steps)
    # each run's steps: its whole budget, so a learning-rate schedule spans the run
    trainers = {name: Trainer(cfg.replace(steps=rounds * per_turn[name], log_interval=per_turn[name],
                                          sample_interval=0, checkpoint_interval=0)) for name, cfg in configs.items()}
    if start is not None:
        for trainer in trainers.values():
            start.load_into(trainer)
    points = max(1, min(quality_points, rounds))
    scored_rounds = {round(rounds * (i + 1) / points) for i in range(points)}  # the last round among them
    if quality:
        for name, trainer in trainers.items():
            trainer.callbacks.append(QualityCurve([r * per_turn[name] for r in scored_rounds]))
    live = plot if hasattr(plot, "update") else LiveRuns() if plot else None  # a figure of its own: LivePanels()

    def after_round(r: int) -> None:
        if live is not None:
            live.update(trainers, (r + 1) * chunk, rounds * chunk, unit)

    def turn(name: str) -> float:  # a chunk's images/s, from the trainer's own clock (one log record per chunk)
        trainers[name].fit(per_turn[name])
        records = trainers[name].history.records
        return records[-1]["images_per_sec"] if records else float("nan")

    take_turns({name: Contender(subject=name, turn=turn) for name in trainers}, rounds, order=SAME,
               after_round=after_round)
    return SideBySide(trainers)


def _turns(configs: dict, images, chunk_images, steps, chunk_steps) -> tuple[dict, int, str, int]:
    """`train_side_by_side`'s budget, checked before any trainer is built: the generator steps each run trains
    per turn (name -> steps), the rounds, the unit the budget is counted in, and the chunk of it one turn trains."""
    if (images is None) == (steps is None):
        raise ConfigError("give the budget as images (real images, with chunk_images) or as steps (generator "
                          "steps, with chunk_steps), not both")
    per_turn = {}
    if steps is not None:
        if not chunk_steps or steps % chunk_steps:
            raise ConfigError(f"steps={steps} must be a multiple of chunk_steps={chunk_steps}")
        per_turn = dict.fromkeys(configs, chunk_steps)
        rounds, unit, chunk = steps // chunk_steps, "generator steps", chunk_steps
    else:
        for name, cfg in configs.items():
            per_step = cfg.images_per_step  # real images per G step
            if not chunk_images or chunk_images % per_step or images % chunk_images:
                raise ConfigError(f"{name}: chunk_images={chunk_images} must be a multiple of batch_size x d_steps "
                                  f"({per_step}), and images={images} a multiple of chunk_images")
            per_turn[name] = chunk_images // per_step
        rounds, unit, chunk = images // chunk_images, "real images", chunk_images
    return per_turn, rounds, unit, chunk


def quality_curve(trainer) -> History:
    """The scores `train_side_by_side(..., quality_points=k)` took over a run, as a History (columns step,
    images_trained, fid, kid, classes_covered, ...), for `display.plot_column`."""
    curve = next((c for c in trainer.callbacks if isinstance(c, QualityCurve)), None)
    return History(list(curve.points) if curve else [])
