"""What 10_several_gpus needs to measure a loop in several processes from a notebook: a kernel is one process, so
the notebook writes its loop as a script and `launch`es it under torchrun; inside, `race_across_ranks` races the
loop in turns as `tutorial.race` does in one kernel, one-process contenders included (rank 0 runs them while the
other ranks wait), and rank 0 hands back what every rank measured (`race_record`, `gathered_differences`,
`profiled_collectives`). `all_reduce_shares` and `all_reduce_cost` set the race's and the profile's measurements of
the all-reduce side by side (the race's share implied as `waiting.implied_share` reads a removed wait) and give one
answer; `show_scaling` charts the scaling and that share. `ScalingPanel` is its try-it widget: gantools' own trainer
under torchrun (`bench.scaling`), since `ControlPanel` trains inside the kernel, in one process."""
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
from .conclusions import DATA_BOTTLENECK, Conclusion, shown_ratio, worth_removing
from .waiting import implied_share

# the all-reduce's share of a DDP step, as each measurement gives it (`all_reduce_shares`)
EXPOSED, RACED, WHOLE = ("the profile: left after backward (exposed)", "the race: DDP against no all-reduce",
                         "the profile: all its time")


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


def all_reduce_shares(race, ddp: str, quiet: str, profile: dict) -> dict:
    """The gradient all-reduce's share of a DDP step, as each of two measurements gives it: name -> (share, low,
    high). The race (`ddp`'s images/s against `quiet`'s, the same loop with the all-reduce replaced by a hook that
    does nothing) measures what the all-reduce costs in speed, low to high over its paired range; the profile
    (`profiled_collectives`) measures the all-reduce's own time, whole (`WHOLE`) and the part left after backward
    (`EXPOSED`; a GPU's profile gives no overlap, so there both are the whole)."""
    paired = race.paired(ddp, quiet)
    share = implied_share(1 / shown_ratio(race.ratio(ddp, quiet), paired))  # the quiet loop as the change
    raced = (share, implied_share(1 / paired.high), implied_share(1 / paired.low)) if paired else (share,) * 3
    exposed = profile.get("exposed_ms", profile["all_reduce_ms"]) / profile["step_ms"]
    whole = profile["all_reduce_ms"] / profile["step_ms"]
    return {EXPOSED: (exposed,) * 3, RACED: raced, WHOLE: (whole,) * 3}


def _percent(x: float) -> str:
    return f"{100 * x:.1f}%"


def all_reduce_cost(shares: dict, backend: str, fix: str) -> Conclusion:
    """One answer from `all_reduce_shares`: the race's share is the all-reduce's cost (what removing it would
    give); the profile's exposed and whole shares bound that cost where communication takes turns with backward
    on the same cores (gloo here), and its exposed share is the cost where it runs beside backward (NCCL's own
    stream). Whether the cost is a bottleneck is `conclusions.worth_removing`'s rule, read at both ends of the
    race's paired range: when the ends disagree, it is not settled. `.keep`: a bottleneck at both ends."""
    share, low, high = shares[RACED]
    exposed, whole = shares[EXPOSED][0], shares[WHOLE][0]
    ends = [worth_removing(x).keep for x in (low, high)]
    line = f"{100 * DATA_BOTTLENECK:.0f}% that counts as a bottleneck"
    said = "a bottleneck" if all(ends) else "not a bottleneck" if not any(ends) else "bottleneck or not: not settled"
    verdict = (f"**a bottleneck** (at least the {line}): {fix}" if all(ends) else
               f"**not a bottleneck** (under the {line})" if not any(ends) else
               f"**whether it reaches the {line} is not settled** by this race: time it longer, or try the fix "
               f"({fix})")
    text = [f"The gradient all-reduce costs **{_percent(share)}** of a DDP step here ({_percent(max(low, 0))}-"
            f"{_percent(high)} over the race's paired range): {verdict}."]
    shared = backend == "gloo"  # on a CPU: the all-reduce's threads and backward take turns on the same cores
    bounds = (exposed, whole) if shared else (0.0, whole)
    text.append(f"The race measures that cost in speed; the profile measures the all-reduce's own time, "
                f"{_percent(whole)} of a profiled step, of which {_percent(exposed)} was left after backward "
                "(exposed). " + (
                    "Over gloo its threads take turns with backward on the same cores, so the part beside backward "
                    "is not hidden and costs time too: the cost lies between the exposed share and the whole, "
                    if shared else
                    f"Over {backend} it runs beside backward on its own stream, so what it costs a step is at most "
                    "its whole time, ")
                + f"{_percent(bounds[0])}-{_percent(bounds[1])}, ")
    agree = low <= bounds[1] and high >= bounds[0]  # the race's range meets the profile's bounds
    text[-1] += ("and the race's range falls in it: **the two measurements agree**." if agree else
                 "and the race's range lies outside it: **the two measurements disagree**: the profiler slows the "
                 "step it watches, and its few profiled steps carry their own noise; the race times the step "
                 "unwatched, in turns, so quote the race.")
    apart = "they agree" if agree else "they disagree: quote the race"
    short = (f"**The gradient all-reduce**: {_percent(share)} of a DDP step by the race, "
             f"{_percent(bounds[0])}-{_percent(bounds[1])} by the profile ({apart}): **{said}**.")
    return Conclusion("\n\n".join(text), all(ends), short)


