"""`python -m gantools train`: every TrainConfig field is a flag; errors are one line, never a traceback.
`torchrun --nproc_per_node N -m gantools train ...` runs the same training data-parallel (see distributed.py)."""
from __future__ import annotations

import argparse
import json
import sys
import typing
from dataclasses import MISSING, fields
from pathlib import Path

from . import distributed
from .checkpoint import CheckpointError
from .config import PRESETS, ConfigError, TrainConfig, preset
from .data import DataError
from .display import ProgressBar
from .hardware import machine_info
from .train import NonFiniteLossError, OutOfMemory, Trainer


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(TrainConfig)
    for f in fields(TrainConfig):
        default = f.default if f.default is not MISSING else f.default_factory()
        flag = "--" + f.name.replace("_", "-")
        kw = {"dest": f.name, "default": argparse.SUPPRESS,
              "help": f"{f.metadata['help']} (default: {default})"}
        if "choices" in f.metadata:
            kw["choices"] = f.metadata["choices"]
        hint = hints[f.name]
        if f.name == "betas":
            kw.update(nargs=2, type=float, metavar=("BETA1", "BETA2"))
        elif hint in (bool, typing.Optional[bool]):
            kw["action"] = argparse.BooleanOptionalAction
        elif hint in (int, typing.Optional[int]):
            kw["type"] = int
        elif hint is float:
            kw["type"] = float
        parser.add_argument(flag, **kw)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gantools", description="Fast GAN training, measured.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a GAN (DCGAN on glyphs unless told otherwise)",
                           description="Train a GAN. Flags override the preset; every flag is a TrainConfig field.")
    _add_preset_flag(train)
    train.add_argument("--resume", nargs="?", const="", default=None, metavar="CHECKPOINT",
                       help="continue from a checkpoint (default path: <out-dir>/checkpoint.pt); flags given here "
                            "override its config, e.g. --steps to train longer")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_config_flags(train)
    prof = sub.add_parser("profile", help="profile a few steps and say what to fix next",
                          description="Profile a config with torch.profiler: per-phase breakdown, op table, trace "
                                      "for Perfetto, and a verdict (data-, host-overhead-, compute- or "
                                      "memory-bound) with the fix to try next.")
    _add_preset_flag(prof)
    prof.add_argument("--profile-steps", type=int, default=5, help="steps recorded by the profiler (default: 5)")
    prof.add_argument("--warmup", type=int, default=2, help="steps run before measuring (default: 2)")
    prof.add_argument("--trace", default=None, help="chrome trace path (default: <out-dir>/trace.json)")
    _add_config_flags(prof)
    bench = sub.add_parser("bench", help="the benchmark ladder: each technique against the tutorial's loop",
                           description="Reference loop, each technique alone, all together and a max-throughput "
                                       "preset, interleaved in one process; --quality adds FID/KID/coverage at an "
                                       "equal image budget. Prints a Markdown table.")
    bench.add_argument("--size", choices=("cpu", "gpu"), default=None,
                       help="cpu: 32 px glyphs, a few minutes on 2 cores; gpu: 64 px colour glyphs (default: by device)")
    bench.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")
    bench.add_argument("--quality", action="store_true", help="also train every variant on the same number of "
                                                               "images and report FID, KID and class coverage")
    bench.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                       help="include torch.compile variants (default: wherever it can compile: CUDA, or a CPU "
                            "with a C++ compiler)")
    bench.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default: 5)")
    bench.add_argument("--variants", nargs="+", default=None, help="run only these ladder rows (quote names)")
    bench.add_argument("--scaling", action="store_true",
                       help="instead of the ladder: images/s and scaling efficiency for 1..N processes under torchrun "
                            "(N: the GPUs here; on a CPU, 2 processes sharing its cores)")
    bench.add_argument("--max-processes", type=int, default=None, help="with --scaling: the largest N")
    bench.add_argument("--json", default=None,
                       help="where to write the JSON (default: runs/bench/bench.json, or scaling.json)")
    bench.add_argument("--png", default="runs/bench/bench.png", help="where to write the chart (default: %(default)s)")
    sub.add_parser("info", help="print what this machine is (device, versions, cores) as JSON")
    _add_doctor(sub)
    return parser


