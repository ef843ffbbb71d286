"""Charts whose question is not images per second: the time per generator step, where the budget is generator steps
and the runs read different numbers of real images per step (07: WGAN-GP's critic reads five batches per step, so
its images/s counts five times the images for the same step), and a step's peak tensor memory, where the question is
memory (08), with the speed each change costs beside it. Linear axes from 0 for ratios, the baseline a dashed line."""
from __future__ import annotations

import numpy as np

from ..measuring.results import megabytes
from .chart_layout import WIDTH_IN, make_room, wrap_names, wrap_to
from .chart_layout import figure as _figure
from .display import _display, comparison_markdown, comparison_rows, speed_chart

STEP_LABEL = "ms per generator step; beside each bar: x the baseline's time"


def step_rows(results: dict, baseline: dict) -> list[dict]:
    """`display.comparison_rows` led by the time per generator step and its ratio to the baseline's, in place of
    the speed-up over images/s (a ratio of real images read per second, which a critic reading several batches
    per step inflates); images/s kept, named for what it counts."""
    rows = []
    for row in comparison_rows(results, baseline):
        ms, per_sec = row.pop("ms/step"), row.pop("images/s")
        row.pop("speed-up")
        rows.append({"run": row.pop("run"), "ms/step": ms,
                     "time per step vs baseline": f"{ms / baseline['step_time_ms']:.2f}x",
                     "real images/s": f"{per_sec:.0f}", **row})
    return rows


def step_chart(results: dict, baseline: dict, title: str = "time per generator step against the baseline"):
    """One bar per run: its ms per generator step, the baseline's a dashed line; under them, when the runs were
    scored, the time per step against FID (left is faster, lower is better)."""
    names = list(results)
    ms = [results[n]["step_time_ms"] for n in names]
    base = baseline["step_time_ms"]
    scored = any("fid" in s for s in results.values())
    fig = speed_chart(names, ms, notes=[f"{v / base:.2f}x" for v in ms], baseline=base,
                      fids=[results[n].get("fid") for n in names] if scored else None,
                      baseline_fid=baseline.get("fid"), title=title, speed_label=STEP_LABEL)
    if scored:
        ax = fig.axes[1]
        ax.set_xlabel("ms per generator step (left is faster)" + (", log scale" if ax.get_xscale() == "log" else ""))
        ax.set_title(ax.get_title().replace("speed against", "time per step against"), fontsize=10)
    return fig


def show_step_comparison(results: dict, baseline: dict, title: str = "time per generator step against the baseline"):
    """A table and `step_chart` for runs trained to the same number of generator steps (name -> summary)."""
    from IPython.display import Markdown

    _display(Markdown(comparison_markdown(step_rows(results, baseline))))
    return _display(step_chart(results, baseline, title))


def _bars(ax, y, values, notes, baseline, reach=None):
    """Horizontal bars from 0, the baseline's value a dashed line, each bar's note beyond its end or beyond its
    `reach` (a whisker's end), whichever is further."""
    reach = reach or values
    ax.barh(y, values, height=0.6, color="tab:blue")
    ax.axvline(baseline, color="grey", ls="--", lw=1)
    ax.set_xlim(0, max(list(reach) + [baseline]) * 1.05)
    make_room(ax, [ax.text(r, yy, f" {note}", va="center", fontsize=8)
                   for r, yy, note in zip(reach, y, notes, strict=True)])


def memory_chart(peaks_mb: dict, baseline: str, speed: dict | None = None,
                 title: str = "a step's peak tensor memory against the baseline"):
    """Peak tensor memory per config (name -> MB), the main chart: bars from 0, the `baseline` config's a dashed
    line, each bar's note its share of the baseline's. Beside it, with `speed` (name -> (speed ratio over the
    baseline, paired range or None)), the speed each config ran at against the baseline: linear bars from 0, a
    dashed line at 1, the paired range as a whisker; a config `speed` lacks is said to be not raced."""
    names, speed = list(peaks_mb), speed or {}
    labels = wrap_names(names)
    n, base = len(names), peaks_mb[baseline]
    row_in = 0.12 + 0.16 * max(label.count("\n") + 1 for label in labels)
    title = wrap_to(title, WIDTH_IN, 11)
    fig, axes = _figure(1, 2 if speed else 1, squeeze=False, sharey=True,
                        figsize=(WIDTH_IN, 1.3 + row_in * max(n, 3) + 0.22 * title.count("\n")),
                        gridspec_kw={"width_ratios": [3, 2] if speed else [1]})
    fig.suptitle(title, fontsize=11)
    y = np.arange(n)[::-1]  # the first config on top
    ax = axes[0][0]
    mb = [peaks_mb[k] for k in names]
    _bars(ax, y, mb, [f"{megabytes(v)}, {v / base:.2f}x" for v in mb], base)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_ylim(-0.6 - max(0.0, (3 - n) / 2), n - 0.4 + max(0.0, (3 - n) / 2))
    ax.set_xlabel(wrap_to(f"peak tensor MB (less is better); dashed: {baseline}", 0.55 * WIDTH_IN, 10))
    if speed:
        _speed_beside(axes[0][1], names, y, speed, baseline)
    return fig


def _speed_beside(ax, names, y, speed, baseline):
    """`memory_chart`'s right panel: each raced config's speed ratio, its paired range a whisker."""
    raced = [(yy, *speed[k]) for k, yy in zip(names, y, strict=True) if k in speed]
    for yy, _, paired in raced:
        if paired is not None:
            ax.plot(list(paired)[:2], [yy, yy], color="black", lw=1)
    _bars(ax, [yy for yy, _, _ in raced], [r for _, r, _ in raced], [f"{r:.2f}x" for _, r, _ in raced], 1.0,
          reach=[max(r, *(p or (r,))) for _, r, p in raced])
    for k, yy in zip(names, y, strict=True):
        if k not in speed:
            ax.text(0.02, yy, "not raced here", va="center", fontsize=8, color="grey",
                    transform=ax.get_yaxis_transform())
    ranged = "; black line: the paired range" if any(p is not None for _, _, p in raced) else ""
    ax.set_xlabel(wrap_to(f"speed against {baseline} (right is faster){ranged}", 0.35 * WIDTH_IN, 10))


def show_memory(peaks_mb: dict, baseline: str, speed: dict | None = None,
                title: str = "a step's peak tensor memory against the baseline"):
    """`memory_chart`, shown."""
    return _display(memory_chart(peaks_mb, baseline, speed, title))


def show_memory_runs(runs, baseline: str, title: str = "a step's peak tensor memory against the baseline"):
    """Runs trained side by side (`runs.train_side_by_side`: name -> Trainer, with `.ratio` and `.paired`): their
    table (`display.comparison_rows`), then `memory_chart`, each run's speed against `baseline`'s beside it."""
    from IPython.display import Markdown

    summaries = {name: t.history.summary() for name, t in runs.items()}
    _display(Markdown(comparison_markdown(comparison_rows(summaries, summaries[baseline]))))
    speed = {name: (runs.ratio(name, baseline), None if name == baseline else runs.paired(name, baseline))
             for name in runs}
    return _display(memory_chart({name: s["peak_mem_mb"] for name, s in summaries.items()}, baseline, speed, title))
