"""What tune found and how: each step it took (`Step`), the result (`TuneResult`) and the path as table rows."""
from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..core.checkpoint import atomic_write
from ..core.config import TrainConfig, cli_flags, differences
from .space import describe


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
    """What tune found and how, built as tune goes, so what it holds after a stop is everything up to the stop.
    `final_config` is the answer; `python()` and `flags()` give it as code and as CLI flags, `markdown()` the path as
    a table (`workbook.display.tune_chart` draws it), `save_json(path)` all of it. `tune` builds it; the fields:

    Args:
        start: the config tune started from, as a dict with its `config`, `images_per_sec` and `fid`.
        final: the config tune ends with, alike.
        path: every step taken (`Step`), in order.
        skipped: (change, why it does not apply here) for each change left out.
        quality: the quality check: held, limit, tries (the back-off), note.
        device: the device tuned on.
        minutes: the time budget.
        elapsed_s: the wall time tune took.
        stopped: whether tune was stopped before it ended.
        ended: why the search ended.
        now: what tune is doing now (for a live view).
        speedup: final over start, measured interleaved at the end; None until then.
        speedup_spread: that measurement's paired ratios (a `turns.Paired`, saved as its (low, high)), what the
            verdict reads; None where there was nothing to measure.
        seconds: where the time went: 'search' (from the start to the search's end), 'left' (the budget's
            seconds left then) and 'reserved' (what the phases after it were estimated to need), then each phase
            after it ('quality', 'final speed check') and, where it was trained, 'second seed' (of the start).
        date: the day tune ran (YYYY-MM-DD).
    """

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
    speedup_spread: tuple | None = None  # its paired ratios (`Paired`; JSON keeps their (low, high))
    seconds: dict = field(default_factory=dict)  # where the time went (see above)
    date: str = field(default_factory=lambda: time.strftime("%Y-%m-%d"))

    @property
    def start_config(self) -> TrainConfig:
        return self.start["config"]

    @property
    def final_config(self) -> TrainConfig:
        return self.final["config"]

    def changes(self) -> dict:
        """The fields the final config changes, from the start's values to its own."""
        return differences(self.final_config, self.start_config)

    def python(self) -> str:
        """The final config as code: `TrainConfig(...)` with every field that differs from the defaults."""
        args = [f"{k}={value!r}" for k, (_, value) in differences(self.final_config).items()]
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
        return [path_row(i, s) for i, s in enumerate(self.path, 1)]

    def markdown(self) -> str:
        from ..measuring.results import markdown_table

        return markdown_table(list(ROW_HEAD), [list(r.values()) for r in self.rows()])

    def summary(self) -> str:
        """The outcome in a few lines: speed, quality, the final config as code and as flags."""
        lines = [f"search: {self.ended}" if self.ended else "search: not finished"]
        s, f = self.start, self.final
        if self.speedup is not None:
            paired = (f" (median of the paired repeats' ratios, {self.speedup_spread[0]:.2f}-"
                      f"{self.speedup_spread[1]:.2f})" if self.speedup_spread else "")
            lines.append(f"speed: start {s['images_per_sec']:.0f} images/s, final {f['images_per_sec']:.0f} images/s "
                         f"(each the median of its interleaved repeats); final over start {self.speedup:.2f}x{paired}")
        elif f.get("images_per_sec") and s.get("images_per_sec"):
            lines.append(f"speed: start {s['images_per_sec']:.0f} images/s, final about {f['images_per_sec']:.0f} "
                         f"(from the path's ratios)")
        q = self.quality
        if q.get("note"):
            lines.append(f"quality: {q['note']}")
        if self.elapsed_s > 60 * self.minutes + 1:
            lines.append(self._overrun())
        lines += [f"skipped here: {'; '.join(f'{c} ({why})' for c, why in self.skipped)}"] if self.skipped else []
        lines += ["final config:", "  " + self.python().replace("\n", "\n  "),
                  f"  python -m gantools train {self.flags()}"]
        return "\n".join(lines)

    def _overrun(self) -> str:
        """'time: ...': how far tune ran past its budget, and what took the time, from `seconds`."""
        t = self.seconds
        head = (f"time: {self.elapsed_s / 60:.1f} min, {self.elapsed_s - 60 * self.minutes:.0f} s past the "
                f"{self.minutes:g}-minute budget")
        if "left" not in t:  # stopped during the search
            return head
        if t["left"] < 0:
            return f"{head}: the search itself ended {-t['left']:.0f} s past it (a step took longer than estimated)"
        after = [f"{words} {t[name]:.0f} s" for name, words in (("quality", "the quality check"),
                                                                 ("final speed check", "the final check")) if name in t]
        seed = f", of which a second seed of the start {t['second seed']:.0f} s" if "second seed" in t else ""
        backed = sum(s.backed_off for s in self.path)
        backed = f"; {backed} kept change(s) backed off, each one more quality run, which no reserve covers" \
            if backed else ""
        return (f"{head}: the search left {t['left']:.0f} s for what comes after it, estimated at "
                f"{t['reserved']:.0f} s from the speeds measured; it took {', '.join(after)}{seed}{backed}")

    def __str__(self):
        return self.markdown() + "\n\n" + self.summary()

    def to_dict(self) -> dict:
        def point(p):
            return {**p, "config": p["config"].to_dict()}

        return {"start": point(self.start), "final": point(self.final), "path": [s.to_dict() for s in self.path],
                "speedup": self.speedup, "speedup_spread": self.speedup_spread,
                "seconds": self.seconds, "quality": self.quality,
                "skipped": self.skipped, "ended": self.ended,
                "stopped": self.stopped, "device": self.device, "minutes": self.minutes,
                "elapsed_s": self.elapsed_s, "date": self.date}

    def save_json(self, path) -> Path:
        path = Path(path)
        atomic_write(path, lambda f: f.write(json.dumps(self.to_dict(), indent=1).encode()))
        return path


ROW_HEAD = ("step", "change", "from", "images/s", "vs incumbent (spread)", "vs start", "result")


def path_row(i: int, s: Step) -> dict:
    """One step as a row of the path table (`ROW_HEAD`), every cell a string."""
    why = s.why + (" (backed off: quality)" if s.backed_off else "")
    return dict(zip(ROW_HEAD, (
        str(i), describe(s.change), s.source, "n/a" if s.images_per_sec is None else f"{s.images_per_sec:.0f}",
        "n/a" if s.ratio is None else f"{s.ratio:.2f}x ({s.spread[0]:.2f}-{s.spread[1]:.2f})",
        "n/a" if s.ratio_to_start is None else f"{s.ratio_to_start:.2f}x", why), strict=True))


def markdown_line(row: dict) -> str:
    """One row as a markdown table line (what tune prints as it goes, under the header)."""
    from ..measuring.results import markdown_table

    return markdown_table(list(row), [list(row.values())]).splitlines()[-1]
