"""What 10_several_gpus needs to measure a loop in several processes from a notebook: a kernel is one process, so
the notebook writes its loop as a script and `launch`es it under torchrun; inside, `race_across_ranks` races the
loop in turns as `tutorial.race` does in one kernel, one-process contenders included (rank 0 runs them while the
other ranks wait), and rank 0 hands back what every rank measured (`race_record`, `gathered_differences`,
`profiled_collectives`). `ScalingPanel` is its try-it widget: gantools' own trainer under torchrun
(`bench.scaling`), since `ControlPanel` trains inside the kernel, in one process."""
from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import torch

from ..core import distributed
from ..measuring.hardware import Timer
from ..measuring.turns import Measured
from . import tutorial


def launch(script, out_dir, processes: int = 2, threads: int = 1, timeout: float = 1200) -> dict:
    """Run `script OUT_DIR` under torchrun (`distributed.launch_command`) with `processes` processes of `threads`
    threads each (OMP_NUM_THREADS: on a CPU, processes x threads should not exceed its cores) and return what rank
    0 wrote to OUT_DIR/rank0.json. A failed run raises with the end of what the processes printed."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rank0.json").unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(distributed.launch_command(processes, str(script), str(out)), env=env,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0 or not (out / "rank0.json").is_file():
        raise RuntimeError(f"{script} under torchrun exited with {done.returncode}:\n{done.stderr[-4000:]}")
    return json.loads((out / "rank0.json").read_text())


def _in_step(batches, chunk_steps: int, threads: int):
    """`batches`, with every rank meeting at a barrier (and this process set to `threads`) before each chunk's
    first batch: a chunk that rank 0 runs alone then has the machine to itself, the other ranks blocked in the
    barrier, and every rank starts a shared chunk together."""
    from torch import distributed as dist

    for i, batch in enumerate(batches):
        if i % chunk_steps == 0:
            torch.set_num_threads(threads)
            dist.barrier()
        yield batch


def _idle(gan, real):
    zero = torch.zeros(())
    return zero, zero


def race_across_ranks(contenders: dict, steps: int, chunk_steps: int, alone: dict | None = None) -> tutorial.Race:
    """`tutorial.race` run by every rank in lockstep. `contenders`: name -> (step_fn, gan), as for `race`; those
    named in `alone` (name -> threads) are one process's loop: rank 0 runs them with that many threads while the
    other ranks wait, so they are timed in the same turns as the loops that need every rank (run with one thread
    each). Each rank returns its own Race; rank 0's holds the one-process figures."""
    from torch import distributed as dist

    alone, rank, ready = alone or {}, dist.get_rank(), {}
    for name, (step_fn, gan) in contenders.items():
        solo = name in alone
        gan.batches = _in_step(gan.batches, chunk_steps, alone[name] if solo and rank == 0 else 1)
        ready[name] = (_idle if solo and rank != 0 else step_fn, gan)
    return tutorial.race(ready, steps, chunk_steps)


def race_record(race: tutorial.Race) -> dict:
    """A Race as JSON values, for rank 0 to hand to the notebook (`race_from_record` reads it back)."""
    return {"measured": {name: {"warmup_s": m.warmup_s, "turns": m.turns, "images_per_sec_runs":
                                m.images_per_sec_runs} for name, m in race.measured.items()},
            "warm_up": race.warm_up, "images": race.images}


def race_from_record(record: dict) -> tutorial.Race:
    """The Race a launched script measured, with its table, ratios and paired ranges, as if raced in the kernel."""
    def turn(t):  # (images/s, (step, losses ...)), as `race` made it
        return t[0], tuple(t[1])

    measured = {name: Measured(subject=name, warmup_s=m["warmup_s"], turns=[turn(t) for t in m["turns"]],
                               images_per_sec_runs=list(m["images_per_sec_runs"]))
                for name, m in record["measured"].items()}
    return tutorial.Race(measured, {k: turn(v) for k, v in record["warm_up"].items()}, record["images"])


