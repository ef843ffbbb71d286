"""Every chart gantools draws, drawn with hard inputs (ten runs with long names, values spanning decades, one run)
at a notebook's width: no two texts overlap, none leaves the figure, no legend or label hides the data, and the
axes fit the data."""
import math
from types import SimpleNamespace

import matplotlib
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.text import Text

import gantools.workbook.display as gd
from gantools.core.history import History
from gantools.tuning.result import Step

matplotlib.use("Agg")

NOTEBOOK_WIDTH_IN = 10.0  # wider figures are scaled down by the notebook, their text with them
SMALLEST_FONT_PT = 7

# ~40 characters, several alike but for their ends (shortening must keep them apart)
NAMES = ["WGAN-GP, 5 D steps, lazy R1 every 16, bf16", "WGAN-GP, 5 D steps, lazy R1 every 16, fp32",
         "BCE (baseline), device loader, batch 128", "BCE (baseline), device loader, batch 256",
         "LSGAN with EMA 0.999 and spectral norm", "R1 every step, gamma 10, channels_last",
         "conditional DCGAN, 10 classes, bf16 amp", "hinge loss, TTUR lr_d=4e-4, lr_g=1e-4",
         "torch.compile max-autotune, CUDA graphs", "torch.compile max-autotune, no CUDA graphs"]


# ---------------------------------------------------------------------------------------------------------- checks
def _boxes(fig, monkeypatch):
    """Draw the figure and return every text it drew (visible, non-empty) with its window extent."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    drawn, draw = [], Text.draw

    def recording_draw(self, renderer):
        if self.get_visible() and self.get_text().strip():
            drawn.append(self)
        return draw(self, renderer)

    monkeypatch.setattr(Text, "draw", recording_draw)
    canvas.draw()
    monkeypatch.setattr(Text, "draw", draw)
    renderer = canvas.get_renderer()
    # Text's own extent: an annotation's would add its leader line's bounding box
    return [(t, Text.get_window_extent(t, renderer)) for t in dict.fromkeys(drawn)], renderer


def _shrunk(box, px=1.0):
    return (box.x0 + px, box.y0 + px, box.x1 - px, box.y1 - px)


def _overlap(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _inside(box, point):
    return box[0] < point[0] < box[2] and box[1] < point[1] < box[3]


def _data_points(fig):
    """Display coordinates of every line vertex and scatter point on the figure's axes."""
    points = []
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_visible():
                points.append(line.get_transform().transform(np.asarray(line.get_xydata(), float)))
        for coll in ax.collections:
            if isinstance(coll, PathCollection) and coll.get_visible() and len(coll.get_offsets()):
                points.append(coll.get_offset_transform().transform(np.asarray(coll.get_offsets(), float)))
    return np.concatenate(points) if points else np.zeros((0, 2))


def assert_readable(fig, monkeypatch):
    """What a reader needs from any chart: nothing overlaps, nothing is cut off, nothing hides the data."""
    texts, renderer = _boxes(fig, monkeypatch)
    assert texts, "nothing drawn"
    problems = []
    width = fig.get_size_inches()[0]
    if width > NOTEBOOK_WIDTH_IN:
        problems.append(f"{width:.1f} in wide: the notebook would shrink it and its text")
    frame = fig.bbox
    for t, box in texts:
        if t.get_fontsize() < SMALLEST_FONT_PT:
            problems.append(f"{t.get_text()!r} is set in {t.get_fontsize():.1f} pt")
        b = _shrunk(box)
        if b[0] < frame.x0 or b[1] < frame.y0 or b[2] > frame.x1 or b[3] > frame.y1:
            problems.append(f"{t.get_text()!r} is cut off: {np.round(box.bounds)} outside the figure "
                            f"{np.round(frame.bounds)}")
    for i, (t, a) in enumerate(texts):
        for u, b in texts[i + 1:]:
            if _overlap(_shrunk(a), _shrunk(b)):
                problems.append(f"{t.get_text()!r} overlaps {u.get_text()!r}")
    problems += _hiding_data(fig, texts, renderer)
    problems += _squeezed(fig)
    assert not problems, f"{len(problems)} problems:\n  " + "\n  ".join(problems[:25])
    return texts