def _add_doctor(sub) -> None:
    from .doctor import STEPS, TIMEOUT_S, WARMUP

    doc = sub.add_parser("doctor", help="diagnose YOUR training script: where its time goes, what to change",
                         usage="python -m gantools doctor [OPTIONS] SCRIPT.py [ARGS...]",
                         description="Run your own GAN training script, unmodified, find its iterations (optimizer "
                                     "steps), time and profile a few, stop it, and say what to change in your code, "
                                     "with the numbers that justify it. Options go before SCRIPT.py; everything "
                                     "after it goes to the script.")
    doc.add_argument("--steps", type=int, default=STEPS,
                     help="iterations timed, then as many profiled (default: %(default)s)")
    doc.add_argument("--warmup", type=int, default=WARMUP, help="iterations skipped first (default: %(default)s)")
    doc.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    doc.add_argument("--trace", default=None, metavar="PATH",
                     help="chrome trace for Perfetto (default: runs/doctor/<script>-trace.json)")
    doc.add_argument("--timeout", type=float, default=TIMEOUT_S, metavar="S",
                     help="give up when no optimizer has stepped S seconds after the start (default: %(default)g)")
    doc.add_argument("script", metavar="SCRIPT.py", nargs="?", help="your training script")  # missing: said in _doctor
    doc.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="its arguments, passed on untouched")


def _add_preset_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=tuple(PRESETS), default="default",
                        help="starting config: 'reference' is the PyTorch DCGAN tutorial's loop (default: default)")


def main(argv=None) -> int:
    args = vars(build_parser().parse_args(argv))
    command = args.pop("command")
    if command == "doctor":
        return _doctor(args)
    if command in ("bench", "profile") and distributed.world().distributed:
        print(f"gantools: error: {command} runs as one process; start it without torchrun "
              f"(bench --scaling launches torchrun itself)", file=sys.stderr)
        return 2
    if command == "bench":
        return _bench(args)
    if command == "info":
        print(json.dumps(machine_info(), indent=1))
        return 0
    if "betas" in args:
        args["betas"] = tuple(args["betas"])
    if command == "profile":
        return _profile(args)
    resume, quiet, name = args.pop("resume"), args.pop("quiet"), args.pop("preset")
    world = distributed.world()
    callbacks = () if quiet or not world.is_main else (ProgressBar(),)  # under torchrun: rank 0 reports
    try:
        if resume is not None:
            out_dir = args.get("out_dir", TrainConfig().out_dir)
            path = Path(resume) if resume else Path(out_dir) / "checkpoint.pt"
            trainer = Trainer.resume(path, callbacks=callbacks, **args)
        else:
            trainer = Trainer(preset(name, **args), callbacks=callbacks)
        history = trainer.fit()
    except (ConfigError, DataError, CheckpointError, NonFiniteLossError, OutOfMemory) as e:
        # config, data and all-reduced losses are the same on every rank: rank 0 says it once
        if world.is_main or isinstance(e, (CheckpointError, OutOfMemory)):
            rank = "" if world.is_main else f" (rank {world.rank})"
            print(f"gantools: error{rank}: {e}", file=sys.stderr)
        return 2
    if not world.is_main:
        return 0
    s = history.summary()
    stopped = " (stopped early: resume with --resume)" if trainer.step < trainer.cfg.steps else ""
    where = f"{world.size} processes ({trainer.device.type})" if world.distributed else trainer.device
    print(f"{s['steps']} steps{stopped} on {where}: {s['images_per_sec']:.0f} images/s (median after "
          f"warm-up), {s['step_time_ms']:.1f} ms/step, peak memory {s['peak_mem_mb']:.0f} MB, "
          f"loss_d {s['loss_d']:.3f}, loss_g {s['loss_g']:.3f}. Samples: {trainer.out_dir / 'samples'}, "
          f"checkpoint: {trainer.out_dir / 'checkpoint.pt'}")
    return 0


