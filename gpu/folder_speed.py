"""`make gpu-evidence`'s folder part (gpu/evidence.py runs it in a process of its own, with gantools importable):
how fast a folder of JPEGs reaches the step: its first decode into the cache by each decoder (PIL in threads on
every core; nvJPEG through `torchvision.io.decode_jpeg` on a GPU), the second run's read of that cache, and the data
wait per iteration of the tutorial's path (a DataLoader decoding with PIL per sample, its best worker count, pinned
on a GPU) against the device and memory-mapped loaders over the cache; on a GPU, and in the dry run in seconds on a
CPU. A script beside evidence.py, as benchmarks/folder_race.py is beside the package: the package keeps the cache.

Each figure is one measurement on one machine, stored in the run's evidence.json; nothing here keeps or drops a
technique by it.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from gantools.core.config import preset, TrainConfig
from gantools.core.data import render_glyphs, write_image_folder
from gantools.core.folder_cache import list_images, load_folder
from gantools.core.trainer import Trainer
from gantools.measuring.hardware import resolve_device, seconds

PER_SAMPLE = "dataloader, PIL per sample"


def write_jpegs(root, n: int, image_size: int = 64, stored_size: int = 96, channels: int = 3) -> Path:
    """n rendered glyphs (`render_glyphs` at `image_size`, seed 0) saved as JPEG files (quality 90) `stored_size`
    pixels wide, so every decode also resizes, one sub-folder per digit (`data.write_image_folder`)."""
    images, labels = render_glyphs(n, image_size, channels, seed=0)
    return write_image_folder(root, images, labels, ".jpg", side=stored_size)


def _warm_nvjpeg(folder: Path, device: torch.device, channels: int) -> None:
    """nvJPEG's decoder and the CUDA context made before the clock starts: torchvision builds its decoder on the
    first call (`CUDAJpegDecoder` in torchvision/csrc/io/image/cuda/decode_jpegs_cuda.cpp), a cost of the process,
    not of the folder."""
    import torchvision.io as tio

    files = list_images(folder).files[:8]
    mode = tio.ImageReadMode.GRAY if channels == 1 else tio.ImageReadMode.RGB
    tio.decode_jpeg([tio.read_file(str(f)) for f in files], mode=mode, device=device)
    torch.cuda.synchronize(device)


def decode_rates(folder, image_size: int, channels: int, cache_root: Path, device: torch.device) -> dict:
    """The first decode into the cache (`rebuild=True`, so each decoder does the whole folder), timed by
    `load_folder` from listing to the committed, re-read cache: 'pil' in one thread per core, 'nvjpeg' on `device`.
    On a GPU, `torchvision.io.decode_jpeg` given a list of CPU tensors and device='cuda' decodes them as one batch
    on its decoder's own stream and makes the current stream wait for it (decode_jpegs_cuda.cpp, event.block); the
    torchvision docs (0.25 to 0.29, so 0.26's too) say a list is "more efficient than repeated individual calls" on
    CUDA, and that the call returns no partial results on an error. folder_cache copies each batch to the host
    (`.cpu()`, which waits for it), so the time covers every decode. A first, untimed build reads the files into the
    page cache and imports the decoders. Then the second run's read: the cache checked and mapped (`load_folder`
    without rebuild), and every byte of it read."""
    found = {}
    # untimed: the decoders' imports, and the files into the page cache, so both timed decodes read them alike
    load_folder(folder, image_size, channels, cache_root, progress=False)
    for decoder in ("pil", "nvjpeg"):
        if decoder == "nvjpeg" and device.type == "cuda":
            _warm_nvjpeg(Path(folder), device, channels)
        got = load_folder(folder, image_size, channels, cache_root, decoder=decoder, device=device, rebuild=True,
                          progress=False)
        found[decoder] = {"seconds": got.seconds, "images_per_sec": len(got.images) / got.seconds,
                          "device": str(device) if decoder == "nvjpeg" else f"{len(os.sched_getaffinity(0))} threads"}
    again = load_folder(folder, image_size, channels, cache_root, progress=False)
    start = seconds()
    again.images.sum(dtype=torch.int64)  # every page of the mapped file read
    found["second_run"] = {"check_s": again.seconds, "read_s": seconds() - start, "built": again.built,
                           "mb": again.images.numel() / 2**20}
    return found


def data_wait(cfg: TrainConfig, steps: int, name: str) -> dict:
    """One loader's figures over `steps` training steps, in a run folder of its own (`name` under `cfg.out_dir`):
    the medians over log intervals after the first (which holds warm-up: cuDNN, worker start-up) of the data wait
    and the step time per iteration, and images/s."""
    summary = Trainer(cfg.replace(out_dir=str(Path(cfg.out_dir) / name))).fit(steps).summary()
    return {k: summary[k] for k in ("data_wait_ms", "step_time_ms", "images_per_sec")}


def loader_waits(cfg: TrainConfig, steps: int, workers=(4, 8)) -> list[dict]:
    """The tutorial's path (transform='per-sample': PIL decodes every image in DataLoader workers; each of `workers`
    tried, pinned on a GPU, the best kept) against the cache on the device (loader='device') and memory-mapped into
    pinned buffers (loader='memmap'), on one config."""
    cuda = torch.device(cfg.device).type == "cuda"
    tried = [{"loader": PER_SAMPLE, "num_workers": w, **data_wait(cfg.replace(
        transform="per-sample", loader="dataloader", num_workers=w, persistent_workers=w > 0,
        pin_memory=True if cuda else None), steps, f"per-sample-{w}")} for w in workers]
    rows = [min(tried, key=lambda r: r["data_wait_ms"])]
    for loader in ("device", "memmap"):
        rows.append({"loader": loader, **data_wait(cfg.replace(loader=loader, transform="on-device"), steps, loader)})
    return rows


def measure(folder, cfg: TrainConfig, steps: int, workers=(4, 8), save=lambda found: None) -> dict:
    """The folder part's figures: `decode_rates` at `cfg`'s resolution (its cache under `cfg.data_root`), then
    `loader_waits`; `save(found)` after each, so a part stopped at its budget keeps what it measured."""
    cache_root = Path(cfg.data_root) / "folder-cache"
    found = {"images": len(list_images(folder).files), "image_size": cfg.image_size, "channels": cfg.channels,
             "batch_size": cfg.batch_size, "steps": steps}
    found["decode"] = decode_rates(folder, cfg.image_size, cfg.channels, cache_root, resolve_device(cfg.device))
    save(found)
    found["loaders"] = loader_waits(cfg.replace(dataset="folder", data_path=str(folder)), steps, workers)
    save(found)
    return found


def lines(found: dict) -> list[str]:
    """The figures as a reader takes them in: each decoder's images/s, the second read, each loader's data wait."""
    decode, out = found.get("decode") or {}, []
    for name in ("pil", "nvjpeg"):
        if name in decode:
            d = decode[name]
            out.append(f"first decode, {name} ({d['device']}): {d['images_per_sec']:,.0f} images/s "
                       f"({found['images']:,} images in {d['seconds']:.2f} s)")
    if "second_run" in decode:
        s = decode["second_run"]
        out.append(f"second run: cache checked in {s['check_s']:.2f} s, its {s['mb']:,.1f} MB read in "
                   f"{s['read_s']:.2f} s")
    for row in found.get("loaders") or []:
        name = row["loader"] + (f", {row['num_workers']} workers" if row["loader"] == PER_SAMPLE else "")
        out.append(f"{name}: data wait {row['data_wait_ms']:.2f} ms of a {row['step_time_ms']:.2f} ms iteration, "
                   f"{row['images_per_sec']:,.0f} images/s")
    return out


MODELS = {"gpu": dict(image_size=64, batch_size=128, ngf=64, ndf=64, log_interval=10),  # DCGAN 64 px, as the ladder
          "tiny": dict(image_size=32, batch_size=16, ngf=8, ndf=8, nz=16, log_interval=2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scratch", type=Path, required=True, help="where the JPEGs, their cache and the runs go")
    p.add_argument("--json", type=Path, required=True, help="the figures, written after each stage")
    p.add_argument("--device", default="cuda")
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--stored-size", type=int, default=96)
    p.add_argument("--model", choices=MODELS, default="gpu")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    a = p.parse_args(argv)
    model = MODELS[a.model]
    folder = write_jpegs(a.scratch / "jpegs", a.images, model["image_size"], a.stored_size, 3)
    cfg = preset("default", device=a.device, channels=3, sample_interval=0, checkpoint_interval=0,
                 data_root=str(a.scratch / "data"), out_dir=str(a.scratch / "runs"), **model)

    def save(found: dict) -> None:  # after each stage: a part stopped at its budget keeps what it measured
        a.json.write_text(json.dumps({**found, "lines": lines(found)}))

    print("\n".join(lines(measure(folder, cfg, a.steps, tuple(a.workers), save=save))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
