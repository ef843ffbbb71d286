"""Small multiples: one small panel per run, all on one scale, each drawn over the start in grey. Eight loss curves on
one axes cross each other at every point and no reader can follow one; a panel per run shows each against the same
reference. `LivePanels` is `LiveRuns`' figure for many runs (`train_side_by_side(..., plot=LivePanels())`);
`loss_panels` draws D's and G's losses of finished runs, a row per run."""
from __future__ import annotations

import math

from .chart_layout import SCALE_NOTE, WIDTH_IN, fit_scale, wrap_to
from .chart_notes import FEW_POINTS, POINT_NOTE, line_style, loss_curves, penalty_note, point_style
from .display import LiveRuns, _display

COLUMNS = 3        # panels across a notebook's width: each stays wide enough to read its curve
PANEL_IN = 2.2     # a panel's height, its title included: at least 1.2 in of plot
START_GREY = "0.8"  # the reference curve behind every panel: lighter than any run's colour (C7 is 0.5)


def _figure(height_in: float):
    import matplotlib.pyplot as plt

    fig = plt.figure(layout="constrained", figsize=(WIDTH_IN, height_in))
    plt.close(fig)  # displayed by the caller, once
    return fig


def draw_panels(axes, curves, names, reference, width_in: float, fontsize: float = 8) -> str:
    """Curve k, (i, x, y) in run i's style, in `axes[k]` under `names[k]`, over `reference` ((x, y): the start) in
    grey wherever the curve is not the reference itself; one y scale for all (the axes share it). Returns the
    scale's note (', log scale' or '')."""
    for ax, (i, x, y), name in zip(axes, curves, names, strict=True):
        if y is not reference[1]:
            ax.plot(*reference, color=START_GREY, lw=1.5, zorder=1)
        ax.plot(x, y, **line_style(i), **point_style(len(x)))
        ax.set_title(wrap_to(name, width_in, fontsize), fontsize=fontsize, color=line_style(i)["color"])
        ax.tick_params(labelsize=fontsize - 1)
    return SCALE_NOTE[fit_scale(axes[0], [v for _, _, y in curves for v in y] + list(reference[1]))]


class LivePanels(LiveRuns):
    """`LiveRuns` for many runs: the same speed bars, and under them each run's D loss in a panel of its own, the
    first run's in grey behind it, all on one scale, so every curve can be followed and set against the start."""

    def __init__(self, columns: int = COLUMNS):
        self.handle, self.columns, self.panels = None, columns, []
        self.fig = _figure(7)
        self.spec = self.fig.add_gridspec(2, 1)
        self.ax_speed = self.fig.add_subplot(self.spec[0])

    def _size(self, bars_in: float, runs: int) -> None:
        panels_in = math.ceil(runs / self.columns) * PANEL_IN
        self.fig.set_size_inches(WIDTH_IN, bars_in + panels_in + 0.8)
        self.spec.set_height_ratios([bars_in, panels_in])

    def _panels(self, n: int) -> list:
        """n axes under the bars in rows of `columns`, sharing x and y; last round's removed."""
        for ax in self.panels:
            ax.remove()
        grid = self.spec[1].subgridspec(math.ceil(n / self.columns), self.columns)
        self.panels = []
        for k in range(n):
            first = self.panels[0] if self.panels else None
            self.panels.append(self.fig.add_subplot(grid[k // self.columns, k % self.columns], sharex=first,
                                                    sharey=first))
        return self.panels

    def update(self, trainers: dict, done: int, total: int, unit: str = "real images") -> None:
        """Redraw after a round, as `LiveRuns.update`."""
        from matplotlib.ticker import EngFormatter

        drawn, curves = loss_curves(trainers, unit)
        axes = self._panels(len(curves))
        if curves:
            every = list(trainers)
            scale = draw_panels(axes, curves, [f"{i + 1}. {every[i]}" for i, _, _ in curves], curves[0][1:],
                                WIDTH_IN / self.columns - 0.6)
            axes[0].xaxis.set_major_formatter(EngFormatter(sep=""))
            what = [f"Under the bars: each run's D loss{penalty_note([t.history for _, t in drawn])}{scale} in a "
                    f"panel of its own, coloured and numbered as its bar, over run {curves[0][0] + 1}'s in grey; "
                    "one scale"]
            what += [POINT_NOTE] if min(len(x) for _, x, _ in curves) <= FEW_POINTS else []
            self.fig.suptitle(wrap_to("; ".join(what), WIDTH_IN - 0.3, 10), fontsize=10)
            self.fig.supxlabel(f"{unit} trained", fontsize=9)
        self._draw_speeds(trainers, done, total, unit)  # last: the bars' labels get room in the final layout
        self.handle = _display(self.fig, self.handle)


def loss_panels(histories: dict, start: str, title: str = "losses against the start", x: str = "step"):
    """A row per run other than `start` (name -> History): its D loss on the left, its G loss on the right, each
    over `start`'s in grey; each column on one scale, so the rows compare. Displayed; returns the figure."""
    others = [name for name in histories if name != start] or [start]
    index = {name: i for i, name in enumerate(histories)}
    fig = _figure(0.9 + 1.8 * len(others))
    axes = fig.subplots(len(others), 2, squeeze=False, sharex=True)
    for column, (what, short) in enumerate((("loss_d", "D"), ("loss_g", "G"))):
        col = [row[column] for row in axes]
        for ax in col[1:]:
            ax.sharey(col[0])
        curves = [(index[name], histories[name].column(x), histories[name].column(what)) for name in others]
        scale = draw_panels(col, curves, [f"{index[n] + 1}. {n}: {short} loss" for n in others],
                            (histories[start].column(x), histories[start].column(what)), WIDTH_IN / 2 - 0.7, 9)
        for ax in col:
            ax.set_ylabel(f"{short} loss{scale}", fontsize=8)
    few = min((len(h) for h in histories.values()), default=0) <= FEW_POINTS
    for ax in axes[-1]:
        ax.set_xlabel(wrap_to(x + (f"; {POINT_NOTE}" if few else ""), WIDTH_IN / 2 - 0.7, 9), fontsize=9)
    head = f"{title}; grey in every panel: {index[start] + 1}. {start}" + penalty_note(list(histories.values()))
    fig.suptitle(wrap_to(head, WIDTH_IN, 11), fontsize=11)
    _display(fig)
    return fig