def _hiding_data(fig, texts, renderer) -> list:
    """`assert_readable`'s problems of texts and legends that sit on data points (a label inside the plot must
    not), apart so each check reads on its own."""
    problems = []
    points = _data_points(fig)
    for t, box in texts:  # a label inside the plot must not sit on a data point
        b = _shrunk(box, 2)
        hidden = [p for p in points if _inside(b, p)]
        if hidden:
            problems.append(f"{t.get_text()!r} hides {len(hidden)} data points")
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)
    for legend in legends:
        b = _shrunk(legend.get_window_extent(renderer), 2)
        hidden = [p for p in points if _inside(b, p)]
        if hidden:
            problems.append(f"a legend ({len(legend.get_texts())} entries) hides {len(hidden)} data points")
    return problems


def _squeezed(fig) -> list:
    """`assert_readable`'s problems of axes that long names squeezed into a sliver."""
    problems = []
    for ax in fig.axes:  # long names must not squeeze the plot itself into a sliver
        if ax.axison and (ax.get_lines() or ax.patches or ax.collections):
            w, h = ax.bbox.width / fig.dpi, ax.bbox.height / fig.dpi
            if w < 2.5 or h < 1.2:
                problems.append(f"the axes {ax.get_title()!r} are squeezed to {w:.1f} x {h:.1f} in")
    return problems


@pytest.fixture
def shown(monkeypatch):
    """The figures the display functions would send to the notebook."""
    figures = []

    def fake_display(obj, handle=None):
        if isinstance(obj, Figure):
            figures.append(obj)
        return handle or SimpleNamespace(update=lambda obj: None)

    monkeypatch.setattr(gd, "_display", fake_display)
    return figures


def _texts_of(fig, monkeypatch):
    return [t.get_text() for t, _ in _boxes(fig, monkeypatch)[0]]


# ---------------------------------------------------------------------------------------------------------- inputs
def _history(i, n_records=40, kind="bce", seed=0):
    """A run's history; `kind` sets the losses: 'bce' (0.3..3), 'mixed' (a critic's -50..+3 beside BCE) or
    'decades' (1e-3..1e2)."""
    rng = np.random.default_rng(seed + i)
    steps = np.arange(1, n_records + 1) * 50
    t = np.linspace(0, 1, n_records)
    if kind == "mixed" and i % 3 == 0:  # a WGAN critic
        loss_d, loss_g = -50 * (1 - np.exp(-4 * t)) + rng.normal(0, 2, n_records), 3 - 6 * t
    elif kind == "decades":
        loss_d = 10 ** (2 - 5 * t) * (1 + 0.1 * i)
        loss_g = 10 ** (-3 + 5 * t) / (1 + 0.1 * i)
    else:
        loss_d, loss_g = 0.3 + 1.2 * np.exp(-3 * t) + 0.05 * i, 3 - 2 * t + rng.normal(0, 0.1, n_records)
    penalty = 10 ** (-3 + 5 * (i % 5) / 4) * (1 + 0.5 * t)  # R1's tiny penalties beside WGAN-GP's large ones
    speed = 50 * 10 ** (2 * i / 9)  # 50 .. 5000 images/s
    return History([{"step": int(s), "loss_d": float(d), "loss_g": float(g), "d_real": 0.5, "d_fake": 0.5,
                     "penalty": float(p), "images_per_sec": speed * (1 + 0.01 * k), "step_time_ms": 1e5 / speed,
                     "data_wait_ms": 0.1, "peak_mem_mb": 100.0 + i, "train_time_s": 0.1 * k}
                    for k, (s, d, g, p) in enumerate(zip(steps, loss_d, loss_g, penalty, strict=True))])


def _histories(n, kind="bce"):
    return {name: _history(i, kind=kind) for i, name in enumerate(NAMES[:n])}


def _summaries(n, fid=True):
    """Run summaries: speeds 50..5000 images/s, FIDs 20..1400 with one outlier and two runs all but equal."""
    fids = [35.0, 36.0, 20.0, 80.0, 150.0, 1357.0, 45.0, 35.5, 60.0, 400.0]
    out = {}
    for i, name in enumerate(NAMES[:n]):
        s = {**_history(i).summary(), "images_trained": 12800, "classes_covered": 9}
        if i in (0, 7):  # two runs at nearly the same speed and FID: their labels must still not collide
            s["images_per_sec"] = 400.0 + i
        if fid:
            s.update(fid=fids[i], kid=0.01)
        out[name] = s
    return out


