import dataclasses
import json

import pytest
import torch

from gantools import Trainer, TrainConfig, preset
from gantools.measuring.protocol import OPTIONAL_PHASES, PHASES
from gantools.speed.profiling import (COMPUTE_SHARE, DATA_BOUND, HOST_BOUND, ProfileReport, compare, diagnose, profile,
                                      time_optimizer_steps)

from conftest import BatchFreeD, BatchFreeG, cuda_only


def test_profile_labels_every_phase_of_the_reference_step(tiny, tmp_path):
    cfg = preset("reference", **{k: getattr(tiny, k) for k in ("nz", "ngf", "ndf", "batch_size", "out_dir")},
                 num_workers=0)
    report = profile(cfg, steps=3, warmup=1, trace_path=tmp_path / "trace.json")
    # the reference reads losses every step: "host sync" shows up; it has no penalty and no EMA
    assert set(report.phases_ms) == set(PHASES) - set(OPTIONAL_PHASES)
    assert report.step_time_ms > 0 and report.unprofiled_step_time_ms > 0 and report.overhead > 0
    assert sum(report.phases_ms.values()) <= report.step_time_ms * 1.05
    assert "aten::" in report.table and report.top_ops and report.peak_mem_mb > 0
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    text = str(report)
    assert "overhead" in text and "verdict:" in text and "images/s" in text
    # its host budget, counted as a GPU runs it: the reference's per-step loss reads are syncs there
    budget = report.host_budget
    assert budget["as_on"] == "cuda" and budget["launches"] > 0 and budget["syncs"] > 0
    assert text.endswith(f"host budget: {budget['launches']:g} launches, {budget['syncs']:g} syncs, "
                         f"{budget['cpu_reads']:g} host reads an iteration (counted as a GPU runs it)")
    assert not (tmp_path / "run" / "host-budget").exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        "run", "trace.json"]  # counted in a scratch folder of its own


def test_profile_a_trainer_with_your_own_networks(tiny, glyphs64):
    trainer = Trainer(tiny, generator=BatchFreeG(), discriminator=BatchFreeD(), dataset=glyphs64)
    report = profile(trainer, steps=2, warmup=1)
    assert "host sync" not in report.phases_ms and report.phases_ms["D backward"] > 0
    assert trainer.step == 1 + 1 + 2 + 2  # warm-up, profiler warm-up, profiled, unprofiled
    assert report.host_budget is None and "host budget" not in str(report)  # your networks: not rebuilt to count
    assert not any(type(c).__name__ == "StepProfiler" for c in trainer.callbacks)


def _judged(report: ProfileReport, cfg: TrainConfig, wait_share: float):
    """The verdict on `report` had its step waited `wait_share` of its time for data: the rule's answer for a loop
    whose share is given, not measured on a machine that may be busy."""
    step = report.step_time_ms
    starved = dataclasses.replace(report, phases_ms={**report.phases_ms, "data wait": wait_share * step},
                                  device_busy_ms=(1 - wait_share) * step)
    return diagnose(starved, cfg)


@pytest.mark.slow
def test_a_slow_loader_is_judged_on_its_measured_wait_and_its_fix_is_a_loading_change_that_trains(tiny, big_images,
                                                                                                 request, tmp_path):
    """The mechanism, not a race: the profile measures the step's wait for data (large PNGs decoded one by one in the
    training process: transform='per-sample'), the verdict is the one rule applied to what was measured, and for
    this loop a data-bound verdict's fix is the folder decoded once into its cache, read without a DataLoader, which
    trains. How much the fix cuts the wait is measured where it is taught (03_data_loading), never asserted on a
    machine that may be busy."""
    from gantools.core.techniques import FOLDER_CACHE

    threads = torch.get_num_threads()
    request.addfinalizer(lambda: torch.set_num_threads(threads))  # the next tests get theirs
    torch.set_num_threads(1)
    cfg = tiny.replace(dataset="folder", data_path=str(big_images), num_workers=0, transform="per-sample",
                       data_root=str(tmp_path / "data"))
    before = profile(cfg, steps=6, warmup=1)
    step, wait = before.step_time_ms, before.phases_ms["data wait"]
    assert wait > 0 and before.verdict.evidence["data wait share"] == pytest.approx(wait / step)
    assert before.verdict.bottleneck == ("data-bound" if wait / step >= DATA_BOUND else "compute-bound")
    v = _judged(before, cfg, 2 * DATA_BOUND)
    assert v.bottleneck == "data-bound" and v.notebook == "03_data_loading" and v.estimated_speedup > 1
    assert v.fix and set(v.fix) <= {"num_workers", "persistent_workers", "prefetch_factor", "pin_memory", "transform",
                                    "loader"}, v.fix
    assert v.technique.startswith(FOLDER_CACHE) and v.fix["transform"] == "on-device" and v.fix["loader"] == "auto"
    after = profile(cfg.replace(**v.fix), steps=2, warmup=1)
    assert (tmp_path / "data" / "folder-cache").is_dir()  # the fix's run decoded the folder once, into the cache
    change = compare(before, after)
    assert before.images_per_sec > 0 and after.images_per_sec > 0  # both measured, without the profiler
    assert "images/s" in str(change)


