import json
import os

import pytest
import torch

from gantools import TrainConfig
from gantools.speed import bench, climb, figures
from gantools.workbook.display import bench_chart

TINY = dict(ngf=8, ndf=8, nz=16, batch_size=32)
PLAN = dict(warmup_images=32, images_per_repeat=64, repeats=2, quality_images=32 * 40)


@pytest.mark.slow
def test_ladder_rows_are_measured_interleaved_and_saved(tmp_path):
    order = []
    result = bench.run("cpu", "cpu", variants=["bf16 autocast", "all together", "max throughput (batch x2)"],
                       overrides=TINY, plan=PLAN, out_dir=tmp_path, progress=order.append, compile=False)
    names = [r["variant"] for r in result["rows"]]
    assert names == ["reference (tutorial loop)", "bf16 autocast", "all together", "max throughput (batch x2)"]
    assert order[-2:] == ["repeat 1/2 done", "repeat 2/2 done"]
    for row in result["rows"]:
        assert len(row["images_per_sec_runs"]) == 2 and row["images_per_sec"] > 0
        assert row["spread"][0] <= row["images_per_sec"] <= row["spread"][1] and row["tflops"] > 0
        assert row["mfu"] is None  # no published peak to divide by on a CPU
        fastest = max(result["measured_matmul_flops"].values())
        assert 0 < row["matmul_share"] == pytest.approx(row["tflops"] * 1e12 / fastest)
    assert result["rows"][0]["speedup"] == 1.0
    assert result["rows"][3]["batch_size"] == 64
    ref, bf16, together, top = (row["flops_per_image"] for row in result["rows"])
    # each variant counts its own step: freezing D in G's step drops D's weight gradients there
    assert ref == bf16 > together == top > 0
    table = bench.markdown(result)
    assert "| reference (tutorial loop) |" in table and "best:" in table and "interleaved" in table
    fp32_only = {**result, "measured_matmul_flops": {"fp32": result["measured_matmul_flops"]["fp32"]}}
    assert "no native bf16, so its emulated bf16 is not measured" in bench.markdown(fp32_only)  # a Zen 3, say
    assert "target 3.0x: " in table  # the CPU target is checked, met or not
    bench.save(result, tmp_path / "b.json")
    bench_chart(result, tmp_path / "b.png")
    assert json.loads((tmp_path / "b.json").read_text())["rows"][1]["variant"] == "bf16 autocast"
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow_bf16  # all together in fp32: bf16 is beside the point here, and emulated, slowly, on some CPUs
@pytest.mark.slow
def test_quality_puts_fid_beside_speed_at_an_equal_image_budget(tmp_path):
    result = bench.run("cpu", "cpu", variants=["max throughput (batch x2)"], quality=True, overrides=TINY,
                       plan=PLAN, out_dir=tmp_path, quality_samples=512, progress=lambda _: None, compile=False)
    ref, fast = result["rows"]
    assert ref["images_trained"] == fast["images_trained"] == 32 * 40
    assert ref["fid"] > 0 and fast["fid"] > 0 and "note" in ref  # fewer than 2048 samples is said
    table = bench.markdown(result)
    assert "FID" in table and "target <= 1.10" in table and "fastest variant that keeps quality" in table


def test_matmul_peak_is_measured_and_the_ladder_adds_compile_where_it_can():
    assert figures.matmul_peak(torch.device("cpu"), torch.float32, n=256, repeats=2) > 1e8
    cpu = torch.device("cpu")
    assert ("torch.compile" in bench.ladder(cpu, True)) and "torch.compile" not in bench.ladder(cpu, False)
    assert bench.ladder(cpu, True)["all together"]["compile"] == "default"


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="unknown variant"):
        bench.run("cpu", "cpu", variants=["warp drive"], overrides=TINY, plan=PLAN)


