"""`make gpu-evidence` and `make gpu-wheels` (gpu/): the dry run passes every part on this CPU, the install takes only
what a Python lacks from the wheel folder, a part over its budget is stopped with its children while the rest goes
on, and what the README and docs/results.md say of stored GPU runs is what their JSON holds."""
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from conftest import FakeClock

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", ROOT / "gpu" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


evidence, wheels = _load("evidence"), _load("wheels")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The README's command for a GPU machine, in dry mode, with this Python (which has torch)."""
    out = tmp_path_factory.mktemp("evidence")
    # a session of its own, so that a hang (each part is stopped after evidence.DRY_HANG_S) ends with all its parts
    proc = subprocess.Popen(["make", "-s", "gpu-evidence", f"PYTHON={sys.executable}", "DRY=1"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "GANTOOLS_EVIDENCE_DIR": str(out)})
    try:
        stdout, stderr = proc.communicate(timeout=1800)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return done, list(out.iterdir())


@pytest.mark.slow
def test_the_dry_run_passes_every_part_and_leaves_one_folder_the_device_tool_can_bring_back(dry_run):
    done, folders = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((folders[0] / "evidence.json").read_text())
    assert len(folders) == 1 and re.fullmatch(rf"[a-z0-9-]+-dry-{data['date']}", folders[0].name)
    files = sorted(p.name for p in folders[0].iterdir())
    # what a device run brings back: at most 8 files, each named in letters, digits, '.', '_' and '-'
    assert len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files), files
    assert {"report.md", "evidence.json", "log.txt", "bench.png", "doctor-dcgan.patch"} <= set(files)
    assert [p["name"] for p in data["parts"]] == [p.name for p in evidence.PARTS]
    statuses = {p["name"]: p["status"] for p in data["parts"]}
    assert statuses.pop("check-autotune") == "skipped: compile max-autotune is a CUDA row"
    assert set(statuses.values()) == {"ok"}, statuses
    for part in data["parts"]:  # each printed its budget as it went
        assert f"[{part['name']}] budget {part['budget_s']} s" in done.stdout
    log = (folders[0] / "log.txt").read_text()
    assert re.search(r"--trace \S*gantools-evidence-\S*/doctor-dcgan-trace\.json", log), "traces go to the scratch"
    check = next(p for p in data["parts"] if p["name"] == "check")["result"]
    assert [r["technique"] for r in check["rows"]] == ["fp32", "bf16 autocast"] and check["ok"]
    assert "out of memory told apart, then training again" in check["cuda_only_not_run"]
    ladder = next(p for p in data["parts"] if p["name"] == "ladder")["result"]
    assert ladder["rows"][0]["variant"].startswith("reference") and ladder["rows"][0]["flops_per_image"] > 0
    # every row's host budget counted as a GPU runs it (the dry run leaves the climb to test_bench's CLI test)
    assert "climb" not in ladder and "partial" not in ladder
    for row in ladder["rows"]:
        assert row["host_budget"]["as_on"] == "cuda" and row["host_ms"] > 0
    # a CPU cannot capture: the graphs part records the switch's refusal, and that is its run
    graphs = next(p for p in data["parts"] if p["name"] == "graphs")["result"]
    assert graphs["refused"].startswith("invalid TrainConfig: cuda_graphs=True") and graphs["steps"] == 20
    doctors = {p["name"]: p["result"] for p in data["parts"] if p["name"].startswith("doctor")}
    assert "try" in doctors["doctor-dcgan"] and "try" not in doctors["doctor-wgan-gp"]  # dry: one --try, one diagnosis
    notebooks = next(p for p in data["parts"] if p["name"] == "notebooks")
    assert re.search(r"\d+ tests? collected", notebooks["output_tail"]), notebooks["output_tail"]  # dry: collected only
    folder = next(p for p in data["parts"] if p["name"] == "folder")["result"]  # both decoders, then three loaders
    assert set(folder["decode"]) == {"pil", "nvjpeg", "second_run"} and folder["decode"]["nvjpeg"]["device"] == "cpu"
    assert [r["loader"] for r in folder["loaders"]] == ["dataloader, PIL per sample", "device", "memmap"]
    assert all(f"- {line}" in (folders[0] / "report.md").read_text() for line in folder["lines"])
    quality = next(p for p in data["parts"] if p["name"] == "quality")["result"]
    assert all("fid" in r for r in quality["rows"])
    report = (folders[0] / "report.md").read_text()
    for heading in ("## The machine", "## Headline", "## The parts", *(f"## {p.name}" for p in evidence.PARTS)):
        assert heading in report
    assert "Not applicable on this CPU (CUDA only):" in report and "gantools check on" in report