def test_in_memory_data_with_a_large_model_is_judged_by_the_rule_and_its_compute_fix_is_valid(tmp_path):
    cfg = TrainConfig(loader="device", ngf=64, ndf=64, batch_size=64, out_dir=str(tmp_path), loss="bce-sigmoid")
    report = profile(cfg, steps=2, warmup=1)
    share = report.phases_ms.get("data wait", 0.0) / report.step_time_ms
    assert report.verdict.bottleneck == ("data-bound" if share >= DATA_BOUND else "compute-bound")
    assert "conv" in report.verdict.evidence["heaviest ops"]  # convolutions: nearly all of a 64-wide DCGAN's time
    v = _judged(report, cfg, 0.0)
    assert v.bottleneck == "compute-bound"
    assert v.fix == {"precision": "bf16", "loss": "bce"}  # BCELoss is unsafe under autocast: the fix says so
    cfg.replace(**v.fix).validate()


def _report(device="cpu", step=100.0, wait=0.0, busy=None, syncs=0.0, top=(("aten::convolution", 80.0),)):
    busy = step - wait if busy is None else busy
    return ProfileReport(device, 5, 64, step, step, {"data wait": wait}, busy, 0.0, syncs, list(top))


def test_thresholds_decide_the_verdict(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))  # a compute-bound A100: bf16
    cfg = TrainConfig()
    assert diagnose(_report(wait=100 * DATA_BOUND + 1), cfg).bottleneck == "data-bound"
    assert diagnose(_report(wait=100 * DATA_BOUND - 1), cfg).bottleneck == "compute-bound"
    idle = diagnose(_report("cuda", busy=100 * (1 - HOST_BOUND) - 1, syncs=4), cfg.replace(sync_every_step=True))
    assert idle.bottleneck == "host-overhead-bound" and idle.fix == {"sync_every_step": False}
    assert idle.estimated_speedup == pytest.approx(100 / 59)
    busy = diagnose(_report("cuda", busy=100 * (1 - HOST_BOUND) + 1), cfg)
    assert busy.bottleneck == "compute-bound"
    elementwise = (("aten::convolution", 100 * COMPUTE_SHARE - 10), ("aten::native_batch_norm", 60.0))
    assert diagnose(_report("cuda", busy=100, top=elementwise), cfg).bottleneck == "memory-bound"
    assert diagnose(_report("cpu", top=elementwise), cfg).bottleneck == "compute-bound"  # CPU: data vs compute
    per_sample = diagnose(_report(wait=50), cfg.replace(transform="per-sample"))
    assert per_sample.fix["transform"] == "on-device" and per_sample.estimated_speedup == pytest.approx(2.0)


@cuda_only
def test_small_model_syncing_every_step_is_host_overhead_bound_on_cuda(tiny, glyphs64):
    cfg = tiny.replace(device="cuda", loader="device", sync_every_step=True, batch_size=8)
    report = profile(Trainer(cfg, dataset=glyphs64), steps=10, warmup=3)
    assert report.verdict.bottleneck == "host-overhead-bound", str(report)
    assert report.host_syncs_per_step >= 4


def test_optimizer_step_timing_covers_each_implementation(tiny):
    ms = time_optimizer_steps(tiny, repeats=3)
    assert set(ms) == {"for-loop", "foreach", "fused"} and all(v > 0 for v in ms.values())


def test_compute_bound_in_16_bit_makes_no_gain_claim():
    v = diagnose(_report(), TrainConfig(precision="bf16"))
    assert v.fix == {"channels_last": True} and v.estimated_speedup is None
    assert "no estimate" in str(v)


def test_cuda_graphs_are_recommended_only_where_gantools_check_validated_them(monkeypatch):
    from gantools.speed import check

    idle = _report("cuda", busy=100 * (1 - HOST_BOUND) - 1, syncs=0)
    v = diagnose(idle, TrainConfig())
    assert v.bottleneck == "host-overhead-bound" and v.fix == {"compile": "default"}
    assert "once `python -m gantools check` has validated it" in v.technique
    monkeypatch.setattr(check, "validated", lambda technique, device, root=None: technique ==
                        "compile reduce-overhead" and device.type == "cuda")
    v = diagnose(idle, TrainConfig())
    assert v.fix == {"compile": "reduce-overhead"} and "validated here" in v.technique


def test_profiled_steps_synchronise_the_data_wait_and_leave_the_trainer_as_it_was(tiny, glyphs64):
    seen = []

    class Watch:
        def on_step_end(self, trainer):
            seen.append(trainer.sync_data_wait)

    trainer = Trainer(tiny, dataset=glyphs64, callbacks=[Watch()])
    report = profile(trainer, steps=2, warmup=1)
    assert seen == [False, True, True, True, False, False]  # warm-up, profiler warm-up + profiled, unprofiled
    assert not trainer.sync_data_wait and report.phases_ms["D backward (G step)"] > 0
    assert report.phases_ms["D forward (G step)"] > 0 and report.phases_ms["G backward"] > 0


