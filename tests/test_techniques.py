"""One list of techniques: the benchmark ladder, `check`'s rows, tune's priors and search order, the panel's controls
and the verdict's notebooks all follow `techniques.TECHNIQUES`, in its order, so a technique added there shows up in
each of them."""
from pathlib import Path

import pytest
import torch

from gantools.speed import bench, check

from gantools.core import techniques

from gantools.tuning import space
from gantools.core.config import TrainConfig, knobs, speed_knobs
from gantools.speed.profiling import ProfileReport, diagnose
from gantools.core.techniques import TECHNIQUES

ROOT = Path(__file__).resolve().parents[1]
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def _in_list_order(names: list, owners: dict) -> bool:
    """Whether `names` (rows) come in the order of the techniques that own them."""
    index = {t.knob: i for i, t in enumerate(TECHNIQUES)}
    positions = [index[owners[name]] for name in names]
    return positions == sorted(positions)


def test_every_speed_field_is_one_technique_with_a_notebook_that_exists():
    assert [t.knob for t in TECHNIQUES] == list(dict.fromkeys(t.knob for t in TECHNIQUES)), "each once"
    assert {t.knob for t in TECHNIQUES} == set(speed_knobs()) | {"batch_size", "r1_interval"}  # r2's comes with r1's
    for t in TECHNIQUES:
        assert (ROOT / "notebooks" / t.notebook).exists(), t.notebook
        assert set(t.devices) <= {"cpu", "cuda"} and len(t.prior) == 2
        for row in (*t.ladder, *t.checks):
            assert t.knob in row.change, f"{row.name} does not turn {t.knob}"
            assert set(row.change) <= set(knobs())
        assert set(t.panel) <= set(knobs())


@pytest.mark.parametrize("device", [CPU, CUDA])
@pytest.mark.parametrize("compile_ok", [True, False])
def test_the_ladder_is_each_techniques_rows_in_order_then_the_presets(device, compile_ok, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))  # an A100: bf16
    steps = bench.ladder(device, compile_ok)
    names = list(steps)
    rows = techniques.rows("ladder", device, compile_ok)
    assert names == ["reference (tutorial loop)", *[r.name for r in rows], "all together", "max throughput (batch x2)"]
    owners = {r.name: t.knob for t in TECHNIQUES for r in t.ladder}
    assert _in_list_order([r.name for r in rows], owners)
    for t in TECHNIQUES:  # a technique for this device has its rows here
        for row in t.ladder:
            if device.type in (row.devices or t.devices) and (row.needs != "compile" or compile_ok):
                assert steps[row.name] == row.change
    for row in rows:  # 'all together' holds every row that joins it, and fp16 only where bf16 is missing
        assert (row.change.items() <= steps["all together"].items()) == row.together
        assert row.together == (row.name not in ("pinned memory", "fp16 + GradScaler"))


@pytest.mark.parametrize("device", [CPU, CUDA])
def test_checks_rows_follow_the_list_then_the_gan_family(device, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))  # an A100: bf16
    rows = list(check.techniques(device, True))
    owners = {r.name: t.knob for t in TECHNIQUES for r in t.checks}
    own = [name for name in rows if name in owners]
    assert rows[0] == "fp32" and rows[1:len(own) + 1] == own, "fp32, then the techniques, then the GAN family"
    assert own == [r.name for r in techniques.rows("checks", device, True)] and _in_list_order(own, owners)
    assert ("fp16 autocast + GradScaler" in rows) == (device.type == "cuda")


def test_tunes_priors_and_search_order_follow_the_list():
    assert list(space.PRIOR) == [t.knob for t in TECHNIQUES]
    assert space.PRIOR == {t.knob: t.prior for t in TECHNIQUES}
    cfg = TrainConfig(loss="bce-sigmoid", transform="per-sample", num_workers=2, sync_every_step=True,
                      freeze_d=False, compile="off")
    candidates, skipped = space.search_space(cfg, CPU, space=(*speed_knobs(), "batch_size"))
    index = {t.knob: i for i, t in enumerate(TECHNIQUES)}
    order = [(-c.prior, index[next(iter(c.change))]) for c in candidates]
    assert order == sorted(order), "likeliest first; among equal priors, the list's order"
    offered = {next(iter(c.change)) for c in candidates} | {c.split("=")[0] for c, _ in skipped}
    assert offered >= {t.knob for t in TECHNIQUES} - {"persistent_workers", "prefetch_factor", "grad_accum_steps",
                                                      "r1_interval"}  # no penalty here
    for t in TECHNIQUES:
        if t.devices == ("cuda",):  # a CUDA technique is never a candidate on a CPU, and says why
            assert t.knob not in {k for c in candidates for k in c.change}
            assert any(c.split("=")[0] == t.knob for c, _ in skipped)