def count_all_reduces(ddp) -> dict:
    """Count the gradient all-reduces of a DistributedDataParallel module (a communication hook that counts each
    bucket it is handed, then all-reduces it as DDP would): `{"calls": n}`, updated as training runs."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    counted = {"calls": 0}

    def hook(state, bucket):
        counted["calls"] += 1
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    return counted


def all_reduces_in_a_step(step_fn, gan, counters) -> int:
    """The all-reduces (`count_all_reduces`' `counters`) that one more step of `step_fn(gan, batch)` makes: a step
    after the first, whose buckets DDP builds in parameter order before it rebuilds them in gradient order."""
    before = sum(c["calls"] for c in counters)
    step_fn(gan, next(gan.batches))
    return sum(c["calls"] for c in counters) - before


def profiled_collectives(step_fn, gan, steps: int = 3, warmup: int = 2) -> dict:
    """`steps` of `step_fn(gan, batch)` under torch.profiler on every rank (a collective needs them all), after
    `warmup` steps (two: DDP rebuilds its buckets in the second iteration, a one-off broadcast of their order that
    is no part of a step): this rank's profiled step time and its collectives per step, read by the doctor's rule
    (`doctor.watching.ddp.collectives`: gradient all-reduces, their time, the share of it that overlapped backward, what
    was left after it, and buffer broadcasts)."""
    from torch import distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from ..doctor.watching.ddp import collectives

    for _ in range(warmup):
        step_fn(gan, next(gan.batches))
    dist.barrier()
    cuda = gan.device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        timer = Timer(gan.device).start()
        for _ in range(steps):
            step_fn(gan, next(gan.batches))
        seconds = timer.stop()
    return {"step_ms": 1e3 * seconds / steps, **collectives(prof.events(), steps, cuda)}


def gathered_differences(nets: dict) -> dict | None:
    """How far apart the ranks' copies are, gathered on rank 0 (None on the others): for each network
    (name -> module), the largest difference between any rank's and rank 0's weights, and between their
    BatchNorm running statistics."""
    from torch import distributed as dist

    mine = {name: {k: v.detach().cpu() for k, v in net.state_dict().items()} for name, net in nets.items()}
    everyone = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, everyone, dst=0)
    if everyone is None:
        return None

    def apart(name, keep) -> float:
        return max(((other[name][k].float() - mine[name][k].float()).abs().max().item()
                    for other in everyone[1:] for k in mine[name] if keep(k)), default=0.0)

    statistic = lambda k: "running_" in k  # noqa: E731
    return {name: {"weights": apart(name, lambda k: not statistic(k) and "num_batches" not in k),
                   "running statistics": apart(name, statistic)} for name in nets}


class ScalingPanel:
    """10's try-it widget: processes, precision, steps and whether to keep the global batch; Run trains gantools'
    trainer under torchrun with 1 to N processes in turns (`bench.scaling`, in a background thread) and shows its
    table against the 1-process baseline it measured, with the torchrun command that trains the same from a
    terminal. (`ControlPanel` cannot: it trains inside the kernel, which is one process.)"""

    def __init__(self, overrides: dict, max_processes: int | None = None, repeats: int = 2, steps: int = 20,
                 out_dir="runs/try-scaling"):
        import ipywidgets as W

        gpus = torch.cuda.device_count()
        top = max(max_processes or gpus or 2, 2)
        self.overrides, self.repeats, self.out_dir, self.result = dict(overrides), repeats, out_dir, None
        self.controls = {
            "processes": W.Dropdown(options=list(range(2, top + 1)), value=top, description="processes"),
            "precision": W.Dropdown(options=["fp32", "bf16"], value=overrides.get("precision", "fp32"),
                                    description="precision"),
            "keep_global_batch": W.Checkbox(value=True, description="keep the global batch"),
            "steps": W.IntText(value=steps, description="steps"),
        }
        self.button, self.status, self.table = W.Button(description="Run"), W.HTML(""), W.Output()
        self.button.on_click(lambda _: self.run(block=False))
        self.widget = W.VBox([W.HBox(list(self.controls.values())), W.HBox([self.button]), self.status, self.table])

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)

    def command(self) -> str:
        """The torchrun line that trains, in a terminal, what the bench trained with the most processes: its config
        (`bench.scaling_config`) at that run's global batch."""
        from ..speed import bench

        c = {name: w.value for name, w in self.controls.items()}
        cfg = bench.scaling_config("cpu", overrides={**self.overrides, "precision": c["precision"]})
        if not c["keep_global_batch"]:  # each process trained the whole batch: the global batch is N of them
            cfg = cfg.replace(batch_size=cfg.batch_size * c["processes"])
        return bench.scaling_command(cfg, c["processes"])

    def run(self, block: bool = True):
        """What Run does: `bench.scaling` with the controls' values; blocking unless `block=False`."""
        worker = threading.Thread(target=self._measure, daemon=True)
        self.button.disabled = True
        worker.start()
        if block:
            worker.join()
        return self

    def _measure(self):
        from IPython.display import Markdown

        from ..speed import bench

        c = {name: w.value for name, w in self.controls.items()}
        try:
            self.status.value = f"Running 1 to {c['processes']} processes ..."
            self.result = bench.scaling(
                "cpu", max_processes=c["processes"], repeats=self.repeats, steps=c["steps"],
                log_interval=max(1, c["steps"] // 4), overrides={**self.overrides, "precision": c["precision"]},
                out_dir=self.out_dir, keep_global_batch=c["keep_global_batch"],
                progress=lambda line: setattr(self.status, "value", line))
            top = self.result["rows"][-1]
            self.status.value = (f"Done: {top['processes']} processes ran {top['speedup']:.2f}x the images/s of the "
                                 "1-process baseline measured in the same turns. In a terminal: "
                                 f"<code>{self.command()}</code>")
            self.table.outputs = ()  # thread-safe way to clear an Output widget
            self.table.append_display_data(Markdown(bench.scaling_markdown(self.result)))
        except Exception as error:  # shown in the widget: a background thread has no cell to raise into
            self.status.value = f"Run failed: {error}"
        finally:
            self.button.disabled = False

