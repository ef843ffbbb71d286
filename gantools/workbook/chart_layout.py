"""What keeps a chart readable at a notebook's width with long run names, many runs and values spanning decades:
names wrapped (their middle left out when too long, so names alike but for their ends stay apart), axes scaled to
the data with ticks a reader can read, value labels given room, and point labels placed where they cover nothing."""
from __future__ import annotations

import math
import textwrap

import numpy as np

WIDTH_IN = 9.5    # a notebook cell's width at the default dpi: a wider figure is scaled down, its text with it
LOG_SPAN = 30     # values spanning more than this ratio get a log axis: on a linear one the small ones vanish
NAME_WIDTH = 26   # characters per line of a run's name beside a bar or in a legend
SCALE_NOTE = {"linear": "", "log": ", log scale", "symlog": ", symlog scale"}  # symmetric log: linear near 0
CHAR_EM = 0.62    # a character's mean width in em (DejaVu Sans, a little over): for wrapping to a width in inches


def wrap(text: str, width: int, lines: int | None = 2) -> str:
    """`text` on at most `lines` lines of about `width` characters. What does not fit loses its middle (an
    ellipsis): names alike but for their ends ('..., bf16', '..., fp32') stay apart."""
    out = textwrap.wrap(text, width, break_on_hyphens=False) or [""]
    if lines is None or len(out) <= lines:
        return "\n".join(out)
    budget = width * lines - 2
    while budget > 3:
        keep = budget - 1
        short = text[:(keep + 1) // 2].rstrip() + "…" + text[len(text) - keep // 2:].lstrip()
        out = textwrap.wrap(short, width, break_on_hyphens=False)
        if len(out) <= lines:
            return "\n".join(out)
        budget -= 2
    return text[:width - 1] + "…"


def wrap_names(names, width: int = NAME_WIDTH, lines: int = 2) -> list[str]:
    """Each name wrapped (`wrap`); any that would read alike after shortening are given whole."""
    short = [wrap(str(n), width, lines) for n in names]
    return [s if short.count(s) == 1 else wrap(str(n), width, None) for s, n in zip(short, names, strict=True)]


def wrap_to(text: str, width_in: float, fontsize: float) -> str:
    """`text` wrapped to fit `width_in` inches at `fontsize` points (a title, a label)."""
    return wrap(text, max(8, int(width_in * 72 / (CHAR_EM * fontsize))), lines=None)


def _tick_subs(decades: float, room: int) -> tuple:
    """Which multiples of each power of ten to label: as many as `room` ticks allow."""
    for subs in ((1.0, 2.0, 5.0), (1.0, 3.0)):
        if decades * len(subs) <= room:
            return subs
    return (1.0,)


def plain_number(x, _pos=None) -> str:
    """A tick as a plain number: thousands separated (5,000; 1,000,000), fractions as decimals (0.002), three
    significant digits at most, never an exponent: every tick of an axis in one format."""
    text = np.format_float_positional(float(x), precision=3, unique=True, fractional=False, trim="-")
    whole, dot, frac = text.partition(".")
    sign, digits = ("-", whole[1:]) if whole.startswith("-") else ("", whole)
    return sign + f"{int(digits):,}" + dot + frac


def fit_scale(ax, values, axis: str = "y", room: int = 7) -> str:
    """Scale `axis` to the data: log where positive values span more than LOG_SPAN, symmetric log (linear near
    zero) where values of both signs span decades (a critic's loss beside BCE's), else linear. Ticks are plain
    numbers (`plain_number`) at 1, 2, 5 (or 1, 3, or 1) times powers of ten, as many as `room` allows. Returns the
    scale."""
    from matplotlib import ticker

    v = np.asarray([x for x in values if x is not None], float)
    v = v[np.isfinite(v)]
    nonzero = np.abs(v[v != 0])
    target = ax.yaxis if axis == "y" else ax.xaxis
    set_scale = ax.set_yscale if axis == "y" else ax.set_xscale
    if not len(nonzero):
        return "linear"
    big, small = nonzero.max(), float(np.quantile(nonzero, 0.1))
    if v.min() > 0 and big / v.min() > LOG_SPAN:
        set_scale("log")
        decades = math.log10(big / v.min())
        target.set_major_locator(ticker.LogLocator(base=10, subs=_tick_subs(decades, room), numticks=room + 2))
    elif v.min() <= 0 and big / small > LOG_SPAN:
        linthresh = max(10 ** math.floor(math.log10(small)), big * 1e-4)
        set_scale("symlog", linthresh=linthresh)
        neg, pos = abs(min(v.min(), 0)), max(v.max(), 0)
        decades = sum(math.log10(s / linthresh) for s in (neg, pos) if s > linthresh) + 1  # + the linear part
        target.set_major_locator(ticker.SymmetricalLogLocator(base=10, linthresh=linthresh,
                                                              subs=_tick_subs(decades, room)))
    else:
        return "linear"
    target.set_major_formatter(ticker.FuncFormatter(plain_number))
    target.set_minor_formatter(ticker.NullFormatter())
    return target.get_scale()


def figure(*args, **kwargs):
    """A figure laid out by constrained layout: titles, labels and legends get room instead of overlapping."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(*args, layout="constrained", **kwargs)
    plt.close(fig)  # displayed by the caller; this stops the inline backend from showing it a second time
    return fig, axes


def renderer(fig):
    """The figure laid out (constrained layout run, limits settled) and the renderer that measured it."""
    fig.draw_without_rendering()
    return fig._get_renderer()  # what draw_without_rendering drew with, on any canvas (matplotlib >= 3.6)


def make_room(ax, labels) -> None:
    """Widen the x-axis until each label at a bar's end (left-aligned text at the bar's value) fits inside it;
    2% to spare, for the ticks the wider axis gets."""
    if not labels:
        return
    r = renderer(ax.figure)
    scale = ax.xaxis.get_transform()  # data -> the axis's linear space (log10 on a log axis)
    width = ax.bbox.width
    lo, hi = scale.transform(list(ax.get_xlim()))
    need = hi
    for t in labels:
        w = t.get_window_extent(r).width + 4
        at = scale.transform([t.get_position()[0]])[0]
        if w < width:
            need = max(need, lo + (at - lo) * width / (width - w))
    if need > hi:
        ax.set_xlim(ax.get_xlim()[0], scale.inverted().transform([lo + (need - lo) * 1.02])[0])


def _points_px(ax, step_px: float = 4.0) -> np.ndarray:
    """Every scatter point of `ax`, and its lines traced every few pixels, in display coordinates."""
    out = [np.zeros((0, 2))]
    for coll in ax.collections:
        offsets = np.asarray(coll.get_offsets(), float)
        if coll.get_visible() and len(offsets):
            out.append(coll.get_offset_transform().transform(offsets))
    for line in ax.get_lines():
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), float))
        xy = xy[np.isfinite(xy).all(axis=1)]
        for a, b in zip(xy[:-1], xy[1:], strict=False):
            n = int(np.hypot(*(b - a)) // step_px) + 1
            out.append(a + np.linspace(0, 1, n + 1)[:, None] * (b - a))
        out.append(xy)
    return np.concatenate(out)


def _hits(box, points, margin: float) -> int:
    x0, y0, x1, y1 = box
    return int(((points[:, 0] > x0 - margin) & (points[:, 0] < x1 + margin) &
                (points[:, 1] > y0 - margin) & (points[:, 1] < y1 + margin)).sum())


def _overlaps(box, boxes) -> int:
    return sum(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in boxes)


def _segment(point, box, step_px: float = 3.0) -> np.ndarray:
    """Points along the line from `point` to the centre of `box`, to where it enters the box."""
    a, b = np.asarray(point, float), np.array([(box[0] + box[2]) / 2, (box[1] + box[3]) / 2])
    line = a + np.linspace(0, 1, int(np.hypot(*(b - a)) // step_px) + 2)[:, None] * (b - a)
    outside = ~((line[:, 0] > box[0]) & (line[:, 0] < box[2]) & (line[:, 1] > box[1]) & (line[:, 1] < box[3]))
    return line[outside]


def _crossed(boxes, point, box) -> int:
    """How many of `boxes` a leader line from `point` to `box` would cross."""
    line = _segment(point, box)
    return sum(_hits(b, line, 0) > 0 for b in boxes)


def _nearest_free(point, w, h, inner, obstacles, placed, step: float = 6.0, margin: float = 3.0):
    """The free spot for a w x h label nearest to `point` on a grid over `inner`, as `place_labels` takes it."""
    xs = np.arange(inner.x0 + w / 2, inner.x1 - w / 2, step)
    ys = np.arange(inner.y0 + h / 2, inner.y1 - h / 2, step)
    if not len(xs) or not len(ys):
        return None
    gx, gy = (a.ravel() for a in np.meshgrid(xs, ys))
    free = np.ones(len(gx), bool)
    for px, py in obstacles:  # a point hits every centre within half the label (and a margin) of it
        free &= ~((np.abs(gx - px) < w / 2 + margin) & (np.abs(gy - py) < h / 2 + margin))
    for b in placed:
        free &= ~((np.abs(gx - (b[0] + b[2]) / 2) < w / 2 + (b[2] - b[0]) / 2) &
                  (np.abs(gy - (b[1] + b[3]) / 2) < h / 2 + (b[3] - b[1]) / 2))
    if not free.any():
        return None
    i = np.argmin(np.where(free, np.hypot(gx - point[0], gy - point[1]), np.inf))
    dx, dy = gx[i] - point[0], gy[i] - point[1]
    return (0, dx, dy, np.hypot(dx, dy), (gx[i] - w / 2, gy[i] - h / 2, gx[i] + w / 2, gy[i] + h / 2))


def _marker_reach(ax) -> float:
    """Pixels from a scatter point's centre to the edge of the largest marker on `ax`: no label comes closer."""
    sizes = [float(np.max(c.get_sizes())) for c in ax.collections if len(c.get_sizes()) and len(c.get_offsets())]
    return math.sqrt(max(sizes, default=0.0)) / 2 * ax.figure.dpi / 72


