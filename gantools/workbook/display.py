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


def _figure(*args, **kwargs):
    """A figure laid out by constrained layout: titles, labels and legends get room instead of overlapping."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(*args, layout="constrained", **kwargs)
    plt.close(fig)  # we display it ourselves; this stops the inline backend from showing it a second time
    return fig, axes


def _display(obj, handle=None):
    from IPython.display import display

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
            ax.plot(steps, h.column("loss_d"), label="D loss")
            ax.plot(steps, h.column("loss_g"), label="G loss")
            ax.set_ylabel("loss" + SCALE_NOTE[fit_scale(ax, h.column("loss_d") + h.column("loss_g"))], fontsize=9)
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)  # off the curves
            last = h[-1]
            ax.set_title(f"step {last['step']}: {last['images_per_sec']:.0f} img/s", fontsize=10)
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


def figure_png(fig, dpi: int = 80) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


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


def image_grid(images, nrow: int = 8) -> np.ndarray:
    """(N, C, H, W) uint8 or [-1, 1] float images -> one (H, W, 3) uint8 grid."""
    import torch
    from torchvision.utils import make_grid

    x = torch.as_tensor(images)
    x = x.float() / 255 if x.dtype == torch.uint8 else (x.float() + 1) / 2
    return make_grid(x.clamp(0, 1), nrow=nrow).mul(255).round().byte().permute(1, 2, 0).numpy()


def show_images(images, nrow: int = 8, title: str = ""):
    """Show a batch of images (uint8 or [-1, 1]) as one grid."""
    fig, ax = _figure(figsize=(5, 5))
    ax.imshow(image_grid(images, nrow))
    ax.set_title(wrap_to(title, 5, 10), fontsize=10)
    ax.axis("off")
    return _display(fig)


SAMPLES_PER_ROW = 6  # grids in a row at a notebook's width, each still wide enough for its name


def show_samples(grids: dict, title: str = "", per_row: int = 6):
    """Sample grids side by side, e.g. {'fp32': grid, 'bf16': grid}; `per_row` of them in a row (at most
    SAMPLES_PER_ROW: more would leave no room for their names), the row as wide as a notebook, each grid's name
    wrapped to its width."""
    per_row = max(1, min(per_row, SAMPLES_PER_ROW))
    rows, cols = -(-len(grids) // per_row), min(len(grids), per_row)
    panel = min(4.0, WIDTH_IN / cols)
    width = max(panel * cols, 4.5)
    names = wrap_names(grids, width=int(panel * 72 / (0.72 * 9)), lines=3)  # 0.72 em: room for capitals
    name_in = max(name.count("\n") + 1 for name in names) * 0.17 + 0.1
    title = wrap_to(title, width, 11) if title else ""
    fig, axes = _figure(rows, cols, figsize=(width, rows * (panel + name_in) + 0.2 * (title.count("\n") + 1)),
                        squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, name, grid in zip(axes.flat, names, grids.values()):
        ax.imshow(grid)
        ax.set_title(name, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=11)
    return _display(fig)


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


def comparison_chart(rows: list[dict], baseline: dict, title: str = "images per second against the baseline"):
    """Speed bars against the baseline; under them, speed against FID when the runs were scored for quality."""
    scored = any(r.get("FID") is not None for r in rows)
    return speed_chart([r["run"] for r in rows], [r["images/s"] for r in rows],
                       notes=[f"{r['speed-up']:.2f}x" for r in rows], baseline=baseline["images_per_sec"],
                       fids=[r.get("FID") for r in rows] if scored else None, baseline_fid=baseline.get("fid"),
                       title=title, speed_label="images / s; beside each bar: its speed-up on the baseline")


def speed_chart(names: list, speeds: list, *, notes: list | None = None, baseline: float | None = None,
                fids: list | None = None, baseline_fid: float | None = None, fid_line: tuple | None = None,
                title: str = "", speed_label: str = "images / s", fid_label: str = "FID (lower is better)"):
    """One bar per run, its note (e.g. the speed-up) at the bar's end, the baseline's speed a dashed line; under
    them, when `fids` are given, speed against FID, each point numbered as its bar (names would cover each other
    and the points). `fid_line`: (FID, what it is) drawn dashed, e.g. a quality target. Log axes where values
    span decades; at a notebook's width whatever the names."""
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
    log = fit_scale(ax, marks, "x") == "log"
    ax.set_xlim(min(v for v in marks if v > 0) / 1.6 if log else 0, max(marks + [1e-9]) * 1.05)
    if baseline:
        ax.axvline(baseline, color="grey", ls="--", lw=1)
    texts = [ax.text(v, yy, f" {note}", va="center", fontsize=8) for v, yy, note in zip(speeds, y, notes or [])]
    ax.set_xlabel(speed_label + (f"; dashed line: the baseline, {baseline:.0f}" if baseline else "") +
                  ("; log scale" if log else ""))
    make_room(ax, texts)
    if not scored:
        return fig
    ax = axes[1][0]
    points, numbers = [], []
    for i in scored:
        ax.scatter(speeds[i], fids[i], color=f"C{i % 10}", s=30, zorder=3)
        points.append((speeds[i], fids[i]))
        numbers.append(str(i + 1))
    if baseline and baseline_fid is not None:
        ax.scatter(baseline, baseline_fid, color="grey", marker="x", s=40, zorder=3)
        points.append((baseline, baseline_fid))
        numbers.append("baseline")
    if fid_line:
        ax.axhline(fid_line[0], color="grey", ls="--", lw=1)
    xlog = fit_scale(ax, [x for x, _ in points], "x") == "log"
    ylog = fit_scale(ax, [f for _, f in points] + ([fid_line[0]] if fid_line else []), "y") == "log"
    ax.margins(0.15)  # room around the points for their numbers
    ax.set_xlabel("images / s (right is faster)" + (", log scale" if xlog else ""))
    ax.set_ylabel(wrap_to(fid_label + (", log scale" if ylog else ""), quality_in - 0.8, 10), fontsize=10)
    what = "speed against image quality: each point numbered as its bar above"
    ax.set_title(wrap_to(what + (f"; dashed: {fid_line[1]}" if fid_line else ""), WIDTH_IN - 3, 10), fontsize=10)
    place_labels(ax, points, numbers, fontsize=8)
    return fig