def test_the_panels_controls_are_the_lists_fields_in_order():
    from gantools.workbook.panel import CONTROL_FIELDS, PROFILE_FIELDS

    assert CONTROL_FIELDS == (*[name for t in TECHNIQUES for name in t.panel], "steps")
    assert PROFILE_FIELDS == ("precision", "loss", "transform", "num_workers", "sync_every_step", "channels_last")
    assert PROFILE_FIELDS == tuple(name for t in TECHNIQUES for name in t.profiled)


@pytest.mark.parametrize("wait, busy, ops, cfg, knob", [
    (50.0, 50.0, [], TrainConfig(transform="per-sample"), "transform"),
    (50.0, 50.0, [], TrainConfig(), "num_workers"),
    (0.0, 100.0, [("aten::convolution", 80.0)], TrainConfig(), "precision"),
    (0.0, 100.0, [("aten::convolution", 80.0)], TrainConfig(precision="bf16"), "channels_last"),
])
def test_the_verdict_names_the_notebook_that_teaches_its_fix(wait, busy, ops, cfg, knob):
    report = ProfileReport("cpu", 5, 128, 100.0, 100.0, {"data wait": wait}, busy, top_ops=ops)
    verdict = diagnose(report, cfg)
    assert next(iter(verdict.fix)) == knob
    assert verdict.notebook == techniques.notebook(knob) == techniques.by_knob(knob).notebook.removesuffix(".ipynb")



GPUS = [((7, 5), "fp16"), ((8, 0), "bf16")]  # a T4 (a V100 or P100 alike): no fast bf16; an A100


@pytest.fixture
def gpu(monkeypatch, request):
    """A GPU given by its compute capability (what `hardware.supports_bf16` reads), and its 16-bit precision."""
    capability, half = request.param
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    return half


@pytest.mark.parametrize("gpu", GPUS, indirect=True)
def test_the_ladder_benchmarks_bf16_where_the_gpu_has_it_and_fp16_with_a_gradscaler_where_not(gpu):
    """Validation refuses bf16 on a GPU before Ampere: there the ladder has no bf16 row, and 'all together' (which
    the max-throughput row and `bench.scaling` train) uses fp16."""
    steps = bench.ladder(CUDA, False)
    sixteen = {change["precision"] for change in steps.values() if change.get("precision", "fp32") != "fp32"}
    assert ("bf16 autocast" in steps) == (gpu == "bf16") and "fp16 + GradScaler" in steps
    assert sixteen == ({"fp16"} if gpu == "fp16" else {"bf16", "fp16"})
    assert steps["all together"]["precision"] == steps["max throughput (batch x2)"]["precision"] == gpu
    assert steps["all together"]["loss"] == "bce"  # the reference's Sigmoid + BCELoss is unsafe in 16-bit


@pytest.mark.slow_bf16
def test_a_cpu_without_native_bf16_measures_bf16_but_neither_joins_it_to_all_together_nor_proposes_it():
    """Emulated bf16 runs a GAN step many times slower than fp32 (docs/profiling.md): the ladder still measures its
    row, but 'all together' and max throughput stay in fp32, and the profiler's verdict passes on to the next fix."""
    steps = bench.ladder(CPU, False)
    assert "bf16 autocast" in steps and "precision" not in steps["all together"]
    assert "precision" not in steps["max throughput (batch x2)"]
    report = ProfileReport("cpu", 5, 128, 100.0, 100.0, {"data wait": 0.0}, 100.0,
                           top_ops=[("aten::convolution", 80.0)])
    assert diagnose(report, TrainConfig(loss="bce-sigmoid")).fix.get("precision") is None
    offers = techniques.by_knob("precision").candidates(TrainConfig(), techniques.Where(device=CPU, cores=2))
    assert {o.value: o.why for o in offers}["bf16"].startswith("no native bf16"), "tune lists bf16 as skipped"


