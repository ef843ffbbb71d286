"""gantools doctor on a DistributedDataParallel script (tests/scripts/dcgan_ddp.py, the tutorial's DCGAN under DDP) in
2 CPU processes over gloo, started by `--nproc 2`: rank 0 reports the all-reduce's share of a step, and the findings
only several processes show. Two doctor runs in all (module fixture), since each start of 2 processes costs seconds:
the script as people first write it (no DistributedSampler, accumulation without no_sync) and with both fixed."""
import contextlib
import json
import os
import sys
from pathlib import Path

import pytest

from gantools import doctor
from gantools.cli import main
from gantools.errors import DoctorError

ROOT = Path(__file__).resolve().parents[1]
DDP_SCRIPT = ROOT / "tests" / "scripts" / "dcgan_ddp.py"
SIZES = ["--nz", "16", "--ngf", "8", "--ndf", "8", "--batch-size", "8", "--accum", "2"]


@contextlib.contextmanager
def _output_to(path: Path):
    """Both output streams of this process and its children (rank 0 writes to the terminal) into a file."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "w") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)


@pytest.fixture(scope="module")
def ddp_reports(small_pngs, tmp_path_factory):
    """{"as written": ..., "fixed": ...}: each the JSON report and the printed text of `--nproc 2`, started from this
    process (the processes' start is most of the time: this one has torch imported already)."""
    out, reports = tmp_path_factory.mktemp("ddp-doctor"), {}
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")  # 2 processes on 2 cores: 1 thread each
        env.setenv("PYTHONPATH", str(ROOT))
        for name, flags in (("as written", ["--no-sampler"]), ("fixed", ["--no-sync"])):
            path, log = out / f"{name.replace(' ', '-')}.json", out / f"{name.replace(' ', '-')}.txt"
            with _output_to(log):
                code = main(["doctor", "--nproc", "2", "--steps", "2", "--warmup", "1", "--json", str(path),
                             "--trace", str(out / "trace.json"), str(DDP_SCRIPT), "--dataroot", str(small_pngs),
                             *SIZES, *flags])
            assert code == 0, log.read_text()[-5000:]
            reports[name] = (json.loads(path.read_text()), log.read_text())
    return reports


def _finding(report: dict, kind: str) -> dict | None:
    return next((f for f in report["findings"] if f["kind"] == kind), None)


@pytest.mark.slow
def test_rank_0_reports_the_all_reduce_share_of_a_step_and_each_ddp_wrapper(ddp_reports):
    report, printed = ddp_reports["as written"]
    ddp = report["settings"]["ddp"]
    assert ddp["world_size"] == 2 and ddp["backend"] == "gloo" and len(ddp["step_ms"]) == 2
    # 2 micro-batches: G's backward twice, D's four times (real and fake halves) and twice more in G's step
    assert ddp["all_reduces_per_iteration"] == 8 and 0 < ddp["all_reduce_ms"] < report["step_time_ms"]
    assert 0 <= ddp["overlap"] <= 1 and 0 <= ddp["exposed_ms"] <= ddp["all_reduce_ms"]
    assert {m["name"]: m["backward_passes_per_step"] for m in ddp["models"]} == {"netG": 2, "netD": 4}
    assert all(m["class"] in ("Generator", "Discriminator") and "dcgan_ddp.py:" in m["built_at"]
               for m in ddp["models"])
    assert report["models"]["D"]["class"] == "Discriminator"  # your class inside DDP, not DDP's
    assert "2 processes (gloo)" in printed and "gradient all-reduce: 8 per iteration" in printed
    assert "of the profiled step" in printed and (Path(report["trace_path"]).parent / "trace-rank1.json").is_file()


@pytest.mark.slow
def test_accumulation_without_no_sync_is_found_with_the_change_in_your_names(ddp_reports):
    report, _ = ddp_reports["as written"]
    found = _finding(report, "ddp-no-sync")
    assert found is not None and "netD.no_sync() never entered" in found["seen"]
    assert "4 backward passes reach netD's parameters" in found["seen"]
    assert "with netG.no_sync() if not last" in found["change"] or "with netD.no_sync() if not last" in found["change"]


@pytest.mark.slow
def test_a_loader_without_a_distributed_sampler_is_found_with_identical_batches(ddp_reports):
    report, _ = ddp_reports["as written"]
    found = _finding(report, "ddp-no-sampler")
    assert found is not None and "RandomSampler on each of the 2 processes" in found["seen"]
    same = report["settings"]["ddp"]["same_batches"]
    assert same == [[same[0][1], same[0][1]]] and same[0][1] > 0  # the same seed: the same images on both ranks
    assert "identical" in found["seen"] and found["estimated_speedup"] == 2.0
    assert "DistributedSampler(dataset)" in found["change"] and "sampler.set_epoch(epoch)" in found["change"]


@pytest.mark.slow
def test_with_a_distributed_sampler_and_no_sync_neither_finding_is_made(ddp_reports):
    report, _ = ddp_reports["fixed"]
    ddp = report["settings"]["ddp"]
    assert report["complete"] and not {"ddp-no-sync", "ddp-no-sampler"} & {f["kind"] for f in report["findings"]}
    assert all(m["no_sync_seen"] for m in ddp["models"]) and all(x["distributed"] for x in ddp["loaders"])
    assert ddp["same_batches"][0][0] == 0  # each rank its own share
    # no_sync on the micro-batches that do not step: half the all-reduces of the script as written
    assert ddp["all_reduces_per_iteration"] == ddp_reports["as written"][0]["settings"]["ddp"][
        "all_reduces_per_iteration"] / 2


@pytest.mark.slow
def test_batchnorm_with_broadcast_buffers_is_found_with_its_measured_broadcasts(ddp_reports):
    report, _ = ddp_reports["fixed"]
    found = _finding(report, "ddp-broadcast-buffers")
    assert found is not None and report["settings"]["ddp"]["broadcasts_per_iteration"] > 0
    assert "broadcast_buffers=True (the default) and 2 BatchNorm layers" in found["seen"]
    assert "broadcast_buffers=False" in found["change"]


def test_under_torchrun_the_python_api_and_multi_node_runs_are_one_clear_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(DoctorError, match=r"torchrun --nproc_per_node N -m gantools doctor"):
        doctor.run_script(DDP_SCRIPT)
    assert main(["doctor", "--nproc", "2", str(DDP_SCRIPT)]) == 2  # --nproc starts the processes itself
    assert "--nproc starts the processes itself" in capsys.readouterr().err
    monkeypatch.delenv("WORLD_SIZE")
    assert main(["doctor", "--nproc", "2", "--try", str(DDP_SCRIPT)]) == 2
    assert "--try, --patch and --fid measure fixes in one process" in capsys.readouterr().err