def show_comparison(results: dict, baseline: dict, title: str = "images per second against the baseline"):
    """A table and a bar chart of runs (name -> History.summary()) against the baseline summary."""
    from IPython.display import Markdown

    rows = comparison_rows(results, baseline)
    _display(Markdown(comparison_markdown(rows)))
    return _display(comparison_chart(rows, baseline, title))


def _line_style(i: int) -> dict:
    """Run i's colour, and past ten runs another dash, so no two runs look alike."""
    return {"color": f"C{i % 10}", "ls": ("-", "--", ":", "-.")[i // 10 % 4]}


def compare_losses(histories: dict, title: str = "losses"):
    """D's and G's loss curves of several runs side by side (a run the same colour in both, one legend under
    them), e.g. {'fp32': history, 'bf16': history}; log axes where the losses span decades."""
    labels = wrap_names(histories)
    fig, axes = _figure(1, 2, figsize=(WIDTH_IN, 3.6 + legend_height(WIDTH_IN, labels)))
    for i, h in enumerate(histories.values()):
        axes[0].plot(h.column("step"), h.column("loss_d"), **_line_style(i))
        axes[1].plot(h.column("step"), h.column("loss_g"), **_line_style(i))
    for ax, what, column in zip(axes, ("discriminator loss", "generator loss"), ("loss_d", "loss_g")):
        scale = fit_scale(ax, [v for h in histories.values() for v in h.column(column)])
        ax.set_title(wrap_to(what + SCALE_NOTE[scale], WIDTH_IN / 2 - 0.7, 10), fontsize=10)
        ax.set_xlabel("step")
    fig.suptitle(wrap_to(title, WIDTH_IN, 11), fontsize=11)
    legend_below(fig, axes[0].get_lines(), labels)
    return _display(fig)


def plot_column(histories: dict, column: str, title: str = "", x: str = "step"):
    """One logged column (e.g. 'penalty') of several runs on shared axes, e.g. {'fp32': history, 'bf16': history};
    a log axis where the values span decades."""
    labels = wrap_names(histories)
    fig, ax = _figure(figsize=(WIDTH_IN, 3.4 + legend_height(WIDTH_IN, labels)))
    for i, h in enumerate(histories.values()):
        ax.plot(h.column(x), h.column(column), **_line_style(i))
    scale = fit_scale(ax, [v for h in histories.values() for v in h.column(column)])
    ax.set_xlabel(x)
    ax.set_ylabel(column + SCALE_NOTE[scale])
    ax.set_title(wrap_to(title or column, WIDTH_IN - 1, 10), fontsize=10)
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
        texts += [ax.text(v, yy, f" {_ms(v)} ms ({100 * v / r.step_time_ms:.0f}%)", va="center", fontsize=8)
                  for p, v, yy in zip(names, ms, at) if p in r.phases_ms]
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
    round: each run's images/s so far (a bar, its name beside it) and, under them, D's loss against the real images
    each run has trained, each curve in its bar's colour and numbered as its bar in the right margin."""

    def __init__(self):
        self.handle = None
        self.fig, (self.ax_speed, self.ax_loss) = _figure(2, 1, figsize=(WIDTH_IN, 7))

    def update(self, trainers: dict, done: int, total: int, unit: str = "real images") -> None:
        """Redraw after a round: `done` of `total` trained, counted in `unit` ('real images' or 'generator
        steps', the x-axis of the loss curves too)."""
        from matplotlib.ticker import EngFormatter

        names = list(trainers)
        labels = wrap_names([f"{i + 1}. {name}" for i, name in enumerate(names)])
        bars_in = 0.8 + (0.12 + 0.16 * max(label.count("\n") + 1 for label in labels)) * max(len(names), 3)
        self.fig.set_size_inches(WIDTH_IN, bars_in + 3.6)
        self.ax_loss.get_gridspec().set_height_ratios([bars_in, 3.6])
        ax = self.ax_speed
        ax.clear()
        y = np.arange(len(names))[::-1]
        speeds = [trainers[n].history.summary().get("images_per_sec", 0) for n in names]
        ax.barh(y, speeds, height=0.6, color=[f"C{i % 10}" for i in range(len(names))])
        ax.set_yticks(y, labels, fontsize=8)
        ax.set_ylim(-0.6, len(names) - 0.4)
        log = fit_scale(ax, [v for v in speeds if v > 0], "x") == "log"
        ax.set_xlim(min(v for v in speeds if v > 0) / 1.6 if log else 0, max(speeds + [1]) * 1.05)
        texts = [ax.text(v, yy, f" {v:.0f}", va="center", fontsize=8) for v, yy in zip(speeds, y)]
        ax.set_xlabel("images / s (median of the chunks after the first)" + (", log scale" if log else ""))
        ax.set_title(f"{done:,} of {total:,} {unit} trained", fontsize=10)
        make_room(ax, texts)
        ax = self.ax_loss
        ax.clear()
        ends, numbers, colors, losses = [], [], [], []
        for i, t in enumerate(trainers.values()):
            h = t.history
            if len(h):
                x = h.column("step") if unit == "generator steps" else [s * t.cfg.images_per_step
                                                                        for s in h.column("step")]
                ax.plot(x, h.column("loss_d"), **_line_style(i))
                ends.append((x[-1], h[-1]["loss_d"]))
                numbers.append(str(i + 1))
                colors.append(_line_style(i)["color"])
                losses += h.column("loss_d")
        scale = fit_scale(ax, losses)  # a critic's loss (wgan-gp) lives on another scale than BCE's
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 200k, 1.2M: no offset text to look for
        ax.set_xlabel(f"{unit} trained")
        ax.set_title(wrap_to("D loss (penalty included)" + SCALE_NOTE[scale] + ": each curve coloured and "
                             "numbered as its bar", WIDTH_IN - 3, 10), fontsize=10)
        label_line_ends(ax, ends, numbers, colors)
        self.handle = _display(self.fig, self.handle)


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
    for x, step in zip(xs, result.path):
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
