import matplotlib
import numpy as np
import pytest

import gantools.workbook.display as gd
from gantools import Trainer
from gantools.workbook.display import LivePlot, comparison_chart, comparison_markdown, comparison_rows, image_grid

matplotlib.use("Agg")


@pytest.fixture
def displays(monkeypatch):
    """Record what would be sent to the notebook: (object, handle) per call."""
    calls = []

    class Handle:
        pass

    def fake_display(obj, handle=None):
        calls.append((obj, handle))
        return handle or Handle()

    monkeypatch.setattr(gd, "_display", fake_display)
    return calls


def test_live_plot_draws_one_figure_and_updates_it_in_place(tiny, glyphs64, displays):
    plot = LivePlot("t", min_interval_s=0.0)
    Trainer(tiny.replace(sample_interval=2), dataset=glyphs64, callbacks=[plot]).fit()
    assert displays[0][1] is None, "the first draw creates the display"
    handles = {id(h) for _, h in displays[1:]}
    assert len(handles) == 1, "every later draw updates that same display"
    assert len({id(fig) for fig, _ in displays}) == 1, "one persistent figure"
    assert plot.draws == len(displays) == 1 + 3 + 1  # start, one per log, end
    assert plot.grid is not None and plot.draw_time_s > 0
    lines = plot.ax_loss.get_lines()
    assert [list(line.get_xdata()) for line in lines] == [[2, 4, 6]] * 2


def test_live_plot_is_throttled(tiny, glyphs64, displays):
    plot = LivePlot(min_interval_s=3600)
    Trainer(tiny.replace(steps=20), dataset=glyphs64, callbacks=[plot]).fit()
    assert plot.draws == 2  # the first draw and the final one; none of the ten log intervals


def test_live_plot_can_draw_into_an_image_widget(tiny, glyphs64):
    import ipywidgets as W

    image = W.Image(format="png")
    Trainer(tiny, dataset=glyphs64, callbacks=[LivePlot(widget=image)]).fit()
    assert image.value[:8] == b"\x89PNG\r\n\x1a\n"


def test_image_grid_accepts_uint8_and_unit_range_images(glyphs64):
    grid = image_grid(glyphs64.images[:16], nrow=4)
    assert grid.shape == (4 * 34 + 2, 4 * 34 + 2, 3) and grid.dtype == np.uint8
    same = image_grid(glyphs64.images[:16].float() / 127.5 - 1, nrow=4)
    assert np.abs(grid.astype(int) - same.astype(int)).max() <= 1


def test_comparison_rows_give_speed_up_against_the_baseline():
    base = {"images_per_sec": 100.0, "step_time_ms": 10, "data_wait_ms": 1, "peak_mem_mb": 5, "loss_d": 1,
            "loss_g": 2}
    rows = comparison_rows({"fast": {**base, "images_per_sec": 250.0}}, base)
    assert rows[0]["speed-up"] == pytest.approx(2.5)
    assert "| fast | 250 | 2.50x |" in comparison_markdown(rows)


def test_comparison_shows_quality_beside_speed_when_runs_were_scored():
    base = {"images_per_sec": 100.0, "step_time_ms": 10, "data_wait_ms": 1, "peak_mem_mb": 5, "loss_d": 1,
            "loss_g": 2, "fid": 40.0, "classes_covered": 9, "images_trained": 1000}
    rows = comparison_rows({"fast": {**base, "images_per_sec": 250.0, "fid": 44.0},
                            "unscored": {k: v for k, v in base.items() if k != "fid"}}, base)
    assert rows[0]["FID vs baseline"] == pytest.approx(1.1) and rows[1]["FID"] is None
    table = comparison_markdown(rows)
    assert "| fast | 250 | 2.50x |" in table and "| 44.0 | 1.10x | 9 | 1000 |" in table and "n/a" in table
    assert len(comparison_chart(rows, base).axes) == 2  # speed bars and speed against FID
    unscored = comparison_rows({"fast": {k: v for k, v in base.items() if k != "fid"}}, base)
    assert "FID" not in unscored[0]  # a scored baseline alone adds no empty quality columns
