"""`python -m gantools check`: every technique on this machine, each verified; a broken one makes it fail."""
import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from gantools import TrainConfig

from gantools.speed import check, iteration_budget
from gantools.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_check_runs_every_technique_here_and_all_pass(tmp_path):
    path = tmp_path / "check.json"  # a process of its own, as a user runs it: torch.compile starts from nothing
    done = subprocess.run([sys.executable, "-m", "gantools", "check", "--device", "cpu", "--json", str(path)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    out = done.stdout
    result = json.loads(path.read_text())
    names = [r["technique"] for r in result["rows"]]
    expected = ["fp32", "bf16 autocast", "device loader", "folder cache, memory-mapped loader", "DataLoader, 2 workers",
                "Adam fused", "Adam foreach",
                "accumulation, 2 micro-batches", "channels_last", "WGAN-GP, 2 D steps", "R1 lazy + EMA",
                "conditional", "warm-up + cosine schedule", "activation checkpointing", "R3GAN: rpgan, R1 + R2",
                "DDP, 2 processes (gloo, CPU)"]
    assert [n for n in names if n != "compile default"] == expected
    assert result["ok"] is True and set(result) >= {"machine", "device", "torch", "date", "rows"}
    for row in result["rows"]:
        assert row["ok"] is True and row["reason"] is None and row["images_per_sec"] > 0, row
        assert all(row["checks"].values()), row
        if row["technique"] != names[-1]:  # one process: gradients into D watched, resume compared bit for bit
            assert row["checks"]["exact resume"] and row["checks"]["no gradients into frozen D"]
    penalised = {"WGAN-GP, 2 D steps", "R1 lazy + EMA", "R3GAN: rpgan, R1 + R2"}
    assert {r["technique"] for r in result["rows"] if "penalty applied" in r["checks"]} == penalised
    if "compile default" in names:  # wherever a C++ compiler is present, as on this project's machine
        compiled = next(r for r in result["rows"] if r["technique"] == "compile default")
        assert compiled["checks"]["compiled graphs"] == 3
        assert compiled["host_budget"]["counted"] == "eager" and compiled["host_budget"]["launches"] > 0
    # every one-process row's host budget, counted as a GPU would run it; DDP's two processes have none
    assert all(r["host_budget"]["launches"] > 0 and r["host_budget"]["as_on"] == "cuda" for r in result["rows"][:-1])
    assert result["rows"][-1]["host_budget"] is None
    assert "every technique works here" in out and "DDP, 2 processes (gloo, CPU)" in out
    assert iteration_budget.HEADER in out


def test_a_broken_technique_fails_the_check_with_its_reason(tmp_path, capsys, monkeypatch):
    def broken(device, compile_ok, fast_bf16=None):
        return {"fp32": {}, "D not frozen": {"freeze_d": False}, "crashes": {"optimizer_impl": "fused"}}

    real_make = check.Trainer

    def trainer(cfg, **kw):  # the "crashes" technique dies in its first step, as a broken kernel would
        t = real_make(cfg, **kw)
        if cfg.optimizer_impl == "fused":
            t.opt_g.step = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no kernel image is available"))
        return t

    monkeypatch.setattr(check, "techniques", broken)
    monkeypatch.setattr(check, "Trainer", trainer)
    ddp_passes = {"ok": True, "reason": None, "images_per_sec": 1.0, "checks": {}}
    monkeypatch.setattr(check, "check_ddp", lambda device, data, work: ddp_passes)
    path = tmp_path / "check.json"
    assert main(["check", "--device", "cpu", "--json", str(path)]) == 1
    rows = {r["technique"]: r for r in json.loads(path.read_text())["rows"]}
    assert rows["fp32"]["ok"] and not rows["D not frozen"]["ok"] and not rows["crashes"]["ok"]
    assert "reached the frozen D in G's step" in rows["D not frozen"]["reason"]
    assert rows["crashes"]["reason"] == "RuntimeError: no kernel image is available"
    assert rows["fp32"]["host_budget"]["launches"] > 0  # a failed row's config is not counted again
    assert rows["D not frozen"]["host_budget"] is None and rows["crashes"]["host_budget"] is None
    out = capsys.readouterr().out
    assert "FAILED: RuntimeError: no kernel image is available" in out and "2 technique(s) FAILED" in out


def test_only_a_gpu_run_that_passed_validates_a_technique_there(tmp_path, monkeypatch):
    result = {"machine": {"device_name": "NVIDIA H100 80GB HBM3"}, "torch": torch.__version__, "date": "today",
              "rows": [{"technique": "compile reduce-overhead", "ok": True}, {"technique": "fp16", "ok": False}]}
    check.record(result, root=tmp_path)
    cuda = torch.device("cuda")
    assert not check.validated("compile reduce-overhead", cuda, root=tmp_path) or torch.cuda.is_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert check.validated("compile reduce-overhead", cuda, root=tmp_path)
    assert not check.validated("fp16", cuda, root=tmp_path) and not check.validated("bf16", cuda, root=tmp_path)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-40GB")
    assert not check.validated("compile reduce-overhead", cuda, root=tmp_path)  # another GPU: not validated
    assert not check.validated("compile reduce-overhead", torch.device("cpu"), root=tmp_path)


def test_an_unknown_technique_is_a_config_error():
    from gantools import ConfigError

    with pytest.raises(ConfigError, match="unknown technique"):
        check.run("cpu", only=["warp drive"])


def test_a_profiled_step_on_cuda_must_count_no_host_syncs(glyphs64, tmp_path, monkeypatch):
    """On CUDA, check profiles gantools' own step, which makes no host sync: the profile must count none (its own
    data-wait synchronisations left out). Offered on CUDA only; its function runs here on the CPU, and fails on a
    count that is not zero."""
    from gantools.measuring.protocol import ProfilerSession

    assert check.PROFILE_ROW in check.row_names({"fp32": {}}, torch.device("cuda"), 1)
    assert check.PROFILE_ROW not in check.row_names({"fp32": {}}, torch.device("cpu"), 0)
    assert check.row_names({"fp32": {}}, torch.device("cuda"), 2)[-1] == "DDP, 2 processes (NCCL)"
    cfg = check.TrainConfig(**check.BASE, device="cpu", out_dir=str(tmp_path)).validate()
    row = check.check_profile_syncs(cfg, glyphs64)
    assert row["ok"] and row["reason"] is None and row["images_per_sec"] > 0
    # as on CUDA when the count took in the data waits' own two synchronisations per step
    monkeypatch.setattr(ProfilerSession, "code_syncs_per_step", lambda self: 2.0)
    row = check.check_profile_syncs(cfg, glyphs64)
    assert not row["ok"] and "counted 2 host syncs per step" in row["reason"]


def test_on_cuda_a_dataset_returning_gpu_tensors_is_checked_with_the_defaults(glyphs64, monkeypatch):
    from gantools import TrainConfig, make_loader

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))  # an A100
    assert check.techniques(torch.device("cuda"), True)[check.CUDA_TENSORS] == {}  # pin_memory auto, no workers
    assert check.CUDA_TENSORS not in check.techniques(torch.device("cpu"), True)
    data = check.ROW_DATASETS[check.CUDA_TENSORS](glyphs64, torch.device("meta"))  # the GPU's stand-in here
    assert len(data) == 64 and all(t.device.type == "meta" for t in data[0])
    loader = make_loader(data, TrainConfig(**check.BASE), torch.device("cuda")).loader
    assert loader.pin_memory is False and loader.num_workers == 0