def _baseline(fid=True):
    return {**_history(0).summary(), "images_per_sec": 300.0, "images_trained": 12800,
            **({"fid": 40.0} if fid else {})}


def _report(scale=1.0, device="cuda (NVIDIA H100 80GB HBM3)"):
    phases = {"data wait": 0.02, "G forward": 4.1, "D forward": 3.2, "D penalty": 12.5, "D backward": 8.4,
              "D optimizer step": 0.6, "D forward (G step)": 3.1, "D backward (G step)": 6.2, "G backward": 80.0,
              "G optimizer step": 0.5, "EMA update": 0.3, "host sync": 0.05}
    phases = {k: v * scale for k, v in phases.items()}
    return SimpleNamespace(phases_ms=phases, step_time_ms=sum(phases.values()) * 1.05, device=device)


def _tune_result(n, all_kept=False):
    changes = [{"precision": "bf16", "loss": "bce"}, {"loader": "device", "transform": "on-device"},
               {"compile": "max-autotune"}, {"channels_last": True}, {"batch_size": 256, "lr_d": 0.0004},
               {"optimizer_impl": "fused"}, {"sync_every_step": False}, {"num_workers": 4},
               {"compile": "reduce-overhead", "cuda_graphs": True}, {"ema_decay": 0.999},
               {"batch_size": 512}, {"grad_accum_steps": 2}, {"precision": "fp16"}, {"d_steps": 2},
               {"r1_interval": 16}]
    path, best = [], 1.0
    for i, change in enumerate(changes[:n]):
        if i % 5 == 3:  # rejected before measuring
            path.append(Step(change, "profile", False, "refused"))
            continue
        kept = all_kept or i % 3 == 0
        ratio = best * (1.6 if kept and not all_kept else 1.15 if kept else 0.9)
        path.append(Step(change, "profile", kept, "faster" if kept else "slower", ratio_to_start=ratio,
                         backed_off=(i == 6 and not all_kept)))
        best = ratio if kept else best
    return SimpleNamespace(path=path)


def _bench_result(n, fid=True):
    rows = [{"variant": name, "images_per_sec": 50 * 10 ** (2 * i / 9), "images_trained": 12800,
             **({"fid": [35.0, 36.0, 20.0, 80.0, 150.0, 1357.0, 45.0, 35.5, 60.0, 400.0][i]} if fid else {})}
            for i, name in enumerate(NAMES[:n])]
    return {"rows": rows, "machine": {"device_name": "NVIDIA H100 80GB HBM3"}}


# ---------------------------------------------------------------------------------------------------------- charts
@pytest.mark.parametrize("n", [1, 10])
@pytest.mark.parametrize("scored", [True, False])
def test_comparison_chart_is_readable(n, scored, monkeypatch):
    results, base = _summaries(n, fid=scored), _baseline(fid=scored)
    fig = gd.comparison_chart(gd.comparison_rows(results, base), base, "every run of this session against the "
                                                                        "baseline, same real images")
    assert_readable(fig, monkeypatch)
    if scored and n == 10:
        quality = [ax for ax in fig.axes if "FID" in ax.get_ylabel()]
        assert quality and quality[0].get_yscale() == "log", "FIDs from 20 to 1357 need a log axis"
    if n == 10:
        speed = [ax for ax in fig.axes if "images / s" in ax.get_xlabel() and ax.patches]
        assert speed[0].get_xscale() == "log", "speeds from 50 to 5000 images/s need a log axis"


def test_show_comparison_draws_its_chart_readably(shown, monkeypatch):
    gd.show_comparison(_summaries(10), _baseline(), "images per second against BCE (bf16), same real images")
    assert len(shown) == 1
    assert_readable(shown[0], monkeypatch)


