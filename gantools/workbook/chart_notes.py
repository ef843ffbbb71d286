"""What a chart says about what it draws, so a reader is not misled at a glance: a loss's title names a penalty only
where a run has one, curves with few points show their points and say what each is, curves that lie on one another
are named as such, and a range of values no wider than noise is not stretched to the full height of the axes."""
from __future__ import annotations

import numpy as np

FEW_POINTS = 30         # a curve of at most this many points shows them: a reader sees how sparse it is
QUALITY_LEAST_SPAN = 0.1  # the least y-range of a quality axis, as a share of its middle value
EQUAL = 0.05            # values closer than this print alike at one decimal: "equal" on a chart


def penalty_note(histories, numbers=None) -> str:
    """What D's loss holds beyond the loss itself: ' (penalty included)' when every run logged a penalty, ' (penalty
    included in runs 2, 4)' when some did (`numbers`: each run's number on the chart; without them, ' (penalty
    included where a run has one)'), '' when none did."""
    has = [any(r.get("penalty", 0) for r in h.records) for h in histories]
    if not any(has):
        return ""
    if all(has):
        return " (penalty included)"
    if numbers is None:
        return " (penalty included where a run has one)"
    which = [str(n) for n, h in zip(numbers, has, strict=True) if h]
    return f" (penalty included in run{'s' if len(which) > 1 else ''} {', '.join(which)})"


def point_style(n_points: int) -> dict:
    """Markers on a curve of few points, so it is not read as a smooth record of every step."""
    return {"marker": "o", "ms": 3} if n_points <= FEW_POINTS else {}


POINT_NOTE = "each point: the mean over the steps since the one before"


def line_style(i: int) -> dict:
    """Run i's colour, and past ten runs another dash, so no two runs look alike."""
    return {"color": f"C{i % 10}", "ls": ("-", "--", ":", "-.")[i // 10 % 4]}


def draw_curves(ax, curves) -> list[list[int]]:
    """Plot (i, x, y) curves in run i's style (`line_style`), their points marked where few (`point_style`);
    where some lie on one another, dashed in turns (`show_coinciding`). Returns their groups (`coinciding`),
    as positions in `curves`, for a note."""
    lines = [ax.plot(x, y, **line_style(i), **point_style(len(x)))[0] for i, x, y in curves]
    groups = coinciding([(x, y) for _, x, y in curves])
    show_coinciding(lines, groups)
    return groups


def loss_curves(trainers: dict, unit: str) -> tuple[list, list]:
    """The runs that have logged, as (i, trainer), and their D-loss curves, (i, x, y) against `unit` trained."""
    drawn = [(i, t) for i, t in enumerate(trainers.values()) if len(t.history)]
    return drawn, [(i, t.history.column("step") if unit == "generator steps" else
                    [s * t.cfg.images_per_step for s in t.history.column("step")], t.history.column("loss_d"))
                   for i, t in drawn]


def coinciding(curves) -> list[list[int]]:
    """Groups of two or more curves ((x, y) each) with the same points: drawn, one hides the others."""
    groups, placed = [], set()
    arrays = [np.asarray(list(zip(*c, strict=True)), float) if len(c[0]) else np.zeros((0, 2)) for c in curves]
    for i, a in enumerate(arrays):
        if i in placed or not len(a):
            continue
        same = [j for j in range(i + 1, len(arrays)) if j not in placed and arrays[j].shape == a.shape
                and np.allclose(arrays[j], a, rtol=1e-6, atol=1e-9, equal_nan=True)]
        if same:
            groups.append([i] + same)
            placed.update(same)
    return groups


def show_coinciding(lines, groups) -> None:
    """Dash the later curves of each group in turns, so every colour of a group shows along the one path."""
    for group in groups:
        m = len(group)
        for k, i in enumerate(group[1:]):
            lines[i].set_linestyle((4 * k, (4, 4 * (m - 1))))


def coinciding_note(groups, names) -> str:
    """'identical: A and B; C and D' for the groups of `coinciding`, named by `names` (each run's name or number)."""
    if not groups:
        return ""
    parts = [", ".join(str(names[i]) for i in g[:-1]) + " and " + str(names[g[-1]]) for g in groups]
    return "identical curves (the same numbers), drawn dashed in turns: " + "; ".join(parts)


def quality_range(ax, values, spread=None, what: str = "FID", keep=()) -> str:
    """Set a linear quality axis's range to at least QUALITY_LEAST_SPAN of its middle value, or the second seed's
    `spread` (a width, or a (low, high) range) where given, so a difference of noise's size looks small; `keep`:
    values that must stay in view (a target line, a band's edges). Returns a note for the chart when all values
    are equal, or all lie within that span; else ''."""
    v = np.asarray([x for x in values if x is not None], float)
    if not len(v) or ax.get_yscale() != "linear":
        return ""
    lo, hi = float(v.min()), float(v.max())
    width = None if spread is None else float(spread[1] - spread[0]) if np.ndim(spread) else float(spread)
    least = width if width else QUALITY_LEAST_SPAN * abs((lo + hi) / 2)
    if hi - lo >= least:
        return ""
    middle, half = (lo + hi) / 2, max(least, hi - lo) / 2 * 1.3
    bottom, top = min([middle - half, *keep]), max([middle + half, *keep])
    pad = 0.05 * (top - bottom) if keep else 0.0
    ax.set_ylim(bottom - pad * (bottom < middle - half), top + pad * (top > middle + half))
    if hi - lo < EQUAL:
        return f"all {what}s equal ({lo:,.1f}): no quality difference to show"
    if width:
        return f"all {what}s within the second seed's spread ({width:,.1f}): no quality difference measured"
    return (f"all {what}s within {hi - lo:,.1f} of each other, drawn on a range of at least "
            f"{QUALITY_LEAST_SPAN:.0%} of {what}; no second seed to judge the difference by")
