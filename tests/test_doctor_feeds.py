"""gantools doctor on loops without a DataLoader or without nn.Modules (tests/scripts/): the real images per iteration
counted from what D is fed, or said to be unknown (never 0), and G and D found as the plain functions the earliest
tutorials wrote, named as the script names them."""
import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.overrides import _len_torch_function_stack

from gantools import doctor
from gantools.doctor.diagnosis.analysis import machine_facts
from gantools.doctor.watching.feeds import Feeds
from gantools.doctor.fixes.catalogue import candidates, context
from gantools.doctor.watching.observations import AGAIN, DATA, DERIVED, MADE
from gantools.doctor.findings.report import UNKNOWN_RATE
from gantools.doctor.trying.trial import Trial
from gantools.doctor.trying.try_fixes import TryReport, _on_functions
from gantools.speed.profiling import compare

SCRIPTS = Path(__file__).parent / "scripts"
FUNCTIONAL, INLINE = SCRIPTS / "vanilla_gan_functional.py", SCRIPTS / "vanilla_gan_inline.py"
NEXT_BATCH = SCRIPTS / "wgan_mlp_next_batch.py"
TORCH_CAT = torch.cat
pytestmark = pytest.mark.usefixtures("one_thread", "steady_doctor")


def flags(script, pngs) -> list:
    batch = ["--batch-size", "32"] if script == NEXT_BATCH else ["--batch-size", "16", "--z-dim", "16"]
    return ["--dataroot", str(pngs), *batch, "--img-size", "16", "--hidden", "32", "--iters", "400"]


@pytest.fixture(scope="module")
def diagnose(small_pngs, tmp_path_factory, steady_doctor):
    """The diagnosis of a script, run once per module."""
    traces, reports = tmp_path_factory.mktemp("traces"), {}

    def get(script):
        if script not in reports:
            torch.set_num_threads(1)
            reports[script] = doctor.run_script(script, flags(script, small_pngs), steps=3, warmup=1,
                                                trace=traces / f"{script.stem}.json")
            assert torch.cat is TORCH_CAT and not _len_torch_function_stack()  # nothing of the doctor's left on
        return reports[script]
    return get


def lines_of(script: Path, code: str) -> list:
    return [i for i, line in enumerate(script.read_text().splitlines(), 1) if line.strip() == code]


def test_plain_functions_are_g_and_d_named_as_the_script_calls_them(diagnose):
    """No nn.Module: the weights are Variables the optimizers hold, G and D plain functions. Each is the function
    that computes with one optimizer's weights alone; G the one whose images D is fed; D's real batch counted."""
    report = diagnose(FUNCTIONAL)
    assert report.complete and not report.missing, report.note
    assert (report.models["G"]["name"], report.models["G"]["class"]) == ("G", "function")
    assert (report.models["D"]["name"], report.models["D"]["class"]) == ("D", "function")
    assert report.optimizers["G"]["name"] == "G_solver" and report.optimizers["D"]["name"] == "D_solver"
    assert report.models["G"]["output_shape"] == [16, 16 * 16] and report.models["D"]["output_shape"] == [16, 1]
    assert report.images_per_step == report.batch_size == 16 and report.images_per_sec > 0
    assert {"G forward", "D forward", "D backward", "D forward (G step)", "G backward"} <= set(report.phases_ms)
    script = str(FUNCTIONAL.resolve())
    d_calls = lines_of(FUNCTIONAL, "D_real = D(X)") + lines_of(FUNCTIONAL, "D_fake = D(G_sample)")
    assert {(script, line) for line in d_calls} == {tuple(at) for at in report.models["D"]["call_sites"]}
    assert context(report, machine_facts(torch.device("cpu"))).g_step_sites == {(script, d_calls[-1])}
    text = str(report)
    assert "the loop: G (function, " in text and "feeds D (function, " in text
    assert f"{report.images_per_sec:.0f} images/s" in text and UNKNOWN_RATE not in text


def test_a_wgan_counts_every_critic_batch_and_not_the_batch_g_step_draws(diagnose):
    """wiseodd's WGAN: five critic steps on a fresh batch of 32 each, and a G step that draws a batch it never feeds
    to D: 160 real images per iteration, every run (the batches' memory is freed and reused between calls)."""
    report = diagnose(NEXT_BATCH)
    assert report.complete, report.note
    assert report.optimizers["D"]["steps_per_iteration"] == 5 and report.optimizers["G"]["steps_per_iteration"] == 1
    assert report.images_per_step == 5 * 32 and report.batch_size == 32
    assert "5 batches of 32 per iteration fed to D" in report.images_source