@pytest.mark.parametrize("kind", ["bce", "mixed", "decades"])
@pytest.mark.parametrize("n", [1, 10])
def test_compare_losses_is_readable(kind, n, shown, monkeypatch):
    gd.compare_losses(_histories(n, kind), "optimizer")
    fig = shown[0]
    texts = assert_readable(fig, monkeypatch)
    if n == 10:
        labels = [t.get_text() for t, _ in texts]
        assert len({label for label in labels if label.replace("\n", " ").startswith("WGAN-GP")}) >= 2, \
            "names alike but for their ends stay apart"
    plots = [ax for ax in fig.axes if ax.get_lines()]
    if kind == "decades":
        assert all(ax.get_yscale() == "log" for ax in plots), "losses from 1e-3 to 1e2 need a log axis"
    if kind == "mixed" and n == 10:
        ax = plots[0]
        assert ax.get_yscale() == "symlog"
        ticks = [t for t in ax.get_yticklabels() if t.get_text() and ax.get_ylim()[0] <= t.get_position()[1]
                 <= ax.get_ylim()[1]]
        assert len(ticks) >= 5, f"a -50..+3 axis needs more than {[t.get_text() for t in ticks]}"
    if kind == "bce":
        assert all(ax.get_yscale() == "linear" for ax in plots)


@pytest.mark.parametrize("n", [1, 10])
def test_plot_column_is_readable(n, shown, monkeypatch):
    gd.plot_column(_histories(n), "penalty", "the penalty's share of D's loss (mean per D step)")
    assert_readable(shown[0], monkeypatch)
    if n == 10:
        assert shown[0].axes[0].get_yscale() == "log", "penalties from 1e-3 to 1e2 need a log axis"


def test_plot_phases_is_readable(shown, monkeypatch):
    gd.plot_phases(_report(), "reference loop: ms per step in each phase")
    assert_readable(shown[0], monkeypatch)


def test_two_profiles_compared_share_one_scale(shown, monkeypatch):
    before, after = _report(), _report(scale=0.1)
    gd.plot_phases(after, "after the fix: ms per step in each phase", before=before)
    fig = shown[0]
    assert_readable(fig, monkeypatch)
    plots = [ax for ax in fig.axes if ax.patches]
    assert len(plots) == 1 and plots[0].get_xlim()[1] >= max(before.phases_ms.values())
    widths = sorted(p.get_width() for p in plots[0].patches)
    assert widths[-1] == pytest.approx(80.0) and pytest.approx(8.0) in widths  # both reports' bars, one axis


def test_a_phase_gone_after_the_fix_keeps_its_row_marked_none(shown, monkeypatch):
    """A fix that removes a phase (no host syncs left): the after chart keeps the before chart's rows, that one
    marked "none", so the two are read row by row on one scale."""
    before, after = _report(), _report(scale=0.5)
    del after.phases_ms["host sync"]
    gd.plot_phases(after, "after the fix", before=before)
    fig = shown[0]
    assert_readable(fig, monkeypatch)
    ax = next(ax for ax in fig.axes if ax.patches)
    assert [t.get_text() for t in ax.get_yticklabels()] == list(before.phases_ms)
    assert [t.get_text() for t in ax.texts].count(" none") == 1


@pytest.mark.parametrize("n", [1, 10])
@pytest.mark.parametrize("kind", ["bce", "mixed"])
@pytest.mark.parametrize("unit", ["real images", "generator steps"])
def test_live_runs_figure_is_readable(n, kind, unit, monkeypatch):
    trainers = {name: SimpleNamespace(history=h, cfg=SimpleNamespace(images_per_step=128 * (1 + i % 5)))
                for i, (name, h) in enumerate(_histories(n, kind).items())}
    live = gd.LiveRuns()
    monkeypatch.setattr(gd, "_display", lambda obj, handle=None: handle or SimpleNamespace(update=lambda obj: None))
    live.update(trainers, 640_000, 1_280_000, unit)
    live.update(trainers, 1_280_000, 1_280_000, unit)  # redrawn in place: nothing doubles
    texts = assert_readable(live.fig, monkeypatch)
    assert live.ax_loss.get_xlabel() == f"{unit} trained"
    if n == 10:
        labels = [t.get_text() for t, _ in texts]
        assert len([t for t in labels if "1,280,000" in t]) == 1, "one title, not two"


