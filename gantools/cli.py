"""`python -m gantools <command>`: every TrainConfig field is a flag; errors are one or two lines, never a traceback.
`torchrun --nproc_per_node N -m gantools train ...` runs the same training data-parallel (see distributed.py).

Each subcommand is one entry of `COMMANDS`: a function that adds its flags and one that runs it. `main` catches
every `GantoolsError` (bad input, data, checkpoint, out of memory, a non-finite loss) for all of them: one message,
exit status 2. Anything else is a bug and keeps its traceback."""
from __future__ import annotations

import argparse
import json
import sys
import typing
from dataclasses import MISSING, fields
from pathlib import Path

from .core import distributed
from .core.config import PRESETS, TrainConfig, preset
from .errors import CheckpointError, GantoolsError, OutOfMemory
from .measuring.hardware import machine_info


class _Parser(argparse.ArgumentParser):
    """An invalid flag value prints what was wrong (the flag, the value, what is allowed) and where the rest is,
    instead of argparse's whole usage block."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"gantools: error: {message}\n  see `{self.prog} --help` for every flag and its values\n")


def _fail(message: str) -> int:
    print(f"gantools: error: {message}", file=sys.stderr)
    return 2


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field, from its Knob: `--name` (`--name/--no-name` for booleans), typed, with its
    choices and help. Flags left out are not in the parsed result, so the preset (or checkpoint) keeps its value."""
    for f in fields(TrainConfig):
        knob = f.metadata["knob"]
        default = f.default if f.default is not MISSING else f.default_factory()
        kw = {"dest": f.name, "default": argparse.SUPPRESS, "help": f"{knob.help} (default: {default})"}
        if knob.choices is not None:
            kw["choices"] = knob.choices
        if knob.kind is bool:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = knob.parse
            if knob.pair:
                kw["nargs"] = 2
            if knob.metavar:
                kw["metavar"] = knob.metavar
        parser.add_argument("--" + f.name.replace("_", "-"), **kw)


def _add_preset_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=tuple(PRESETS), default="default",
                        help="starting config: 'reference' is the PyTorch DCGAN tutorial's loop (default: default)")