def _around(point, w, h, reach, inner, obstacles, placed, leaders):
    """The best spot for a w x h label of those `place_labels` tries around `point`, nearest first, each costed
    by what it covers: (cost, dx, dy, dist, box), the first free one (cost 0) where there is one; None where none
    fits inside `inner`."""
    cx, cy = point
    best = None
    for dist in (5, 10, 18, 28, 42, 60, 85, 115, 150):
        for deg in (0, 180, 90, 270, 30, 150, 330, 210, 60, 120, 300, 240, 15, 165, 345, 195):
            c, s = math.cos(math.radians(deg)), math.sin(math.radians(deg))
            dx, dy = c * (reach + dist + w / 2), s * (reach + dist + h / 2)
            box = (cx + dx - w / 2, cy + dy - h / 2, cx + dx + w / 2, cy + dy + h / 2)
            if box[0] < inner.x0 or box[2] > inner.x1 or box[1] < inner.y0 or box[3] > inner.y1:
                continue
            cost = (_hits(box, obstacles, 3 + reach) + 10 * _overlaps(box, placed) + _hits(box, leaders, 1) +
                    (10 * _crossed(placed, (cx, cy), box) if dist > 10 else 0))
            if best is None or cost < best[0]:
                best = (cost, dx, dy, dist, box)
            if cost == 0:
                break
        if best is not None and best[0] == 0:
            break
    return best


