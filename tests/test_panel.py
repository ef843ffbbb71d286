import time

import pytest

import gantools.workbook.panel as gp
from gantools.workbook.panel import CONTROL_FIELDS, RUNS, ControlPanel

from conftest import measurements_take


@pytest.fixture
def panel(tiny):
    RUNS.clear()
    gp._ACTIVE.update(thread=None, stop=None, trainer=None)
    base = {"images_per_sec": 100.0}
    yield ControlPanel(tiny.replace(dataset="glyphs", steps=4), base)
    gp.stop_active_run()
    RUNS.clear()


def test_panel_has_a_control_for_every_technique(panel):
    assert set(panel.controls) == set(CONTROL_FIELDS)
    assert panel.controls["precision"].options == ("fp32", "fp16", "bf16")
    assert panel.config() == panel.base


def test_run_trains_with_the_controls_and_adds_a_row(panel):
    history = panel.set(loader="device", precision="bf16").run()
    assert history[-1]["step"] == 4
    assert list(RUNS) == ["precision=bf16, loader=device"]  # in the order of the controls
    assert "1 x" not in panel.status.value and "Done" in panel.status.value
    assert panel.plot.value[:4] == b"\x89PNG" and len(panel.table.outputs) == 2
    panel.run()
    assert len(RUNS) == 2, "a second run with the same settings gets its own row"


def test_every_run_starts_from_the_panels_warm_start(panel):
    loaded = []

    class Start:  # what ControlPanel asks of a warm.WarmStart
        def load_into(self, trainer):
            assert trainer.step == 0, "loaded before the run trains"
            loaded.append(trainer.cfg.precision)

    panel.start = Start()
    panel.set(loader="device", precision="bf16").run()
    panel.set(precision="fp32").run()
    assert loaded == ["bf16", "fp32"], "each Run gets its own copy of the start"


def test_a_bad_combination_is_reported_not_run(panel):
    assert panel.set(loader="device", num_workers=2).run() is None
    assert "Cannot run" in panel.status.value and "DataLoader knobs" in panel.status.value
    assert not RUNS


def test_a_new_panel_stops_the_running_loop(panel, tiny):
    panel.set(steps=100000, loader="device")
    panel.run(block=False)
    _wait(lambda: gp._ACTIVE["trainer"] is not None and gp._ACTIVE["trainer"].step >= 2)
    trainer, thread = gp._ACTIVE["trainer"], gp._ACTIVE["thread"]
    ControlPanel(tiny, {"images_per_sec": 1.0})  # what re-running the widget cell does
    assert not thread.is_alive() and trainer.step < 100000
    assert (trainer.out_dir / "checkpoint.pt").is_file(), "the stopped run still wrote its checkpoint"


def test_stop_button_ends_the_run_between_steps(panel):
    panel.set(steps=100000, loader="device")
    panel.run_button.click()
    _wait(lambda: gp._ACTIVE["trainer"] is not None and gp._ACTIVE["trainer"].step >= 1)
    panel.stop_button.click()
    gp._ACTIVE["thread"].join(300)
    assert not gp._ACTIVE["thread"].is_alive()
    assert "stopped early" in panel.status.value and len(RUNS) == 1


def test_each_control_is_chosen_by_its_fields_description(tiny):
    from gantools.workbook.panel import _widget
    from gantools.core.config import knobs

    panel = ControlPanel(tiny, {"images_per_sec": 1.0})
    pin = panel.controls["pin_memory"]
    assert pin.label == "auto" and [label for label, _ in pin.options] == ["auto", "on", "off"]
    assert panel.config().pin_memory is None and panel.set(pin_memory=False).config().pin_memory is False
    assert "reduce-overhead" not in panel.controls["compile"].options  # the panel trains in a background thread
    assert type(panel.controls["channels_last"]).__name__ == "Checkbox"
    assert panel.controls["batch_size"].value == tiny.batch_size
    assert type(_widget("lr_g", knobs()["lr_g"], 2e-4)).__name__ == "FloatText"
    with pytest.raises(ValueError, match="no control for betas"):
        _widget("betas", knobs()["betas"], (0.5, 0.999))


def _wait(condition, seconds=300):
    """Until `condition()` holds: a guard against a hang, never a judge of speed (what takes a second here has
    minutes)."""
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline
        time.sleep(0.05)


@pytest.mark.slow
def test_tune_button_tunes_in_the_background_draws_the_path_and_loads_the_result(panel, fake_clock, monkeypatch):
    """24 s of budget on the test's clock, each measurement taking 10: one candidate is measured, and the search
    ends there for time, as it would on any machine."""
    measurements_take(10.0, fake_clock, monkeypatch)
    panel.set(loader="device").minutes.value = 0.4
    panel.tune_button.click()
    _wait(lambda: gp._ACTIVE["thread"] is not None)
    assert panel.run_button.disabled and panel.tune_button.disabled and not panel.stop_button.disabled
    gp._ACTIVE["thread"].join(300)
    result = panel.tuned
    assert panel.status.value.startswith("Tuned") and len(result.path) == 1 and not result.stopped, panel.status.value
    assert result.ended.startswith("time: "), result.ended
    assert result.start_config.loader == "device" and result.quality["images"] == 4 * 16  # a Run's images
    assert panel.tune_view in panel.widget.children and panel.tune_plot.value[:4] == b"\x89PNG"
    assert "| step | change |" in panel.tune_table.outputs[0]["data"]["text/markdown"]
    assert not panel.load_button.disabled and not panel.run_button.disabled
    panel.load_button.click()
    final, loaded = result.final_config, panel.config()
    assert all(getattr(loaded, k) == getattr(final, k) for k in result.changes()), "Run now trains the tuned config"
    assert "Loaded the tuned config" in panel.status.value


def test_stop_ends_a_tune_between_measurements(panel):
    panel.set(loader="device").minutes.value = 10
    panel.tune_button.click()
    _wait(lambda: "measuring" in panel.status.value)
    panel.stop_button.click()
    gp._ACTIVE["thread"].join(300)
    assert not gp._ACTIVE["thread"].is_alive()
    assert panel.status.value.startswith("Tune stopped") and panel.tuned.stopped
    assert not panel.load_button.disabled, "what was found before the stop can be loaded"
