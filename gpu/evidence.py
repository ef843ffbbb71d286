"""`make gpu-evidence`: everything a GPU machine should tell gantools, in one command, in 9 minutes.

A GPU reaches this project rarely and briefly, bare: its own Python and PyTorch, no network. So the run is prepared
here and needs nothing there but a `python3` with torch and the wheel folder that `make gpu-wheels` fills:

1. install: the packages gantools needs that this Python lacks, from the wheel folder, into a folder of their own
   (`pip install --no-index --no-deps --target`): its torch and everything else it has are never touched;
2. the parts (`PARTS`), each a child process with its own time budget (what an earlier part left unused is added to
   the next), stopped with all its children when it overruns, so one failure cannot eat the rest: the machine;
   the data the parts train on; `gantools check` (every row, the CUDA-only ones included); whole-step CUDA graphs
   replayed against eager training (`speed.replay.replay_matches_eager`); the climbing benchmark ladder at DCGAN 64
   px (images/s, FLOPs, MFU against the published peak and against the bf16 matmul peak measured here, each row's
   host budget); a folder of JPEGs decoded once into the cache by PIL and by nvJPEG, and its data wait per iteration
   by loader; `gantools doctor --try --patch` on the tutorial's plain DCGAN and on a WGAN-GP; FID of the ladder's
   best beside the reference's where the time left fits a meaningful budget; the first notebook in quick mode;
3. one folder, `<device>-<date>` under $GANTOOLS_EVIDENCE_DIR (default gpu-evidence/), rewritten after every part
   (a run cut off still leaves what it measured): `report.md` (the machine, each part's result, each failure with
   its traceback), `evidence.json` (the same, and every number), `log.txt` (everything the parts printed), the
   ladder's chart and the doctor's patches: ready to copy into docs/gpu/.

`--dry` runs the same parts on a CPU at tiny sizes in a minute or two (CUDA-only rows listed as not applicable):
`make test` runs it, so the command cannot rot between GPU runs. It checks that each part runs, on a CPU however slow
or busy: each part's time is reported beside its budget, and only a part that hangs (`DRY_HANG_S`) is stopped.
`--parts` (or $GANTOOLS_EVIDENCE_PARTS) runs a few parts again, e.g. a second try of one that failed. Standard
library only: it runs before anything is installed.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import (EVIDENCE, LOG, REPORT, _part, folder_name, headline, headline_markdown,  # noqa: E402
                    report_markdown)
from wheels import ROOT, normalize  # noqa: E402 (the folder's other script: one way to compare names)

TOTAL_S = 540     # the whole run, install and a last part's stop included: 9 minutes, so that 15 minutes of a
                  # lent GPU leave room for its start and a second try of a part (`--parts`, `--seconds`)
DRY_TOTAL_S = 300
STOP_S = 12       # the most a part's stop takes (_kill)
DRY_HANG_S = 600  # the dry run's only limit on a part: a hang, never a slow or busy CPU
TAIL = 6000       # characters of a part's output kept in evidence.json (log.txt has it all)
MIN_FID_IMAGES = 128 * 800  # below this FID on glyphs still falls steeply: shorter budgets compare noise (bench.PLAN)
FID_IMAGES = 128 * 3000     # the ladder's own quality budget on a GPU (bench.PLAN)


@dataclass(frozen=True)
class Part:
    """One child process's worth of evidence: its budget in seconds on a GPU and in the dry run, and what it shows."""

    name: str
    budget_s: int
    dry_budget_s: int
    what: str