def _whiskers(ax, values, ranges, y) -> None:
    """Error bars from each (low, high) in `ranges` around its bar's value, only where the range has a width."""
    drawn = [(v, lo, hi, yy) for v, (lo, hi), yy in zip(values, ranges, y, strict=True) if hi > lo]
    if drawn:
        v, lo, hi, yy = (list(c) for c in zip(*drawn, strict=True))
        ax.errorbar(v, yy, xerr=[[max(a - b, 0) for a, b in zip(v, lo, strict=True)],
                                 [max(b - a, 0) for a, b in zip(v, hi, strict=True)]],
                    fmt="none", ecolor="0.3", capsize=3, lw=1)


def scaling_figure(images_per_sec: dict, base: str, shares: dict, spreads: dict | None = None,
                   title: str = "data parallelism on this machine"):
    """Two panels, linear from 0: each loop's images/s (`images_per_sec`, name -> figure; `spreads`, name ->
    (low, high), drawn as error bars), its speed against `base` beside its bar; under them, the all-reduce's
    share of a step as each measurement gives it (`all_reduce_shares`), the share that counts as a bottleneck a
    dashed line."""
    import numpy as np

    from .chart_layout import WIDTH_IN, figure, make_room, wrap_names, wrap_to

    names, methods = list(images_per_sec), list(shares)
    rows = len(names) + len(methods)
    fig, (top, bottom) = figure(2, 1, figsize=(WIDTH_IN, 1.9 + 0.5 * rows),
                                gridspec_kw={"height_ratios": [max(len(names), 2), max(len(methods), 2)]})
    fig.suptitle(wrap_to(title, WIDTH_IN, 11), fontsize=11)
    y = np.arange(len(names))[::-1]
    speeds = [images_per_sec[n] for n in names]
    ranges = [(spreads or {}).get(n, (v, v)) for n, v in zip(names, speeds, strict=True)]
    top.barh(y, speeds, height=0.6, color=[f"C{i % 10}" for i in range(len(names))])
    _whiskers(top, speeds, ranges, y)
    top.set_yticks(y, wrap_names(names), fontsize=8)
    top.set_xlim(0, max(hi for _, hi in ranges) * 1.05)
    texts = [top.text(hi, yy, f" {v / images_per_sec[base]:.2f}x", va="center", fontsize=8)
             for v, (_, hi), yy in zip(speeds, ranges, y, strict=True)]
    top.set_xlabel(wrap_to(f"images / s (bars: the median; whiskers: the chunks' range); beside each bar: its "
                           f"speed against {base}", WIDTH_IN - 2, 10), fontsize=10)
    make_room(top, texts)
    y = np.arange(len(methods))[::-1]
    values = [100 * max(shares[m][0], 0) for m in methods]  # a share below 0 (noise) drawn as none, said as it is
    low, high = ([100 * max(shares[m][k], 0) for m in methods] for k in (1, 2))
    bottom.barh(y, values, height=0.6, color="tab:grey")
    _whiskers(bottom, values, list(zip(low, high, strict=True)), y)
    bottom.axvline(100 * DATA_BOTTLENECK, color="tab:red", ls="--", lw=1)
    bottom.set_yticks(y, wrap_names(methods, width=30), fontsize=8)
    bottom.set_xlim(0, max(high + [100 * DATA_BOTTLENECK]) * 1.08)
    texts = [bottom.text(max(v, hi), yy, f" {100 * shares[m][0]:.1f}%", va="center", fontsize=8)
             for m, v, hi, yy in zip(methods, values, high, y, strict=True)]
    bottom.set_xlabel(wrap_to("the gradient all-reduce's share of a DDP step, % (whiskers: the race's paired "
                              f"range); dashed: the {100 * DATA_BOTTLENECK:.0f}% that counts as a bottleneck",
                              WIDTH_IN - 2, 10), fontsize=10)
    make_room(bottom, texts)
    return fig


def show_scaling(race, base: str, shares: dict, title: str = "data parallelism on this machine"):
    """`scaling_figure` of a race (`race_from_record`) against `base`, shown in the notebook."""
    from . import display

    return display._display(scaling_figure(race.images_per_sec, base, shares,
                                           {n: race.spread(n) for n in race.images_per_sec}, title))


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