R3GAN_CUDA = ("R3GAN, fp16 + GradScaler", check.R3GAN_FP32_ROW, "R3GAN, bf16 autocast",
              "R3GAN + compile reduce-overhead")


def test_r3gan_runs_everywhere_and_its_16_bit_and_compiled_rows_on_cuda_bf16_only_where_fast(monkeypatch):
    r3gan = check.techniques(torch.device("cpu"), True)[check.R3GAN_ROW]
    cfg = TrainConfig(**{**check.BASE, **r3gan}).validate()  # R3GAN's networks build at the check's sizes
    assert (cfg.architecture, cfg.loss, cfg.r1_gamma > 0, cfg.r2_gamma > 0) == ("r3gan", "rpgan", True, True)
    assert not set(R3GAN_CUDA) & set(check.techniques(torch.device("cpu"), True))
    a100 = check.techniques(torch.device("cuda"), True, fast_bf16=True)
    assert [[a100[name].get(k) for k in ("precision", "compile", "fp32_stages")] for name in R3GAN_CUDA] == [
        ["fp16", None, None], ["fp16", None, 1], ["bf16", None, None], [None, "reduce-overhead", None]]
    TrainConfig(**{**check.BASE, **a100[check.R3GAN_FP32_ROW], "precision": "bf16"}).validate()  # fp16 is CUDA's
    assert all(a100[name].items() >= r3gan.items() for name in R3GAN_CUDA)
    t4 = check.techniques(torch.device("cuda"), True, fast_bf16=False)
    assert "R3GAN, bf16 autocast" not in t4 and {"R3GAN, fp16 + GradScaler", check.R3GAN_FP32_ROW,
                                                    check.R3GAN_ROW} <= set(t4)
    # compiled, R3GAN's step needs one graph more than DCGAN's: D on real images under no_grad in G's step
    assert check.expected_graphs(cfg.replace(compile="default")) == check.expected_graphs(TrainConfig()) + 1 == 4