def place_labels(ax, points, labels, fontsize: float = 8, **text_kw) -> list:
    """Label each point (data coordinates) where its label covers no point, line or other label and stays inside
    the axes, clear of the markers' edges: the nearest free spot of those tried around it, joined to it by a thin
    line when it had to move away. Call it last: it reads the figure's final layout."""
    fig = ax.figure
    r = renderer(fig)
    obstacles = _points_px(ax)
    reach = _marker_reach(ax)
    inner = ax.bbox.padded(-2)
    to_pt = 72 / fig.dpi
    placed, texts, leaders = [], [], np.zeros((0, 2))  # leaders: points along the lines to moved labels
    for (x, y), label in zip(points, labels, strict=True):
        cx, cy = ax.transData.transform((x, y))
        probe = ax.annotate(label, (x, y), fontsize=fontsize, ha="center", va="center", **text_kw)
        extent = probe.get_window_extent(r)
        w, h = extent.width, extent.height
        probe.remove()
        best = _around((cx, cy), w, h, reach, inner, obstacles, placed, leaders)
        if best is None or best[0] > 0:  # crowded around the point: the nearest free spot anywhere in the axes
            best = _nearest_free((cx, cy), w, h, inner, obstacles, placed, margin=3 + reach) or best
        if best is None:  # no room inside the axes at all (a tiny plot): beside the point
            gap = reach + 5
            best = (0, w / 2 + gap, 0, 5, (cx + gap, cy - h / 2, cx + w + gap, cy + h / 2))
        _, dx, dy, dist, box = best
        if dist > 10:
            leaders = np.concatenate([leaders, _segment((cx, cy), box)])
        arrow = dict(arrowstyle="-", color="0.55", lw=0.6, shrinkA=0, shrinkB=4) if dist > 10 else None
        t = ax.annotate(label, (x, y), xytext=(dx * to_pt, dy * to_pt), textcoords="offset points",
                        fontsize=fontsize, ha="center", va="center", arrowprops=arrow, annotation_clip=False,
                        **text_kw)
        t.set_in_layout(False)  # placed for this layout: it must not move it
        placed.append(box)
        texts.append(t)
    return texts