def _count(minimum: int):
    """An argparse type: a whole number >= minimum, refused with one clear line otherwise."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is too small: it must be >= {minimum}")
        return value
    return parse


# -- train ----------------------------------------------------------------------------------------------------------

def _train_flags(p: argparse.ArgumentParser) -> None:
    _add_preset_flag(p)
    p.add_argument("--resume", nargs="?", const="", default=None, metavar="CHECKPOINT",
                   help="continue from a checkpoint (default path: <out-dir>/checkpoint.pt); flags given here "
                        "override its config, e.g. --steps to train longer")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_config_flags(p)


def _train(args: dict) -> int:
    from .workbook.display import ProgressBar
    from .core.trainer import Trainer

    resume, quiet, name = args.pop("resume"), args.pop("quiet"), args.pop("preset")
    world = distributed.world()
    callbacks = () if quiet or not world.is_main else (ProgressBar(),)  # under torchrun: rank 0 reports
    if resume is not None:
        path = Path(resume) if resume else Path(args.get("out_dir", TrainConfig().out_dir)) / "checkpoint.pt"
        trainer = Trainer.resume(path, callbacks=callbacks, **args)
    else:
        trainer = Trainer(preset(name, **args), callbacks=callbacks)
    history = trainer.fit()
    if not world.is_main:
        return 0
    s = history.summary()
    stopped = " (stopped early: resume with --resume)" if trainer.step < trainer.cfg.steps else ""
    where = f"{world.size} processes ({trainer.device.type})" if world.distributed else trainer.device
    print(f"{s['steps']} steps{stopped} on {where}: {s['images_per_sec']:.0f} images/s (median after "
          f"warm-up), {s['step_time_ms']:.1f} ms/step, peak tensor memory {s['peak_mem_mb']:.0f} MB, "
          f"loss_d {s['loss_d']:.3f}, loss_g {s['loss_g']:.3f}. Samples: {trainer.out_dir / 'samples'}, "
          f"checkpoint: {trainer.out_dir / 'checkpoint.pt'}")
    return 0


# -- prepare --------------------------------------------------------------------------------------------------------

def _prepare_flags(p: argparse.ArgumentParser) -> None:
    knobs = {f.name: f.metadata["knob"] for f in fields(TrainConfig)}
    p.add_argument("data_path", metavar="DATA_PATH", help="the folder of image files (class sub-folders give labels)")
    for name in ("image_size", "channels", "data_root"):
        knob = knobs[name]
        p.add_argument(f"--{name.replace('_', '-')}", type=knob.kind, choices=knob.choices,
                       default=getattr(TrainConfig(), name), help=f"{knob.help}: as train will be given")
    p.add_argument("--decoder", choices=("pil", "nvjpeg"), default="pil",
                   help="pil: PIL in threads, the per-sample path's pixels exactly; nvjpeg: JPEGs decoded in batches "
                        "by torchvision.io.decode_jpeg on --device (a GPU's nvJPEG)")
    p.add_argument("--device", default="auto", help="where --decoder nvjpeg decodes (default: CUDA when present)")
    p.add_argument("--workers", type=_count(1), default=None, help="decoding threads (default: this process's cores)")
    p.add_argument("--rebuild", action="store_true", help="decode again even if the cache matches the folder")


def _prepare(args: dict) -> int:
    from .core.data import CachedFolder
    from .measuring.hardware import resolve_device

    device = resolve_device(args["device"]) if args["decoder"] == "nvjpeg" else None
    CachedFolder(args["data_path"], args["image_size"], args["channels"], args["data_root"], progress=True,
                 workers=args["workers"], decoder=args["decoder"], device=device, rebuild=args["rebuild"])
    return 0


# -- profile --------------------------------------------------------------------------------------------------------

def _profile_flags(p: argparse.ArgumentParser) -> None:
    _add_preset_flag(p)
    p.add_argument("--profile-steps", type=_count(1), default=5, help="steps recorded by the profiler (default: 5)")
    p.add_argument("--warmup", type=_count(0), default=2, help="steps run before measuring (default: 2)")
    p.add_argument("--trace", default=None, help="chrome trace path (default: <out-dir>/trace.json)")
    add_config_flags(p)


def _profile(args: dict) -> int:
    from .speed.profiling import profile

    steps, warmup, trace, name = args.pop("profile_steps"), args.pop("warmup"), args.pop("trace"), args.pop("preset")
    report = profile(preset(name, **args), steps=steps, warmup=warmup, trace_path=trace)
    print(report)
    print(report.table)
    print(f"trace (open in https://ui.perfetto.dev): {report.trace_path}")
    return 0


# -- bench ----------------------------------------------------------------------------------------------------------

def _bench_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", choices=("cpu", "gpu", "tiny"), default=None,
                   help="cpu: 32 px glyphs, a few minutes on 2 cores; gpu: 64 px colour glyphs; tiny: seconds, to see "
                        "that it runs, its figures meaning nothing (default: by device)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")
    p.add_argument("--quality", action="store_true", help="also train every variant on the same number of images "
                                                          "and report FID, KID and class coverage")
    p.add_argument("--quality-images", type=_count(1), default=None, metavar="N",
                   help="with --quality: training images per variant (default: 800 steps of batch 128 on a CPU, 3000 "
                        "on a GPU; fewer compare noise)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="include torch.compile variants (default: wherever it can compile: CUDA, or a CPU with a C++ "
                        "compiler)")
    p.add_argument("--repeats", type=_count(1), default=None, help="interleaved repeats (default: 5)")
    p.add_argument("--variants", nargs="+", default=None, help="run only these ladder rows (quote names)")
    p.add_argument("--climb", action=argparse.BooleanOptionalAction, default=None,
                   help="after the rows, the climbing ladder: from the reference, each technique added to the best "
                        "config so far and kept only where the keep rule measures it faster; its last kept config is "
                        "its 'all together' (default: on CUDA)")
    p.add_argument("--scaling", action="store_true",
                   help="instead of the ladder: images/s and scaling efficiency for 1..N processes under torchrun "
                        "(N: the GPUs here; on a CPU, 2 processes sharing its cores)")
    p.add_argument("--max-processes", type=_count(1), default=None, help="with --scaling: the largest N")
    p.add_argument("--json", default=None,
                   help="where to write the JSON (default: runs/bench/bench.json, or scaling.json)")
    p.add_argument("--png", default="runs/bench/bench.png", help="where to write the chart (default: %(default)s)")


def _bench(args: dict) -> int:
    from .speed import bench
    from .core.checkpoint import ensure_writable
    from .measuring.hardware import resolve_device

    size = args["size"] or ("gpu" if resolve_device(args["device"]).type == "cuda" else "cpu")
    progress = lambda line: print(line, file=sys.stderr)  # noqa: E731
    if args["scaling"]:
        path = args["json"] or "runs/bench/scaling.json"
        ensure_writable(Path(path).parent)  # before minutes of measuring, not after
        try:
            result = bench.scaling(size, args["device"], args["max_processes"], args["repeats"] or 3,
                                   progress=progress)
        except bench.ScalingCrash as e:  # not the user's mistake: show what the child printed, as a failure
            print(f"gantools: FAILED: {e}", file=sys.stderr)
            return 1
        bench.save(result, path)
        print(bench.scaling_markdown(result))
        print(f"\nJSON: {path}")
        return 0
    args["json"] = args["json"] or "runs/bench/bench.json"
    for path in (args["json"], args["png"]):
        ensure_writable(Path(path).parent)
    plan = {"quality_images": args["quality_images"]} if args["quality_images"] else None
    result = bench.run(size, args["device"], args["variants"], args["quality"], args["compile"], args["repeats"],
                       plan=plan, progress=progress, climb=args["climb"],
                       partial=lambda so_far: bench.save(so_far, args["json"]))  # a run cut short keeps its rows
    bench.save(result, args["json"])
    import matplotlib

    matplotlib.use("Agg")  # a file, not a window
    from .workbook.display import bench_chart

    bench_chart(result, args["png"])
    print(bench.markdown(result))
    print(f"\nJSON: {args['json']}  chart: {args['png']}")
    return 0


# -- check ----------------------------------------------------------------------------------------------------------

def _check_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    p.add_argument("--json", default="runs/check/check.json", help="where to write the results (default: %(default)s)")
    p.add_argument("--only", nargs="+", default=None, metavar="ROW",
                   help="check only these rows (quote names, e.g. --only fp32 'compile default'; a GPU's run is "
                        "recorded only when every row ran)")
    p.add_argument("--skip", nargs="+", default=None, metavar="ROW", help="check every row but these")


def _check(args: dict) -> int:
    from .speed import check
    from .core.checkpoint import ensure_writable

    ensure_writable(Path(args["json"]).parent)
    result = check.run(args["device"], progress=lambda line: print(line, file=sys.stderr), only=args["only"],
                       save_to=args["json"], skip=args["skip"])
    check.save(result, args["json"])
    print(check.table(result))
    print(f"\nJSON: {args['json']}")
    return 0 if result["ok"] else 1


# -- doctor ---------------------------------------------------------------------------------------------------------

def _doctor_flags(p: argparse.ArgumentParser) -> None:
    from .doctor import STEPS, TIMEOUT_S, WARMUP

    p.usage = "python -m gantools doctor [OPTIONS] SCRIPT.py [ARGS...]"
    p.add_argument("--steps", type=_count(1), default=STEPS,
                   help="iterations timed, then as many profiled (default: %(default)s)")
    p.add_argument("--warmup", type=_count(0), default=WARMUP, help="iterations skipped first (default: %(default)s)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="chrome trace for Perfetto (default: runs/doctor/<script>-trace.json)")
    p.add_argument("--timeout", type=_seconds, default=TIMEOUT_S, metavar="S",
                   help="give up when no optimizer has stepped S seconds after the start (default: %(default)g)")
    p.add_argument("--try", dest="try_fixes", action="store_true",
                   help="then run the script again with each fix applied, measure each against the best so far, "
                        "keep the ones that win")
    p.add_argument("--patch", default=None, metavar="PATH",
                   help="write the kept fixes as a unified diff of your files (implies --try; your files are never "
                        "edited)")
    p.add_argument("--repeats", type=_count(2), default=5,
                   help="paired runs per fix with --try (default: %(default)s; five more when undecided)")
    p.add_argument("--fid", default=None, choices=("glyphs", "mnist", "fashion-mnist", "cifar10"), metavar="DATASET",
                   help="with --try: your script trains on this gantools dataset, so hold the kept fixes to FID "
                        "(glyphs, mnist, fashion-mnist, cifar10), judged against a second seed's spread")
    p.add_argument("--fid-images", type=_count(1), default=12_800, metavar="N",
                   help="training images per FID run with --fid (default: %(default)s)")
    p.add_argument("--nproc", type=_count(2), default=None, metavar="N",
                   help="run a DistributedDataParallel script in N processes on this machine, as torchrun would "
                        "(or start the doctor itself under torchrun); rank 0 reports")
    p.add_argument("script", metavar="SCRIPT.py", nargs="?", help="your training script")  # missing: said in _doctor
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="its arguments, passed on untouched")


def _positive(unit: str):
    """An argparse type: a positive number of `unit`."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{value:g} must be > 0")
        return value
    return parse


