"""Notebook output that updates in place: one figure per run, redrawn through a display handle (never by clearing
the cell), throttled so drawing stays a small, measured fraction of training time."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..measuring.results import markdown_table
from ..speed.keep import QUALITY_TARGET

from .chart_layout import (SCALE_NOTE, WIDTH_IN, fit_scale, label_line_ends, legend_below, legend_height, make_room,
    place_labels, wrap, wrap_names, wrap_to)
from .chart_layout import figure as _figure
from .chart_notes import (FEW_POINTS, POINT_NOTE, coinciding_note, draw_curves, loss_curves, penalty_note,
    point_style, quality_range)
from .chart_notes import line_style as _line_style
from .grids import SAMPLES_PER_ROW, image_grid, samples_figure  # noqa: F401 (image_grid: the notebooks' import)


def _display(obj, handle=None):
    from IPython.display import Image, display

    if hasattr(obj, "savefig"):  # a matplotlib figure: shown as figure_png's compact PNG, at the figure's own dpi
        obj = Image(figure_png(obj, dpi=obj.dpi))
    if handle is None:
        return display(obj, display_id=True)
    handle.update(obj)
    return handle


class LivePlot:
    """Trainer callback: loss curves and the fixed-noise sample grid, one figure updated in place.

    Redraws at most every `min_interval_s` seconds (and once at the end); `draw_time_s` is the time spent drawing,
    which the trainer keeps out of its step times: compare it with `history.summary()['train_time_s']`."""

    def __init__(self, title: str = "", min_interval_s: float = 1.0, widget=None):
        self.title, self.min_interval_s, self.widget = title, min_interval_s, widget  # widget: ipywidgets.Image
        self.draw_time_s, self.draws, self.grid, self.handle = 0.0, 0, None, None
        self._last = 0.0

    def on_fit_start(self, trainer):
        self.fig, (self.ax_loss, self.ax_img) = _figure(1, 2, figsize=(WIDTH_IN, 3.8),
                                                        gridspec_kw={"width_ratios": [1.6, 1]})
        if self.title:
            self.fig.suptitle(wrap_to(self.title, WIDTH_IN, 11), fontsize=11)
        self._draw(trainer)

    def on_log(self, trainer, record):
        if time.perf_counter() - self._last >= self.min_interval_s:
            self._draw(trainer)

    def on_sample(self, trainer, step, grid):
        self.grid = grid

    def on_fit_end(self, trainer):
        self._draw(trainer)

    def _draw(self, trainer):
        t0 = time.perf_counter()
        h = trainer.history
        ax = self.ax_loss
        ax.clear()
        if len(h):
            steps = h.column("step")
            ax.plot(steps, h.column("loss_d"), label="D loss" + penalty_note([h]), **point_style(len(h)))
            ax.plot(steps, h.column("loss_g"), label="G loss", **point_style(len(h)))
            ax.set_ylabel("loss" + SCALE_NOTE[fit_scale(ax, h.column("loss_d") + h.column("loss_g"))], fontsize=9)
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)  # off the curves
            last = h[-1]
            ax.set_title(f"step {last['step']}: {last['images_per_sec']:.0f} img/s in the last interval", fontsize=10)
        ax.set_xlabel("step")
        self.ax_img.clear()
        self.ax_img.axis("off")
        if self.grid is not None:
            self.ax_img.imshow(self.grid)
            self.ax_img.set_title("fixed-noise samples", fontsize=10)
        if self.widget is not None:  # inside a widget panel: safe to update from the training thread
            self.widget.value = figure_png(self.fig)
        else:
            self.handle = _display(self.fig, self.handle)
        self._last = time.perf_counter()
        self.draw_time_s += self._last - t0
        self.draws += 1


def figure_png(fig, dpi: float = 80) -> bytes:
    """The figure as a PNG of 256 colours chosen for it, without dithering: grey samples, text and a few line colours
    look the same and the stored notebook holds half the bytes or less of a full-colour PNG."""
    import io

    from PIL import Image  # matplotlib's own dependency

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    picture = Image.open(buf).convert("RGB").quantize(256, dither=Image.Dither.NONE)
    out = io.BytesIO()
    picture.save(out, format="png", optimize=True)
    return out.getvalue()


class ProgressBar:
    """Trainer callback: a tqdm bar (a widget in Jupyter, text in a terminal or CI) with the latest losses and
    speed; host-only work, so it never syncs the device."""

    def on_fit_start(self, trainer):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=trainer.cfg.steps, initial=trainer.step, unit="step", dynamic_ncols=True)

    def on_step_end(self, trainer):
        self.bar.update(1)

    def on_log(self, trainer, record):
        self.bar.set_postfix(loss_d=f"{record['loss_d']:.3f}", loss_g=f"{record['loss_g']:.3f}",
                             img_s=f"{record['images_per_sec']:.0f}", refresh=False)

    def on_fit_end(self, trainer):
        self.bar.close()


def show_images(images, nrow: int = 8, title: str = ""):
    """Show a batch of images (uint8 or [-1, 1]) as one grid."""
    fig, ax = _figure(figsize=(5, 5))
    ax.imshow(image_grid(images, nrow))
    ax.set_title(wrap_to(title, 5, 10), fontsize=10)
    ax.axis("off")
    return _display(fig)


def show_samples(grids: dict, title: str = "", per_row: int = SAMPLES_PER_ROW):
    """Sample grids, e.g. {'fp32': grid, 'bf16': grid}, at most `per_row` in a row and in as many rows as keep
    each large enough to see (`grids.grid_layout`), each under its name."""
    return _display(samples_figure(grids, title, per_row))


def comparison_rows(results: dict, baseline: dict) -> list[dict]:
    """One row per run: speed, speed-up over the baseline, time waiting for data, peak tensor memory, final losses, and
    image quality (FID, classes covered, images trained) for runs scored by metrics.QualityCallback."""
    rows = []
    scored = any("fid" in s for s in results.values())  # quality columns only when some run was scored
    for name, s in results.items():
        row = {"run": name, "images/s": s["images_per_sec"],
               "speed-up": s["images_per_sec"] / baseline["images_per_sec"],
               "ms/step": s["step_time_ms"], "data wait ms": s["data_wait_ms"],
               "peak tensor MB": s["peak_mem_mb"], "loss D": s["loss_d"], "loss G": s["loss_g"]}
        if scored:
            same_budget = s.get("images_trained") == baseline.get("images_trained")  # else the ratio misleads
            row.update({"FID": s.get("fid"), "FID vs baseline": s["fid"] / baseline["fid"]
                        if "fid" in s and "fid" in baseline and same_budget else None,
                        "classes": s.get("classes_covered"), "images trained": s.get("images_trained")})
        rows.append(row)
    return rows


FORMATS = {"images/s": "{:.0f}", "speed-up": "{:.2f}x", "ms/step": "{:.1f}", "data wait ms": "{:.2f}",
           "peak tensor MB": "{:.0f}", "loss D": "{:.3f}", "loss G": "{:.3f}", "FID": "{:.1f}",
           "FID vs baseline": "{:.2f}x"}


def comparison_markdown(rows: list[dict]) -> str:
    head = list(dict.fromkeys(k for r in rows for k in r))
    return markdown_table(head, [["n/a" if r.get(k) is None else FORMATS.get(k, "{}").format(r[k]) for k in head]
                                 for r in rows])


def comparison_chart(rows: list[dict], baseline: dict, title: str = "images per second against the baseline",
                     fid_spread=None):
    """Speed bars against the baseline; under them, speed against FID when the runs were scored for quality
    (`fid_spread`: the second seed's spread, as `speed_chart` takes it)."""
    scored = any(r.get("FID") is not None for r in rows)
    return speed_chart([r["run"] for r in rows], [r["images/s"] for r in rows],
                       notes=[f"{r['speed-up']:.2f}x" for r in rows], baseline=baseline["images_per_sec"],
                       fids=[r.get("FID") for r in rows] if scored else None, baseline_fid=baseline.get("fid"),
                       title=title, speed_label="images / s; beside each bar: its speed-up on the baseline",
                       fid_spread=fid_spread)


def speed_chart(names: list, speeds: list, *, notes: list | None = None, baseline: float | None = None,
                fids: list | None = None, baseline_fid: float | None = None, fid_line: tuple | None = None,
                title: str = "", speed_label: str = "images / s", fid_label: str = "FID (lower is better)",
                fid_spread=None, scale: str = "auto"):
    """One bar per run, its note (e.g. the speed-up) at the bar's end, the baseline's speed a dashed line; under
    them, when `fids` are given, speed against FID, each point numbered as its bar (names would cover each other
    and the points). `fid_line`: (FID, what it is) drawn dashed, e.g. a quality target. `fid_spread`: the second
    seed's spread (|FID(seed 0) - FID(seed 1)|, or a (low, high) range), a grey band around the baseline's FID.
    Log axes where values span decades (`scale="linear"`: bars from 0 whatever the span, where the bars' lengths
    must compare); at a notebook's width whatever the names."""
    n = len(names)
    scored = [i for i, f in enumerate(fids or []) if f is not None]
    labels = wrap_names([f"{i + 1}. {name}" if scored else name for i, name in enumerate(names)])
    row_in = 0.12 + 0.16 * max(label.count("\n") + 1 for label in labels)
    bars_in, quality_in = 0.9 + row_in * max(n, 3), 3.6 if scored else 0.0
    title = wrap_to(title, WIDTH_IN, 11) if title else ""
    fig, axes = _figure(2 if scored else 1, 1, squeeze=False,
                        figsize=(WIDTH_IN, bars_in + quality_in + 0.22 * (title.count("\n") + 1)),
                        gridspec_kw={"height_ratios": [bars_in, quality_in] if scored else [1]})
    if title:
        fig.suptitle(title, fontsize=11)
    ax = axes[0][0]
    y = np.arange(n)[::-1]  # the first run on top
    ax.barh(y, speeds, height=0.6, color=[f"C{i % 10}" for i in range(n)] if scored else "tab:blue")
    ax.set_yticks(y, labels, fontsize=8)
    pad = max(0.0, (3 - n) / 2)  # a lone bar as thick as one of three
    ax.set_ylim(-0.6 - pad, n - 0.4 + pad)
    marks = [v for v in list(speeds) + [baseline] if v]
    log = scale != "linear" and fit_scale(ax, marks, "x") == "log"
    ax.set_xlim(min(v for v in marks if v > 0) / 1.6 if log else 0, max(marks + [1e-9]) * 1.05)
    if baseline:
        ax.axvline(baseline, color="grey", ls="--", lw=1)
    texts = [ax.text(v, yy, f" {note}", va="center", fontsize=8)
             for v, yy, note in zip(speeds, y, notes or [], strict=False)]  # no notes: no texts
    ax.set_xlabel(speed_label + (f"; dashed line: the baseline, {baseline:.0f}" if baseline else "") +
                  ("; log scale" if log else ""))
    make_room(ax, texts)
    if scored:
        _speed_against_fid(axes[1][0], [(i, speeds[i], fids[i]) for i in scored], baseline, baseline_fid, fid_line,
                           (fid_label, quality_in - 0.8), fid_spread)
    return fig


def _speed_against_fid(ax, points, baseline, baseline_fid, fid_line, fid_label, fid_spread) -> None:
    """`speed_chart`'s lower panel: (i, speed, FID) points numbered i + 1; the baseline a grey cross, or its
    number on the run that is the baseline; an FID range of noise's size not stretched to the full height.
    `fid_label`: (the y-axis label, the inches it may take)."""
    xy, numbers = [(x, f) for _, x, f in points], [str(i + 1) for i, _, _ in points]
    for i, x, f in points:
        ax.scatter(x, f, color=f"C{i % 10}", s=30, zorder=3)
    if baseline and baseline_fid is not None:
        same = [k for k, p in enumerate(xy) if np.allclose(p, (baseline, baseline_fid), rtol=1e-9)]
        if same:
            numbers[same[0]] += " = baseline"
        else:
            ax.scatter(baseline, baseline_fid, color="grey", marker="x", s=40, zorder=3)
            xy.append((baseline, baseline_fid))
            numbers.append("baseline")
    band = None
    if fid_spread is not None and (np.ndim(fid_spread) or baseline_fid is not None):
        band = tuple(fid_spread) if np.ndim(fid_spread) else (baseline_fid - fid_spread, baseline_fid + fid_spread)
        ax.axhspan(*band, color="0.92", zorder=0)
    if fid_line:
        ax.axhline(fid_line[0], color="grey", ls="--", lw=1)
    xlog = fit_scale(ax, [x for x, _ in xy], "x") == "log"
    keep = ([fid_line[0]] if fid_line else []) + list(band or [])  # in view, whatever the points' range
    ylog = fit_scale(ax, [f for _, f in xy] + keep, "y") == "log"
    ax.margins(0.15)  # room around the points for their numbers
    note = quality_range(ax, [f for _, f in xy], fid_spread, keep=keep)
    ax.set_xlabel("images / s (right is faster)" + (", log scale" if xlog else ""))
    ax.set_ylabel(wrap_to(fid_label[0] + (", log scale" if ylog else ""), fid_label[1], 10), fontsize=10)
    what = ["speed against image quality: each point numbered as its bar above"]
    what += [f"dashed: {fid_line[1]}"] if fid_line else []
    what += ["grey band: the baseline's FID give or take the second seed's spread"] if band else []
    ax.set_title(wrap_to("; ".join(what + ([note] if note else [])), WIDTH_IN - 3, 10), fontsize=10)
    place_labels(ax, xy, numbers, fontsize=8)


def show_comparison(results: dict, baseline: dict, title: str = "images per second against the baseline",
                    fid_spread=None):
    """A table and a bar chart of runs (name -> History.summary()) against the baseline summary; `fid_spread`:
    the second seed's spread of FID, where one was trained (`speed_chart`)."""
    from IPython.display import Markdown

    rows = comparison_rows(results, baseline)
    _display(Markdown(comparison_markdown(rows)))
    return _display(comparison_chart(rows, baseline, title, fid_spread))


def compare_losses(histories: dict, title: str = "losses"):
    """D's and G's loss curves of several runs side by side (a run the same colour in both, one legend under
    them), e.g. {'fp32': history, 'bf16': history}; log axes where the losses span decades. Curves of few points
    show them; curves on one another are dashed in turns and named in the title."""
    labels = wrap_names(histories)
    fig, axes = _figure(1, 2, figsize=(WIDTH_IN, 3.6 + legend_height(WIDTH_IN, labels)))
    runs = list(histories.values())
    whats = ("discriminator loss" + penalty_note(runs), "generator loss")
    notes = []
    for ax, what, column in zip(axes, whats, ("loss_d", "loss_g"), strict=True):
        groups = draw_curves(ax, [(i, h.column("step"), h.column(column)) for i, h in enumerate(runs)])
        notes.append(coinciding_note(groups, wrap_names(histories, width=40, lines=1)))
        scale = fit_scale(ax, [v for h in runs for v in h.column(column)])
        ax.set_title(wrap_to(what + SCALE_NOTE[scale], WIDTH_IN / 2 - 0.7, 10), fontsize=10)
        few = min((len(h) for h in runs), default=0) <= FEW_POINTS
        ax.set_xlabel(wrap_to("step" + (f"; {POINT_NOTE}" if few else ""), WIDTH_IN / 2 - 0.7, 10))
    note = notes[0] if notes[0] == notes[1] else "; ".join(f"{w}: {n}" for w, n in zip("DG", notes, strict=True) if n)
    fig.suptitle("\n".join(wrap_to(t, WIDTH_IN, 11) for t in (title, note) if t), fontsize=11)
    legend_below(fig, axes[0].get_lines(), labels)
    return _display(fig)


def plot_column(histories: dict, column: str, title: str = "", x: str = "step"):
    """One logged column (e.g. 'penalty') of several runs on shared axes, e.g. {'fp32': history, 'bf16': history};
    a log axis where the values span decades."""
    labels = wrap_names(histories)
    fig, ax = _figure(figsize=(WIDTH_IN, 3.4 + legend_height(WIDTH_IN, labels)))
    groups = draw_curves(ax, [(i, h.column(x), h.column(column)) for i, h in enumerate(histories.values())])
    note = coinciding_note(groups, wrap_names(histories, width=40, lines=1))
    scale = fit_scale(ax, [v for h in histories.values() for v in h.column(column)])
    ax.set_xlabel(x)
    ax.set_ylabel(column + SCALE_NOTE[scale])
    ax.set_title(wrap_to((title or column) + (f"; {note}" if note else ""), WIDTH_IN - 1, 10), fontsize=10)
    legend_below(fig, ax.get_lines(), labels)
    return _display(fig)


def _ms(v: float) -> str:
    return f"{v:.1f}" if v >= 1 else f"{v:.2f}"


def plot_phases(report, title: str = "where one training step's time goes", before=None):
    """Horizontal bars of a ProfileReport's (or DoctorReport's) milliseconds per phase. With `before` (another
    report), both on one axis, its bar above each of this one's: two reports compared share one scale."""
    return _display(phases_figure(report, title, before))


def phases_figure(report, title: str = "where one training step's time goes", before=None):
    """`plot_phases`' figure, not displayed: for a widget (`panel.ProfilePanel`) that shows it as a PNG."""
    reports = [("before", before), ("after", report)] if before is not None else [("", report)]
    names = list(dict.fromkeys([p for _, r in reports for p in r.phases_ms]))
    n, k = len(names), len(reports)
    fig, ax = _figure(figsize=(WIDTH_IN, 1.2 + (0.26 + 0.2 * (k - 1)) * max(n, 3) + 0.35 * (k - 1)))
    y = np.arange(n)[::-1]
    height = 0.8 / k
    texts = []
    for j, (which, r) in enumerate(reports):
        at = y + (k - 1 - 2 * j) * height / 2  # the first report on top
        ms = [r.phases_ms.get(p, 0.0) for p in names]
        step = f"{which}: {_ms(r.step_time_ms)} ms a step" if which else ""
        ax.barh(at, ms, height=height * 0.9, color="tab:grey" if which == "before" else "tab:orange", label=step)
        texts += [ax.text(v, yy, f" {_ms(v)} ms ({100 * v / r.step_time_ms:.0f}%)" if p in r.phases_ms else " none",
                          va="center", fontsize=8) for p, v, yy in zip(names, ms, at, strict=True)]
    ax.set_yticks(y, names, fontsize=9)
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlim(0, max([v for _, r in reports for v in r.phases_ms.values()] + [1e-3]) * 1.05)
    on = f"on {report.device}"
    ax.set_xlabel(f"ms per step ({on})" if before is not None else
                  f"ms per step (step: {_ms(report.step_time_ms)} ms {on})")
    ax.set_title(wrap_to(title, WIDTH_IN - 2.5, 10), fontsize=10)
    if before is not None:
        legend_below(fig, *ax.get_legend_handles_labels())
    make_room(ax, texts)
    return fig


class LiveRuns:
    """One figure for runs trained side by side (`workbook.train_side_by_side`), updated in place after each
    round: each run's images/s so far (a bar, its name beside it; its ms per generator step where the budget is
    generator steps and the runs read different real images per step, as WGAN-GP's critic does) and, under them,
    D's loss against what each run has trained, each curve in its bar's colour and numbered as its bar."""

    def __init__(self):
        self.handle = None
        self.fig, (self.ax_speed, self.ax_loss) = _figure(2, 1, figsize=(WIDTH_IN, 7))

    def update(self, trainers: dict, done: int, total: int, unit: str = "real images") -> None:
        """Redraw after a round: `done` of `total` trained, counted in `unit` ('real images' or 'generator
        steps', the x-axis of the loss curves too)."""
        from matplotlib.ticker import EngFormatter

        self._draw_speeds(trainers, done, total, unit)
        ax = self.ax_loss
        ax.clear()
        drawn, curves = loss_curves(trainers, unit)
        groups = draw_curves(ax, curves)
        scale = fit_scale(ax, [v for _, _, y in curves for v in y])  # a critic's loss (wgan-gp): another scale
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 200k, 1.2M: no offset text to look for
        ax.set_xlabel(f"{unit} trained")
        numbers = [str(i + 1) for i, _, _ in curves]
        what = [f"D loss{penalty_note([t.history for _, t in drawn], numbers)}{SCALE_NOTE[scale]}: each curve "
                "coloured and numbered as its bar"]
        what += [POINT_NOTE] if curves and min(len(x) for _, x, _ in curves) <= FEW_POINTS else []
        what += [coinciding_note(groups, numbers)] if groups else []
        ax.set_title(wrap_to("; ".join(what), WIDTH_IN - 3, 10), fontsize=10)
        hidden = {k for g in groups for k in g[1:]}  # a group's curves end at one point: one label, "1 = 2"
        ends = {k: " = ".join(numbers[j] for j in g) for g in groups for k in g[:1]}
        label_line_ends(ax, [(x[-1], y[-1]) for k, (_, x, y) in enumerate(curves) if k not in hidden],
                        [ends.get(k, numbers[k]) for k in range(len(curves)) if k not in hidden],
                        [_line_style(i)["color"] for k, (i, _, _) in enumerate(curves) if k not in hidden])
        self.handle = _display(self.fig, self.handle)

    def _size(self, bars_in: float, runs: int) -> None:
        """Fit the figure to the bars (`bars_in` inches high) and the loss curves under them."""
        self.fig.set_size_inches(WIDTH_IN, bars_in + 3.6)
        self.ax_loss.get_gridspec().set_height_ratios([bars_in, 3.6])

    def _draw_speeds(self, trainers: dict, done: int, total: int, unit: str) -> None:
        """Each run's images/s so far (time per generator step where that is the budget and runs read different
        images per step), a bar numbered as its curve; the figure sized to them first (`_size`)."""
        names = list(trainers)
        labels = wrap_names([f"{i + 1}. {name}" for i, name in enumerate(names)])
        bars_in = 0.8 + (0.12 + 0.16 * max(label.count("\n") + 1 for label in labels)) * max(len(names), 3)
        self._size(bars_in, len(names))
        ax = self.ax_speed
        ax.clear()
        y = np.arange(len(names))[::-1]
        # a budget of generator steps for runs that read different real images per step: time per step compares
        per_step = unit == "generator steps" and len({t.cfg.images_per_step for t in trainers.values()}) > 1
        key, what = ("step_time_ms", "ms per generator step") if per_step else ("images_per_sec", "images / s")
        speeds = [trainers[n].history.summary().get(key, 0) for n in names]
        ax.barh(y, speeds, height=0.6, color=[f"C{i % 10}" for i in range(len(names))])
        ax.set_yticks(y, labels, fontsize=8)
        ax.set_ylim(-0.6, len(names) - 0.4)
        log = fit_scale(ax, [v for v in speeds if v > 0], "x") == "log"
        ax.set_xlim(min(v for v in speeds if v > 0) / 1.6 if log else 0, max(speeds + [1]) * 1.05)
        texts = [ax.text(v, yy, f" {v:.0f}", va="center", fontsize=8) for v, yy in zip(speeds, y, strict=True)]
        ax.set_xlabel(f"{what} (median of the chunks after the first)" + (", log scale" if log else ""))
        ax.set_title(f"{done:,} of {total:,} {unit} trained", fontsize=10)
        make_room(ax, texts)


def tune_chart(result, title: str = "tune: every candidate against the start"):
    """The tune path: each step's speed against the start (kept: green; not kept: grey; rejected before measuring:
    a red mark on the axis) and the incumbent's speed-up as a line, stepping up at each change kept, which is named
    beside its point (every step is in the path table, numbered as on the x-axis)."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    kinds = {"kept": dict(color="tab:green", marker="o", s=40), "not kept": dict(color="tab:grey", marker=".", s=30),
             "kept, then backed off for quality": dict(color="tab:grey", marker="s", s=30),
             "rejected before measuring": dict(color="tab:red", marker="x", s=30)}
    fig, ax = _figure(figsize=(WIDTH_IN, 4.4))
    xs = list(range(1, len(result.path) + 1))
    best, incumbent, ratios, kept_points, kept_names = 1.0, [], [], [], []
    for x, step in zip(xs, result.path, strict=True):
        if step.ratio_to_start is None:
            ax.scatter(x, 1.0, zorder=3, **kinds["rejected before measuring"])
        else:
            kept = step.accepted and not step.backed_off
            kind = "kept" if kept else ("kept, then backed off for quality" if step.backed_off else "not kept")
            ax.scatter(x, step.ratio_to_start, zorder=3, **kinds[kind])
            ratios.append(step.ratio_to_start)
            if kept:
                best = step.ratio_to_start
                kept_points.append((x, best))
                # tune_space.describe's form; importing it would close a cycle (tune_space -> bench -> display)
                kept_names.append(wrap(", ".join(f"{k}={v}" for k, v in step.change.items()), 24))
        incumbent.append(best)
    ax.step([0] + xs, [1.0] + incumbent, where="post", color="tab:green", lw=1.5)
    ax.axhline(1.0, color="grey", ls="--", lw=1)
    log = fit_scale(ax, ratios + incumbent + [1.0]) == "log"
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(0, max(xs, default=0) + 1)
    ax.margins(y=0.3)  # room above and below the points for the changes' names
    ax.set_xlabel("step (numbered as in the table)")
    ax.set_ylabel("images/s against the start" + (", log scale" if log else ""))
    ax.set_title(wrap_to(title, WIDTH_IN - 1, 10), fontsize=10)
    handles = [Line2D([], [], ls="", markersize=6 if k != "kept" else 7, color=v["color"], marker=v["marker"])
               for k, v in kinds.items()]
    handles += [Line2D([], [], color="tab:green", lw=1.5), Line2D([], [], color="grey", ls="--", lw=1)]
    legend_below(fig, handles, list(kinds) + ["the incumbent (kept so far)", "the start"])
    place_labels(ax, kept_points, kept_names, fontsize=8)
    return fig


class LiveTune:
    """`tune(..., on_update=LiveTune())`: the path table, what tune is doing and the chart, shown once and updated
    in place (display handles) as tune goes; in a widget panel, pass its Output and Image widgets instead."""

    def __init__(self, table=None, image=None):
        self.table, self.image, self.handles = table, image, None

    def __call__(self, result):
        from IPython.display import Markdown

        text = Markdown(result.markdown() + (f"\n\n*{result.now}*" if result.now and result.now != "done" else
                                             "\n\n" + result.summary().split("final config:")[0]))
        fig = tune_chart(result) if result.path else None
        if self.table is not None:  # widgets (the panel): replace their content
            self.table.outputs = ()
            self.table.append_display_data(text)
            if fig is not None:
                self.image.value = figure_png(fig)
            return
        if self.handles is None:
            self.handles = [_display(text), _display(fig) if fig is not None else None]
            return
        self.handles[0].update(text)
        if fig is not None:
            self.handles[1] = _display(fig, self.handles[1])


def bench_chart(result: dict, path) -> None:
    """Speed bars against the reference (the first row); under them speed against FID when quality was measured,
    the quality target a dashed line (`speed_chart`)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    rows = result["rows"]
    scored = "fid" in rows[0]
    ref = rows[0]["images_per_sec"]
    fig = speed_chart([r["variant"] for r in rows], [r["images_per_sec"] for r in rows],
                      notes=[f"{r['images_per_sec'] / ref:.2f}x" for r in rows],
                      fids=[r.get("fid") for r in rows] if scored else None,
                      fid_line=(QUALITY_TARGET * rows[0]["fid"], f"{QUALITY_TARGET}x the reference's FID (the "
                                                                 "quality target)") if scored else None,
                      title=f"{result['machine']['device_name']}: speed" + (" against quality" if scored else ""),
                      speed_label="images / s; beside each bar: its speed against the reference (the first)",
                      fid_label=f"FID after {rows[0]['images_trained']:,} training images (lower is better)"
                      if scored else "FID")
    fig.savefig(path, dpi=100)
