"""Notebook output that updates in place: one figure per run, redrawn through a display handle (never by clearing
the cell), throttled so drawing stays a small, measured fraction of training time."""
from __future__ import annotations

import time

import numpy as np


def _figure(*args, **kwargs):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(*args, **kwargs)
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
        self.fig, (self.ax_loss, self.ax_img) = _figure(1, 2, figsize=(10, 3.8),
                                                        gridspec_kw={"width_ratios": [1.5, 1]})
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
            ax.legend(loc="upper right")
            last = h[-1]
            ax.set_title(f"{self.title}  step {last['step']}: {last['images_per_sec']:.0f} img/s", fontsize=10)
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
    ax.set_title(title, fontsize=10)
    ax.axis("off")
    return _display(fig)


def show_samples(grids: dict, title: str = "", per_row: int = 6):
    """Sample grids side by side, e.g. {'fp32': grid, 'bf16': grid}; `per_row` of them in a row."""
    rows, cols = -(-len(grids) // per_row), min(len(grids), per_row)
    fig, axes = _figure(rows, cols, figsize=(4 * cols, 4.2 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, (name, grid) in zip(axes.flat, grids.items()):
        ax.imshow(grid)
        ax.set_title(name, fontsize=10)
    fig.suptitle(title)
    return _display(fig)


def comparison_rows(results: dict, baseline: dict) -> list[dict]:
    """One row per run: speed, speed-up over the baseline, time waiting for data, peak memory, final losses, and
    image quality (FID, classes covered, images trained) for runs scored by metrics.QualityCallback."""
    rows = []
    scored = any("fid" in s for s in results.values())  # quality columns only when some run was scored
    for name, s in results.items():
        row = {"run": name, "images/s": s["images_per_sec"],
               "speed-up": s["images_per_sec"] / baseline["images_per_sec"],
               "ms/step": s["step_time_ms"], "data wait ms": s["data_wait_ms"],
               "peak MB": s["peak_mem_mb"], "loss D": s["loss_d"], "loss G": s["loss_g"]}
        if scored:
            same_budget = s.get("images_trained") == baseline.get("images_trained")  # else the ratio misleads
            row.update({"FID": s.get("fid"), "FID vs baseline": s["fid"] / baseline["fid"]
                        if "fid" in s and "fid" in baseline and same_budget else None,
                        "classes": s.get("classes_covered"), "images trained": s.get("images_trained")})
        rows.append(row)
    return rows


FORMATS = {"images/s": "{:.0f}", "speed-up": "{:.2f}x", "ms/step": "{:.1f}", "data wait ms": "{:.2f}",
           "peak MB": "{:.0f}", "loss D": "{:.3f}", "loss G": "{:.3f}", "FID": "{:.1f}", "FID vs baseline": "{:.2f}x"}


def markdown_table(head: list, rows: list[list]) -> str:
    """A Markdown table: the one way gantools draws one (cells already formatted)."""
    lines = ["| " + " | ".join(map(str, head)) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(map(str, cells)) + " |" for cells in rows]
    return "\n".join(lines)


def comparison_markdown(rows: list[dict]) -> str:
    head = list(dict.fromkeys(k for r in rows for k in r))
    return markdown_table(head, [["n/a" if r.get(k) is None else FORMATS.get(k, "{}").format(r[k]) for k in head]
                                 for r in rows])


def comparison_chart(rows: list[dict], baseline: dict, title: str = "images per second against the baseline"):
    """Speed bars against the baseline; beside them, speed against FID when the runs were scored for quality."""
    scored = [r for r in rows if r.get("FID") is not None]
    fig, axes = _figure(1, 2 if scored else 1, figsize=(12 if scored else 7, 0.8 + 0.45 * max(len(rows), 6)),
                        squeeze=False)
    ax = axes[0][0]
    bars = ax.barh([r["run"] for r in rows][::-1], [r["images/s"] for r in rows][::-1], color="tab:blue")
    ax.axvline(baseline["images_per_sec"], color="grey", ls="--", label="baseline")
    for bar, r in zip(bars, rows[::-1]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {r['speed-up']:.2f}x", va="center")
    ax.set_xlim(0, max(r["images/s"] for r in rows) * 1.2)
    ax.set_xlabel("images / s")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right")
    if scored:
        ax = axes[0][1]
        for i, r in enumerate(scored):
            ax.scatter(r["images/s"], r["FID"], color=f"C{i}")
            ax.annotate(f" {r['run']}", (r["images/s"], r["FID"]), fontsize=8)
        if "fid" in baseline:
            ax.scatter(baseline["images_per_sec"], baseline["fid"], color="grey", marker="x", label="baseline")
            ax.legend(loc="upper right")
        ax.set_xlabel("images / s (right is faster)")
        ax.set_ylabel("FID (lower is better)")
        ax.set_title("speed against image quality", fontsize=10)
    fig.tight_layout()
    return fig


def show_comparison(results: dict, baseline: dict, title: str = "images per second against the baseline"):
    """A table and a bar chart of runs (name -> History.summary()) against the baseline summary."""
    from IPython.display import Markdown

    rows = comparison_rows(results, baseline)
    _display(Markdown(comparison_markdown(rows)))
    return _display(comparison_chart(rows, baseline, title))


def compare_losses(histories: dict, title: str = "losses"):
    """Loss curves of several runs on shared axes (D solid, G dashed), e.g. {'fp32': history, 'bf16': history}."""
    fig, axes = _figure(1, 2, figsize=(11, 3.5))
    for i, (name, h) in enumerate(histories.items()):
        color = f"C{i}"
        axes[0].plot(h.column("step"), h.column("loss_d"), color=color, label=f"{name}")
        axes[1].plot(h.column("step"), h.column("loss_g"), color=color, ls="--", label=f"{name}")
    for ax, what in zip(axes, ("discriminator loss", "generator loss")):
        ax.set_title(f"{title}: {what}", fontsize=10)
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return _display(fig)


def plot_column(histories: dict, column: str, title: str = "", x: str = "step"):
    """One logged column (e.g. 'penalty') of several runs on shared axes, e.g. {'fp32': history, 'bf16': history}."""
    fig, ax = _figure(figsize=(7, 3.2))
    for i, (name, h) in enumerate(histories.items()):
        ax.plot(h.column(x), h.column(column), color=f"C{i}", label=name)
    ax.set_xlabel(x)
    ax.set_title(title or column, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _display(fig)


def plot_phases(report, title: str = "where one training step's time goes"):
    """Horizontal bar chart of a ProfileReport's per-phase milliseconds."""
    fig, ax = _figure(figsize=(7, 3))
    names = list(report.phases_ms)[::-1]
    ms = [report.phases_ms[n] for n in names]
    ax.barh(names, ms, color="tab:orange")
    for y, v in enumerate(ms):
        ax.text(v, y, f" {v:.1f} ms ({100 * v / report.step_time_ms:.0f}%)", va="center", fontsize=8)
    ax.set_xlabel(f"ms per step (step: {report.step_time_ms:.1f} ms on {report.device})")
    ax.set_title(title, fontsize=10)
    ax.set_xlim(0, max(ms) * 1.35 if ms else 1)
    fig.tight_layout()
    return _display(fig)


class LiveRuns:
    """One figure for runs trained side by side (`workbook.train_side_by_side`), updated in place after each
    round: D's loss against the real images each run has trained, and each run's images/s so far."""

    def __init__(self):
        self.handle = None
        self.fig, (self.ax_loss, self.ax_speed) = _figure(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [1.4, 1]})

    def update(self, trainers: dict, done: int, total: int) -> None:
        ax = self.ax_loss
        ax.clear()
        for i, (name, t) in enumerate(trainers.items()):
            h = t.history
            if len(h):
                per_step = t.cfg.images_per_step
                ax.plot([s * per_step for s in h.column("step")], h.column("loss_d"), color=f"C{i % 10}", label=name)
        ax.set_xlabel("real images trained")
        ax.set_yscale("symlog")  # a critic's loss (wgan-gp) lives on another scale than BCE's
        ax.set_title(f"D loss (penalty included): {done:,} of {total:,} images", fontsize=10)
        ax.legend(fontsize=7, loc="upper right")
        ax = self.ax_speed
        ax.clear()
        names = list(trainers)[::-1]
        speeds = [trainers[n].history.summary().get("images_per_sec", 0) for n in names]
        ax.barh(names, speeds, color="tab:blue")
        for y, v in enumerate(speeds):
            ax.text(v, y, f" {v:.0f}", va="center", fontsize=8)
        ax.set_xlim(0, max(speeds + [1]) * 1.2)
        ax.set_xlabel("images / s (median of the chunks after the first)")
        ax.tick_params(axis="y", labelsize=8)
        self.fig.tight_layout()
        self.handle = _display(self.fig, self.handle)


def tune_chart(result, title: str = "tune: every candidate against the start"):
    """The tune path: each step's speed against the start (kept: green; not kept: grey; rejected before measuring:
    a red mark on the axis) and the incumbent's speed-up as a line, stepping up at each change kept."""
    fig, ax = _figure(figsize=(9, 3.6))
    xs = list(range(1, len(result.path) + 1))
    best, incumbent = 1.0, []
    for x, step in zip(xs, result.path):
        if step.ratio_to_start is None:
            ax.scatter(x, 1.0, marker="x", color="tab:red", zorder=3)
        else:
            kept = step.accepted and not step.backed_off
            ax.scatter(x, step.ratio_to_start, color="tab:green" if kept else "tab:grey", zorder=3,
                       marker="o" if kept else ("s" if step.backed_off else "."), s=40 if kept else 30)
            best = step.ratio_to_start if kept else best
        incumbent.append(best)
        ax.annotate(" " + ", ".join(f"{k}={v}" for k, v in list(step.change.items())[:2]), (x, incumbent[-1]),
                    fontsize=7, rotation=35, xytext=(0, 6), textcoords="offset points")
    ax.step([0] + xs, [1.0] + incumbent, where="post", color="tab:green", lw=1.5, label="the incumbent (kept so far)")
    ax.axhline(1.0, color="grey", ls="--", lw=1, label="the start")
    ax.set_xlabel("step")
    ax.set_ylabel("images/s against the start")
    ax.set_xlim(0, max(xs, default=0) + 1.5)
    ax.set_ylim(min([0.8] + [s.ratio_to_start for s in result.path if s.ratio_to_start]) * 0.95,
                max([1.2] + incumbent + [s.ratio_to_start for s in result.path if s.ratio_to_start]) * 1.25)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
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