@pytest.mark.parametrize("flags, fast", [((False, False), False), ((True, False), True), ((False, True), True)])
def test_a_cpu_has_fast_bf16_only_with_avx512_bf16_or_amx(monkeypatch, flags, fast):
    """`hardware.fast_bf16` itself (the suite pins its answer: tests/conftest.py) reads the CPU's flags through
    torch.cpu; bf16 autocast runs on the CPU either way."""
    from gantools.measuring import hardware

    for name, value in zip(("_is_avx512_bf16_supported", "_is_amx_tile_supported"), flags, strict=True):
        monkeypatch.setattr(torch.cpu, name, lambda value=value: value, raising=False)
    assert hardware.fast_bf16.__wrapped__(CPU) is fast and hardware.supports_bf16(CPU)


@pytest.mark.parametrize("gpu", GPUS, indirect=True)
def test_the_verdict_proposes_the_16_bit_precision_the_gpu_has(gpu):
    report = ProfileReport("cuda", 5, 128, 100.0, 100.0, {"data wait": 0.0}, 100.0,
                           top_ops=[("aten::convolution", 80.0)])
    verdict = diagnose(report, TrainConfig(loss="bce-sigmoid"))
    assert verdict.bottleneck == "compute-bound" and verdict.fix == {"precision": gpu, "loss": "bce"}
    assert verdict.technique.startswith(f"{gpu} autocast")


@pytest.mark.parametrize("gpu", GPUS, indirect=True)
def test_tune_tries_the_16_bit_precision_the_gpu_has(gpu):
    candidates, skipped = space.search_space(TrainConfig(), CUDA)
    assert [c.change["precision"] for c in candidates if "precision" in c.change] == [gpu]
    assert not any(c.startswith("precision") for c, _ in skipped)
    # with fp16 'auto' already builds fused Adam there (config.optimizer_kernels): only the others are worth a try
    impls = lambda cfg: [c.change["optimizer_impl"] for c in space.search_space(cfg, CUDA)[0]  # noqa: E731
                         if "optimizer_impl" in c.change]
    assert impls(TrainConfig(precision="fp16")) == ["foreach", "for-loop"]
    assert impls(TrainConfig(precision=gpu, optimizer_impl="foreach")) == ["fused", "for-loop"]


def test_the_search_space_offers_and_skips_each_techniques_values_in_order(monkeypatch):
    """Pinned: every candidate and every skipped value with its reason, likeliest first, on a CPU."""
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr(bench, "can_compile", lambda device: True)
    cfg = TrainConfig(loss="bce-sigmoid", transform="per-sample", loader="dataloader", num_workers=3,
                      sync_every_step=True, freeze_d=False, compile="off", grad_accum_steps=4)
    candidates, skipped = space.search_space(cfg, CPU, space=(*speed_knobs(), "batch_size"), own_dataset=True,
                                             cpu_tensors=False)
    assert [c.label for c in candidates] == [
        "precision=bf16, loss=bce", "channels_last=True", "compile=default", "freeze_d=True",
        "batch_size=256, lr_g=0.000282842712474619, lr_d=0.000282842712474619",
        "loader=device, transform=on-device, num_workers=0", "sync_every_step=False", "persistent_workers=True",
        "prefetch_factor=4", "grad_accum_steps=2", "optimizer_impl=fused", "optimizer_impl=foreach",
        "optimizer_impl=for-loop"]
    not_cpu = "your dataset's tensors are not on the CPU: a forked worker cannot use CUDA"
    assert skipped == [("precision=fp16", "fp16 needs CUDA (GradScaler and fast fp16 kernels)"),
                       ("transform=on-device", "your own dataset brings its own transforms"),
                       ("num_workers=1", not_cpu), ("num_workers=2", not_cpu),
                       ("pin_memory=True", "pinned memory only helps copies to a GPU"),
                       ("cuda_graphs=True", "CUDA graphs need a CUDA GPU"),
                       ("tf32=True", "TF32 needs an Ampere or newer GPU"), ("cudnn_benchmark=True", "cuDNN is CUDA's")]
    monkeypatch.setattr(bench, "can_compile", lambda device: False)
    assert space.search_space(cfg, CPU, space=("compile",))[1] == [
        ("compile", "torch.compile needs a C++ compiler on the CPU")]


@pytest.mark.parametrize("passed, main_thread, why", [
    (False, True, "not validated by `python -m gantools check` on this GPU"),
    (False, False, "not validated by `python -m gantools check` on this GPU"),
    (True, False, "CUDA graphs are refused in a background thread")])
