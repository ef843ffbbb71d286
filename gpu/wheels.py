"""`make gpu-wheels`: the wheel folder that lets `make gpu-evidence` install gantools on a GPU machine with no network.

A lent GPU machine brings its own Python and PyTorch (the CUDA build that matches its driver) and reaches no package
registry. So the packages gantools needs beside torch are downloaded here, as wheels for that machine's Python and
platform, into one folder that travels with the checkout; `gpu/evidence.py` installs from it the ones that machine
lacks, never touching its torch.

What goes in: gantools' own dependencies (pyproject.toml) and what runs the notebooks headless (nbval, ipykernel), as
pip resolves them for the target Python next to the torch and torchvision that machine has, less everything torch and
torchvision themselves pull in (NVIDIA's libraries, triton, numpy, pillow, sympy...): wherever that torch is installed,
those are too. The folder must stay under its budget (the device tool carries 64 MiB in all, the checkout included).

    python gpu/wheels.py [--out gpu-wheels] [--python-version 3.12] [--torch 2.11.0] [--torchvision 0.26.0]
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET_MB = 60
RUNNERS = ("nbval", "ipykernel")  # the notebooks, executed headless in quick mode (dev extras of pyproject.toml)
PROVIDED = ("torch", "torchvision")  # the GPU machine's own: never carried, and neither is anything they require
# pip matches a platform tag exactly, so every manylinux glibc level a wheel may be tagged with is named
PLATFORMS = [*(f"manylinux_2_{n}_x86_64" for n in range(39, 4, -1)), "manylinux2014_x86_64", "manylinux2010_x86_64",
             "manylinux1_x86_64", "any"]


def normalize(name: str) -> str:
    """A distribution's name as PEP 503 compares them: `PyYAML` and `pyyaml`, `nest_asyncio` and `nest-asyncio`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """gantools' dependencies and the notebook runners, as pyproject.toml states them."""
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    dev = project["optional-dependencies"]["dev"]
    runners = [r for r in dev if normalize(re.match(r"[A-Za-z0-9._-]+", r).group()) in RUNNERS]
    return [*project["dependencies"], *runners]


def _requirement(spec: str) -> tuple[str, set[str], str]:
    """'cuda-toolkit[cublas,cufft]==13.0; python_version >= "3.9"' -> ('cuda-toolkit', {'cublas', 'cufft'}, marker)."""
    head, _, marker = spec.partition(";")
    m = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", head)
    extras = {normalize(e.strip()) for e in (m.group(2) or "").split(",") if e.strip()}
    return normalize(m.group(1)), extras, marker


def _required(item: dict, extras: set[str]) -> dict[str, set[str]]:
    """What an item of pip's install report requires (name -> extras asked of it), with the requirements of the
    `extras` asked of it and none of its other extras' (any other marker is kept: the closure may be larger than
    what the target installs, never smaller)."""
    needed: dict[str, set[str]] = {}
    for spec in item["metadata"].get("requires_dist", []):
        name, wanted, marker = _requirement(spec)
        gate = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
        if gate and normalize(gate.group(1)) not in extras:
            continue
        needed.setdefault(name, set()).update(wanted)
    return needed


def carried(report: dict, provided=PROVIDED) -> dict[str, str]:
    """name -> version of what to carry: everything pip resolved, less `provided` and all they require in turn
    (through the extras they ask for: torch asks for cuda-toolkit's, which name NVIDIA's libraries)."""
    items = {normalize(i["metadata"]["name"]): i for i in report["install"]}
    theirs: dict[str, set[str]] = {}
    todo = [(normalize(p), set()) for p in provided]
    while todo:
        name, extras = todo.pop()
        if name not in items or (name in theirs and extras <= theirs[name]):
            continue
        theirs[name] = theirs.get(name, set()) | extras
        todo.extend(_required(items[name], theirs[name]).items())
    return {name: i["metadata"]["version"] for name, i in sorted(items.items()) if name not in theirs}


def _target(python_version: str) -> list[str]:
    abi = "cp" + python_version.replace(".", "")
    return ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp", "--abi", abi,
            *(a for p in PLATFORMS for a in ("--platform", p))]


def resolve(python_version: str, torch: str, torchvision: str) -> dict:
    """pip's own resolution for the target Python beside that torch (`pip install --dry-run --report`)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                        "--target", str(Path(tmp) / "t"), "--report", str(report), *_target(python_version),
                        f"torch=={torch}", f"torchvision=={torchvision}", *requirements()], check=True)
        return json.loads(report.read_text())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="gpu-wheels", help="the wheel folder (default: %(default)s)")
    p.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default: %(default)s)")
    p.add_argument("--torch", default="2.11.0", help="the GPU machine's torch (default: %(default)s)")
    p.add_argument("--torchvision", default="0.26.0", help="the GPU machine's torchvision (default: %(default)s)")
    p.add_argument("--budget-mb", type=float, default=BUDGET_MB, help="the folder's limit (default: %(default)s)")
    a = p.parse_args(argv)
    out = Path(a.out)
    print(f"resolving gantools' needs for Python {a.python_version} beside torch {a.torch} ...", flush=True)
    wanted = carried(resolve(a.python_version, a.torch, a.torchvision))
    if out.exists():
        for old in out.glob("*.whl"):
            old.unlink()
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(out),
                    *_target(a.python_version), *(f"{n}=={v}" for n, v in wanted.items())], check=True)
    wheels = sorted(out.glob("*.whl"), key=lambda w: -w.stat().st_size)
    total = sum(w.stat().st_size for w in wheels) / 1e6
    (out / "manifest.json").write_text(json.dumps(
        {"python_version": a.python_version, "torch": a.torch, "torchvision": a.torchvision,
         "total_mb": round(total, 1), "wheels": {w.name: w.stat().st_size for w in wheels}}, indent=1))
    print(f"{len(wheels)} wheels, {total:.1f} MB in {out}/ (budget {a.budget_mb:g} MB); the largest: "
          + ", ".join(f"{w.name.split('-')[0]} {w.stat().st_size / 1e6:.1f}" for w in wheels[:5]))
    if total > a.budget_mb:
        print(f"gpu-wheels: {total:.1f} MB is over the {a.budget_mb:g} MB budget", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