PARTS = (
    Part("machine", 10, 30, "the GPU, its driver, torch, CUDA and cuDNN (`gantools info`, nvidia-smi)"),
    Part("data", 25, 40, "the glyph caches the ladder trains on and the PNG folder the doctor's scripts read"),
    Part("check", 60, 90, "`gantools check`: every technique a few steps, each verified (CUDA-only rows on a GPU), "
                          "but compile max-autotune"),
    Part("check-autotune", 60, 30, "`gantools check`'s compile max-autotune row on its own: the slowest to compile, "
                                   "so an overrun costs no other row"),
    Part("graphs", 35, 30, "whole-step CUDA graphs replayed against eager training: 20 seeded steps of the GPU "
                           "preset (device data, bf16), losses and weights compared"),
    Part("ladder", 120, 60, "the climbing benchmark ladder at DCGAN 64 px: the reference and device-resident data, "
                            "then each technique on top of the best so far, kept where measured faster; images/s, "
                            "FLOPs, MFU, each row's host budget"),
    Part("memory", 20, 40, "the largest batch that fits the GPU (`largest_batch`: cudaMemGetInfo, bisection on "
                           "out-of-memory) and activation checkpointing's peak against none, at DCGAN 64 px"),
    Part("folder", 35, 60, "a folder of 2,000 JPEGs: the first decode into the cache by PIL on every core against "
                           "nvJPEG on the GPU, the second run's read, and the data wait per iteration of a DataLoader "
                           "decoding per sample (best of 4 and 8 workers, pinned) against the cache on the device and "
                           "memory-mapped, at DCGAN 64 px"),
    Part("doctor-dcgan", 55, 60, "`gantools doctor --try --patch` on the PyTorch tutorial's plain DCGAN script"),
    Part("doctor-wgan-gp", 50, 60, "`gantools doctor --try --patch` on a WGAN-GP script (PyTorch-GAN's)"),
    Part("quality", 50, 60, "FID at an equal image budget: the reference against all together"),
    Part("notebooks", 20, 90, "the first notebook in quick mode (nbval), where Jupyter came in the wheel folder"),
)


class Run:
    """Where one run keeps its state: the options, the folders, the environment of its children, the parts so far."""

    def __init__(self, dry: bool, out_root: Path, wheels: Path, python: str, commit: str | None,
                 seconds: int | None = None):
        self.dry, self.wheels, self.python = dry, wheels, python
        # A GPU run stops each part at its budget; the dry run checks that every part runs on a CPU, however slow
        # or busy, so it reports each part's time against its budget and stops none (`run_part`).
        self.timed = not dry
        self.clock = time.monotonic  # what budgets are read on (a test's fake clock in tests/test_gpu_evidence.py)
        self.t0 = self.clock()
        total = seconds or (DRY_TOTAL_S if dry else TOTAL_S)
        self.deadline = self.t0 + total
        self.scratch = Path(tempfile.mkdtemp(prefix="gantools-evidence-"))
        self.site = self.scratch / "site"
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(self.site), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
            "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg"}
        self.env.pop("GANTOOLS_QUICK", None)  # each part says its own size
        if dry:  # and the benchmark's plan is the quick one: one-step chunks
            self.env["GANTOOLS_QUICK"] = "1"
        self.out_root = out_root
        self.out: Path | None = None  # named for the device once the machine part has run
        self.evidence = {"dry": dry, "date": time.strftime("%Y-%m-%d"), "started": time.strftime("%H:%M:%S %Z"),
                         "commit": commit or _commit(), "total_budget_s": total,
                         "python": python, "install": None, "machine": None, "parts": []}
        self.logs: list[str] = []
        self.slack = 0.0

    def left(self) -> float:
        return self.deadline - self.clock()


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# -- install ----------------------------------------------------------------------------------------------------------

def installed(python: str) -> set[str]:
    """The distributions `python` already has (normalized names), as importlib.metadata finds them."""
    code = "import importlib.metadata as m, json; print(json.dumps([d.metadata['Name'] for d in m.distributions()]))"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return {normalize(n) for n in json.loads(done.stdout) if n}


def missing_wheels(wheels: Path, have: set[str]) -> list[Path]:
    """The wheels in the folder whose distribution `have` lacks (a wheel's name starts with its distribution's)."""
    return sorted(w for w in wheels.glob("*.whl") if normalize(w.name.split("-")[0]) not in have)


def unpack(wheels: list[Path], site: Path) -> None:
    """Install wheels without pip, for a Python that has none: a wheel is a zip of what goes into site-packages
    (PEP 427), its `.data/purelib` and `.data/platlib` folders moved there too; scripts and headers are not needed."""
    import zipfile

    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            for member in z.namelist():
                parts = member.split("/")
                if parts[0].endswith(".data"):
                    if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                        continue
                    parts = parts[2:]
                target = site.joinpath(*parts)
                if member.endswith("/"):
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(member))