def test_a_penalty_that_overflows_every_step_fails_its_row(tmp_path, monkeypatch, glyphs64):
    """With a GradScaler an inf penalty is logged as 0 and its D step skipped, so the losses stay finite: the row
    must still fail. Played on the CPU with the GradScaler turned on for fp32, the relativistic loss with R1 + R2
    on the check's DCGAN (cheaper than R3GAN's networks)."""
    import gantools.core.step as step

    real_scaler, real_grads, real_at = torch.amp.GradScaler, step.input_gradients, step.gradients_at
    monkeypatch.setattr(torch.amp, "GradScaler", lambda device, enabled: real_scaler(device, enabled=True))
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)  # the host syncs are counted with a scaler
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    cfg = TrainConfig(**check.BASE, loss="rpgan", r1_gamma=1.0, r2_gamma=1.0, out_dir=str(tmp_path)).validate()
    row = check.check_technique(cfg, glyphs64, tmp_path / "scaled")
    assert row["ok"] and row["checks"]["penalty applied"], row  # the scaled input gradients, unscaled
    monkeypatch.setattr(step, "input_gradients", lambda *a: real_grads(*a) * math.inf)  # a penalty's own forward
    monkeypatch.setattr(step, "gradients_at", lambda *a: real_at(*a) * math.inf)  # or the loss's, shared
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the scale falling, as it should when every D step overflows
        row = check.check_technique(cfg, glyphs64, tmp_path / "overflowing")
    assert row["checks"]["finite losses"] and not row["checks"]["penalty applied"] and not row["ok"]
    assert "penalty was 0 or overflowed" in row["reason"]


FP16_ADAM = {"fp16 + Adam fused": "fused", "fp16 + Adam foreach": "foreach", "fp16 + Adam for-loop": "for-loop"}


def test_fp16_is_checked_with_each_optimizer_implementation_on_cuda_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))  # a T4
    on_cuda = check.techniques(torch.device("cuda"), True)
    for name, impl in FP16_ADAM.items():
        assert on_cuda[name] == {"optimizer_impl": impl, "precision": "fp16"}
    assert not set(FP16_ADAM) & set(check.techniques(torch.device("cpu"), True))


