"""10_several_gpus's measuring: Amdahl's law read from a measured speed-up and the conclusion drawn from it, a race
handed from rank 0 to the notebook, and, under torchrun with 2 CPU processes, racing one-process loops in the same
turns as DDP loops, counting all-reduces, profiling the collectives and comparing the processes' networks."""
import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from gantools.measuring.protocol import amdahl_speedup, parallel_share
from gantools.measuring.turns import Measured
from gantools.workbook import conclusions, data_parallel, tutorial

from conftest import TINY

ROOT = Path(__file__).resolve().parents[1]


def test_the_parallel_share_is_amdahls_law_solved_for_p_and_clipped():
    assert parallel_share(1.6, 2) == pytest.approx(0.75)
    assert amdahl_speedup(parallel_share(1.6, 2), 2) == pytest.approx(1.6)
    assert amdahl_speedup(0.75, 4) == pytest.approx(1 / (0.25 + 0.75 / 4))
    assert parallel_share(0.9, 2) == 0.0 and parallel_share(2.3, 2) == 1.0  # slower: nothing parallel; superlinear
    with pytest.raises(ValueError, match="at least 2"):
        parallel_share(1.2, 1)


def test_a_prediction_comes_only_from_a_speed_up_the_paired_range_calls_faster():
    faster = conclusions.scaling_prediction(1.6, "1 process", 2, paired=(1.5, 1.7))
    assert faster.keep and "P = 0.75" in faster.text and "(0.67-0.82 over the paired range)" in faster.text
    assert "N = 4: 2.29x (57%)" in faster.text and "N = 8: 2.91x (36%)" in faster.text
    assert "never more than 4.0x" in faster.text and "scaling efficiency 80%" in faster.text
    unsure = conclusions.scaling_prediction(1.05, "1 process", 2, paired=(0.95, 1.12))
    assert not unsure.keep and "No parallel share" in unsure.text and "P =" not in unsure.text
    single = conclusions.scaling_prediction(1.6, "1 process", 2)  # one measurement: no range, no P
    assert not single.keep and "one measurement" in single.text
    full = conclusions.scaling_prediction(2.0, "1 process", 2, paired=(1.9, 2.1))
    assert full.keep and "P = 1.00" in full.text and "cannot bound" in full.text


def test_a_race_handed_over_as_json_reads_back_as_the_same_race():
    measured = {"one": Measured(subject="a", warmup_s=1.0, turns=[(100.0, (4, 0.5, 2.0)), (110.0, (6, 0.4, 2.1))],
                                images_per_sec_runs=[100.0, 110.0]),
                "two": Measured(subject="b", warmup_s=2.0, turns=[(150.0, (4, 0.5, 2.0)), (180.0, (6, 0.4, 2.1))],
                                images_per_sec_runs=[150.0, 180.0])}
    race = tutorial.Race(measured, {"one": (90.0, (2, 0.6, 1.9)), "two": (140.0, (2, 0.6, 1.9))}, 768)
    back = data_parallel.race_from_record(json.loads(json.dumps(data_parallel.race_record(race))))
    assert back.images_per_sec == race.images_per_sec and back.images == 768
    assert back.ratio("two", "one") == race.ratio("two", "one") and back.paired("two", "one") == (1.5, 180 / 110)
    assert back.losses == race.losses and back._repr_markdown_() == race._repr_markdown_()