def install(run: Run) -> dict:
    """Install what this Python lacks (by distribution name) from the wheel folder into the run's own site folder;
    then gantools must import (what else does not import is recorded). Returns what was done; raises RuntimeError
    with the reason when nothing could run."""
    t = time.monotonic()
    have = installed(run.python)
    if "torch" not in have:
        raise RuntimeError(f"{run.python} has no torch: run with PYTHON=/path/to/the/python/that/has/torch")
    todo = missing_wheels(run.wheels, have) if run.wheels.is_dir() else []
    if todo:
        done = subprocess.run([run.python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                               "--no-compile", "--no-cache-dir", "--target", str(run.site), *map(str, todo)],
                              capture_output=True, text=True, timeout=max(10, run.left()))
        if done.returncode and "No module named pip" in done.stderr:
            unpack(todo, run.site)
        elif done.returncode:
            raise RuntimeError(f"pip could not install from {run.wheels}: {done.stderr.strip()[-2000:]}")
    check = ("import importlib, json, torch\n"
             "mods = ['gantools', 'gantools.doctor', 'libcst', 'ipywidgets', 'torchmetrics', 'matplotlib']\n"
             "bad = {}\nfor m in mods:\n"
             "    try: importlib.import_module(m)\n"
             "    except Exception as e: bad[m] = f'{type(e).__name__}: {e}'\n"
             "print(json.dumps({'torch': torch.__version__, 'cuda': torch.cuda.is_available(), 'failed': bad}))")
    done = subprocess.run([run.python, "-c", check], capture_output=True, text=True, timeout=120, env=run.env)
    if done.returncode:
        raise RuntimeError(f"importing gantools failed: {done.stderr.strip()[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    lacking = sorted(n for n in ("libcst", "ipywidgets", "torchmetrics", "matplotlib", "nbval", "ipykernel")
                     if normalize(n) not in have and not any(normalize(w.name.split("-")[0]) == n for w in todo))
    info = {"wheel_folder": str(run.wheels), "installed": [w.name for w in todo], "site": str(run.site),
            "torch": result["torch"], "cuda_available": result["cuda"], "import_failures": result["failed"],
            "not_available": lacking, "seconds": round(time.monotonic() - t, 1)}
    if "gantools" in result["failed"]:  # nothing can run; any other package only fails the parts that need it
        raise RuntimeError(f"gantools would not import: {result['failed']['gantools']}"
                           + (f" ({', '.join(lacking)} not in {run.wheels}: run `make gpu-wheels` first)"
                              if lacking else ""))
    return info


# -- running a part ---------------------------------------------------------------------------------------------------