def _profile(args: dict) -> int:
    from .profiling import profile

    steps, warmup, trace, name = args.pop("profile_steps"), args.pop("warmup"), args.pop("trace"), args.pop("preset")
    if steps < 1 or warmup < 0:
        print("gantools: error: --profile-steps must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    try:
        report = profile(preset(name, **args), steps=steps, warmup=warmup, trace_path=trace)
    except (ConfigError, DataError, NonFiniteLossError) as e:
        print(f"gantools: error: {e}", file=sys.stderr)
        return 2
    print(report)
    print(report.table)
    print(f"trace (open in https://ui.perfetto.dev): {report.trace_path}")
    return 0


def _doctor(args: dict) -> int:
    from . import doctor

    if args["script"] is None:
        print("gantools: error: give your training script: python -m gantools doctor [OPTIONS] SCRIPT.py [ARGS...]",
              file=sys.stderr)
        return 2
    if args["steps"] < 1 or args["warmup"] < 0 or args["timeout"] <= 0:
        print("gantools: error: --steps must be >= 1, --warmup >= 0 and --timeout > 0", file=sys.stderr)
        return 2
    try:
        report = doctor.run_script(args["script"], args["args"], args["steps"], args["warmup"], args["trace"],
                                   args["timeout"])
    except doctor.ScriptError as e:  # the user's own traceback, marked as theirs; none of ours
        print(f"gantools doctor: your script raised:\n{e.traceback_text}gantools doctor: {e}", file=sys.stderr)
        return 2
    except doctor.DoctorError as e:
        print(f"gantools: error: {e}", file=sys.stderr)
        return 2
    print(report)
    if args["json"]:
        print(f"JSON: {report.save_json(args['json'])}")
    if not report.complete:
        print(f"gantools doctor: {report.note}", file=sys.stderr)
        return 130 if report.settings.get("outcome") == "interrupted" else 2
    return 0


def _bench(args: dict) -> int:
    from . import bench
    from .hardware import resolve_device

    size = args["size"] or ("gpu" if resolve_device(args["device"]).type == "cuda" else "cpu")
    if args["repeats"] is not None and args["repeats"] < 1:
        print("gantools: error: --repeats must be >= 1", file=sys.stderr)
        return 2
    if args["scaling"]:
        return _scaling(args, size)
    args["json"] = args["json"] or "runs/bench/bench.json"
    try:
        result = bench.run(size, args["device"], args["variants"], args["quality"], args["compile"], args["repeats"],
                           progress=lambda line: print(line, file=sys.stderr))
    except (ValueError, ConfigError, DataError) as e:
        print(f"gantools: error: {e}", file=sys.stderr)
        return 2
    bench.save(result, args["json"], args["png"])
    print(bench.markdown(result))
    print(f"\nJSON: {args['json']}  chart: {args['png']}")
    return 0


def _scaling(args: dict, size: str) -> int:
    from . import bench

    if args["max_processes"] is not None and args["max_processes"] < 1:
        print("gantools: error: --max-processes must be >= 1", file=sys.stderr)
        return 2
    path = args["json"] or "runs/bench/scaling.json"
    try:
        result = bench.scaling(size, args["device"], args["max_processes"], args["repeats"] or 3,
                               progress=lambda line: print(line, file=sys.stderr))
    except (ValueError, ConfigError, DataError, RuntimeError) as e:
        print(f"gantools: error: {e}", file=sys.stderr)
        return 2
    bench.save(result, path)
    print(bench.scaling_markdown(result))
    print(f"\nJSON: {path}")
    return 0