def test_device_busy_time_on_cuda_counts_each_kernel_once():
    """kineto gives a kernel's time to its row and again to the CPU op that launched it, and user annotations span
    whole regions: only kernel rows are the device's busy time (rows built by hand; no GPU here)."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from gantools.speed.profiling import device_time

    def row(key, ms, device_type, annotation=False):
        return SimpleNamespace(key=key, self_device_time_total=ms * 1e3, device_type=device_type,
                               is_user_annotation=annotation, self_cpu_time_total=0)

    rows = [row("aten::cudnn_convolution", 6.0, DeviceType.CPU), row("sm80_xmma_fprop", 6.0, DeviceType.CUDA),
            row("Optimizer.step#Adam.step", 3.0, DeviceType.CUDA, annotation=True),
            row("multi_tensor_apply_kernel", 2.0, DeviceType.CUDA), row("Memcpy HtoD", 1.0, DeviceType.CUDA)]
    busy, h2d, top = device_time(rows, steps=1, step_ms=20.0, wait_ms=0.0, cuda=True)
    assert busy == pytest.approx(8.0) and h2d == pytest.approx(1.0)
    assert [name for name, _ in top] == ["sm80_xmma_fprop", "multi_tensor_apply_kernel", "Memcpy HtoD"]


def test_a_host_overhead_verdict_never_proposes_the_per_step_reads_that_are_already_off():
    """Syncs the config does not make (GradScaler's, your own networks') are no reason to propose
    sync_every_step=False when it is already off: that fix would change nothing (and tune would stop there)."""
    idle = _report("cuda", busy=100 * (1 - HOST_BOUND) - 1, syncs=2)
    v = diagnose(idle, TrainConfig(sync_every_step=False))
    assert v.bottleneck == "host-overhead-bound" and v.fix == {"compile": "default"}
    assert "sync_every_step" not in v.fix and ".item()" not in v.technique
    assert diagnose(idle, TrainConfig(sync_every_step=True)).fix == {"sync_every_step": False}


def test_host_syncs_leave_out_gantools_own_synchronisations():
    """A cuda*Synchronize inside gantools' own range (hardware.synchronize) is not the training code's; the one
    outside is, and so is one that only overlaps the range (its middle lies outside). The one after the last
    iteration is the profiler's, stopping its trace (met on an H200: "0.5 host syncs per step in a step that makes
    none"). Events built by hand."""
    from gantools.measuring.protocol import OWN_SYNC, Span, code_syncs

    events = [Span("ProfilerStep#1", 0, 100), Span(OWN_SYNC, 10, 20), Span("cudaDeviceSynchronize", 11, 19),
              Span("aten::item", 40, 50), Span("cudaStreamSynchronize", 42, 48),
              Span(OWN_SYNC, 60, 62), Span("cudaStreamSynchronize", 61, 90), Span("cudaLaunchKernel", 12, 13),
              Span("cudaDeviceSynchronize", 101, 103)]  # the profiler's own, as it stops the trace
    assert [(e.name, e.start) for e in code_syncs(events)] == [("cudaStreamSynchronize", 42),
                                                                ("cudaStreamSynchronize", 61)]
    assert code_syncs(events, skip=()) == [e for e in events[:-1] if e.name.endswith("Synchronize")]


def test_a_host_sync_is_told_with_the_ranges_around_it():
    """A failed sync count names where each sync was made, outermost range first, the profiler's step left out, so
    a GPU run's report says which read to look for. Events built by hand."""
    from gantools.measuring.protocol import Span, sync_site

    events = [Span("ProfilerStep#1", 0, 100), Span("D optimizer step", 30, 60), Span("aten::item", 40, 50),
              Span("aten::_local_scalar_dense", 41, 49), Span("cudaStreamSynchronize", 42, 48)]
    assert sync_site(events[-1], events) == "D optimizer step > aten::item > aten::_local_scalar_dense"
    assert sync_site(Span("cudaDeviceSynchronize", 101, 102), events) == "outside every range"


def test_a_profiled_step_counts_none_of_gantools_own_synchronisations(monkeypatch):
    """On a real profile: hardware.synchronize marks its range, so the profiler's count is the code's alone. No GPU
    here: torch.cuda.synchronize is replaced by a CPU op standing in for cudaDeviceSynchronize, which the code
    also calls once per step outside gantools."""
    from gantools.measuring import hardware
    from gantools.measuring.protocol import ProfilerSession

    stand_in = ("aten::fill_",)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: torch.empty(1).fill_(0))
    session = ProfilerSession(torch.device("cpu"), steps=2)
    with session:
        for _ in range(3):  # the profiler's warm-up step, then 2 profiled
            hardware.synchronize(torch.device("cuda"))  # gantools' own, twice a step
            torch.empty(1).fill_(1)  # the code's own sync
            hardware.synchronize(torch.device("cuda"))
            session.step()
    assert session.per_step(stand_in) == 3
    assert session.code_syncs_per_step(stand_in) == 1