WORKER = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from gantools.workbook import data_parallel, tutorial

    dist.init_process_group("gloo")
    SIZE = dict(nz=8, ngf=8, ndf=8, batch_size=16)

    def ddp_gan():
        gan = tutorial.plain_gan("cpu", **SIZE)
        gan.G, gan.D = DDP(gan.G, broadcast_buffers=False), DDP(gan.D, broadcast_buffers=False)
        return gan

    def half_step(gan, real):  # each rank its half of the batch
        return tutorial.train_step(gan, real.chunk(2)[dist.get_rank()])

    ddp = ddp_gan()
    counts = [data_parallel.count_all_reduces(ddp.G), data_parallel.count_all_reduces(ddp.D)]
    race = data_parallel.race_across_ranks({"alone": (tutorial.train_step, tutorial.plain_gan("cpu", **SIZE)),
                                            "ddp": (half_step, ddp)}, 6, 2, alone={"alone": 2})
    one_step = data_parallel.all_reduces_in_a_step(half_step, ddp, counts)
    profile = data_parallel.profiled_collectives(half_step, ddp_gan(), steps=2)
    apart = data_parallel.gathered_differences({"G": ddp.G.module, "D": ddp.D.module})
    if dist.get_rank() == 0:
        Path(sys.argv[1], "rank0.json").write_text(json.dumps({
            "race": data_parallel.race_record(race), "calls": [c["calls"] for c in counts], "one_step": one_step,
            "profile": profile,
            "apart": apart, "threads": torch.get_num_threads()}))
    dist.destroy_process_group()
