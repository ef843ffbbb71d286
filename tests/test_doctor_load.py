"""Honest numbers on a busy machine: the doctor reads the CPU time other processes take while it measures
(`measuring.load`), doubts a profiler overhead no quiet machine gives, and then warns instead of reporting the
timings as findings; `--try` says "measure again on a quiet machine" on a paired range wider than the effect, and
what it tried. Every verdict here is on a reading handed in, except the last test's, which loads a core on purpose
and asserts on the reading it made, not on a timing."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch.utils.data import DataLoader

from gantools import doctor
from gantools.doctor.diagnosis import analysis
from gantools.doctor.findings.report import DoctorReport, Finding, Verdict
from gantools.doctor.fixes import catalogue as fixes
from gantools.doctor.trying import try_fixes as trying
from gantools.doctor.trying.trial import Trial
from gantools.measuring import load as machine
from gantools.measuring.load import BUSY_SHARE, CpuTimes, Load, LoadWindow, doubts

from conftest import BatchFreeD, BatchFreeG
from test_doctor import bce_step

BUSY = Load(seconds=2.0, cores=2, others_s=1.9).describe()   # a second process on one of two cores
QUIET = Load(seconds=2.0, cores=2, others_s=0.1).describe()


def test_the_window_counts_other_processes_cpu_time_not_this_process_or_its_children(fake_clock):
    readings = iter([CpuTimes(cores=2, busy_s=100.0, own_s=10.0), CpuTimes(cores=2, busy_s=103.0, own_s=11.5)])
    window = LoadWindow(read=lambda: next(readings)).start()
    fake_clock.advance(2.0)
    load = window.stop()
    assert load.others_s == pytest.approx(1.5) and load.seconds == pytest.approx(2.0, abs=0.01)
    assert load.others_share == pytest.approx(1.5 / 4, abs=0.01) and load.busy
    short = Load(seconds=0.1, cores=2, others_s=0.06, error_s=0.06)  # a few ticks: rounding, not load
    assert short.others_share > BUSY_SHARE and not short.busy and not doubts(short.describe(), None)
    assert LoadWindow(read=lambda: None).start().stop() is None  # no /proc: nothing read, nothing judged
    assert LoadWindow().stop() is None  # never started


def fake_proc(root, cores: dict, processes: dict):
    """A /proc of `cores` (core -> busy ticks) and `processes` (pid -> (parent, CPU ticks)), as the kernel writes it."""
    lines = [f"cpu{c} {busy} 0 0 500 7 0 0 0 0 0" for c, busy in cores.items()]  # user .. steal, idle and iowait
    (root / "stat").write_text("cpu  0 0 0 0 0 0 0 0 0 0\n" + "\n".join(lines) + "\n")
    for pid, (parent, ticks) in processes.items():
        (root / str(pid)).mkdir(exist_ok=True)
        fields = ["S", str(parent)] + ["0"] * 9 + [str(ticks), "0", "0", "0"] + ["0"] * 10
        (root / str(pid) / "stat").write_text(f"{pid} (python (a worker)) " + " ".join(fields))
    return str(root)


def test_the_reading_counts_this_process_and_its_children_and_a_job_s_sibling_ranks_as_its_own(tmp_path,
                                                                                               monkeypatch):
    me, parent = os.getpid(), os.getppid()
    cores = {c: 1000 for c in os.sched_getaffinity(0)}
    proc = fake_proc(tmp_path, {**cores, 999: 5000}, {  # a core this process may not run on is left out
        me: (parent, 300), 10**7 + 1: (me, 40), parent: (1, 2), 10**7 + 2: (parent, 50), 10**7 + 3: (1, 700)})
    reading = machine.read_cpu_times(proc)
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert reading.cores == len(cores) and reading.busy_s == pytest.approx(1000 * len(cores) * tick)
    assert reading.own_s == pytest.approx(340 * tick)  # itself and its worker; not a sibling, not a stranger
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # one of two ranks: the other is the same job's
    assert machine.read_cpu_times(proc).own_s == pytest.approx((340 + 2 + 50) * tick)


def test_a_reading_of_this_machine_has_its_cores_and_this_process_s_time():
    first = machine.read_cpu_times()
    if first is None:
        pytest.skip("no /proc here: nothing to read")
    sum(i * i for i in range(200_000))
    now = machine.read_cpu_times()
    assert first.cores == len(os.sched_getaffinity(0)) and now.own_s >= first.own_s and now.busy_s >= first.busy_s


@pytest.mark.parametrize("load, overhead, said", [
    (BUSY, 1.2, "other processes took 48% of the CPU time of the 2 cores"),
    (QUIET, 0.30, "the profiler's overhead came out at 0.30x"),
    (None, 7.42, "the profiler's overhead came out at 7.42x"),
    (QUIET, 1.2, None), (None, float("nan"), None), (None, None, None)])
def test_doubts_name_the_load_and_a_profiler_overhead_no_quiet_machine_gives(load, overhead, said):
    found = doubts(load, overhead)
    assert (said in found[0] and len(found) == 1) if said else found == []


def diagnosed(load, unprofiled_ms=95.0) -> DoctorReport:
    """A complete report of a 100 ms profiled iteration, with one finding estimated at 1.64x."""
    r = DoctorReport("train.py", "cpu", complete=True, steps=5, step_time_ms=100.0,
                     unprofiled_step_time_ms=unprofiled_ms, phases_ms={"G forward": 60.0, "D forward": 40.0},
                     settings={"machine_load": load, "timed_iterations_ms": [unprofiled_ms] * 5},
                     verdict=Verdict("compute-bound", {"step ms": 100.0}))
    r.findings = [Finding("fp32-convolutions", "convolutions and matmuls run in fp32", "16 outputs in float32",
                          "autocast halves them", "with torch.autocast(...):", "02_mixed_precision", 1.64)]
    r.timings_doubted = analysis.timing_doubts(r)
    return r


def test_a_busy_machine_s_report_warns_and_estimates_no_gain_from_its_timings():
    busy, slowed, quiet = diagnosed(BUSY), diagnosed(QUIET, unprofiled_ms=100 / 7.42), diagnosed(QUIET)
    text = str(busy)
    assert "timings unreliable: other processes took 48%" in text and "again on a quiet machine" in text
    assert "1.64x" not in text and "gain not estimated: the timings are unreliable" in text
    assert busy.to_dict()["timings_doubted"] == busy.timings_doubted  # and in the JSON, the estimate kept there
    assert "profiler's overhead came out at 7.42x" in str(slowed) and "1.64x" not in str(slowed)
    text = str(quiet)
    assert "unreliable" not in text and "(estimated gain 1.64x)" in text and "up to" not in text


class _Pairs:
    """A runner whose pairs are prepared rounds of ms per iteration (best, candidate), each run read under `load`."""

    def __init__(self, *rounds, load=None):
        self.rounds, self.calls, self.load = list(rounds), 0, load

    def pair(self, a, b, repeats):
        best, candidate = self.rounds[self.calls]
        self.calls += 1
        return ([Trial(a, "measured", [ms], [[0.5]], 16, load=self.load) for ms in best],
                [Trial(b, "measured", [ms], [[0.5]], 16, load=self.load) for ms in candidate])


class _Fix:
    name, title, parts, changes_losses = fixes.AUTOCAST, "autocast", (fixes.AUTOCAST,), ""


def test_try_measures_a_range_wider_than_the_effect_again_then_says_to_measure_on_a_quiet_machine():
    wild = ([10, 10, 10, 10, 10], [160, 7, 1.3, 8, 11])  # 0.06x-7.5x, as a loaded machine gave
    runner = _Pairs(wild, wild, load=BUSY)
    tried, _ = trying._compare(runner, (), _Fix.parts, _Fix, 5)
    assert runner.calls == 2 and tried.outcome == "too noisy" and "measure again on a quiet machine" in tried.why
    assert "other processes took 48%" in tried.why and tried.load == BUSY
    result = trying.TryReport("train.py", "cpu", "cpu", tried=[tried])
    assert "nothing kept: autocast measured too noisy to decide: measure again on a quiet machine" in str(result)
    steady = ([10, 10, 10, 10, 10], [10.2, 9.9, 10.1, 9.8, 10.3])  # a fix that does nothing, on a quiet machine
    tried, _ = trying._compare(_Pairs(steady, steady), (), _Fix.parts, _Fix, 5)
    assert tried.outcome == "not faster" and "quiet" not in tried.why


def test_try_s_summary_says_what_it_tried():
    none_tried = trying.TryReport("train.py", "cpu", "cpu", skipped=[("autocast", "D's loss cannot be followed")])
    text = str(none_tried)
    assert "nothing was tried: no fix the findings call for can be applied at run time here" in text
    assert "made this loop faster" not in text
    lost = trying.Tried(fixes.AUTOCAST, "autocast", (fixes.AUTOCAST,), "not faster", "0.95x (0.90-0.99)")
    assert "of the 1 fix tried (autocast), none made this loop faster here" in str(
        trying.TryReport("train.py", "cpu", "cpu", tried=[lost]))


def _spinning(pid: int) -> None:
    """Until the spinner has run a tenth of a second: started, and in its loop."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if sum(int(v) for v in f.read().rsplit(")", 1)[1].split()[11:13]) >= os.sysconf("SC_CLK_TCK") // 10:
                return
        time.sleep(0.02)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or machine.read_cpu_times() is None,
                    reason="needs Linux's /proc and CPU affinity")
def test_a_core_kept_busy_beside_the_doctor_is_read_and_warned_about(glyphs64, one_thread):
    """A second process spins on the core this test's thread is pinned to while the doctor measures a tiny loop in
    this process: the reading counts it (the two share the core, so the spinner takes about half of it, past
    `BUSY_SHARE`, whatever else runs there), and the report warns on that reading."""
    torch.manual_seed(0)
    G, D = BatchFreeG(), BatchFreeD()
    opt_g, opt_d = torch.optim.Adam(G.parameters()), torch.optim.Adam(D.parameters())
    loader = DataLoader(glyphs64, batch_size=16, shuffle=True)

    def train_step(batch):
        real = batch[0].float() / 127.5 - 1
        bce_step(G, D, opt_g, opt_d, real, torch.randn(real.shape[0], 8))

    mine, core = os.sched_getaffinity(0), min(os.sched_getaffinity(0))
    # started by a shell that exits at once, so the spinner is not this process's descendant (whose CPU time the
    # reading counts as the doctor's own: DataLoader workers), but another job's, as the load a user meets is
    started = subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, check=True)
    spinner = int(started.stdout)
    try:
        os.sched_setaffinity(spinner, {core})
        _spinning(spinner)
        os.sched_setaffinity(0, {core})
        report = doctor.run(train_step, loader, steps=20, warmup=1)  # a window of many clock ticks
    finally:
        os.sched_setaffinity(0, mine)
        os.kill(spinner, signal.SIGKILL)
    load = report.settings["machine_load"]
    assert load["cores"] == 1 and load["busy"] and load["others_share"] >= BUSY_SHARE, load
    assert report.timings_doubted[0].startswith("other processes took"), report.timings_doubted
    assert "timings unreliable: other processes took" in str(report)
