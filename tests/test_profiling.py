import json

from gantools import Trainer, preset
from gantools.profiling import PHASES, profile

from conftest import BatchFreeD, BatchFreeG


def test_profile_labels_every_phase_of_the_reference_step(tiny, tmp_path):
    cfg = preset("reference", **{k: getattr(tiny, k) for k in ("nz", "ngf", "ndf", "batch_size", "out_dir")},
                 num_workers=0)
    report = profile(cfg, steps=3, warmup=1, trace_path=tmp_path / "trace.json")
    assert set(report.phases_ms) == set(PHASES)  # the reference syncs every step: "host sync" shows up
    assert report.step_time_ms > 0
    assert sum(report.phases_ms.values()) <= report.step_time_ms * 1.05
    assert "aten::" in report.table
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert "ms/step" in str(report)


def test_profile_a_trainer_with_your_own_networks(tiny, glyphs64):
    trainer = Trainer(tiny, generator=BatchFreeG(), discriminator=BatchFreeD(), dataset=glyphs64)
    report = profile(trainer, steps=2, warmup=1)
    assert "host sync" not in report.phases_ms and report.phases_ms["D backward"] > 0
    assert trainer.step == 3 and not any(type(c).__name__ == "StepProfiler" for c in trainer.callbacks)


def test_optimizer_step_timing_covers_each_implementation(tiny):
    from gantools.profiling import time_optimizer_steps

    ms = time_optimizer_steps(tiny, repeats=3)
    assert set(ms) == {"for-loop", "foreach", "fused"} and all(v > 0 for v in ms.values())