''')


@pytest.mark.slow
def test_two_processes_race_a_one_process_loop_in_turns_and_rank_0_hands_back_what_they_measured(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    measured = data_parallel.launch(script, tmp_path / "out", processes=2, threads=1, timeout=300)
    race = data_parallel.race_from_record(measured["race"])
    assert set(race.images_per_sec) == {"alone", "ddp"} and all(v > 0 for v in race.images_per_sec.values())
    assert len(race.measured["ddp"].images_per_sec_runs) == 2 and race.paired("ddp", "alone") is not None
    # the DDP loop stepped 6 times: G's and D's gradients each all-reduced once per step (and D's once more in
    # G's step, whose backward runs through D's DDP wrapper in the tutorial's step)
    assert measured["calls"] == [7, 14] and measured["one_step"] == 3  # and one more step after the race
    assert measured["profile"]["all_reduces_per_iteration"] >= 2 and measured["profile"]["step_ms"] > 0
    assert measured["profile"]["broadcasts_per_iteration"] == 0  # broadcast_buffers=False
    # the same averaged gradients: identical weights; BatchNorm statistics from each rank's own half batch
    assert all(d["weights"] == 0 for d in measured["apart"].values())
    assert any(d["running statistics"] > 0 for d in measured["apart"].values())
    assert measured["threads"] == 1  # the last chunk was a shared one: back to one thread


def test_a_launch_that_fails_says_what_the_processes_printed(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("raise SystemExit('no GPUs today')\n")
    with pytest.raises(RuntimeError, match="no GPUs today"):
        data_parallel.launch(script, tmp_path / "out", processes=1, timeout=120)


@pytest.mark.slow
def test_the_scaling_panel_runs_the_bench_keeping_the_global_batch_and_shows_the_torchrun_command(tmp_path):
    pytest.importorskip("ipywidgets")
    panel = data_parallel.ScalingPanel({k: v for k, v in TINY.items() if k not in ("steps", "log_interval")},
                                       steps=4, out_dir=tmp_path)
    assert panel.controls["processes"].value == 2 and panel.controls["keep_global_batch"].value
    panel.run(block=True)
    assert panel.status.value.startswith("Done: 2 processes ran"), panel.status.value
    assert "torchrun --nproc_per_node 2 -m gantools train --preset reference" in panel.status.value
    assert "--loader device" in panel.status.value and "--batch-size 16" in panel.status.value  # the bench's config
    one, two = panel.result["rows"]
    assert one["global_batch"] == two["global_batch"] == 16 and two["batch_per_process"] == 8
    assert len(two["images_per_sec_runs"]) == 2 and two["paired"] is not None and panel.table.outputs
    assert "a global batch of 16 shared by the processes" in panel.table.outputs[0]["data"]["text/markdown"]
    assert not panel.button.disabled


def test_every_rank_runs_the_same_script_so_the_launcher_sets_one_thread_each(monkeypatch, tmp_path):
    seen = {}

    def fake_run(command, env, **kw):
        seen.update(command=command, threads=env["OMP_NUM_THREADS"])
        (tmp_path / "out" / "rank0.json").write_text("{}")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(data_parallel.subprocess, "run", fake_run)
    assert data_parallel.launch("s.py", tmp_path / "out", processes=2, threads=1) == {}
    assert seen["threads"] == "1" and seen["command"][-2:] == ["s.py", str(tmp_path / "out")]
    assert seen["command"][1:3] == ["-m", "torch.distributed.run"] and "--nproc_per_node" in seen["command"]


def test_the_panels_command_trains_the_global_batch_the_bench_trained_with_the_most_processes():
    pytest.importorskip("ipywidgets")
    panel = data_parallel.ScalingPanel({"batch_size": 16, "ngf": 8, "ndf": 8, "nz": 8}, steps=4)
    assert "--batch-size 16" in panel.command() and "--channels-last" in panel.command()  # 'all together'
    panel.controls["keep_global_batch"].value = False  # each process trained 16: together 32 a step
    assert "--batch-size 32" in panel.command() and panel.command().startswith("torchrun --nproc_per_node 2 ")


def _race(images_per_sec_runs: dict) -> tutorial.Race:
    return tutorial.Race({n: Measured(subject=n, images_per_sec_runs=v) for n, v in images_per_sec_runs.items()},
                         {}, 0)


PROFILE = {"step_ms": 319.1, "all_reduce_ms": 26.1, "exposed_ms": 12.1, "overlap": 0.54}


@pytest.mark.parametrize("quiet, said, short, keep", [
    ([416, 428, 430, 431, 425], "**whether it reaches the 5% that counts as a bottleneck is not settled**",
     "bottleneck or not: not settled", False),
    ([446, 448, 450, 451, 445], "**a bottleneck**", "a bottleneck", True),
    ([406, 408, 410, 411, 405], "**not a bottleneck**", "not a bottleneck", False)])
def test_the_race_and_the_profile_give_one_answer_on_the_all_reduce(quiet, said, short, keep):
    """The race measures the all-reduce's cost; the profile's exposed and whole shares bound it over gloo. The
    verdict reads the bottleneck rule at both ends of the race's paired range: ends that disagree are not settled."""
    ddp = [398, 400, 405, 395, 402]
    race = _race({"ddp": ddp, "quiet": quiet})
    shares = data_parallel.all_reduce_shares(race, "ddp", "quiet", PROFILE)
    assert shares[data_parallel.EXPOSED][0] == pytest.approx(12.1 / 319.1)
    assert shares[data_parallel.WHOLE][0] == pytest.approx(26.1 / 319.1)
    low, high = shares[data_parallel.RACED][1:]
    ratios = [a / b for a, b in zip(ddp, quiet, strict=True)]
    assert (low, high) == pytest.approx((1 - max(ratios), 1 - min(ratios)))
    cost = data_parallel.all_reduce_cost(shares, "gloo", "fewer, larger all-reduces")
    assert said in cost.text and cost.keep is keep
    first = cost.text.split("\n\n")[0]
    assert first.startswith("The gradient all-reduce costs") and "the profile" not in first  # one answer first
    assert "3.8%-8.2%" in cost.text
    assert cost.short.startswith("**The gradient all-reduce**: ") and "3.8%-8.2% by the profile" in cost.short
    assert cost.short.endswith(f"**{short}**.")


def test_a_race_outside_the_profiles_bounds_is_said_to_disagree():
    race = _race({"ddp": [300, 301, 299, 300, 302], "quiet": [420, 421, 419, 420, 422]})  # 29% in the race
    cost = data_parallel.all_reduce_cost(data_parallel.all_reduce_shares(race, "ddp", "quiet", PROFILE), "gloo",
                                         "fix")
    assert "**the two measurements disagree**" in cost.text and "quote the race" in cost.text
    over_nccl = data_parallel.all_reduce_cost(data_parallel.all_reduce_shares(
        _race({"ddp": [410, 412, 409, 411, 410], "quiet": [420, 421, 419, 420, 422]}), "ddp", "quiet",
        {"step_ms": 20.0, "all_reduce_ms": 2.0}), "nccl", "fix")  # a GPU's profile: no overlap, all of it
    assert "at most its whole time, 0.0%-10.0%" in over_nccl.text and "**the two measurements agree**" in over_nccl.text
