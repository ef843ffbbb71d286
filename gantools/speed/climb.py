"""The climbing ladder: from the reference, each rung adds one technique on top of the best config so far, is measured
against that best with the ladder's protocol (`bench.interleave`, handed in as `Measuring`: the two interleaved,
paired repeat by repeat) and is kept or not by gantools' one keep rule (`keep.decide_in_two`, tune's and the
doctor's). Its last kept config is its 'all together': every technique in it was measured faster than the config
before it, so that row is never slower than its parts, as the one-at-a-time ladder's fixed combination can be. A rung
that does not apply on the device, or whose config is refused (validation, the trainer's build), is a row that says
why; the climb goes on. Every row carries its host figures (`figures.host_figures`), counted after all the speeds."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypedDict

import torch

from ..core import techniques
from ..core.config import TrainConfig
from ..errors import GantoolsError
from ..measuring.turns import Spread
from . import keep
from .figures import HOST_HEAD, first_line, host_cells, host_figures

REFERENCE, BEST = "reference (tutorial loop)", "all together"


class ClimbRow(TypedDict, total=False):
    """One rung of the climbing ladder: its changes from the reference, whether the keep rule kept it (`why`), or
    `skipped` and why (it does not apply here, or its config was refused), its paired speed against the best so far
    (`vs_best`: the median ratio and its spread), its own images/s and its host figures."""

    variant: str
    changes: dict
    kept: bool
    skipped: str | None
    why: str
    vs_best: dict | None
    images_per_sec: float | None
    spread: Spread | None
    images_per_sec_runs: list
    best_images_per_sec: float
    batch_size: int
    warmup_s: float
    host_budget: dict | None
    host_ms: float | None


@dataclass(frozen=True)
class Rung:
    """A rung of the climbing ladder: its name, the change it adds to the best config so far ('batch_scale': times
    the preset's batch, as `bench.row_config` reads it), and why it does not apply here (None where it does)."""

    name: str
    change: dict
    why_not: str | None = None


def climb_rungs(device: torch.device, compile_ok: bool, compile_why: str | None = None) -> list[Rung]:
    """The climbing ladder's rungs in order: the data and the per-step syncs first (what keeps a GPU waiting on a
    small GAN), then the arithmetic, then fewer launches (torch.compile, CUDA graphs), then more work per launch (a
    larger batch). Each change is its technique's ladder row, as `ladder` reads them (`techniques.rows`); a rung
    that does not apply on `device` says why (`compile_why`: why torch.compile is left out)."""
    found = techniques.rows("ladder", device, compile_ok)
    rows = {row.name: row.change for row in found}
    half = next((row for row in found if "precision" in row.change and row.together), None)  # the device's own
    cudnn = device.type in techniques.by_knob("cudnn_benchmark").devices
    return [
        Rung("device-resident data", rows["device-resident data"]),
        Rung("no per-step .item()", rows["no per-step .item()"]),
        Rung(half.name, half.change) if half else Rung(
            "bf16 autocast", {}, "no fast 16-bit precision here: this CPU has no native bf16 (emulated, slower)"),
        Rung("channels_last + cudnn.benchmark" if cudnn else "channels_last",
             {**rows["channels_last"], **({"cudnn_benchmark": True} if cudnn else {})}),
        Rung("fused Adam", rows["fused Adam"]),
        Rung("D frozen in G step", rows["D frozen in G step"]),
        Rung("torch.compile", rows.get("torch.compile", {}),
             None if "torch.compile" in rows else compile_why or "torch.compile cannot build here"),
        # with what a capture needs (validation.capture_problems), in case an earlier rung was not kept
        Rung("CUDA graphs", {"cuda_graphs": True, "compile": "off", **rows["device-resident data"],
                             "sync_every_step": False, "optimizer_impl": "fused"},
             None if device.type in techniques.by_knob("cuda_graphs").devices else "CUDA graphs need a CUDA GPU"),
        Rung("batch x2", {"batch_scale": 2}),
        Rung("batch x4", {"batch_scale": 4}),
    ]


@dataclass(frozen=True)
class Measuring:
    """How the ladder measures, which the climb uses as it is: `bench` hands in its own (`interleave`,
    `measurement_trainer`, `row_config`), so that this module needs nothing of it and a test can hand in its own."""

    interleave: Callable  # (contenders, warmup_images, images_per_repeat, repeats, min_chunk_s=...) -> Measured's
    trainer: Callable  # (cfg, plan) -> a trainer for interleaved chunks
    config: Callable  # (base, changes, out_dir, name) -> the validated config of a row


class Climb:
    """The climbing ladder as it climbs: the best config so far (its changes from the reference and its warm
    trainer), a row per rung, and each row's config, for the host figures counted after the measuring (`count`), so
    a run stopped at a time limit has the speeds first. `on_row` is told after each row."""

    def __init__(self, base: TrainConfig, plan: dict, out_dir: Path, measuring: Measuring, progress=print,
                 on_row: Callable[[], None] | None = None):
        self.base, self.plan, self.out_dir, self.progress = base, plan, Path(out_dir), progress
        self.on_row = on_row or (lambda: None)
        self.measuring = measuring
        self.reference = measuring.config(base, {}, self.out_dir, "00-reference")
        self.best, self.best_changes = None, {}
        self.rows: list[ClimbRow] = [{
            "variant": REFERENCE, "changes": {}, "kept": True, "skipped": None, "why": "the start",
            "vs_best": None, "images_per_sec": None, "batch_size": self.reference.batch_size, "host_budget": None,
            "host_ms": None}]
        self.configs: list[TrainConfig | None] = [self.reference]

    def climb(self, rungs: list[Rung], start=None) -> None:
        """Every rung in turn; `start`: the reference's warm trainer, where one was measured already."""
        self.best = start if start is not None else (lambda: self.measuring.trainer(self.reference, self.plan))
        for i, rung in enumerate(rungs, 1):
            row, cfg = self.rung(i, rung)
            self.rows.append(row)
            self.configs.append(cfg)
            self.progress(f"climb: {rung.name}: " + (f"skipped: {row['skipped']}" if row["skipped"] else row["why"]))
            self.on_row()

    def rung(self, i: int, rung: Rung) -> tuple[ClimbRow, TrainConfig | None]:
        """One rung measured against the best so far and kept or not (`keep.decide_in_two`); skipped where it does
        not apply, or where its config is refused (a ConfigError at validation or at the trainer's build: its first
        line), or where it runs out of memory."""
        changes = {**self.best_changes, **rung.change}
        if rung.why_not:
            return self._skipped(rung.name, changes, rung.why_not), None
        try:
            cfg = self.measuring.config(self.base, changes, self.out_dir, f"{i:02d}-{rung.name}")
            measured = self._measure({"best": self.best,
                                      "candidate": lambda: self.measuring.trainer(cfg, self.plan)})
            kept, ratio, spread, why = self._decide(measured)
        except GantoolsError as e:
            return self._skipped(rung.name, changes, first_line(e)), None
        best, new = measured["best"], measured["candidate"]
        if self.rows[0]["images_per_sec"] is None:  # the reference, the best until a rung is kept
            self.rows[0].update(images_per_sec=best.images_per_sec, spread=best.spread, warmup_s=best.warmup_s)
        row = {"variant": rung.name, "changes": changes, "kept": kept, "skipped": None, "why": why,
               "vs_best": {"ratio": ratio, "spread": spread}, "images_per_sec": new.images_per_sec,
               "spread": new.spread, "images_per_sec_runs": new.images_per_sec_runs,
               "best_images_per_sec": best.images_per_sec, "batch_size": cfg.batch_size, "warmup_s": new.warmup_s,
               "host_budget": None, "host_ms": None}
        (best if kept else new).subject.close()  # the one not carried on: its DataLoader workers end
        if kept:
            self.best, self.best_changes = new.subject, changes
        return row, cfg

    def _measure(self, contenders: dict) -> dict:
        p = self.plan
        return self.measuring.interleave(contenders, p["warmup_images"], p["images_per_repeat"], p["repeats"],
                                         min_chunk_s=p.get("min_chunk_s"))

    def _decide(self, measured: dict) -> tuple:
        """The keep rule on the pair; a close call measured again, its repeats added to the first ones."""
        best, new = measured["best"], measured["candidate"]

        def again(why: str) -> tuple:
            more = self._measure({"best": best.subject, "candidate": new.subject})
            best.images_per_sec_runs += more["best"].images_per_sec_runs
            new.images_per_sec_runs += more["candidate"].images_per_sec_runs
            return more["best"].images_per_sec_runs, more["candidate"].images_per_sec_runs
        return keep.decide_in_two(best.images_per_sec_runs, new.images_per_sec_runs, again)

    @staticmethod
    def _skipped(name: str, changes: dict, why: str) -> ClimbRow:
        return {"variant": name, "changes": changes, "kept": False, "skipped": why, "why": f"skipped: {why}",
                "vs_best": None, "images_per_sec": None, "host_budget": None, "host_ms": None}

    def count(self, cache: dict) -> None:
        """Each measured row's host figures (`host_figures`)."""
        for i, (row, cfg) in enumerate(zip(self.rows, self.configs, strict=True)):
            if cfg is not None:
                row.update(host_figures(cfg, self.out_dir / "host" / f"{i:02d}", cache))
                self.on_row()

    def result(self) -> dict:
        """The rows, and the best: the last kept config, named 'all together'."""
        last = next(row for row in reversed(self.rows) if row["kept"])
        return {"rows": self.rows, "best": {**last, "variant": BEST, "from": last["variant"]}}


def climb_ladder(base: TrainConfig, plan: dict, out_dir: Path, rungs: list[Rung], measuring: Measuring, start=None,
                 progress=print, result: dict | None = None, emit: Callable[[], None] = lambda: None) -> Climb:
    """`bench.run`'s climb up `rungs` from `start` (the reference's warm trainer, where the ladder measured one);
    after each row the climb so far goes into `result` (under 'climb') and `emit` hands it on."""
    def on_row() -> None:
        if result is not None:
            result["climb"] = climber.result()
        emit()
    climber = Climb(base, plan, out_dir, measuring, progress, on_row)
    climber.climb(rungs, start)
    return climber


def _climb_cells(row: dict) -> list[str]:
    """A climbing row's verdict, images/s, paired ratio and why (the keep rule's words after its ratio)."""
    if row.get("skipped"):
        return ["skipped", "", "", row["skipped"]]
    if row["vs_best"] is None:  # the start
        speed = f"{row['images_per_sec']:.0f}" if row["images_per_sec"] is not None else "n/a"
        return ["start", speed, "", row["why"]]
    ratio, (low, high) = row["vs_best"]["ratio"], row["vs_best"]["spread"]
    return ["kept" if row["kept"] else "not kept", f"{row['images_per_sec']:.0f}",
            f"{ratio:.2f}x ({low:.2f}-{high:.2f})", row["why"].split(", ", 1)[-1]]


def climb_markdown(result: dict) -> str:
    """The climbing table: a row per rung, then its best ('all together'), with what it is and how it was kept."""
    climb = result["climb"]
    head = ["rung", "kept", "images/s", "vs best so far (paired, spread)", "why", *HOST_HEAD]
    lines = ["Climbing: from the reference, each rung adds one technique to the best config so far, measured against "
             "that best in interleaved pairs and kept or not by gantools' keep rule (gantools.speed.keep: kept where "
             "faster in every repeat; a close call measured again and kept where faster in 80% of all its repeats). "
             "Batch x2 and x4 are the preset's batch with both learning rates scaled by the square root of the batch "
             "ratio (config.scale_batch): fewer optimizer steps per image, so they change what is learned; compare "
             "quality before keeping them.", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in climb["rows"]:
        verdict, speed, ratio, why = _climb_cells(row)
        lines.append("| " + " | ".join([row["variant"], verdict, speed, ratio, why, *host_cells(row)]) + " |")
    best = climb.get("best")
    if best and best.get("images_per_sec") is not None:
        cells = [f"**{BEST}** (as kept at {best['from']})", "", f"{best['images_per_sec']:.0f}", "",
                 "every rung kept up to here", *host_cells(best)]
        lines.append("| " + " | ".join(cells) + " |")
        reference = climb["rows"][0]["images_per_sec"]
        if reference:
            lines += ["", f"climbing best: {best['images_per_sec']:.0f} images/s, "
                          f"{best['images_per_sec'] / reference:.2f}x the reference's (each rung was paired with the "
                          "best before it; this ratio of two rungs' figures is not paired)"]
    return "\n".join(lines)