_seconds = _positive("seconds")


def _doctor(args: dict) -> int:
    from . import doctor
    from .core.checkpoint import ensure_writable

    if args["script"] is None:
        return _fail("give your training script: python -m gantools doctor [OPTIONS] SCRIPT.py [ARGS...]")
    script = doctor.check_script(args["script"], several=True)  # under torchrun: `ranks` runs it
    for path in (args["json"], args["trace"] or doctor.default_trace(args["script"])):  # before the run, not after
        if path:
            ensure_writable(Path(path).parent)
    if args["patch"]:
        from .doctor.patching.patch import check_patch_path
        check_patch_path(Path(args["patch"]), script)
    if args["nproc"] or distributed.world().distributed:  # a DDP script: one diagnosis per process
        from .doctor.diagnosis import ranks
        return ranks.main(args, _doctor_argv(args))
    try:
        report = doctor.run_script(args["script"], args["args"], args["steps"], args["warmup"], args["trace"],
                                   args["timeout"])
    except doctor.ScriptError as e:  # the user's own traceback, marked as theirs; none of ours
        print(f"gantools doctor: your script raised:\n{e.traceback_text}gantools doctor: {e}", file=sys.stderr)
        return 2
    print(report)
    if args["json"]:
        print(f"JSON: {report.save_json(args['json'])}")
    if not report.complete:
        print(f"gantools doctor: {report.note}", file=sys.stderr)
        return 130 if report.settings.get("outcome") == "interrupted" else 2
    if args["try_fixes"] or args["patch"] or args["fid"]:
        return _try(args, report)
    return 0