@pytest.mark.slow
def test_scaling_row_times_one_and_two_processes_and_states_the_efficiency(tmp_path):
    lines = []
    result = bench.scaling("cpu", "cpu", max_processes=2, repeats=1, steps=6, log_interval=2, overrides=TINY,
                           out_dir=tmp_path, progress=lines.append)
    one, two = result["rows"]
    assert (one["processes"], two["processes"]) == (1, 2) and len(lines) == 2
    assert (one["global_batch"], two["global_batch"]) == (32, 64) and two["batch_per_process"] == 32
    assert one["images_per_sec"] > 0 and two["images_per_sec"] > 0 and one["efficiency"] == 1.0
    assert two["efficiency"] == pytest.approx(two["images_per_sec"] / (2 * one["images_per_sec"]))
    assert result["threads_per_process"] == {1: os.cpu_count(), 2: max(1, os.cpu_count() // 2)}
    history = json.loads((tmp_path / "2-processes-0" / "history.json").read_text())
    assert [r["step"] for r in history] == [2, 4, 6]  # rank 0's record of the 2-process run
    table = bench.scaling_markdown(result)
    assert "| 2 | 64 |" in table and "scaling efficiency" in table and "gloo" in table and "share its" in table


def test_counting_a_variants_flops_does_not_change_its_training(tmp_path):
    from gantools import ImageTensorDataset, Trainer, TrainConfig, render_glyphs

    data = ImageTensorDataset(*render_glyphs(64, 32, 1, seed=0))
    cfg = TrainConfig(nz=8, ngf=8, ndf=8, batch_size=16, steps=4, log_interval=1, sample_interval=0, hflip=True,
                      loader="device")
    counted = Trainer(cfg.replace(out_dir=str(tmp_path / "a")), dataset=data)
    counted.fit(2)
    frozen = bench.flops_per_image(counted)
    counted.fit(2)
    plain = Trainer(cfg.replace(out_dir=str(tmp_path / "b")), dataset=data)
    plain.fit()
    assert counted.history.column("loss_g") == plain.history.column("loss_g")
    assert all(torch.equal(a, b) for a, b in zip(counted.discriminator.state_dict().values(),
                                                 plain.discriminator.state_dict().values(), strict=True))
    # and each config counts its own step: D's weight gradients in G's step when D is not frozen
    free = bench.flops_per_image(Trainer(cfg.replace(freeze_d=False, out_dir=str(tmp_path / "c")), dataset=data))
    assert free > frozen > 0


class _FakeHistory:
    def __init__(self):
        self.records = []

    def __len__(self):
        return len(self.records)


class _FakeTrainer:
    """Just what `interleave` reads of a trainer: its config, step, fit() and the log records fit() writes."""

    def __init__(self, name, step_ms, order):
        from types import SimpleNamespace

        self.name, self.step_ms, self.order, self.step = name, step_ms, order, 0
        self.cfg = SimpleNamespace(images_per_step=32, loader="device", num_workers=0)
        self.history = _FakeHistory()

    def fit(self, n):
        self.order.append((self.name, n))
        self.step += n
        self.history.records.append({"step": self.step, "step_time_ms": self.step_ms})


def test_interleave_warms_up_then_alternates_and_reads_each_chunk_from_the_logged_step_times():
    order = []
    fast, slow = _FakeTrainer("fast", 10.0, order), _FakeTrainer("slow", 20.0, order)
    lines = []
    measured = bench.interleave({"fast": fast, "slow": lambda: slow}, 64, 96, 3, progress=lines.append)
    assert order == [("fast", 2), ("slow", 2), ("fast", 3), ("slow", 3), ("slow", 3), ("fast", 3), ("fast", 3),
                     ("slow", 3)]
    assert measured["fast"].images_per_sec_runs == pytest.approx([3200.0] * 3) and measured["slow"].subject is slow
    assert measured["slow"].spread == (1600.0, 1600.0) and lines[-1] == "repeat 3/3 done"
    stopped = _FakeTrainer("x", 1.0, [])
    with pytest.raises(bench.Stopped):
        bench.interleave({"x": stopped}, 32, 32, 1, stop=lambda: True)


def test_side_by_side_gives_each_config_its_own_folder(tmp_path, monkeypatch):
    """Each contender's trainer writes under `<out_dir>/<its index>`: a function built in a loop must bind the index
    it was built with, not read the loop's last one when it is called."""
    folders, real = {}, bench.interleave

    def recording(contenders, *args, **kwargs):
        measured = real(contenders, *args, **kwargs)
        folders.update({name: m.subject.cfg.out_dir for name, m in measured.items()})
        return measured

    monkeypatch.setattr(bench, "interleave", recording)
    cfg = TrainConfig(image_size=32, channels=1, **TINY, device="cpu")
    result = bench.side_by_side({"fp32": cfg, "again": cfg.replace(lr_g=1e-4)}, out_dir=tmp_path,
                                plan=dict(warmup_images=32, images_per_repeat=32, repeats=1))
    assert list(result["rows"]) == ["fp32", "again"]
    assert folders == {"fp32": str(tmp_path / "0"), "again": str(tmp_path / "1")}


def test_interleave_on_cuda_lengthens_each_chunk_to_half_a_second_at_its_warm_up_speed():
    """On CUDA a chunk lasts at least `min_chunk_s` at the speed of the warm-up's second half (the first holds
    compile and capture), each contender its own; on a CPU the plan's chunks stand (the test above)."""
    from types import SimpleNamespace

    order = []
    fast, slow = _FakeTrainer("fast", 10.0, order), _FakeTrainer("slow", 100.0, order)
    for trainer in (fast, slow):
        trainer.device = SimpleNamespace(type="cuda")
    bench.interleave({"fast": fast, "slow": slow}, 4 * 32, 32, 2, min_chunk_s=0.5)
    # warm-ups of 4 steps in two halves; then 0.5 s at 3200 images/s (50 steps of 32) and at 320 (5 steps)
    assert order == [("fast", 2), ("fast", 2), ("slow", 2), ("slow", 2), ("fast", 50), ("slow", 5), ("slow", 5),
                     ("fast", 50)]
    order.clear()
    bench.interleave({"fast": fast}, 32, 96, 1, min_chunk_s=None)  # off: the plan's chunk
    assert order == [("fast", 1), ("fast", 3)]


class _Closable:
    def __init__(self, cfg):
        self.cfg, self.closed = cfg, False

    def close(self):
        self.closed = True


def _measuring(speed_of):
    """The ladder's way of measuring, but training nothing: each contender's images/s per repeat is
    `speed_of(its config)`; its configs are the ladder's own (`bench.row_config`, validated)."""
    from gantools.measuring.turns import Measured

    def interleave(contenders, warmup_images, images_per_repeat, repeats, progress=None, stop=None, min_chunk_s=None):
        out = {}
        for name, c in contenders.items():
            subject = c if isinstance(c, _Closable) else c()
            out[name] = Measured(subject=subject, images_per_sec_runs=[speed_of(subject.cfg)] * repeats)
        return out
    return climb.Measuring(interleave, lambda cfg, plan: _Closable(cfg), bench.row_config)


def test_the_climb_keeps_by_the_keep_rule_skips_what_does_not_apply_and_ends_at_its_last_kept_config(tmp_path):
    """Each rung is measured against the best so far and kept by `keep.decide_in_two` (here: faster in every
    repeat, or not faster); a rung that does not apply, or whose config is refused, is a skipped row with the reason
    (the refusal's first line), never a crash; the best ('all together') is the last kept config."""
    from gantools.core.config import preset

    def speed_of(cfg):  # faster with the device loader, bf16 and channels_last; slower with D frozen, a larger batch
        return (100.0 * (2 if cfg.loader == "device" else 1) * (1.5 if cfg.precision == "bf16" else 1)
                * (1.2 if cfg.channels_last else 1) * (0.5 if cfg.freeze_d else 1) / (cfg.batch_size / 32))

    base = preset("reference", device="cpu", **bench.SIZES["tiny"])
    cpu = torch.device("cpu")
    rungs = climb.climb_rungs(cpu, compile_ok=False, compile_why="left out here")
    assert [r.name for r in rungs] == ["device-resident data", "no per-step .item()", "bf16 autocast",
                                       "channels_last", "fused Adam", "D frozen in G step", "torch.compile",
                                       "CUDA graphs", "batch x2", "batch x4"]
    refused = climb.Rung("a refused rung", {"loader": "dataloader", "pin_memory": True})  # pinning: CUDA only
    told = []
    climber = climb.Climb(base, bench.QUICK_PLAN, tmp_path, _measuring(speed_of), progress=told.append)
    climber.climb([*rungs[:3], refused, *rungs[3:]])
    rows = {r["variant"]: r for r in climber.rows}
    assert len(climber.rows) == 12 and len(told) == 11
    assert rows["device-resident data"]["kept"] and rows["device-resident data"]["vs_best"]["ratio"] == 2.0
    assert rows["bf16 autocast"]["kept"] and rows["bf16 autocast"]["changes"]["precision"] == "bf16"
    assert not rows["D frozen in G step"]["kept"] and rows["D frozen in G step"]["why"].startswith("not kept")
    assert not rows["no per-step .item()"]["kept"]  # not faster: the rule keeps no tie
    assert rows["torch.compile"]["skipped"] == "left out here"
    assert rows["CUDA graphs"]["skipped"] == "CUDA graphs need a CUDA GPU"
    skipped = rows["a refused rung"]["skipped"]
    assert skipped.startswith("invalid TrainConfig: ") and "pin_memory" in skipped
    assert not rows["a refused rung"]["kept"] and rows["a refused rung"]["host_budget"] is None
    # each rung stands on the best so far: batch x4 after a batch x2 not kept is x4 of the preset's batch
    assert rows["batch x4"]["changes"]["batch_scale"] == 4 and rows["batch x4"]["batch_size"] == 4 * 32
    assert rows["batch x4"]["changes"]["loader"] == "device" and "freeze_d" not in rows["batch x4"]["changes"]
    for row in climber.rows:
        assert {"kept", "vs_best", "host_budget", "host_ms", "changes"} <= set(row)
    best = climber.result()["best"]
    kept = [r for r in climber.rows if r["kept"]]
    assert not rows["fused Adam"]["kept"]  # as fast as the best: a tie is not kept
    assert best["variant"] == "all together" and best["from"] == kept[-1]["variant"] == "channels_last"
    assert best["changes"] == kept[-1]["changes"] and best["images_per_sec"] == 360.0


def test_a_cuda_graphs_rung_refused_by_validation_is_skipped_with_its_reason(tmp_path):
    """The CUDA graphs rung on a config that cannot capture (here a CPU) is a skipped row saying why, as the config's
    own validation words it."""
    from gantools.core.config import preset

    climber = climb.Climb(preset("reference", device="cpu", **bench.SIZES["tiny"]), bench.QUICK_PLAN, tmp_path,
                          _measuring(lambda cfg: 100.0), progress=lambda line: None)
    climber.climb([climb.Rung("CUDA graphs", {"cuda_graphs": True, "compile": "off"})])  # as on CUDA: tried
    row = climber.rows[-1]
    assert row["skipped"] and "cuda_graphs" in row["skipped"] and row["kept"] is False and row["vs_best"] is None
    assert climber.result()["best"]["from"] == "reference (tutorial loop)"


def test_every_ladder_row_carries_its_host_budget_counted_as_a_gpu_runs_it(tmp_path):
    result = bench.run("tiny", "cpu", variants=["device-resident data"], compile=False, out_dir=tmp_path,
                       progress=lambda line: None)
    assert "climb" not in result  # no climb by default on a CPU
    for row in result["rows"]:
        budget = row["host_budget"]
        assert budget["as_on"] == "cuda" and budget["launches"] > 0 and row["host_ms"] > 0
    ref, device_data = result["rows"]
    assert ref["host_budget"]["syncs"] > 0  # the tutorial's .item() every step
    table = bench.markdown(result)
    assert "| launches/it | syncs/it | host reads/it | host ms |" in table and "(counted as a GPU runs it)" in table


@pytest.mark.slow
def test_bench_climb_from_the_cli_writes_both_tables_and_every_rows_host_budget_to_the_json(tmp_path, capsys):
    from gantools.cli import main

    path = tmp_path / "b.json"
    assert main(["bench", "--size", "tiny", "--device", "cpu", "--variants", "device-resident data", "--no-compile",
                 "--climb", "--json", str(path), "--png", str(tmp_path / "b.png")]) == 0
    saved = json.loads(path.read_text())
    assert "partial" not in saved  # the last save is the whole result
    climbed = saved["climb"]
    assert [r["variant"] for r in climbed["rows"]][:2] == ["reference (tutorial loop)", "device-resident data"]
    for row in [*saved["rows"], *climbed["rows"]]:
        assert {"host_budget", "host_ms"} <= set(row)
    for row in climbed["rows"]:
        assert row["kept"] in (True, False, None) and "vs_best" in row  # None: too noisy to decide (keep.too_noisy)
        if row["skipped"]:
            assert row["host_budget"] is None and row["vs_best"] is None
        else:
            assert row["host_budget"]["as_on"] == "cuda" and row["images_per_sec"] > 0
            assert row["vs_best"] is None or len(row["vs_best"]["spread"]) == 2
    skipped = {r["variant"]: r["skipped"] for r in climbed["rows"] if r["skipped"]}
    assert skipped == {"torch.compile": "left out (compile=False, --no-compile)",
                       "CUDA graphs": "CUDA graphs need a CUDA GPU"}
    last_kept = [r for r in climbed["rows"] if r["kept"]][-1]
    assert climbed["best"]["variant"] == "all together" and climbed["best"]["changes"] == last_kept["changes"]
    out = capsys.readouterr().out
    assert "Climbing: from the reference" in out and "| **all together** (as kept at" in out
    assert out.index("| reference (tutorial loop) |") < out.index("Climbing:")  # after the main table