@pytest.mark.parametrize("n, all_kept", [(1, False), (15, False), (15, True)])
def test_tune_chart_is_readable(n, all_kept, monkeypatch):
    fig = gd.tune_chart(_tune_result(n, all_kept))
    texts = [t.get_text().replace("\n", " ") for t, _ in assert_readable(fig, monkeypatch)]
    kept = [s for s in _tune_result(n, all_kept).path if s.accepted and not s.backed_off and s.ratio_to_start]
    assert all(any(k in t for t in texts) for s in kept for k in s.change), "each change kept is named"


@pytest.mark.parametrize("long_title", [False, True])
def test_live_plot_figure_is_readable(long_title, shown, monkeypatch):
    plot = gd.LivePlot(NAMES[0] + " on the all-together preset" if long_title else "reference",
                       min_interval_s=0.0)
    trainer = SimpleNamespace(history=_history(0, kind="decades"))
    plot.on_fit_start(trainer)
    plot.on_sample(trainer, 2000, np.zeros((274, 274, 3), np.uint8))
    plot.on_fit_end(trainer)
    assert_readable(plot.fig, monkeypatch)


def test_show_images_is_readable(shown, monkeypatch):
    gd.show_images(np.zeros((16, 1, 32, 32), np.uint8), title="glyphs: the first 64 training images, " * 3)
    assert_readable(shown[0], monkeypatch)


@pytest.mark.parametrize("n, per_row", [(1, 6), (9, 5), (2, 6), (10, 10)])
def test_show_samples_is_readable(n, per_row, shown, monkeypatch):
    grids = {name: np.zeros((274, 274, 3), np.uint8) for name in NAMES[:n]}
    gd.show_samples(grids, "the same fixed noise after the same number of real images", per_row=per_row)
    texts = assert_readable(shown[0], monkeypatch)
    shown_names = " ".join(t.get_text().replace("\n", " ") for t, _ in texts)
    assert all(name.split(",")[0] in shown_names for name in NAMES[:n])