def _doctor_argv(args: dict) -> list:
    """The doctor's command line for each of --nproc's processes."""
    argv = ["--steps", str(args["steps"]), "--warmup", str(args["warmup"]), "--timeout", str(args["timeout"])]
    for flag in ("json", "trace"):
        if args[flag]:
            argv += [f"--{flag}", str(args[flag])]
    return argv + [args["script"], *args["args"]]


def _try(args: dict, report) -> int:
    from .doctor.diagnosis import analysis
    from .core.checkpoint import atomic_write
    from .doctor.patching import patch as patching
    from .doctor.trying import try_fixes as trying
    from .doctor.fixes.catalogue import context

    import torch
    facts = analysis.machine_facts(torch.device(report.device))
    print()
    result = trying.try_fixes(args["script"], args["args"], report, facts, args["warmup"], args["steps"],
                              args["repeats"], args["timeout"], progress=lambda line: print(line, flush=True),
                              fid=args["fid"], fid_images=args["fid_images"])
    print()
    print(result)
    if args["json"]:
        data = json.loads(Path(args["json"]).read_text())
        data["try"] = result.to_dict()
        Path(args["json"]).write_text(json.dumps(data, indent=1))
    if result.interrupted:
        print("gantools doctor: interrupted (Ctrl-C) during --try: no patch written", file=sys.stderr)
        return 130
    if args["patch"]:
        patch = patching.make_patch(result.kept_parts, report, context(report, facts))
        for fix, why in patch.by_hand:
            print(f"  apply by hand ({fix}): {why}")
        atomic_write(args["patch"], lambda f: f.write(patch.diff.encode()))
        print(patching.patch_line(args["patch"], patch, result.kept_parts))
    return 0


# -- tune -----------------------------------------------------------------------------------------------------------

def _tune_flags(p: argparse.ArgumentParser) -> None:
    _add_preset_flag(p)
    p.add_argument("--minutes", type=_positive("minutes"), default=15.0, metavar="M",
                   help="wall-clock budget, the quality check included (default: %(default)g)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the result as JSON")
    p.add_argument("--quality", action=argparse.BooleanOptionalAction, default=True,
                   help="train the start and the final config on the same images and keep the final FID within "
                        "1.1x the start's, backing off changes if needed (default: on)")
    p.add_argument("--quality-images", type=_count(1), default=None, metavar="N",
                   help="images each config trains on for the quality check (default: 800 steps of batch 128 on a "
                        "CPU, 3000 on a GPU)")
    p.add_argument("--tune-batch-size", action="store_true",
                   help="also try doubling batch_size (learning rates x sqrt 2): changes what is learned per image, "
                        "so off by default")
    add_config_flags(p)


def _tune(args: dict) -> int:
    from .core.checkpoint import ensure_writable
    from .tuning.autotune import tune
    from .tuning.space import default_space

    minutes, path, quality = args.pop("minutes"), args.pop("json"), args.pop("quality")
    images, batch, name = args.pop("quality_images"), args.pop("tune_batch_size"), args.pop("preset")
    if path:
        ensure_writable(Path(path).parent)  # before minutes of tuning, not after
    result = tune(preset(name, **args), minutes, quality=quality, quality_images=images,
                  space=default_space(batch_size=True) if batch else None)
    print()
    print(result.summary())
    if path:
        print(f"JSON: {result.save_json(path)}")
    return 130 if result.stopped else 0


