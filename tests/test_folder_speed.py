"""gpu/folder_speed.py, what `make gpu-evidence`'s folder part measures: the JPEGs it writes, each decoder's first
decode of the same folder into the cache, the second run's read, and the words the report shows. Figures are only
checked to exist: a shared CPU's speeds decide nothing here."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

spec = importlib.util.spec_from_file_location("gpu_folder_speed", Path(__file__).resolve().parents[1] / "gpu" /
                                              "folder_speed.py")
folder_speed = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = folder_speed
spec.loader.exec_module(folder_speed)


def test_the_folder_is_jpegs_larger_than_the_training_size_in_a_folder_per_digit(tmp_path):
    folder = folder_speed.write_jpegs(tmp_path / "jpegs", 24, image_size=32, stored_size=48, channels=3)
    files = sorted(folder.rglob("*"))
    jpegs = [f for f in files if f.is_file()]
    assert len(jpegs) == 24 and all(f.suffix == ".jpg" and f.parent.name.isdigit() for f in jpegs)
    with Image.open(jpegs[0]) as image:
        assert image.size == (48, 48) and image.format == "JPEG" and image.mode == "RGB"


def test_each_decoder_rebuilds_the_cache_and_the_second_run_reads_it(tmp_path):
    folder = folder_speed.write_jpegs(tmp_path / "jpegs", 16, image_size=32, stored_size=48, channels=1)
    found = folder_speed.decode_rates(folder, 32, 1, tmp_path / "cache", torch.device("cpu"))
    assert found["pil"]["images_per_sec"] > 0 and found["nvjpeg"]["images_per_sec"] > 0
    assert found["nvjpeg"]["device"] == "cpu" and found["pil"]["device"].endswith("threads")
    second = found["second_run"]
    assert second["built"] is False and second["mb"] == pytest.approx(16 * 32 * 32 / 2**20)
    words = folder_speed.lines({"images": 16, "decode": found, "loaders": [
        {"loader": folder_speed.PER_SAMPLE, "num_workers": 8, "data_wait_ms": 20.0, "step_time_ms": 30.0,
         "images_per_sec": 4000.0}, {"loader": "memmap", "data_wait_ms": 0.5, "step_time_ms": 9.0,
                                     "images_per_sec": 14000.0}]})
    assert words[0].startswith("first decode, pil (") and words[1].startswith("first decode, nvjpeg (cpu)")
    assert words[2].startswith("second run: cache checked in")
    assert words[3] == ("dataloader, PIL per sample, 8 workers: data wait 20.00 ms of a 30.00 ms iteration, "
                        "4,000 images/s")
    assert words[4] == "memmap: data wait 0.50 ms of a 9.00 ms iteration, 14,000 images/s"