def test_the_search_space_on_a_gpu_without_fast_bf16(monkeypatch, passed, main_thread, why):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(check, "validated", lambda technique, device, root=None: passed)
    candidates, skipped = space.search_space(TrainConfig(loader="dataloader", num_workers=0), CUDA,
                                             main_thread=main_thread)
    assert [c.label for c in candidates] == [
        "precision=fp16", "loader=device", "channels_last=True", "compile=default",
        "num_workers=2, persistent_workers=True", "cudnn_benchmark=True", "pin_memory=True",
        "optimizer_impl=foreach", "optimizer_impl=for-loop"]  # 'auto' is fused on CUDA already
    graphs = ("CUDA graphs are refused in a background thread" if not main_thread else
              "loader='dataloader': a graph gathers its batch from device-resident data inside the capture; use "
              "loader='device'")
    assert skipped == [("compile=max-autotune", why), ("compile=reduce-overhead", why), ("cuda_graphs=True", graphs),
                       ("tf32=True", "TF32 needs an Ampere or newer GPU")]


def test_checks_rows_are_pinned():
    assert list(check.techniques(CPU, True)) == [
        "fp32", "bf16 autocast", "device loader", techniques.FOLDER_MEMMAP, "DataLoader, 2 workers", "Adam fused",
        "Adam foreach",
        "accumulation, 2 micro-batches", "channels_last", "compile default", "WGAN-GP, 2 D steps", "R1 lazy + EMA",
        "conditional", "warm-up + cosine schedule", "activation checkpointing", "R3GAN: rpgan, R1 + R2"]
    assert list(check.techniques(CUDA, False, fast_bf16=False)) == [
        "fp32", "fp16 autocast + GradScaler", "device loader", techniques.FOLDER_MEMMAP, techniques.FOLDER_AUTO,
        "DataLoader, 2 workers, pinned", "Adam fused",
        "Adam foreach", "fp16 + Adam fused", "fp16 + Adam foreach", "fp16 + Adam for-loop",
        "accumulation, 2 micro-batches", "channels_last", "compile reduce-overhead", "compile max-autotune",
        "whole-step CUDA graphs", "TF32 + cudnn.benchmark", "WGAN-GP, 2 D steps", "R1 lazy + EMA", "conditional",
        "warm-up + cosine schedule",
        "activation checkpointing", "R3GAN: rpgan, R1 + R2", "WGAN-GP, fp16 + GradScaler",
        "WGAN-GP + compile reduce-overhead", "R3GAN, fp16 + GradScaler", check.R3GAN_FP32_ROW,
        "R3GAN + compile reduce-overhead", check.CUDA_TENSORS]


@pytest.mark.parametrize("device, wait, busy, syncs, ops, cfg, fix, text", [
    ("cpu", 50.0, 50.0, 0, [], TrainConfig(transform="per-sample"),
     {"transform": "on-device", "num_workers": 0, "persistent_workers": False, "prefetch_factor": None},
     "drop per-image PIL transforms: copy uint8 batches and normalise them on the device"),
    ("cpu", 50.0, 50.0, 0, [], TrainConfig(transform="per-sample", dataset="folder", data_path="."),
     {"transform": "on-device", "loader": "auto", "num_workers": 0, "pin_memory": None, "persistent_workers": False,
      "prefetch_factor": None},
     "decode the folder once (gantools prepare / transform='on-device'), then read it with loader='auto': the whole "
     "cache on the device where it fits, else memory-mapped batches"),
    ("cuda", 50.0, 50.0, 0, [], TrainConfig(dataset="folder", data_path=".", num_workers=2, pin_memory=True),
     {"loader": "auto", "num_workers": 0, "pin_memory": None, "persistent_workers": False, "prefetch_factor": None},
     "read the folder's cache with loader='auto': the whole cache on the device where it fits, else memory-mapped "
     "batches"),
    ("cpu", 50.0, 50.0, 0, [], TrainConfig(loader="dataloader", num_workers=2),
     {"num_workers": 4, "persistent_workers": True},
     "more DataLoader workers, or a dataset decoded once and held on the device"),
    ("cuda", 0.0, 30.0, 4, [], TrainConfig(sync_every_step=True), {"sync_every_step": False},
     "remove per-step host syncs (.item()), then torch.compile (mode='reduce-overhead', CUDA graphs, once "
     "`python -m gantools check` has validated it on this machine), or a larger batch"),
    ("cuda", 0.0, 30.0, 0, [], TrainConfig(sync_every_step=True), {"compile": "default"},
     "torch.compile (mode='reduce-overhead', CUDA graphs, once `python -m gantools check` has validated it on this "
     "machine), or a larger batch"),
    ("cpu", 0.0, 100.0, 0, [("aten::convolution", 80.0)], TrainConfig(loss="bce-sigmoid"),
     {"precision": "bf16", "loss": "bce"}, "bf16 autocast"),
    ("cpu", 0.0, 100.0, 0, [("aten::convolution", 80.0)], TrainConfig(precision="bf16"), {"channels_last": True},
     "channels_last, then torch.compile"),
    ("cuda", 0.0, 100.0, 0, [("aten::add", 80.0)], TrainConfig(), {"compile": "default"},
     "torch.compile to fuse elementwise ops, channels_last"),
])
def test_each_verdicts_fix_and_its_words_are_pinned(monkeypatch, device, wait, busy, syncs, ops, cfg, fix, text):
    monkeypatch.setattr("os.cpu_count", lambda: 3)
    monkeypatch.setattr(check, "validated", lambda technique, device, root=None: False)
    report = ProfileReport(device, 5, 128, 100.0, 100.0, {"data wait": wait}, busy, top_ops=ops,
                           host_syncs_per_step=syncs)
    verdict = diagnose(report, cfg)
    assert (verdict.fix, verdict.technique) == (fix, text)
    assert (verdict.estimated_speedup is None) == (fix == {"channels_last": True}), "channels_last: measure it"