def label_line_ends(ax, ends, labels, colors, fontsize: float = 8) -> list:
    """Label lines in the axes' right margin, each label at its line's last value where it can be, moved up or
    down just enough that no two overlap, joined to the line's end by a thin line in its colour. Call it last."""
    from matplotlib.patches import ConnectionPatch

    if not ends:
        return []
    texts = [ax.text(1.02, 0.5, label, transform=ax.transAxes, fontsize=fontsize, color=color, va="center")
             for label, color in zip(labels, colors, strict=True)]
    r = renderer(ax.figure)  # the layout, with room made for the labels' width
    height = ax.bbox.height
    gap = max(t.get_window_extent(r).height for t in texts) * 1.15 / height  # axes fraction
    wanted = [float(np.clip(ax.transAxes.inverted().transform(ax.transData.transform(end))[1], 0, 1))
              for end in ends]
    order = sorted(range(len(ends)), key=lambda i: wanted[i])
    at = [0.0] * len(ends)
    low = gap / 2
    for i in order:  # upwards: each no lower than it wants nor than the one below allows
        at[i] = low = max(wanted[i], low)
        low += gap
    high = 1 - gap / 2
    for i in reversed(order):  # then down from the top where they ran over it
        at[i] = high = min(at[i], high)
        high -= gap
    for t, y, end, color in zip(texts, at, ends, colors, strict=True):
        t.set_position((1.02, y))
        leader = ConnectionPatch(end, (1.02, y), coordsA=ax.transData, coordsB=ax.transAxes, color=color, lw=0.5,
                                 alpha=0.6, shrinkB=1)
        leader.set_in_layout(False)  # it crosses the plot: the layout must not make room for it
        ax.add_artist(leader)
    return texts


def _legend_columns(width_in: float, labels, fontsize: float) -> int:
    widest = max((max(len(line) for line in str(lab).split("\n")) for lab in labels), default=1)
    entry_in = widest * CHAR_EM * fontsize / 72 + 0.7  # its text, the handle and the gap
    return max(1, min(len(labels), int(width_in // entry_in)))


def legend_height(width_in: float, labels, fontsize: float = 8) -> float:
    """Inches a `legend_below` of these labels takes at the bottom of a figure `width_in` wide."""
    if not labels:
        return 0.0
    ncols = _legend_columns(width_in, labels, fontsize)
    lines = max(str(lab).count("\n") + 1 for lab in labels)
    return 0.15 + math.ceil(len(labels) / ncols) * (lines * 1.25 * fontsize + 0.5 * fontsize) / 72


def legend_below(fig, handles, labels, fontsize: float = 8):
    """One legend under the whole figure (constrained layout makes room), in as many columns as fit across."""
    ncols = _legend_columns(fig.get_size_inches()[0], labels, fontsize)
    return fig.legend(handles, labels, loc="outside lower center", ncols=ncols, fontsize=fontsize, frameon=False)
