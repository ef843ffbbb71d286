"""Sample grids a reader can see: images of a batch in one grid, and several runs' grids laid out in rows, each
grid at least GRID_LEAST_PX pixels a side at the figure's dpi (more grids make more rows, never smaller grids)."""
from __future__ import annotations

import math

import numpy as np

from .chart_layout import WIDTH_IN, figure, wrap_names, wrap_to

GRID_LEAST_PX = 200   # a grid of 8 x 8 small images narrower than this shows shapes, not samples
SAMPLES_PER_ROW = 6   # the most grids in a row, whatever the width: each still wide enough for its name


def image_grid(images, nrow: int = 8) -> np.ndarray:
    """(N, C, H, W) uint8 or [-1, 1] float images -> one (H, W, 3) uint8 grid."""
    import torch
    from torchvision.utils import make_grid

    x = torch.as_tensor(images)
    x = x.float() / 255 if x.dtype == torch.uint8 else (x.float() + 1) / 2
    return make_grid(x.clamp(0, 1), nrow=nrow).mul(255).round().byte().permute(1, 2, 0).numpy()


def grid_layout(n: int, per_row: int = SAMPLES_PER_ROW, width_in: float = WIDTH_IN,
                dpi: float | None = None) -> tuple[int, int, float]:
    """Rows, columns and each grid's width in inches for `n` grids across `width_in`: at most `per_row` (and
    SAMPLES_PER_ROW) a row, and as few a row as keep each grid GRID_LEAST_PX wide at `dpi` (the figure default
    when None); the rows balanced (six grids that fit four a row: two rows of three)."""
    import matplotlib

    dpi = dpi or matplotlib.rcParams["figure.dpi"]
    fit = max(1, int(width_in * dpi // GRID_LEAST_PX))
    most = max(1, min(per_row, SAMPLES_PER_ROW, fit, n))
    rows = math.ceil(n / most)
    cols = math.ceil(n / rows)
    return rows, cols, min(4.0, width_in / cols)


def samples_figure(grids: dict, title: str = "", per_row: int = SAMPLES_PER_ROW):
    """`display.show_samples`' figure, not displayed: the grids in rows (`grid_layout`), each under its name."""
    rows, cols, panel = grid_layout(len(grids), per_row)
    width = max(panel * cols, 4.5)
    names = wrap_names(grids, width=int(panel * 72 / (0.72 * 9)), lines=3)  # 0.72 em: room for capitals
    name_in = max(name.count("\n") + 1 for name in names) * 0.17 + 0.1
    title = wrap_to(title, width, 11) if title else ""
    fig, axes = figure(rows, cols, figsize=(width, rows * (panel + name_in) + 0.2 * (title.count("\n") + 1)),
                       squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, name, grid in zip(axes.flat, names, grids.values(), strict=False):
        ax.imshow(grid)
        ax.set_title(name, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig
