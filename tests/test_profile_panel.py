"""01's try-it widget (`panel.ProfilePanel`): profile on click, the result set against the notebook's baseline; and
what 01 reads from a profile of its own loop (`profiling.phase_ms`, `time_shares`, `conclusions.same_story`)."""
import time
from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

import gantools.workbook.panel as gp
from gantools import preset
from gantools.workbook.panel import ProfilePanel
from gantools.workbook.conclusions import same_story
from gantools.speed.profiling import ProfileReport, phase_ms, time_shares


def _baseline(**overrides) -> ProfileReport:
    """A baseline report as 01 measures it (`profiling.profile`), made up: 100 images/s without the profiler."""
    phases = {"data wait": 1.0, "G forward": 20.0, "D forward": 30.0, "D backward": 40.0}
    return ProfileReport(**{"device": "cpu", "steps": 2, "batch_size": 16, "step_time_ms": 180.0,
                            "unprofiled_step_time_ms": 160.0, "phases_ms": phases, **overrides})


@pytest.fixture
def reference(tiny):
    """The reference loop at the tiny size, its data read in the training process (no worker start-up)."""
    return preset("reference", **{k: getattr(tiny, k) for k in ("nz", "ngf", "ndf", "batch_size", "out_dir")},
                  num_workers=0)


@pytest.fixture
def panel(reference):
    gp._ACTIVE.update(thread=None, stop=None, trainer=None)
    yield ProfilePanel(reference, _baseline(), techniques=("precision", "loss", "sync_every_step"), steps=1, warmup=1)
    gp.stop_active_run()


def test_the_layout_is_what_the_browser_test_clicks(panel):
    """tests/test_browser.py's check_try_it: a VBox whose direct HBox child holds "Profile" and "Stop", the status
    as the box's first HTML widget, and an image."""
    import ipywidgets as W

    rows = panel.widget.children
    buttons = next(r for r in rows if isinstance(r, W.HBox))
    assert [b.description for b in buttons.children if isinstance(b, W.Button)] == ["Profile", "Stop"]
    assert next(r for r in rows if isinstance(r, W.HTML)) is panel.status
    assert panel.image in rows and panel.stop_button.disabled, "Stop is off while nothing runs"
    assert panel.status.value.startswith("Set the controls")


def test_profile_reports_speed_against_the_baseline_and_the_verdict(panel):
    report = panel.set(sync_every_step=False).profile()
    assert report is not None and report.verdict is not None
    status = panel.status.value
    assert status.startswith("Done: <b>sync_every_step=False</b>: ") and "images/s (unprofiled)" in status
    assert f"{report.images_per_sec / 100.0:.2f}x the baseline" in status
    assert f"verdict: {report.verdict.bottleneck}" in status
    assert panel.image.value[:4] == b"\x89PNG"
    assert panel.reports == {"sync_every_step=False": report}
    assert not panel.profile_button.disabled and panel.stop_button.disabled
    panel.set(sync_every_step=True).profile()
    assert list(panel.reports) == ["sync_every_step=False", "the baseline's config"], "unchanged controls: the base"


def test_a_summary_dict_is_a_baseline_too(reference):
    panel = ProfilePanel(reference, {"images_per_sec": 50.0}, techniques=("sync_every_step",), steps=1, warmup=1)
    report = panel.profile()
    assert f"{report.images_per_sec / 50.0:.2f}x the baseline" in panel.status.value
    assert panel.image.value[:4] == b"\x89PNG", "the phases alone, with no baseline phases to draw beside them"


def test_a_bad_combination_is_reported_not_profiled(panel):
    assert panel.set(precision="bf16").profile() is None  # bce-sigmoid is fp32 only
    assert panel.status.value.startswith("<b style='color:#b00'>Cannot run:") and "bce-sigmoid" in panel.status.value
    assert not panel.reports and panel.image.value == b""
    assert panel.set(loss="bce").profile() is not None, "with the loss the verdict moves to, it runs"
    assert "precision=bf16, loss=bce" in panel.reports


def test_stop_ends_the_profile_between_steps(panel):
    panel.steps.value = 1000
    panel.profile_button.click()
    deadline = time.time() + 300
    while gp._ACTIVE["trainer"] is None or gp._ACTIVE["trainer"].step < 1:
        assert time.time() < deadline
        time.sleep(0.05)
    assert panel.stop_button.disabled is False and panel.profile_button.disabled
    panel.stop_button.click()
    gp._ACTIVE["thread"].join(300)
    assert not gp._ACTIVE["thread"].is_alive() and gp._ACTIVE["trainer"].step < 1000
    assert panel.status.value.startswith("Stopped") and not panel.reports
    assert panel.stop_button.disabled and not panel.profile_button.disabled


def _row(key, cpu_us, device=DeviceType.CPU):
    return SimpleNamespace(key=key, cpu_time_total=cpu_us, device_type=device)


def test_phase_ms_reads_each_labels_cpu_row_not_its_gpu_annotation():
    # on a GPU a record_function label has two rows of one name: the host's range, then (starting later, so listed
    # later) its GPU annotation, which has no CPU time
    rows = [_row("ProfilerStep*", 9000), _row("D backward", 4000), _row("aten::mm", 100),
            _row("D backward", 0, DeviceType.CUDA), _row("G forward", 2000)]
    assert phase_ms(rows, 2, names=("G forward", "D backward", "D penalty")) == {"G forward": 1.0, "D backward": 2.0}


def test_time_shares_leave_waiting_out_of_the_work():
    phases = {"data wait": 50.0, "G forward": 10.0, "D backward": 20.0, "G backward": 10.0, "host sync": 5.0}
    shares = time_shares(phases, [("aten::convolution_backward", 30.0), ("aten::mm", 10.0), ("aten::add_", 40.0)],
                         busy_ms=80.0)
    assert shares == {"backward passes": 0.75, "convolutions and matrix multiplies": 0.5}


def test_same_story_says_whether_two_profiles_agree():
    a = {"backward passes": 0.50, "convolutions and matrix multiplies": 0.70}
    same = same_story(a, {"backward passes": 0.45, "convolutions and matrix multiplies": 0.78}, "mine", "theirs")
    assert same.keep and "the same story" in same.text and "50% in **mine**, 45% in **theirs**" in same.text
    apart = same_story(a, {"backward passes": 0.30, "convolutions and matrix multiplies": 0.70}, "mine", "theirs")
    assert not apart.keep and "differ by more than 10 points in backward passes" in apart.text
