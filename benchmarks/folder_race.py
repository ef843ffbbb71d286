"""Your own folder of JPEGs, per image against decoded once: the measurement behind docs/datasets.md.

Writes (once) a folder of JPEGs from Fashion-MNIST (`gantools.workbook.jpeg_folder`), times the cache's first build
and a second run's check, then trains the same DCGAN from the same seed on it through every data path, in turns
(`train_side_by_side`): PIL per image with 0, 1 and 2 DataLoader workers, and the cache through a DataLoader, on the
device and memory-mapped. Prints a Markdown table and writes the numbers as JSON.

    .venv/bin/python benchmarks/folder_race.py --json docs/folder-race-cpu.json
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

import gantools as gt
from gantools.measuring.hardware import machine_info
from gantools.workbook.jpeg_folder import jpeg_folder
from gantools.workbook.runs import train_side_by_side

START = "PIL per image, 0 workers"


def configs(folder: Path, cache_root: Path, args) -> dict:
    base = dict(dataset="folder", data_path=str(folder), data_root=str(cache_root), image_size=args.image_size,
                channels=1, batch_size=args.batch_size, ngf=args.width, ndf=args.width, seed=0, pin_memory=False,
                out_dir=str(cache_root / "runs"))
    return {
        START: gt.TrainConfig(**base, transform="per-sample"),
        "PIL per image, 1 worker": gt.TrainConfig(**base, transform="per-sample", num_workers=1,
                                                  persistent_workers=True),
        "PIL per image, 2 workers": gt.TrainConfig(**base, transform="per-sample", num_workers=2,
                                                   persistent_workers=True),
        "decoded once, DataLoader": gt.TrainConfig(**base),
        "decoded once, on the device": gt.TrainConfig(**base, loader="device"),
        "decoded once, memory-mapped": gt.TrainConfig(**base, loader="memmap"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--width", type=int, default=64, help="ngf = ndf")
    parser.add_argument("--steps", type=int, default=48, help="generator steps per run")
    parser.add_argument("--chunk", type=int, default=6, help="steps per turn")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    folder = jpeg_folder(args.files)
    cache_root = Path(tempfile.mkdtemp(prefix="folder-race-"))
    first = gt.CachedFolder(folder, args.image_size, 1, root=cache_root)
    second = gt.CachedFolder(folder, args.image_size, 1, root=cache_root)
    runs = train_side_by_side(configs(folder, cache_root, args), steps=args.steps, chunk_steps=args.chunk,
                              quality=False, plot=False)
    losses = {name: torch.tensor([[r["loss_d"], r["loss_g"]] for r in t.history.records]) for name, t in runs.items()}
    rows = {}
    for name, trainer in runs.items():
        s = trainer.history.summary()
        low, high = (runs.paired(name, START) or (float("nan"),) * 2) if name != START else (1.0, 1.0)
        rows[name] = {"data_wait_ms": s["data_wait_ms"], "step_time_ms": s["step_time_ms"],
                      "images_per_sec": s["images_per_sec"], "vs_start": runs.ratio(name, START),
                      "vs_start_paired": [low, high],
                      "largest_loss_difference": float((losses[name] - losses[START]).abs().max())}
    result = {"folder": {"files": len(first), "source": folder.name, "bytes": first.images.numel(),
                         "first_build_s": first.folder.seconds, "second_check_s": second.folder.seconds},
              "settings": vars(args) | {"json": str(args.json)}, "machine": machine_info("cpu"), "runs": rows}
    print(f"\n{len(first):,} JPEGs ({folder.name}), cache {first.images.numel() / 2**20:.1f} MB: first build "
          f"{first.folder.seconds:.1f} s, a second run's check {second.folder.seconds:.2f} s\n")
    print("| data path | data wait ms | ms/step | images/s | vs the start (paired) | loss diff |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        low, high = r["vs_start_paired"]
        print(f"| {name} | {r['data_wait_ms']:.2f} | {r['step_time_ms']:.0f} | {r['images_per_sec']:.0f} | "
              f"{r['vs_start']:.2f}x ({low:.2f}-{high:.2f}) | {r['largest_loss_difference']:.1e} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