def test_the_check_counts_host_syncs_in_the_optimizer_steps_and_fails_fused_adam_that_syncs(tmp_path, monkeypatch,
                                                                                           glyphs64):
    """On a GPU the check counts what torch.cuda's sync debug mode reports ("called a synchronizing CUDA operation",
    c10/cuda/CUDAFunctions.cpp) during the optimizer steps of a run with a GradScaler. Played here on the CPU: the
    GradScaler is turned on for fp32, the debug mode is a flag, and GradScaler's `.item()` on found_inf (in
    `_maybe_opt_step`, which only a non-fused optimizer goes through) warns as it does on a GPU."""
    real_scaler, mode, fused_syncs = torch.amp.GradScaler, ["default"], []
    monkeypatch.setattr(torch.amp, "GradScaler", lambda device, enabled: real_scaler(device, enabled=True))
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: {"default": 0, "warn": 1}[mode[0]])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda m: mode.__setitem__(0, {0: "default"}.get(m, m)))

    def sync_if_watched():
        if mode[0] == "warn":
            warnings.warn("called a synchronizing CUDA operation", stacklevel=1)

    opt_step, adam_step = real_scaler._maybe_opt_step, torch.optim.Adam.step
    monkeypatch.setattr(real_scaler, "_maybe_opt_step", lambda self, *a, **k: sync_if_watched() or
                        opt_step(self, *a, **k))
    monkeypatch.setattr(torch.optim.Adam, "step", lambda self, *a, **k: (sync_if_watched() if fused_syncs else None)
                        or adam_step(self, *a, **k))
    rows = {}
    for impl in ("fused", "foreach", "for-loop"):
        cfg = TrainConfig(**check.BASE, optimizer_impl=impl, out_dir=str(tmp_path / impl)).validate()
        rows[impl] = check.check_technique(cfg, glyphs64, tmp_path / impl)
    assert mode == ["default"], "the debug mode is put back"
    syncs = {impl: row["checks"]["host syncs per step (optimizer)"] for impl, row in rows.items()}
    assert syncs == {"fused": 0, "foreach": 2, "for-loop": 2}  # D's step and G's: one .item() each
    assert all(row["ok"] for row in rows.values()), rows
    fused_syncs.append(True)  # a fused Adam that syncs after all (a torch where its kernel reads found_inf back)
    cfg = TrainConfig(**check.BASE, optimizer_impl="fused", out_dir=str(tmp_path / "again")).validate()
    row = check.check_technique(cfg, glyphs64, tmp_path / "again")
    assert not row["ok"] and "fused Adam synced the host 2 times per step" in row["reason"]
    result = {"machine": {"device_name": "NVIDIA T4"}, "device": "cuda:0", "torch": torch.__version__,
              "date": "today", "rows": [{"technique": f"fp16 + Adam {impl}", **r} for impl, r in rows.items()]}
    text = check.table(result)
    assert "ok (0 host syncs per step in the optimizer steps)" in text
    assert "ok (2 host syncs per step in the optimizer steps)" in text


def test_only_the_rows_named_run_and_a_cpu_check_lists_what_only_a_gpu_runs(tmp_path, capsys):
    path = tmp_path / "check.json"
    assert main(["check", "--device", "cpu", "--only", "fp32", "channels_last", "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert [r["technique"] for r in result["rows"]] == ["fp32", "channels_last"]
    for row in result["rows"]:  # gantools' own step, counted as a GPU would run it: no sync, no host read
        budget = row["host_budget"]
        assert budget["as_on"] == "cuda" and budget["counted"] == "as run" and budget["launches"] > 0
        assert budget["syncs"] == 0 and budget["cpu_reads"] == 0
    printed = capsys.readouterr().out
    assert iteration_budget.HEADER in printed
    assert f"{iteration_budget.cell(result['rows'][0]['host_budget'])}  ok" in printed
    cuda_only = result["cuda_only_not_run"]
    assert {"fp16 + Adam fused", "compile max-autotune", check.PROFILE_ROW, check.OOM_ROW} <= set(cuda_only)
    assert not {"fp32", "bf16 autocast", "channels_last"} & set(cuda_only)
    assert main(["check", "--device", "cpu", "--only", "warp drive", "--json", str(path)]) == 2
    assert "unknown technique(s) ['warp drive']" in capsys.readouterr().err


def test_a_real_out_of_memory_must_be_told_apart_and_training_go_on(glyphs64, monkeypatch, tmp_path):
    """The CUDA row's logic, on the CPU: the allocation larger than the device stands in for the GPU's."""
    cfg = TrainConfig(**check.BASE, device="cpu", out_dir=str(tmp_path)).validate()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: type("P", (), {"total_memory": 2**20}))

    def refuse(*args, **kwargs):  # what the caching allocator raises
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty",
                        lambda *a, **k: refuse() if a and a[0] == 2**20 + 2**30 else real_empty(*a, **k))
    row = check.check_out_of_memory(cfg, glyphs64)
    assert row["ok"] and row["checks"] == {"out of memory told apart": True, "finite losses after": True}
    # an error that is not out of memory (the host's allocator saying no in its own words) fails the row
    monkeypatch.setattr(torch, "empty", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("can't allocate memory"))
                        if a and a[0] == 2**20 + 2**30 else real_empty(*a, **k))
    row = check.check_out_of_memory(cfg, glyphs64)
    assert not row["ok"] and "RuntimeError was not classified as out of memory" in row["reason"]