@pytest.mark.parametrize("device", [CPU, CUDA])
def test_each_technique_offers_only_its_own_field(device, monkeypatch):
    """search_space gives an offer its technique's prior: an offer of another field would be ordered wrongly."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    where = techniques.Where(device=device, cores=4)
    for cfg in (TrainConfig(), TrainConfig(loader="dataloader", num_workers=2, grad_accum_steps=2, compile="default")):
        for t in TECHNIQUES:
            assert {o.field for o in t.candidates(cfg, where)} <= {t.knob}, t.knob


def test_a_data_bound_folder_is_offered_its_cache_by_the_verdict_and_by_tune(tmp_path):
    """One list decides both: the profiler's fix for a folder decoded per sample is the cache read without a
    DataLoader (`_fix_transform`), and tune's search space for it holds the cache (transform='on-device') and
    loader='auto', never loader='device' blind (a folder's cache may not fit the device)."""
    cfg = TrainConfig(dataset="folder", data_path=str(tmp_path), transform="per-sample", num_workers=2,
                      out_dir=str(tmp_path / "run"))
    report = ProfileReport("cpu", 5, 128, 100.0, 100.0, {"data wait": 60.0}, 40.0)
    verdict = diagnose(report, cfg)
    assert verdict.bottleneck == "data-bound" and verdict.notebook == "03_data_loading"
    assert verdict.technique.startswith("decode the folder once (gantools prepare / transform='on-device')")
    assert cfg.replace(**verdict.fix).validate().loader == "auto"
    cached = cfg.replace(**verdict.fix)
    assert diagnose(report, cached.replace(loader="dataloader")).fix["loader"] == "auto"  # the cache, DataLoader-read
    candidates, skipped = space.search_space(cfg, CPU, space=("transform", "loader"))
    changes = [c.change for c in candidates]
    assert {"transform": "on-device"} in changes
    assert {"loader": "auto", "transform": "on-device", "num_workers": 0} in changes
    assert not any(c.get("loader") == "device" for c in changes)
    assert dict(skipped)["loader=device"].startswith("a folder's cache may not fit the device")
    for change in changes:
        cfg.replace(**change).validate()
    glyphs = TrainConfig(transform="per-sample", num_workers=2)  # not a folder: the device loader, as before
    assert [c.change.get("loader") for c in space.search_space(glyphs, CPU, space=("loader",))[0]] == ["device"]


@pytest.mark.parametrize("loader", ["device", "memmap", "auto"])
def test_a_data_bound_step_on_a_loader_without_workers_is_never_told_to_add_workers(loader):
    """Workers are a DataLoader's: validation refuses them with the in-memory loaders, so no verdict proposes them
    there (it names no fix the config could take rather than one it would refuse)."""
    cfg = TrainConfig(loader=loader)
    report = ProfileReport("cpu", 5, 128, 100.0, 100.0, {"data wait": 60.0}, 40.0)
    verdict = diagnose(report, cfg)
    assert verdict.bottleneck == "data-bound"
    assert "num_workers" not in verdict.fix and verdict.fix == ({"loader": "auto"} if loader == "memmap" else {})
    cfg.replace(**verdict.fix).validate()