def _kill(proc: subprocess.Popen) -> None:
    """The part's whole process group (its DataLoader workers, compile workers, torchrun, which stops its own ranks):
    first Ctrl-C's SIGINT, on which `doctor --try` still writes what it measured, then TERM, then KILL for whatever
    of the group is left. At most `STOP_S` seconds."""
    for sig, wait in ((signal.SIGINT, 8), (signal.SIGTERM, 4), (signal.SIGKILL, 0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            pass


def run_commands(commands: list[list[str]], env: dict, seconds: float | None, log: Path,
                 clock=time.monotonic) -> tuple[int | None, float]:
    """Run the commands one after another in a new process group, output to `log`, within `seconds` for all of them
    (None: no limit). Returns (the last exit status, or None when stopped at the limit; seconds taken on `clock`)."""
    t = clock()
    with open(log, "ab") as out:
        for command in commands:
            out.write(f"$ {shlex.join(command)}\n".encode())
            out.flush()
            proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                code = proc.wait(None if seconds is None else max(1.0, seconds - (clock() - t)))
            except subprocess.TimeoutExpired:
                _kill(proc)
                return None, clock() - t
            finally:
                if proc.poll() is None:
                    _kill(proc)
            if code != 0:
                return code, clock() - t
    return 0, clock() - t


def _traceback(text: str) -> str | None:
    """The last traceback (or gantools error) in a part's output."""
    at = text.rfind("Traceback (most recent call last)")
    if at >= 0:
        return text[at:][-TAIL:]
    errors = [line for line in text.splitlines() if "error" in line.lower()]
    return "\n".join(errors[-5:]) or None


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# -- the parts --------------------------------------------------------------------------------------------------------

def _py(run: Run, *args: str) -> list[str]:
    return [run.python, *args]


@dataclass
class Built:
    """A part ready to run: its commands, how to read its result afterwards, and its environment if not the run's."""

    commands: list
    result: object = lambda: None
    env: dict | None = None


def part_machine(run: Run, seconds: float) -> Built:
    info = run.scratch / "info.json"
    code = (f"import json, gantools.measuring.hardware as h; "
            f"open({str(info)!r}, 'w').write(json.dumps(h.machine_info()))")

    def result():
        gpu = {}
        for key, field in (("name", "name"), ("driver", "driver_version"), ("memory", "memory.total"),
                           ("max_sm_clock", "clocks.max.sm"), ("power_limit", "power.limit")):
            value = _nvidia_smi(field)  # one field at a time: a field this driver lacks costs only itself
            if value:
                gpu[key] = value
        return {"info": _json(info), "nvidia_smi": gpu or None}
    return Built([_py(run, "-c", code)], result)


def _nvidia_smi(field: str) -> str | None:
    """One field of the first GPU as nvidia-smi reports it, or None (no nvidia-smi, or a field it does not know)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        q = subprocess.run([smi, f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True, text=True,
                           timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = q.stdout.strip().splitlines()
    return lines[0].strip() if q.returncode == 0 and lines else None


def part_data(run: Run, seconds: float) -> Built:
    size = 32 if run.dry else 64
    code = (f"from gantools.core.data import load_glyphs, write_glyph_pngs\n"
            f"load_glyphs({size}, {1 if run.dry else 3})\n"
            f"write_glyph_pngs({str(run.scratch / 'pngs')!r}, {64 if run.dry else 2000}, {size}, 3)")
    return Built([_py(run, "-c", code)], lambda: {"pngs": str(run.scratch / "pngs")})


AUTOTUNE = "compile max-autotune"


def part_check(run: Run, seconds: float) -> Built:
    path = run.scratch / "check.json"
    device = ["--device", "cpu", "--only", "fp32", "bf16 autocast"] if run.dry else ["--device", "cuda", "--skip",
                                                                                     AUTOTUNE]
    return Built([_py(run, "-m", "gantools", "check", *device, "--json", str(path))], lambda: _json(path))


def part_check_autotune(run: Run, seconds: float) -> Built | str:
    if run.dry:
        return f"{AUTOTUNE} is a CUDA row"
    path = run.scratch / "check-autotune.json"
    return Built([_py(run, "-m", "gantools", "check", "--device", "cuda", "--only", AUTOTUNE, "--json", str(path))],
                 lambda: _json(path))


GRAPHS_STEPS = 20

GRAPHS_CODE = """
import json, sys
from gantools.core.config import preset
from gantools.errors import ConfigError
from gantools.speed.bench import SIZES
from gantools.speed.figures import first_line
cfg = preset("default", device={device!r}, loader="device", precision="bf16", **SIZES[{size!r}])
found = {{"size": {size!r}, "loader": "device", "precision": "bf16", "steps": {steps}}}
def done(code):
    json.dump(found, open({path!r}, "w"))
    sys.exit(code)
try:
    cfg.replace(cuda_graphs=True).validate()
except ConfigError as e:
    found["refused"] = first_line(e)
    print(f"cuda_graphs=True refused: {{found['refused']}}")
    done(0 if {dry!r} else 1)  # a CPU cannot capture: its refusal is what the dry run checks
if {dry!r}:
    found["error"] = "cuda_graphs=True was accepted on a CPU, which cannot capture"
    print(found["error"])
    done(1)
from gantools.speed.replay import replay_matches_eager
found.update(replay_matches_eager(cfg, steps={steps}))
verdict = "matches" if found["matches"] else "DOES NOT MATCH"
print(f"CUDA graph replay against eager, {{found['steps']}} seeded steps: {{verdict}} (largest loss difference "
      f"{{found['max_loss_diff']:.2e}}, largest relative weight difference {{found['max_weight_rel_diff']:.2e}})")
done(0 if found["matches"] else 1)
"""


def part_graphs(run: Run, seconds: float) -> Built:
    """`replay_matches_eager` on the GPU preset with device data and bf16. The dry run's CPU cannot capture: there
    the part records the ConfigError the switch raises, which is what it checks."""
    path = run.scratch / "graphs.json"
    code = GRAPHS_CODE.format(device="cpu" if run.dry else "cuda", size="tiny" if run.dry else "gpu",
                              steps=GRAPHS_STEPS, path=str(path), dry=run.dry)
    return Built([_py(run, "-c", code)], lambda: _json(path))


def part_ladder(run: Run, seconds: float) -> Built:
    """The climbing ladder (`bench --climb`) after a one-at-a-time table of the reference and one row: the climb
    holds every technique, and its budget is the part's."""
    path = run.scratch / "bench.json"
    # the dry run's variant trains in fp32: on a CPU without native bf16, a bf16 row at this width overruns the part
    size = (["--size", "tiny", "--device", "cpu", "--variants", "channels_last", "--repeats", "2", "--no-compile"]
            if run.dry else ["--size", "gpu", "--device", "cuda", "--variants", "device-resident data",
                             "--repeats", "3"])
    # the dry run leaves the climb out: a CPU's climb is tests/test_bench.py's, and here it would double the run
    climb = "--no-climb" if run.dry else "--climb"
    return Built([_py(run, "-m", "gantools", "bench", *size, climb, "--json", str(path), "--png",
                       str(run.out / "bench.png"))], lambda: _json(path))


MEMORY_CODE = """
import json
from gantools.core.config import preset
from gantools.speed.batch_fit import largest_batch, peak_mb
cfg = preset("default", device={device!r}, loader="device", **{size!r})
start = peak_mb(cfg, cfg.batch_size)
checkpointed = peak_mb(cfg.replace(activation_checkpointing="both"), cfg.batch_size)
print(f"batch {{cfg.batch_size}}: a step's peak {{start:.0f}} MB; with activation_checkpointing='both' "
      f"{{checkpointed:.0f}} MB")
found = {{"batch_size": cfg.batch_size, "peak_mb": start, "checkpointed_peak_mb": checkpointed}}
json.dump(found, open({path!r}, "w"))  # kept if the search below runs out of time
fit = largest_batch(cfg, budget_mb={budget})
print(f"the largest batch: {{fit.describe()}}; measured: {{fit.measured}}")
json.dump({{**found, "largest_batch": fit.batch, "limit": fit.limit, "largest_peak_mb": fit.peak_mb,
           "budget_mb": fit.budget_mb,
           "fixed_mb": fit.fixed_mb, "per_image_mb": fit.per_image_mb,
           "measured": {{str(k): v for k, v in fit.measured.items()}}}}, open({path!r}, "w"))
"""


def part_memory(run: Run, seconds: float) -> Built:
    """`largest_batch` and checkpointing on the device: on a GPU its free memory is the budget; the dry run gives
    a CPU budget of a few tiny batches' peaks."""
    path = run.scratch / "memory.json"
    code = MEMORY_CODE.format(
        device="cpu" if run.dry else "cuda", path=str(path),
        size=dict(nz=16, ngf=8, ndf=8, batch_size=32) if run.dry else
        dict(dataset="glyphs-color", image_size=64, channels=3, batch_size=128, ngf=64, ndf=64),
        budget="4 * start" if run.dry else None)
    return Built([_py(run, "-c", code)], lambda: _json(path))


def part_folder(run: Run, seconds: float) -> Built:
    """gpu/folder_speed.py on a folder of JPEGs it writes (glyphs drawn at the training size, stored half as large
    again, so every decode resizes): 2,000 at 64 px on the GPU; 64 at 32 px and one worker count in the dry run, where
    'nvjpeg' runs the same batched path on the CPU."""
    path = run.scratch / "folder.json"
    size = (["--device", "cpu", "--images", "64", "--stored-size", "48", "--model", "tiny", "--steps", "6",
             "--workers", "2"] if run.dry else ["--device", "cuda"])
    return Built([_py(run, str(ROOT / "gpu" / "folder_speed.py"), "--scratch", str(run.scratch / "folder"),
                      "--json", str(path), *size)], lambda: _json(path))


def _doctor(run: Run, name: str, script: str, args: list[str], dry_args: list[str], dry_try: bool = True) -> Built:
    path, patch = run.scratch / f"{name}.json", run.out / f"{name}.patch"
    # two paired runs per fix (two more when undecided): each run starts the script again, and a GPU's short
    # steps make that start-up, not the steps, most of the part's time; compile, the slowest to try, comes last
    steps = ["--steps", "2", "--warmup", "1", "--repeats", "2"] if run.dry else ["--repeats", "2"]
    trying = ["--patch", str(patch)] if dry_try or not run.dry else []
    command = _py(run, "-m", "gantools", "doctor", *steps, *trying, "--json", str(path),
                  "--trace", str(run.scratch / f"{name}-trace.json"),
                  str(ROOT / "tests" / "scripts" / script), "--dataroot", str(run.scratch / "pngs"),
                  *(dry_args if run.dry else args))
    return Built([command], lambda: _json(path))


def part_doctor_dcgan(run: Run, seconds: float) -> Built:
    return _doctor(run, "doctor-dcgan", "dcgan_plain.py", ["--epochs", "100"],
                   ["--batch-size", "16", "--ngf", "8", "--ndf", "8", "--nz", "16", "--epochs", "50", "--workers", "0"])


def part_doctor_wgan_gp(run: Run, seconds: float) -> Built:
    # the dry run diagnoses it only: --try's path is the DCGAN part's (and tests/test_doctor_try.py's) on a CPU
    return _doctor(run, "doctor-wgan-gp", "wgan_gp_mlp.py", ["--n_epochs", "200", "--sample_interval", "0"],
                   ["--batch_size", "16", "--hidden", "16", "--latent_dim", "16", "--n_epochs", "50",
                    "--sample_interval", "0"], dry_try=False)


def quality_images(ladder: dict | None, seconds: float, dry: bool) -> tuple[int | None, str]:
    """Training images per variant for the quality part: the ladder's own budget, or as many as `seconds` holds at the
    speeds the ladder measured (the reference and all together each train them, after their warm-ups again); None
    with the reason when fewer than a meaningful budget fit."""
    if dry:
        return 128 * 3, "the dry run's tiny budget (its FID means nothing)"
    rows = {r["variant"]: r for r in (ladder or {}).get("rows", [])}
    # without the fixed combination's row, the climb's best (its 'all together') sizes it
    ref, together = rows.get("reference (tutorial loop)"), rows.get("all together") or _climb_best(ladder)
    if not ref or not together:
        return None, "the ladder measured no reference and all-together speeds to size it by"
    train_s = seconds - 1.5 * (ref["warmup_s"] + together["warmup_s"]) - 15  # warm-ups, the FID classifier
    per_image = 1 / ref["images_per_sec"] + 1 / together["images_per_sec"]
    fits = int(max(0.0, train_s) / per_image) // 128 * 128
    if fits < MIN_FID_IMAGES:
        return None, (f"{MIN_FID_IMAGES:,} images each need about {MIN_FID_IMAGES * per_image + seconds - train_s:.0f}"
                      f" s at the ladder's speeds; {seconds:.0f} s were left")
    n = min(fits, FID_IMAGES)
    return n, f"{n:,} images each ({'the ladder budget' if n == FID_IMAGES else 'what the time left holds'})"


def _climb_best(ladder: dict | None) -> dict | None:
    best = ((ladder or {}).get("climb") or {}).get("best")
    return best if best and best.get("images_per_sec") and best.get("warmup_s") is not None else None


def part_quality(run: Run, seconds: float) -> Built | str:
    n, why = quality_images((_part(run.evidence, "ladder") or {}).get("result"), seconds, run.dry)
    if n is None:
        return why
    path = run.scratch / "quality.json"
    size = (["--size", "tiny", "--device", "cpu", "--variants", "channels_last", "--no-compile"]
            if run.dry else ["--size", "gpu", "--device", "cuda", "--variants", "all together"])
    command = _py(run, "-m", "gantools", "bench", *size, "--repeats", "1", "--quality", "--quality-images", str(n),
                  "--json", str(path), "--png", str(run.scratch / "quality.png"))
    return Built([command], lambda: {**_json(path), "images_each": n, "why": why} if _json(path) else None)


def part_notebooks(run: Run, seconds: float) -> Built | str:
    probe = subprocess.run([run.python, "-c", "import nbval, ipykernel"], env=run.env, capture_output=True, text=True)
    if probe.returncode:
        return ("Jupyter is not here (nbval and ipykernel did not import: "
                f"{probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else '?'})")
    notebooks = ["notebooks/00_baseline.ipynb"]  # all of them take minutes even on a GPU; make test runs them all
    env = {**run.env, "GANTOOLS_QUICK": "1"}
    # the dry run collects its cells only: make test runs that notebook itself, beside this part
    collect = ["--collect-only"] if run.dry else []
    command = _py(run, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax", "-o", "addopts=", *collect,
                  *notebooks)
    return Built([command], env=env)


BUILDERS = {"machine": part_machine, "data": part_data, "check": part_check, "check-autotune": part_check_autotune,
            "graphs": part_graphs, "ladder": part_ladder, "memory": part_memory, "folder": part_folder,
            "doctor-dcgan": part_doctor_dcgan, "doctor-wgan-gp": part_doctor_wgan_gp, "quality": part_quality,
            "notebooks": part_notebooks}


def run_part(run: Run, part: Part) -> dict:
    budget = part.dry_budget_s if run.dry else part.budget_s
    allowed = min(budget + run.slack, run.left() - STOP_S) if run.timed else budget + run.slack
    entry = {"name": part.name, "what": part.what, "budget_s": budget, "allowed_s": round(allowed),
             "seconds": 0.0, "status": None, "returncode": None, "output_tail": "", "traceback": None, "result": None}
    if run.timed and allowed < 5:
        entry["status"] = "not started: the run's time is spent"
        return entry
    print(f"[{part.name}] budget {budget} s (+{run.slack:.0f} s left over), {run.left():.0f} s of the run left"
          f"{'' if run.timed else ' (dry run: reported, not enforced)'}: {part.what}", flush=True)
    built = BUILDERS[part.name](run, allowed)
    if isinstance(built, str):
        run.slack = allowed  # all of it is the next part's
        entry["status"] = f"skipped: {built}"
        print(f"[{part.name}] {entry['status']}", flush=True)
        return entry
    log = run.scratch / f"{part.name}.log"
    code, seconds = run_commands(built.commands, built.env or run.env, allowed if run.timed else DRY_HANG_S, log,
                                 run.clock)
    text = log.read_text(errors="replace")
    run.logs.append(f"===== {part.name} =====\n{text}")
    entry.update(seconds=round(seconds, 1), returncode=code, output_tail=text[-TAIL:])
    try:
        entry["result"] = built.result()
    except Exception as e:  # noqa: BLE001 (a part's result that cannot be read is reported, not fatal)
        entry["result"] = None
        entry["traceback"] = f"reading the result: {type(e).__name__}: {e}"
    if code is None:
        entry["status"] = f"{'over budget' if run.timed else 'hung'}: stopped after {seconds:.0f} s"
        entry["traceback"] = _traceback(text) or "(stopped at its time limit; the end of its output is in log.txt)"
    elif code == 0:
        entry["status"] = "ok"
    elif part.name.startswith("check") and code == 1 and entry["result"]:
        entry["status"] = "ran: some rows FAILED"
    else:
        entry["status"] = f"FAILED (exit status {code})"
        entry["traceback"] = _traceback(text)
    run.slack = max(0.0, allowed - seconds) if code is not None else 0.0
    print(f"[{part.name}] {entry['status']} in {seconds:.0f} s", flush=True)
    return entry


def save(run: Run) -> None:
    """Write (again) the folder's report, JSON and log: after every part, so a run cut off keeps what it measured."""
    if run.out is None:
        run.out = run.out_root / folder_name(run.evidence)
        run.out.mkdir(parents=True, exist_ok=True)
    try:
        run.evidence["headline"] = headline(run.evidence)  # its numbers stored, as the docs quote them
        report = report_markdown(run.evidence)
    except Exception as e:  # noqa: BLE001 (a result this code did not expect must not end the run)
        report = f"# gantools GPU evidence\n\nThe report could not be drawn ({type(e).__name__}: {e}); " \
                 f"evidence.json holds every part's result.\n"
    (run.out / EVIDENCE).write_text(json.dumps(run.evidence, indent=1))
    (run.out / REPORT).write_text(report)
    (run.out / LOG).write_text("\n".join(run.logs))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry", action="store_true", help="the same parts on a CPU at tiny sizes (what make test runs)")
    p.add_argument("--out", default=os.environ.get("GANTOOLS_EVIDENCE_DIR", "gpu-evidence"),
                   help="where the run's folder goes (default: $GANTOOLS_EVIDENCE_DIR, else gpu-evidence)")
    p.add_argument("--wheels", default=os.environ.get("GANTOOLS_WHEELS", str(ROOT / "gpu-wheels")),
                   help="the folder `make gpu-wheels` filled (default: $GANTOOLS_WHEELS, else gpu-wheels)")
    p.add_argument("--parts", default=os.environ.get("GANTOOLS_EVIDENCE_PARTS"),
                   help=f"comma-separated, to run only these (of {', '.join(x.name for x in PARTS)}; the machine "
                        "always runs)")
    p.add_argument("--seconds", type=int, default=None,
                   help=f"the whole run's budget (default {TOTAL_S}; a dry run reports against {DRY_TOTAL_S} and stops "
                        "no part for time): less for a second try in the device time a session has left")
    p.add_argument("--python", default=sys.executable, help="the Python that has torch (default: this one)")
    p.add_argument("--headline", metavar="RUN", default=None,
                   help="print the headline of a stored run (docs/gpu/RUN) for the README and docs/results.md")
    a = p.parse_args(argv)
    if a.headline:
        folder = Path(a.headline)
        print(headline_markdown(json.loads((folder / EVIDENCE).read_text()), (folder / EVIDENCE).as_posix()))
        return 0
    chosen = {x.strip() for x in a.parts.split(",")} if a.parts else {x.name for x in PARTS}
    unknown = chosen - {x.name for x in PARTS}
    if unknown:
        print(f"gpu-evidence: unknown part(s) {', '.join(sorted(unknown))}; the parts: "
              f"{', '.join(x.name for x in PARTS)}", file=sys.stderr)
        return 2
    if any(x in chosen for x in ("doctor-dcgan", "doctor-wgan-gp")):
        chosen.add("data")
    chosen.add("machine")
    run = Run(a.dry, Path(a.out), Path(a.wheels), a.python, os.environ.get("GANTOOLS_COMMIT"), a.seconds)
    run.slack = sum(x.dry_budget_s if a.dry else x.budget_s for x in PARTS if x.name not in chosen)  # theirs to use
    print(f"gpu-evidence{' (dry run)' if a.dry else ''}: {run.evidence['total_budget_s']} s in all; scratch "
          f"{run.scratch}", flush=True)
    try:
        run.evidence["install"] = install(run)
        print(f"[install] {len(run.evidence['install']['installed'])} wheels in "
              f"{run.evidence['install']['seconds']} s", flush=True)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        run.evidence["install"] = {"error": str(e)}
        save(run)
        print(f"gpu-evidence: the install failed: {e}\n  report: {run.out / REPORT}", file=sys.stderr)
        return 1
    for part in PARTS:
        if part.name not in chosen:
            continue
        if part.name != "machine" and run.out is None:
            save(run)
        entry = run_part(run, part)
        run.evidence["parts"].append(entry)
        if part.name == "machine":
            run.evidence["machine"] = entry["result"]
        save(run)
    failed = [x["name"] for x in run.evidence["parts"] if x["status"] != "ok" and not x["status"].startswith("skipped")]
    print(f"gpu-evidence: {run.out}/ ({REPORT}, {EVIDENCE}, {LOG} ...): "
          + (f"not ok: {', '.join(failed)}" if failed else "every part ok"), flush=True)
    shutil.rmtree(run.scratch, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