def test_each_finished_row_is_saved_so_a_check_stopped_midway_keeps_it(tmp_path, monkeypatch):
    path, saved_rows, real_save = tmp_path / "check.json", [], check.save

    def save(result, where):  # what the file holds after each write
        real_save(result, where)
        saved_rows.append([r["technique"] for r in json.loads(Path(where).read_text())["rows"]])
    monkeypatch.setattr(check, "save", save)
    result = check.run("cpu", progress=lambda line: None, only=["fp32", "channels_last"], save_to=path)
    assert saved_rows == [["fp32"], ["fp32", "channels_last"]]
    assert json.loads(path.read_text())["partial"] is True and "partial" not in result


def test_skipped_rows_do_not_run_and_an_unknown_one_is_refused(tmp_path):
    result = check.run("cpu", progress=lambda line: None, only=["fp32", "channels_last"], skip=["channels_last"])
    assert [r["technique"] for r in result["rows"]] == ["fp32"]
    with pytest.raises(check.ConfigError, match="unknown technique"):
        check.run("cpu", progress=lambda line: None, skip=["compile warp"])


def test_a_host_budget_that_cannot_be_counted_fails_its_row_and_ddp_has_none(tmp_path, monkeypatch, glyphs64):
    """The host budget is counted on a trainer of the row's config (`iteration_budget.budget_of`): where that count
    breaks (here told to), the row fails and says so; a row without a one-process config shows "-"."""
    from gantools.speed import iteration_budget

    cfg = TrainConfig(**check.BASE, device="cpu", out_dir=str(tmp_path)).validate()
    passed = {"ok": True, "reason": None, "images_per_sec": 1.0, "checks": {}}
    counted = check.with_host_budget(passed, cfg, glyphs64, tmp_path)
    assert counted["ok"] and counted["host_budget"]["launches"] > 0 and counted["host_budget"]["syncs"] == 0

    def broken(*args, **kwargs):
        raise RuntimeError("no dispatch here")
    monkeypatch.setattr(iteration_budget, "budget_of", broken)
    row = check.with_host_budget(passed, cfg, glyphs64, tmp_path)
    assert not row["ok"] and row["reason"] == "host budget not counted: RuntimeError: no dispatch here"
    assert check.with_host_budget(passed, None, glyphs64, tmp_path)["host_budget"] is None  # DDP
    assert iteration_budget.cell(None) == "-" and iteration_budget.cell(counted["host_budget"]).endswith(" / 0 / 0")


def test_the_folder_rows_train_on_the_checks_images_as_files_decoded_once(tmp_path, monkeypatch):
    """The folder cache read by the memory-mapped loader (on CUDA also by loader='auto'): the check's own 64 images
    written as PNG files once and decoded once into a cache under the check's own data root, then trained and
    verified as every row is (finite losses, exact resume on a CPU)."""
    from gantools.core import loaders
    from gantools.core.techniques import FOLDER_AUTO, FOLDER_MEMMAP

    assert check.techniques(torch.device("cpu"), True)[FOLDER_MEMMAP] == {"loader": "memmap", "dataset": "folder"}
    assert FOLDER_AUTO not in check.techniques(torch.device("cpu"), True)
    assert check.techniques(torch.device("cuda"), True, fast_bf16=True)[FOLDER_AUTO]["loader"] == "auto"
    fields = check.images_folder(tmp_path, check.BASE)
    assert len(list(Path(fields["data_path"]).rglob("*.png"))) == 64 and any(Path(fields["data_root"]).rglob("*.u8"))
    assert check.images_folder(tmp_path, check.BASE) == fields  # written once
    built, mapped = [], loaders.MappedLoader

    class Counted(mapped):  # the row's trainer reads the cache through the memory-mapped loader
        def __init__(self, *args, **kwargs):
            built.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(loaders, "MappedLoader", Counted)
    result = check.run("cpu", only=[FOLDER_MEMMAP])
    row = result["rows"][0]
    assert row["ok"], row
    assert row["checks"]["finite losses"] and row["checks"]["exact resume"]
    assert built and all(type(d).__name__ == "CachedFolder" for d in built)
