"""Charts on another axis than images per second (`workbook.chart_axes`): time per generator step where the budget is
generator steps and the runs read different real images per step (07), peak memory where the question is memory
(08); each readable at a notebook's width with long names, on linear axes from 0."""
from types import SimpleNamespace

import pytest
from test_charts import NAMES, _baseline, _histories, _summaries, assert_readable

import gantools.workbook.chart_axes as ca
import gantools.workbook.display as gd


@pytest.mark.parametrize("n", [1, 10])
@pytest.mark.parametrize("scored", [True, False])
def test_step_chart_draws_time_per_generator_step_readably(n, scored, monkeypatch):
    results, base = _summaries(n, fid=scored), _baseline(fid=scored)
    fig = ca.step_chart(results, base, "the papers' settings after 1200 generator steps each")
    assert_readable(fig, monkeypatch)
    bars = fig.axes[0]
    assert bars.get_xlabel().startswith("ms per generator step")
    widths = sorted(p.get_width() for p in bars.patches)
    assert widths == pytest.approx(sorted(s["step_time_ms"] for s in results.values()))
    if scored:
        assert fig.axes[1].get_xlabel().startswith("ms per generator step (left is faster)")


def test_step_rows_lead_with_the_time_per_step_and_drop_the_images_per_second_speed_up():
    results, base = _summaries(3), _baseline()
    rows = ca.step_rows(results, base)
    assert list(rows[0])[:4] == ["run", "ms/step", "time per step vs baseline", "real images/s"]
    assert "speed-up" not in rows[0]
    s = next(iter(results.values()))
    assert rows[0]["time per step vs baseline"] == f"{s['step_time_ms'] / base['step_time_ms']:.2f}x"


@pytest.mark.parametrize("n", [1, 4, 10])
@pytest.mark.parametrize("with_speed", [True, False])
def test_memory_chart_is_the_main_chart_with_speed_beside_it(n, with_speed, monkeypatch):
    names = NAMES[:n]
    peaks = {name: 60.0 + 10 * i for i, name in enumerate(names)}
    # the second config not raced (16-bit activations in 08: 02's race)
    speed = ({name: (0.7 + 0.05 * i, (0.6 + 0.05 * i, 0.95 + 0.05 * i)) for i, name in enumerate(names) if i != 1}
             if with_speed else None)
    fig = ca.memory_chart(peaks, names[0], speed, "a step's peak tensor memory: each change against the loop")
    texts = [t.get_text() for t, _ in assert_readable(fig, monkeypatch)]
    memory = fig.axes[0]
    assert memory.get_xlim()[0] == 0 and memory.get_xlabel().startswith("peak tensor MB")
    assert sorted(p.get_width() for p in memory.patches) == pytest.approx(sorted(peaks.values()))
    if with_speed:
        assert len(fig.axes) == 2 and fig.axes[1].get_xlim()[0] == 0, "speed ratios on a linear axis from 0"
        assert fig.axes[1].get_xlim()[1] >= 0.95 + 0.05 * (n - 1), "every paired range in view"
        assert ("not raced here" in texts) == (n > 1)


def test_live_runs_show_time_per_generator_step_where_runs_read_different_images_per_step(monkeypatch):
    monkeypatch.setattr(gd, "_display", lambda obj, handle=None: handle or SimpleNamespace(update=lambda obj: None))
    histories = _histories(3)
    for per_step, unit, want in (((64, 320, 64), "generator steps", "ms per generator step"),
                                 ((64, 64, 64), "generator steps", "images / s"),
                                 ((64, 320, 64), "real images", "images / s")):
        trainers = {name: SimpleNamespace(history=h, cfg=SimpleNamespace(images_per_step=k))
                    for (name, h), k in zip(histories.items(), per_step, strict=True)}
        live = gd.LiveRuns()
        live.update(trainers, 1200, 1200, unit)
        assert live.ax_speed.get_xlabel().startswith(want), (per_step, unit)


def test_show_memory_runs_shows_the_table_then_memory_with_each_runs_speed_beside_it(monkeypatch):
    shown = []
    monkeypatch.setattr(ca, "_display", lambda obj, handle=None: shown.append(obj))
    histories = _histories(4)

    class Runs(dict):
        def ratio(self, name, against):
            return self[name].history.summary()["images_per_sec"] / self[against].history.summary()["images_per_sec"]

        def paired(self, name, against):
            r = self.ratio(name, against)
            return (0.9 * r, 1.1 * r)

    runs = Runs({name: SimpleNamespace(history=h) for name, h in histories.items()})
    first = next(iter(runs))
    ca.show_memory_runs(runs, first, "activation checkpointing: peak tensor memory, and the speed each ran at")
    table, fig = shown
    assert "peak tensor MB" in table.data
    assert_readable(fig, monkeypatch)
    assert sorted(p.get_width() for p in fig.axes[0].patches) == pytest.approx(
        sorted(h.summary()["peak_mem_mb"] for h in histories.values()))
    assert len(fig.axes[1].patches) == 4, "every run's speed beside its memory, the baseline's at 1.00x"