def test_a_loop_whose_networks_are_not_found_says_so_and_never_0_images(diagnose, tmp_path):
    """G and D written inline in the loop, real and fake joined in one batch: no function to find, so the report
    names the optimizers whose networks it could not find, gives the timings and says images/s is unknown, and
    --json writes null, never 0."""
    report = diagnose(INLINE)
    assert report.complete and report.unprofiled_step_time_ms > 0 and report.phases_ms, report.note
    assert report.images_per_step is None and report.images_per_sec is None and report.batch_size is None
    assert {"G_solver step", "D_solver step"} <= set(report.phases_ms)
    assert len(report.missing) == 2 and all(re.match(r"the network [GD]_solver trains: ", m) for m in report.missing)
    text = str(report)
    assert UNKNOWN_RATE in text and not re.search(r"\b0 images/s", text)
    assert "not found: the network G_solver trains" in text and "real images per iteration: unknown" in text
    saved = json.loads(report.save_json(tmp_path / "inline.json").read_text())  # what --json writes
    assert [saved[k] for k in ("images_per_step", "images_per_sec", "batch_size")] == [None, None, None]
    assert saved["iterations_per_sec"] > 0 and saved["missing"] == report.missing


def test_what_fed_a_model_is_told_by_storage_not_by_address():
    """G's images (a view, a detached copy), a batch joined from real and fake (its real rows count), a penalty's
    mix (it requires grad), a batch fed twice in one iteration, and new data; a freed output's memory handed to a new
    batch is that batch's, not G's."""
    feeds, g, d = Feeds(), object(), object()
    fake, real = torch.randn(8, 4), torch.randn(8, 4)
    feeds.output(g, fake)
    assert feeds.fed(d, fake.detach().view(8, 2, 2)) == (g, {MADE: 8, DATA: 0})
    joined = torch.cat([real, fake.detach()])
    feeds.joined([real, fake.detach()], joined, 0)
    assert feeds.fed(d, joined) == (g, {MADE: 8, DATA: 8})
    assert feeds.fed(d, real) == (None, {DATA: 8}) and feeds.fed(d, real.view(8, 4)) == (None, {AGAIN: 8})
    assert feeds.fed(d, (0.5 * real + 0.5 * fake).requires_grad_(True)) == (None, {DERIVED: 8})
    reused = 0
    for _ in range(20):
        out = torch.from_numpy(np.ones((64, 64), dtype=np.float32))
        feeds.output(g, out)
        address = out.data_ptr()
        del out
        batch = torch.from_numpy(np.zeros((64, 64), dtype=np.float32))
        reused += batch.data_ptr() == address
        assert feeds.fed(d, batch) == (None, {DATA: 64})
    assert reused  # the allocator did hand the freed memory on: the case above was met


def test_an_unknown_image_count_is_compared_in_iterations_per_second():
    """--try and compare() on a loop whose images per iteration are unknown: the same ratios, in iterations/s, and
    the output says so; never 0 images/s."""
    unknown = Trial((), "measured", [10.0, 10.0], images_per_iteration=None)
    known = Trial((), "measured", [10.0], [], 16)
    assert unknown.images_per_sec is None and unknown.rate == unknown.iterations_per_sec == 100.0
    assert known.rate == known.images_per_sec == 1600.0
    tried = TryReport("x.py", "cpu", "cpu", start_images_per_sec=100.0, unit="iterations/s",
                      together={"speedup": 1.5, "spread": (1.4, 1.6), "images_per_sec": 150.0})
    tried.tried.append(SimpleNamespace(outcome="kept", name="f", title="f", why="faster", traceback=""))
    text = str(tried)
    assert "compared in iterations/s: the images per iteration are unknown" in text
    assert "100 -> 150 iterations/s" in text
    before, after = (doctor.DoctorReport("x.py", "cpu", unprofiled_step_time_ms=ms, phases_ms={"other": ms})
                     for ms in (20.0, 10.0))
    change = compare(before, after)
    assert change.speedup == 2.0 and "iterations/s" in str(change) and "images/s" not in str(change)


def test_try_leaves_out_the_fixes_that_change_a_module_when_g_and_d_are_functions(diagnose):
    report = diagnose(FUNCTIONAL)
    fixes, skipped = candidates(report, machine_facts(torch.device("cpu")))
    plain = SimpleNamespace(models={"G": {"class": "Generator"}, "D": {"class": "Discriminator"}})
    assert _on_functions(fixes, skipped, plain) == (fixes, skipped)
    from gantools.doctor.fixes.catalogue import FIXES
    kept, said = _on_functions(list(FIXES), [], report)
    on_modules = {"autocast", "logits", "freeze-d", "channels-last", "compile", "detach-fakes"}
    assert not on_modules & {f.name for f in kept} and {name for name, _ in said} == on_modules
    assert all("G and D are plain functions" in why for _, why in said)