@pytest.mark.slow
def test_the_headline_says_what_the_runs_json_holds(dry_run):
    _, folders = dry_run
    data = json.loads((folders[0] / "evidence.json").read_text())
    h = evidence.headline(data)
    rows = next(p for p in data["parts"] if p["name"] == "ladder")["result"]["rows"]
    best = max(rows, key=lambda r: r["speedup"])
    assert h["ladder"]["best"] == best["variant"] and h["ladder"]["best_speedup"] == best["speedup"]
    text = evidence.headline_markdown(data, "docs/gpu/x/evidence.json")
    assert f"| reference (tutorial loop) images/s | {rows[0]['images_per_sec']:.0f} |" in text
    assert f"| best against the reference | {best['speedup']:.2f}x |" in text
    assert "a dry run on a CPU" in text and "2 of 2 rows ok (fp32, bf16 autocast)" in text


def _run(tmp_path, wheels, dry=True):
    """A run whose scratch folder is under the test's own."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    run = evidence.Run(dry, tmp_path / "out", wheels, sys.executable, "test")
    Path(run.scratch).rmdir()
    run.scratch = tmp_path / "scratch"
    run.scratch.mkdir()
    run.site = run.scratch / "site"
    run.env["PYTHONPATH"] = os.pathsep.join([str(run.site), *run.env["PYTHONPATH"].split(os.pathsep)[1:]])
    return run


def _wheel(folder: Path, name: str, module: str) -> Path:
    """A minimal pure-Python wheel: one module, its dist-info."""
    path = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}.py", "VALUE = 42\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.mark.slow
def test_the_install_takes_from_the_wheel_folder_only_what_this_python_lacks(tmp_path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    _wheel(folder, "gantools_probe_dist", "gantools_probe_module")
    _wheel(folder, "torch", "torch_impostor")  # torch is installed here: its wheel must be left alone
    run = _run(tmp_path, folder)
    assert [w.name for w in evidence.missing_wheels(folder, evidence.installed(sys.executable))] == [
        "gantools_probe_dist-1.0-py3-none-any.whl"]
    info = evidence.install(run)
    assert info["installed"] == ["gantools_probe_dist-1.0-py3-none-any.whl"] and not info["import_failures"]
    assert (run.site / "gantools_probe_module.py").is_file() and not (run.site / "torch_impostor.py").exists()
    done = subprocess.run([sys.executable, "-c", "import gantools_probe_module as m; print(m.VALUE)"], env=run.env,
                          capture_output=True, text=True)
    assert done.stdout.strip() == "42"


def test_a_python_without_torch_is_refused_in_one_line(tmp_path, monkeypatch):
    run = _run(tmp_path, tmp_path)
    monkeypatch.setattr(evidence, "installed", lambda python: {"numpy"})
    with pytest.raises(RuntimeError, match="has no torch: run with PYTHON="):
        evidence.install(run)


@pytest.mark.slow
def test_a_part_over_its_budget_is_stopped_with_its_children_and_the_next_part_runs(tmp_path, monkeypatch):
    pid_file = tmp_path / "child.pid"
    sleeper = ("import subprocess, sys, time\n"
               f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
               f"open({str(pid_file)!r}, 'w').write(str(p.pid))\ntime.sleep(60)\n")
    run = _run(tmp_path, tmp_path)
    run.timed = True  # as on a GPU (the dry run stops no part)
    run.out = tmp_path / "out"
    run.out.mkdir()
    monkeypatch.setitem(evidence.BUILDERS, "check", lambda r, s: evidence.Built([[sys.executable, "-c", sleeper]]))
    monkeypatch.setitem(evidence.BUILDERS, "ladder", lambda r, s: evidence.Built(
        [[sys.executable, "-c", "raise ValueError('the ladder broke')"]]))
    parts = {p.name: p for p in evidence.PARTS}
    slow = evidence.Part("check", 6, 6, "sleeps")
    stopped = evidence.run_part(run, slow)  # a minute's sleep in a 6 s budget
    assert stopped["status"].startswith("over budget: stopped after") and stopped["returncode"] is None
    child = int(pid_file.read_text())
    time.sleep(0.5)
    status = Path(f"/proc/{child}/status")  # the part's own child went with it (gone, or a zombie not yet reaped)
    assert not status.exists() or "\nState:\tZ" in status.read_text()
    broken = evidence.run_part(run, parts["ladder"])
    assert broken["status"] == "FAILED (exit status 1)" and "ValueError: the ladder broke" in broken["traceback"]
    run.evidence["parts"] += [stopped, broken]
    evidence.save(run)
    report = (run.out / "report.md").read_text()
    assert "| check | 6 | 6 |" in report and "ValueError: the ladder broke" in report


def test_budgets_carry_what_a_part_leaves_and_stop_at_the_runs_end_on_the_clock(tmp_path, monkeypatch):
    """The budget arithmetic on a fake clock (each part "takes" what the test says): a part may use its budget and what
    the parts before it left, never past the run's end less a stop's time; a part over its allowance is reported
    stopped and leaves nothing over; none starts once under 5 s are left. The dry run is never stopped."""
    clock = FakeClock()
    run = _run(tmp_path, tmp_path, dry=False)
    run.clock, run.out = clock, tmp_path / "out"
    run.out.mkdir()
    run.deadline = clock() + 100
    allowed, takes = [], iter([10.0, 60.0, 5.0, 9.0])

    def commands(cmds, env, seconds, log, clock_):
        assert clock_ is clock
        log.write_text("ran\n")
        allowed.append(seconds)
        took = next(takes)
        clock.advance(took)
        return (0 if seconds is None or took < seconds else None), took

    monkeypatch.setattr(evidence, "run_commands", commands)
    monkeypatch.setitem(evidence.BUILDERS, "check", lambda r, s: evidence.Built([["true"]]))
    parts = [evidence.run_part(run, evidence.Part("check", 30, 30, "x")) for _ in range(5)]
    # 30; 30 + the 20 left over; the 30 s left less the stop's 12 s; 25 s left less 12; then 16 s left: none
    assert [round(a) for a in allowed] == [30, 50, 18, 13]
    assert [p["status"] for p in parts[:4]] == ["ok", "over budget: stopped after 60 s", "ok", "ok"]
    assert parts[4]["status"] == "not started: the run's time is spent" and round(run.slack) == 4

    dry = _run(tmp_path / "dry", tmp_path, dry=True)
    dry.clock, dry.out, dry.deadline = clock, tmp_path / "out", clock() - 1  # its whole time already spent
    takes = iter([500.0, 700.0])
    entry = evidence.run_part(dry, evidence.Part("check", 30, 30, "x"))  # 500 s of a 30 s budget: it ran
    assert allowed[-1] == evidence.DRY_HANG_S and entry["status"] == "ok" and entry["budget_s"] == 30
    hung = evidence.run_part(dry, evidence.Part("check", 30, 30, "x"))
    assert hung["status"] == "hung: stopped after 700 s"


def test_fid_runs_only_where_the_time_left_holds_a_meaningful_budget():
    ladder = {"rows": [{"variant": "reference (tutorial loop)", "images_per_sec": 4000.0, "warmup_s": 2.0},
                       {"variant": "all together", "images_per_sec": 20000.0, "warmup_s": 10.0}]}
    n, why = evidence.quality_images(ladder, 100, dry=False)
    # 100 s, less 1.5 x the warm-ups (18 s) and 15 s: 67 s at 1/4000 + 1/20000 s per image
    assert n == int(67 / (1 / 4000 + 1 / 20000)) // 128 * 128 and n >= evidence.MIN_FID_IMAGES
    assert evidence.quality_images(ladder, 1000, dry=False)[0] == evidence.FID_IMAGES  # never more than the ladder's
    none, why = evidence.quality_images(ladder, 40, dry=False)
    assert none is None and "102,400 images each need about" in why
    assert evidence.quality_images(None, 100, dry=False)[0] is None


def test_without_an_all_together_row_the_climbs_best_sizes_the_fid_budget():
    ladder = {"rows": [{"variant": "reference (tutorial loop)", "images_per_sec": 4000.0, "warmup_s": 2.0}],
              "climb": {"best": {"variant": "all together", "images_per_sec": 20000.0, "warmup_s": 10.0}}}
    n, _ = evidence.quality_images(ladder, 100, dry=False)
    assert n == int(67 / (1 / 4000 + 1 / 20000)) // 128 * 128


def test_the_headline_shows_the_climbs_best_and_graph_replay_where_a_run_has_them():
    budget = {"launches": 154, "syncs": 0}
    climb = {"rows": [{"variant": "reference (tutorial loop)", "kept": True, "images_per_sec": 100.0,
                       "host_budget": {"launches": 300, "syncs": 4}},
                      {"variant": "device-resident data", "kept": True, "images_per_sec": 150.0},
                      {"variant": "CUDA graphs", "kept": False, "skipped": "refused", "images_per_sec": None}],
             "best": {"variant": "all together", "from": "device-resident data", "images_per_sec": 150.0,
                      "host_budget": budget}}
    ladder = {"rows": [{"variant": "reference (tutorial loop)", "images_per_sec": 100.0, "speedup": 1.0,
                        "tflops": 0.1, "mfu": None, "flops_per_image": 1e9}],
              "measured_matmul_flops": {"fp32": 1e12}, "climb": climb}
    graphs = {"steps": 20, "max_loss_diff": 1e-6, "max_weight_rel_diff": 2e-7, "matches": True}
    data = {"dry": False, "date": "2026-12-01", "commit": "abc", "machine": {"info": {"device_name": "NVIDIA H200"}},
            "parts": [{"name": "graphs", "result": graphs}, {"name": "ladder", "result": ladder}]}
    text = evidence.headline_markdown(data, "x")
    assert "| climbing ladder's best (all together: device-resident data) images/s | 150 |" in text
    assert "| launches, syncs per iteration: reference / climbing best | 300, 4 / 154, 0 |" in text
    assert "CUDA graph replay against eager over 20 seeded steps: matches" in text
    graphs_refused = {**data, "parts": [{"name": "graphs", "result": {"steps": 20, "refused": "no GPU"}}]}
    assert "CUDA graphs (cuda_graphs=True) refused: no GPU." in evidence.headline_markdown(graphs_refused, "x")


def test_the_wheel_folder_leaves_out_torch_and_everything_it_brings():
    def item(name, *requires):
        return {"metadata": {"name": name, "version": "1.0", "requires_dist": list(requires)}}
    report = {"install": [
        item("torch", "cuda-toolkit[cublas]==13.0; platform_system == 'Linux'", "sympy>=1", "filelock"),
        item("cuda-toolkit", "nvidia-cublas; extra == 'cublas'", "nvidia-cufft; extra == \"cufft\""),
        item("nvidia-cublas"), item("nvidia-cufft"), item("sympy", "mpmath"), item("mpmath"), item("filelock"),
        item("torchvision", "numpy", "pillow", "torch==2.11"), item("numpy"), item("pillow"),
        item("matplotlib", "numpy>=1.23", "pillow>=8", "pyparsing"), item("pyparsing"),
        item("libcst", "pyyaml>=5.2", "black; extra == 'dev'"), item("PyYAML"),
        item("nbval", "ipykernel"), item("ipykernel", "tornado"), item("tornado")]}
    # nvidia-cufft: resolved but asked for only by an extra torch does not ask for, so carried (the safe side)
    assert set(wheels.carried(report)) == {"matplotlib", "pyparsing", "libcst", "pyyaml", "nbval", "ipykernel",
                                           "tornado", "nvidia-cufft"}


def test_the_wheel_folder_holds_gantools_dependencies_and_the_notebook_runner():
    needed = {wheels.normalize(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in wheels.requirements()}
    assert {"libcst", "ipywidgets", "torchmetrics", "matplotlib", "nbval", "ipykernel"} <= needed
    assert "playwright" not in needed and "sphinx" not in needed  # the browser test and the book stay here


def test_unknown_parts_are_refused_before_anything_runs(capsys):
    assert evidence.main(["--dry", "--parts", "ladder,warp"]) == 2
    assert "unknown part(s) warp; the parts: machine, data, check" in capsys.readouterr().err


def test_the_documented_budgets_are_the_runs_own_and_leave_time_for_a_second_try():
    """The run fits a lent GPU's 15 minutes with room for the machine's start and a second try of a part that
    needs one (at least 4 minutes must be left to start a machine)."""
    text = (ROOT / "docs" / "testing.md").read_text()
    documented = dict(re.findall(r"^\| ([a-z-]+) \| (\d+) s \|", text, flags=re.M))
    assert documented == {p.name: str(p.budget_s) for p in evidence.PARTS}
    assert sum(p.budget_s for p in evidence.PARTS) <= evidence.TOTAL_S <= 9 * 60
    assert f"stops at {evidence.TOTAL_S} s" in text


def test_results_and_the_readme_show_every_stored_gpu_run():
    results, readme = (ROOT / "docs" / "results.md").read_text(), (ROOT / "README.md").read_text()
    runs = sorted((ROOT / "docs" / "gpu").glob("*/evidence.json"))
    if not runs:  # then both say so, and where the command is
        assert "No GPU run is stored yet" in results and "No GPU run is stored yet" in readme
        assert "make gpu-evidence" in results and "make gpu-evidence" in readme
    for path in runs:
        data = json.loads(path.read_text())
        assert not data["dry"] and data["machine"]["info"]["device"].startswith("cuda"), \
            f"{path}: only a GPU's run is evidence; store GPU runs only"
        shown = evidence.headline_markdown(data, path.relative_to(ROOT).as_posix())
        assert shown in results and shown in readme, f"{path}: print it with gpu/evidence.py --headline"


def test_a_python_without_pip_still_gets_the_wheels_unpacked(tmp_path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    wheel = _wheel(folder, "gantools_probe_dist", "gantools_probe_module")
    with zipfile.ZipFile(wheel, "a") as z:  # a wheel whose module sits under .data/purelib, as some are built
        z.writestr("gantools_probe_dist-1.0.data/purelib/gantools_probe_extra.py", "EXTRA = 7\n")
        z.writestr("gantools_probe_dist-1.0.data/scripts/tool", "#!/bin/sh\n")
    site = tmp_path / "site"
    evidence.unpack([wheel], site)
    assert (site / "gantools_probe_module.py").read_text() == "VALUE = 42\n"
    assert (site / "gantools_probe_extra.py").is_file() and not (site / "tool").exists()
    assert (site / "gantools_probe_dist-1.0.dist-info" / "METADATA").is_file()


@pytest.mark.slow
def test_every_gpu_command_is_one_gantools_accepts(tmp_path):
    """The real run's command lines, built here and parsed by gantools' own parser (and the scripts' flags by the
    scripts' own): a flag misspelt for the GPU would otherwise first fail there."""
    from gantools.cli import build_parser

    run = _run(tmp_path, tmp_path, dry=False)
    run.out = tmp_path / "out"
    ladder = {"rows": [{"variant": "reference (tutorial loop)", "images_per_sec": 4000.0, "warmup_s": 2.0},
                       {"variant": "all together", "images_per_sec": 20000.0, "warmup_s": 10.0}]}
    run.evidence["parts"].append({"name": "ladder", "result": ladder})
    parser, scripts = build_parser(), []
    for part in ("check", "check-autotune", "ladder", "doctor-dcgan", "doctor-wgan-gp", "quality"):
        built = evidence.BUILDERS[part](run, 100)
        for command in built.commands:
            assert command[1:3] == ["-m", "gantools"], command
            namespace, unknown = parser.parse_known_args(command[3:])
            assert not unknown, (part, unknown)
            if namespace.command == "doctor":  # the script's own flags, parsed by the script's own parser (below)
                assert Path(namespace.script).is_file()
                scripts.append((part, namespace.script, namespace.args))
            if namespace.command == "check":  # every row once, between the two parts
                assert namespace.device == "cuda" and (namespace.only, namespace.skip) in (
                    (None, [evidence.AUTOTUNE]), ([evidence.AUTOTUNE], None))
            if namespace.command == "bench":
                assert namespace.size == "gpu" and namespace.device == "cuda"
    # each script's source up to its parse_args(), run in a namespace of its own, in one interpreter for all
    done = subprocess.run([sys.executable, "-c", (
        "import json, sys\n"
        "for part, script, args in json.loads(sys.argv[1]):\n"
        "    src = open(script).read()\n"
        "    src = src[:src.index('args = parser.parse_args()') if 'args = parser.parse_args()' in src\n"
        "              else src.index('opt = parser.parse_args()')]\n"
        "    sys.argv, scope = [script, *args], {'__name__': '__main__'}\n"
        "    print(part, flush=True)\n"
        "    exec(src, scope)\n"
        "    scope['parser'].parse_args()\n"), json.dumps(scripts)], capture_output=True, text=True)
    assert [p for p, _, _ in scripts] == ["doctor-dcgan", "doctor-wgan-gp"]
    assert done.returncode == 0 and done.stdout.split() == ["doctor-dcgan", "doctor-wgan-gp"], \
        done.stdout + done.stderr[-500:]


def test_a_report_of_failed_and_missing_parts_is_still_drawn():
    parts = [{"name": n, "what": "w", "budget_s": 10, "allowed_s": 10, "seconds": 1.0, "status": s, "returncode": 1,
              "output_tail": "Traceback (most recent call last):\nValueError: x", "traceback": "ValueError: x",
              "result": r}
             for n, s, r in (("machine", "ok", {"info": {"device_name": "NVIDIA H100"}, "nvidia_smi": {"driver": "1"}}),
                             ("check", "over budget: stopped after 9 s", {"rows": [
                                 {"technique": "fp32", "ok": True, "reason": None}], "partial": True}),
                             ("ladder", "FAILED (exit status 1)", None), ("quality", "skipped: no ladder", None),
                             ("doctor-dcgan", "FAILED (exit status 2)", None))]
    data = {"dry": False, "date": "2026-11-25", "started": "x", "commit": "abc", "total_budget_s": 450,
            "python": "python3", "install": {"installed": [], "import_failures": {"libcst": "ImportError: y"}},
            "machine": parts[0]["result"], "parts": parts}
    report = evidence.report_markdown(data)
    assert "max SM clock ?" in report and "Would not import" in report and "libcst: ImportError: y" in report
    assert "Stopped before its last row; the rows it finished:\n\n- fp32: ok" in report
    assert "The ladder did not finish" in report and "ValueError: x" in report
    assert "(stopped before its last row): 1 of 1 rows ok" in evidence.headline_markdown(data, "x")
    data["install"] = {"error": "pip could not install"}
    assert "The install failed, so no part ran:" in evidence.report_markdown({**data, "parts": []})