@pytest.mark.parametrize("n", [1, 10])
@pytest.mark.parametrize("fid", [True, False])
def test_bench_chart_is_readable(n, fid, tmp_path, monkeypatch):
    saved, savefig = [], Figure.savefig

    def keep(fig, *args, **kwargs):
        saved.append(fig)
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    gd.bench_chart(_bench_result(n, fid), tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"
    monkeypatch.setattr(Figure, "savefig", savefig)
    assert_readable(saved[0], monkeypatch)
    if fid and n == 10:
        assert [ax for ax in saved[0].axes if ax.collections][0].get_yscale() == "log"


def test_the_checks_catch_overlap_clipping_and_hidden_data(monkeypatch):
    """The checks above can fail: a figure with each fault is refused."""
    fig = Figure(figsize=(6, 3))
    ax = fig.add_subplot()
    ax.plot(range(10), range(10), label="a line")
    ax.set_title("a title")
    ax.text(0.5, 1.0, "text on the title", transform=ax.transAxes, ha="center", va="bottom")
    with pytest.raises(AssertionError, match="overlaps"):
        assert_readable(fig, monkeypatch)
    fig = Figure(figsize=(6, 3))
    fig.add_subplot().text(1.1, 0.5, "far to the right, cut off", transform=fig.axes[0].transAxes)
    with pytest.raises(AssertionError, match="cut off"):
        assert_readable(fig, monkeypatch)
    fig = Figure(figsize=(6, 3))
    ax = fig.add_subplot()
    ax.scatter(np.linspace(0, 1, 50), np.linspace(0, 1, 50))
    ax.text(0.5, 0.5, "on the points", ha="center")
    with pytest.raises(AssertionError, match="hides"):
        assert_readable(fig, monkeypatch)
    fig = Figure(figsize=(6, 3))
    ax = fig.add_subplot()
    ax.set_xticks(np.arange(40), [f"label {i}" for i in range(40)])
    ax.plot(range(40), range(40))
    with pytest.raises(AssertionError, match="overlaps"):  # one axis's tick labels over each other
        assert_readable(fig, monkeypatch)
    assert math.isclose(fig.get_size_inches()[0], 6)


# ---------------------------------------------------------------------------------------------- what is drawn is said
def _without_penalty(h, keep=False):
    return History([{**r, "penalty": r["penalty"] if keep else 0.0} for r in h.records])


def _trainers(histories):
    return {name: SimpleNamespace(history=h, cfg=SimpleNamespace(images_per_step=128))
            for name, h in histories.items()}


def _live_runs(histories):
    """LiveRuns after its last round (its figure sent to `shown`, which the test must request)."""
    live = gd.LiveRuns()
    live.update(_trainers(histories), 8 * 6400, 8 * 6400)
    return live


@pytest.mark.parametrize("with_penalty, said", [((), "D loss:"), ((1,), "D loss (penalty included in run 2)"),
                                                ((0, 1, 2), "D loss (penalty included)")])
def test_the_loss_panel_names_a_penalty_only_where_a_run_has_one(with_penalty, said, shown):
    histories = {name: _without_penalty(_history(i, 8), keep=i in with_penalty) for i, name in enumerate(NAMES[:3])}
    title = _live_runs(histories).ax_loss.get_title().replace("\n", " ")
    assert title.startswith(said)
    assert ("penalty" in title) == bool(with_penalty)


def test_sparse_curves_show_every_record_and_say_what_a_point_is(shown, monkeypatch):
    histories = {name: _history(i, 8) for i, name in enumerate(NAMES[:3])}
    live = _live_runs(histories)
    lines = live.ax_loss.get_lines()
    assert [len(line.get_xdata()) for line in lines] == [8, 8, 8], "every logged record drawn"
    assert all(line.get_marker() not in ("None", "", None) for line in lines), "few points: each one shown"
    assert "each point: the mean over the steps since the one before" in live.ax_loss.get_title().replace("\n", " ")
    gd.compare_losses(histories, "losses")
    plots = [ax for ax in shown[-1].axes if ax.get_lines()]
    assert all(line.get_marker() not in ("None", "") and len(line.get_xdata()) == 8
               for ax in plots for line in ax.get_lines())
    assert all("each point" in ax.get_xlabel().replace("\n", " ") for ax in plots)


def test_identical_curves_are_named_not_hidden(shown, monkeypatch):
    same = _history(0, 8)
    histories = {NAMES[0]: same, NAMES[2]: _history(2, 8), NAMES[4]: History(list(same.records))}
    live = _live_runs(histories)
    title = live.ax_loss.get_title().replace("\n", " ")
    assert "identical curves" in title and "1 and 3" in title
    texts = _texts_of(live.fig, monkeypatch)
    assert "1 = 3" in texts and "1" not in texts and "3" not in texts, "one label where the curves end together"
    lines = live.ax_loss.get_lines()
    assert lines[0].get_linestyle() == "-" and lines[2].get_linestyle() != "-", "the later curve dashed over"
    assert lines[1].get_linestyle() == "-", "a curve of its own is drawn as always"
    gd.compare_losses(histories, "losses")
    suptitle = shown[-1]._suptitle.get_text().replace("\n", " ")
    assert "identical curves" in suptitle and "LSGAN" in suptitle and NAMES[0][:7] in suptitle
    assert "BCE" not in suptitle


def _quality_axes(fig):
    return next(ax for ax in fig.axes if "FID" in ax.get_ylabel())


def _scores(fids, baseline_fid):
    results = {name: {**_history(i).summary(), "images_per_sec": 300.0 + 60 * i, "images_trained": 12800,
                      "classes_covered": 9, "fid": f} for i, (name, f) in enumerate(zip(NAMES, fids, strict=False))}
    return results, {**_history(0).summary(), "images_per_sec": 250.0, "images_trained": 12800, "fid": baseline_fid}


@pytest.mark.parametrize("baseline_is_a_run", [False, True])
def test_point_labels_stand_clear_of_every_marker(baseline_is_a_run, monkeypatch):
    results, base = _scores([53.3, 54.6, 80.0], 60.0)
    if baseline_is_a_run:
        base = results[NAMES[0]]
    fig = gd.comparison_chart(gd.comparison_rows(results, base), base)
    texts, renderer = _boxes(fig, monkeypatch)
    ax = _quality_axes(fig)
    markers = [(xy, np.sqrt(size) / 2 * fig.dpi / 72) for coll in ax.collections if isinstance(coll, PathCollection)
               for xy, size in zip(coll.get_offset_transform().transform(coll.get_offsets()),
                                   np.broadcast_to(coll.get_sizes(), len(coll.get_offsets())), strict=True)]
    labels = [(t, box) for t, box in texts if t.axes is ax and t is not ax.title]
    assert any("baseline" in t.get_text() for t, _ in labels)
    for t, box in labels:
        for (x, y), radius in markers:
            gap = np.hypot(max(box.x0 - x, 0, x - box.x1), max(box.y0 - y, 0, y - box.y1)) - radius
            assert gap >= 2, f"{t.get_text()!r} is {gap:.1f} px from a marker's edge"


def test_a_noise_sized_fid_range_is_not_stretched_to_full_height(monkeypatch):
    results, base = _scores([53.3, 54.6], 53.3)
    fig = gd.comparison_chart(gd.comparison_rows(results, base), base)
    ax = _quality_axes(fig)
    low, high = ax.get_ylim()
    assert high - low >= 0.1 * 54, f"a 1.3-point difference drawn on {high - low:.1f} points of height"
    assert "within 1.3 of each other" in ax.get_title().replace("\n", " ")
    spread = _quality_axes(gd.comparison_chart(gd.comparison_rows(results, base), base, fid_spread=11.1))
    assert spread.get_ylim()[1] - spread.get_ylim()[0] >= 2 * 11.1, "the seed band in view"
    assert "within the second seed's spread (11.1)" in spread.get_title().replace("\n", " ")
    wide, _ = _scores([40.0, 80.0], 40.0)
    assert "within" not in _quality_axes(gd.comparison_chart(gd.comparison_rows(wide, base), base)).get_title()


def test_equal_fids_are_said_to_be_equal(monkeypatch):
    results, base = _scores([1208.7, 1208.7, 1208.7], 1208.7)
    fig = gd.comparison_chart(gd.comparison_rows(results, base), base)
    assert "all FIDs equal (1,208.7)" in _quality_axes(fig).get_title().replace("\n", " ")
    assert_readable(fig, monkeypatch)


@pytest.mark.parametrize("n", [6, 10])
def test_sample_grids_are_large_enough_to_see(n, shown, monkeypatch):
    grids = {name: np.zeros((274, 274, 3), np.uint8) for name in NAMES[:n]}
    gd.show_samples(grids, "samples at the end, the same noise for each")
    fig = shown[0]
    renderer = _boxes(fig, monkeypatch)[1]
    sides = [min(im.get_window_extent(renderer).width, im.get_window_extent(renderer).height)
             for ax in fig.axes for im in ax.get_images()]
    assert len(sides) == n and min(sides) >= 200, f"grids {min(sides):.0f} px a side at {fig.dpi} dpi"
    assert_readable(fig, monkeypatch)


def test_grid_layout_balances_its_rows():
    from gantools.workbook.grids import grid_layout

    assert grid_layout(6, 6, 9.5, 100)[:2] == (2, 3)
    assert grid_layout(6, 6, 9.5, 200)[:2] == (1, 6), "at twice the dpi, six fit across"
    assert grid_layout(2, 6, 9.5, 100)[:2] == (1, 2)
    assert grid_layout(9, 5, 9.5, 100)[:2] == (3, 3)


PLAIN = r"^-?\d{1,3}(,\d{3})*(\.\d+)?$"  # 5,000 or 0.002 or -50: never 1e+06, 10^3 or 2x10^2


def _log_tick_labels(fig) -> list:
    """The tick labels a reader sees on the figure's log and symlog axes."""
    fig.draw_without_rendering()
    out = []
    for ax in fig.axes:
        for axis, k in ((ax.xaxis, 0), (ax.yaxis, 1)):
            low, high = sorted(axis.get_view_interval())
            if axis.get_scale() in ("log", "symlog"):
                out += [t.get_text() for t in axis.get_ticklabels() if t.get_text() and
                        low <= t.get_position()[k] <= high]
    return out


def test_every_log_axis_reads_in_plain_numbers(shown):
    import re

    loaders = {"DataLoader, 0 workers": 7730, "DataLoader, 2 workers": 11645, "data on the device": 1259955}
    figs = [gd.speed_chart(list(loaders), list(loaders.values()))]
    gd.compare_losses(_histories(3, "decades"))
    gd.compare_losses(_histories(4, "mixed"))
    labels = [label for fig in figs + shown for label in _log_tick_labels(fig)]
    assert "1,000,000" in labels and "0.001" in labels and any(label.startswith("-") for label in labels)
    assert not [label for label in labels if not re.match(PLAIN, label)], labels


@pytest.mark.parametrize("negative", [False, True])
def test_the_scaling_chart_draws_speeds_and_the_all_reduce_share_on_linear_axes_from_zero(negative, monkeypatch):
    from gantools.workbook import data_parallel as dp

    speeds = {"1 process": 213.0, "1 process, 2 threads": 385.0, "2 processes (DDP)": 400.0,
              "2 processes, no all-reduce": 428.0}
    raced = (-0.01, -0.04, 0.02) if negative else (0.066, 0.054, 0.084)  # noise can put the race's share below 0
    shares = {dp.EXPOSED: (0.038,) * 3, dp.RACED: raced, dp.WHOLE: (0.082,) * 3}
    fig = dp.scaling_figure(speeds, "1 process", shares, {n: (0.95 * v, 1.03 * v) for n, v in speeds.items()},
                            "data parallelism on this machine: 2 CPU processes over gloo")
    texts = _texts_of(fig, monkeypatch)
    assert_readable(fig, monkeypatch)
    bars = [ax for ax in fig.axes if ax.patches]
    assert len(bars) == 2 and all(ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0 for ax in bars)
    assert " 1.88x" in texts and " 3.8%" in texts and " 8.2%" in texts
    assert (" -1.0%" if negative else " 6.6%") in texts  # a negative share said as measured, drawn as none
    assert min(p.get_width() for p in bars[1].patches) >= 0


# ------------------------------------------------------------------------------------------------ small multiples
def _panel_curves(ax):
    """The run's own curve in a small panel (the last line drawn; the start's grey one is behind it)."""
    return ax.get_lines()[-1]


@pytest.mark.parametrize("n", [2, 8, 10])
def test_live_panels_give_each_run_its_own_panel_on_one_scale(n, monkeypatch):
    from gantools.workbook.multiples import START_GREY, LivePanels

    monkeypatch.setattr(gd, "_display", lambda obj, handle=None: handle or SimpleNamespace(update=lambda obj: None))
    import gantools.workbook.multiples as gm

    monkeypatch.setattr(gm, "_display", gd._display)
    live = LivePanels()
    trainers = _trainers({name: _history(i, 12) for i, name in enumerate(NAMES[:n])})
    live.update(trainers, 6400, 12800)
    live.update(trainers, 12800, 12800)  # redrawn in place: last round's panels go
    panels = [ax for ax in live.fig.axes if ax is not live.ax_speed]
    assert len(panels) == n, "one panel per run, none left from the round before"
    assert len({ax.get_ylim() for ax in panels}) == 1, "one y scale for every panel"
    for k, ax in enumerate(panels):
        assert len(ax.get_lines()) == (1 if k == 0 else 2), "each run over the start, the start alone in its own"
        assert all(line.get_color() == START_GREY for line in ax.get_lines()[:-1])
    assert_readable(live.fig, monkeypatch)


def test_loss_panels_set_each_run_against_the_start_in_both_losses(shown, monkeypatch):
    import gantools.workbook.multiples as gm

    monkeypatch.setattr(gm, "_display", gd._display)
    histories = {name: _history(i, 12) for i, name in enumerate(NAMES[:7])}
    fig = gm.loss_panels(histories, NAMES[0], "D's and G's losses of the settings")
    assert shown == [fig]
    panels = [ax for ax in fig.axes if ax.get_lines()]
    assert len(panels) == 2 * 6, "a row per run other than the start, D's loss and G's"
    for column in (panels[0::2], panels[1::2]):
        assert len({ax.get_ylim() for ax in column}) == 1, "one scale down each column"
    assert all(len(ax.get_lines()) == 2 for ax in panels)
    assert_readable(fig, monkeypatch)


def test_a_linear_speed_chart_starts_its_bars_at_zero_whatever_their_span():
    loaders = {"DataLoader, 0 workers": 14.4, "DataLoader, 2 workers": 13.5, "data on the device": 0.15}
    fig = gd.speed_chart(list(loaders), list(loaders.values()), scale="linear")
    ax = fig.axes[0]
    assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0
    assert gd.speed_chart(list(loaders), list(loaders.values())).axes[0].get_xscale() == "log", "auto: as before"