# -- info -----------------------------------------------------------------------------------------------------------

def _info(args: dict) -> int:
    print(json.dumps(machine_info(), indent=1))
    return 0


# name -> (one-line help, description, add its flags, run it, may run under torchrun)
COMMANDS = {
    "train": ("train a GAN (DCGAN on glyphs unless told otherwise)",
              "Train a GAN. Flags override the preset; every flag is a TrainConfig field.", _train_flags, _train, True),
    "prepare": ("decode a folder of images once into the cache train reads (run it once, e.g. in a cluster job)",
                "Decode, resize and crop every image under DATA_PATH once into a uint8 cache at the training "
                "resolution (a memory-mappable file and a manifest, under the data root); train, profile and tune "
                "with dataset=folder read it, and rebuild it when the folder or the settings change.",
                _prepare_flags, _prepare, False),
    "profile": ("profile a few steps and say what to fix next",
                "Profile a config with torch.profiler: per-phase breakdown, op table, trace for Perfetto, and a "
                "verdict (data-, host-overhead-, compute- or memory-bound) with the fix to try next.",
                _profile_flags, _profile, False),
    "bench": ("the benchmark ladder: each technique against the tutorial's loop",
              "Reference loop, each technique alone, all together and a max-throughput preset, interleaved in one "
              "process; --climb (the default on CUDA) adds the climbing ladder, each technique on top of the best "
              "so far, kept where measured faster; --quality adds FID/KID/coverage at an equal image budget. Prints "
              "Markdown tables.",
              _bench_flags, _bench, False),
    "check": ("run every technique for a few steps on this machine and say which work (the first thing to run on "
              "a new GPU)",
              "Every precision the device supports, fused and foreach Adam (on CUDA also fp16 with each optimizer "
              "implementation), channels_last, torch.compile, the device "
              "loader, a DataLoader with workers (pinned on CUDA), accumulation, WGAN-GP, lazy R1 with EMA, a "
              "conditional GAN and DDP with 2 processes, a few "
              "steps each: finite losses, no gradients into a frozen D, recompiles within bounds, exact resume "
              "(CPU), host syncs in a GradScaler's optimizer steps (none with fused Adam). Prints a table, writes "
              "JSON, exits 1 if anything failed.", _check_flags, _check, False),
    "doctor": ("diagnose YOUR training script: where its time goes, what to change in it",
               "Run your own GAN training script, unmodified, find its iterations (optimizer steps), time and "
               "profile a few, stop it, and say what to change in your code, with the numbers that justify it. "
               "Options go before SCRIPT.py; everything after it goes to the script.", _doctor_flags, _doctor,
               True),
    "tune": ("find the fastest config on this machine, keeping quality: profile, fix, measure, repeat",
             "Start from a config (the train flags) and run the workbook's loop: profile, try the verdict's fix (or "
             "the next speed knob), measure it against the best so far interleaved, keep it only if faster by more "
             "than the spread; then train start and final on the same images and keep FID within 1.1x. Prints the "
             "path as it goes and the final config as Python and as flags; Ctrl-C stops between measurements.",
             _tune_flags, _tune, False),
    "info": ("print what this machine is (device, versions, cores) as JSON", None, lambda p: None, _info, True),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m gantools", description="Fast GAN training, measured.")
    sub = parser.add_subparsers(dest="command", required=True)
    parser.commands = {}
    for name, (help, description, add_flags, _, _) in COMMANDS.items():
        parser.commands[name] = sub.add_parser(name, help=help, description=description or help)
        add_flags(parser.commands[name])
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    namespace, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the subcommand's parser, so the pointer is to its own --help
        parser.commands[namespace.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    args = vars(namespace)
    command = args.pop("command")
    _, _, _, run, under_torchrun = COMMANDS[command]
    world = distributed.world()
    if world.distributed and not under_torchrun:
        return _fail(f"{command} runs as one process; start it without torchrun (bench --scaling launches "
                     f"torchrun itself)")
    try:
        return run(args)
    except GantoolsError as e:
        # config, data and all-reduced losses are the same on every rank: rank 0 says it once
        if world.is_main or isinstance(e, (CheckpointError, OutOfMemory)):
            rank = "" if world.is_main else f" (rank {world.rank})"
            print(f"gantools: error{rank}: {e}", file=sys.stderr)
        return 2
