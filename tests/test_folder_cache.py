"""A folder decoded once (gantools/core/folder_cache.py, data.CachedFolder) and the loaders that read it
(loaders.MappedLoader, loader='auto'): the cache equals the per-access decode, is rebuilt whenever it cannot be
trusted, refuses bad files before any work, and trains the same losses as the per-sample path."""
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from gantools import CachedFolder, DataError, ImageFolderDataset, MappedLoader, Trainer, TrainConfig, make_loader
from gantools.cli import main
from gantools.core import folder_cache
from gantools.core.loaders import DeviceLoader, choose_loader


def _write(folder, n, start=0, suffix=".jpg", classes=2):
    """n RGB images of varied sizes in `classes` class sub-folders (a JPEG's decode included)."""
    rng = np.random.default_rng(start)
    for i in range(start, start + n):
        sub = folder / f"class{i % classes}"
        sub.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (30 + i % 9, 26 + i % 5, 3), dtype=np.uint8)).save(sub / f"{i}{suffix}")


@pytest.fixture
def folder(tmp_path):
    _write(tmp_path / "images", 40)
    return tmp_path / "images"


def _cached(folder, tmp_path, size=28, channels=3, **options):
    return CachedFolder(folder, size, channels, root=tmp_path / "data", say=None, **options)


def test_the_cache_holds_the_per_access_decode_and_a_second_run_reuses_it(folder, tmp_path):
    first = _cached(folder, tmp_path)
    per_access = ImageFolderDataset(folder, 28, 3)
    assert first.folder.built and first.folder.reason == "no cache yet"
    assert first.images.shape == (40, 3, 28, 28) and first.images.dtype == torch.uint8
    assert all(torch.equal(first[i][0], per_access[i][0]) for i in range(40))
    assert first.labels.tolist() == per_access.labels and first.classes == ["class0", "class1"]
    second = _cached(folder, tmp_path)
    assert not second.folder.built and torch.equal(second.images, first.images)
    assert [p.name for p in second.folder.cache_dir.iterdir()] and len(list(second.folder.cache_dir.glob("*.u8"))) == 1


@pytest.mark.parametrize("change, word", [("add", "added"), ("remove", "removed"), ("replace", "replaced")])
def test_a_changed_folder_is_detected_and_rebuilt(folder, tmp_path, change, word):
    _cached(folder, tmp_path)
    victim = sorted(folder.rglob("*.jpg"))[3]
    if change == "add":
        _write(folder, 1, start=100)
    elif change == "remove":
        victim.unlink()
    else:
        Image.fromarray(np.full((30, 30, 3), 7, np.uint8)).save(victim)
        os.utime(victim, ns=(victim.stat().st_atime_ns, victim.stat().st_mtime_ns + 10**9))
    again = _cached(folder, tmp_path)
    assert again.folder.built and word in again.folder.reason
    per_access = ImageFolderDataset(folder, 28, 3)
    assert len(again) == len(per_access) and all(torch.equal(again[i][0], per_access[i][0]) for i in range(len(again)))


def _images_file(dataset):
    manifest = json.loads((dataset.folder.cache_dir / "manifest.json").read_text())
    return dataset.folder.cache_dir / manifest["images"]


def test_a_truncated_cache_is_rebuilt_not_read(folder, tmp_path):
    path = _images_file(_cached(folder, tmp_path))
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    again = _cached(folder, tmp_path)
    assert again.folder.built and "truncated" in again.folder.reason
    assert torch.equal(again[5][0], ImageFolderDataset(folder, 28, 3)[5][0])


def test_a_damaged_cache_of_the_right_size_fails_its_checksum(folder, tmp_path):
    first = _cached(folder, tmp_path)
    expected = first.images.clone()
    with open(_images_file(first), "r+b") as f:
        f.write(bytes(255 - b for b in f.read(64)))  # the first block is always among those checked
    again = _cached(folder, tmp_path)
    assert again.folder.built and "checksum" in again.folder.reason and torch.equal(again.images, expected)


def test_an_unreadable_manifest_or_other_settings_rebuild(folder, tmp_path):
    first = _cached(folder, tmp_path)
    (first.folder.cache_dir / "manifest.json").write_text("{not json")
    assert "unreadable" in _cached(folder, tmp_path).folder.reason
    manifest = json.loads((first.folder.cache_dir / "manifest.json").read_text())
    manifest["version"] = -1
    (first.folder.cache_dir / "manifest.json").write_text(json.dumps(manifest))
    assert "other settings" in _cached(folder, tmp_path).folder.reason
    grey = _cached(folder, tmp_path, size=32, channels=1)  # another setting is another cache, beside it
    assert grey.folder.built and grey.folder.cache_dir != first.folder.cache_dir
    assert grey.images.shape[1:] == (1, 32, 32)


def test_a_corrupt_image_is_refused_with_its_name_and_nothing_is_committed(folder, tmp_path):
    bad = folder / "class0" / "broken.jpg"
    bad.write_bytes(sorted(folder.rglob("*.jpg"))[0].read_bytes()[:200])  # a JPEG cut short
    (folder / "class1" / "notes.png").write_text("not an image")
    with pytest.raises(DataError) as e:
        _cached(folder, tmp_path)
    message = str(e.value)
    assert "2 of 42 files" in message and str(bad) in message and "notes.png" in message
    cache_dir = folder_cache.cache_dir_for(folder, 28, 3, tmp_path / "data" / "folder-cache")
    assert not (cache_dir / "manifest.json").exists() and not list(cache_dir.glob("images-*"))


def test_the_memory_mapped_loader_gives_the_device_loaders_batches(folder, tmp_path):
    ds = _cached(folder, tmp_path)
    common = dict(seed=3, hflip=True, labels=True)
    mapped = MappedLoader(ds, 8, "cpu", generator=torch.Generator().manual_seed(1), **common)
    device = DeviceLoader(ds, 8, "cpu", generator=torch.Generator().manual_seed(1), **common)
    for loader in (mapped, device):
        loader.set_position(1, 2)  # mid-epoch, as a resumed run starts
    pairs = list(zip(mapped, device, strict=True))
    assert len(pairs) == 5 - 2
    for (x, y), (x2, y2) in pairs:
        assert torch.equal(x, x2) and torch.equal(y, y2) and x.dtype == torch.float32


@pytest.mark.parametrize("budget, kind", [(0.01, MappedLoader), (1000.0, DeviceLoader)])
def test_auto_takes_the_device_when_the_images_fit_the_budget_else_the_memory_map(folder, tmp_path, capsys, budget,
                                                                                 kind):
    ds = _cached(folder, tmp_path)
    cfg = TrainConfig(loader="auto", data_budget_mb=budget, batch_size=8)
    assert isinstance(make_loader(ds, cfg, "cpu"), kind)
    said = capsys.readouterr().out
    assert "0.1 MB of uint8 images" in said and f"{budget:,.1f} MB of cpu memory" in said
    assert choose_loader(ImageFolderDataset(folder, 28, 3), "cpu")[0] == "dataloader"


def test_every_path_trains_the_per_sample_paths_losses(folder, tmp_path):
    """Same seed, same crops, same order: the per-sample PIL path and the cache read by each loader (the memory map
    on a budget too small for the device) train the same losses, labels included."""
    base = dict(dataset="folder", data_path=str(folder), data_root=str(tmp_path / "data"), image_size=28,
                channels=3, steps=2, batch_size=8, ngf=8, ndf=8, nz=16, checkpoint_interval=0, conditional=True,
                out_dir=str(tmp_path / "out"))
    runs = {"per-sample": dict(transform="per-sample"), "dataloader": {}, "device": dict(loader="device"),
            "auto": dict(loader="auto", data_budget_mb=0.01)}
    losses = {}
    for name, options in runs.items():
        trainer = Trainer(TrainConfig(**base, **options))
        losses[name] = [(r["loss_d"], r["loss_g"]) for r in trainer.fit().records]
        if name == "auto":
            assert isinstance(trainer.loader, MappedLoader)
    for name in ("dataloader", "device", "auto"):
        np.testing.assert_allclose(losses[name], losses["per-sample"], rtol=1e-5, atol=1e-6)


def test_a_batched_decoder_on_the_cpu_matches_pil_within_rounding_and_falls_back_for_pngs(tmp_path):
    _write(tmp_path / "mixed", 12)
    _write(tmp_path / "mixed", 4, start=50, suffix=".png")
    pil = _cached(tmp_path / "mixed", tmp_path / "a")
    batched = _cached(tmp_path / "mixed", tmp_path / "b", decoder="nvjpeg", device="cpu")
    pngs = [i for i, p in enumerate(pil.files) if p.suffix == ".png"]
    assert len(pngs) == 4 and torch.equal(batched.images[pngs], pil.images[pngs])
    difference = (batched.images.float() - pil.images.float()).abs()
    assert difference.mean() < 3 and 0 < difference.max() <= 64  # another resize, the same decode
    with pytest.raises(DataError, match="decoder='gpu'"):
        _cached(tmp_path / "mixed", tmp_path / "c", decoder="gpu")


def test_config_refuses_what_the_in_memory_loaders_cannot_do():
    with pytest.raises(Exception, match="transform='on-device'"):
        TrainConfig(loader="memmap", transform="per-sample").validate()
    with pytest.raises(Exception, match="DataLoader knobs"):
        TrainConfig(loader="auto", num_workers=2).validate()
    with pytest.raises(Exception, match="data_budget_mb only decides loader='auto'"):
        TrainConfig(loader="device", data_budget_mb=100).validate()


def test_prepare_builds_the_cache_once_and_says_so(folder, tmp_path, capsys):
    args = ["prepare", str(folder), "--image-size", "28", "--channels", "3", "--data-root", str(tmp_path / "d")]
    assert main(args) == 0
    assert "decoded" in capsys.readouterr().out
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"read {folder} from its cache") and "40 images at 28 x 28 x 3" in out
    trainer = Trainer(TrainConfig(dataset="folder", data_path=str(folder), data_root=str(tmp_path / "d"),
                                  image_size=28, channels=3, batch_size=8, loader="memmap", steps=1))
    assert not trainer.dataset.folder.built  # train reads what prepare made
    assert main(["prepare", str(tmp_path / "nowhere")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_two_builders_at_once_both_get_the_images_and_leave_one_whole_cache(folder, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        built = list(pool.map(lambda _: _cached(folder, tmp_path, rebuild=True), range(2)))
    assert torch.equal(built[0].images, built[1].images)
    cache_dir = built[0].folder.cache_dir
    assert not list(cache_dir.glob("*.partial")) and 1 <= len(list(cache_dir.glob("images-*.u8"))) <= 2
    assert not _cached(folder, tmp_path).folder.built  # what they left is whole, and read as it is


def test_a_killed_builds_leftovers_are_removed_once_old(folder, tmp_path):
    first = _cached(folder, tmp_path)
    cache_dir = first.folder.cache_dir
    replaced = _images_file(first)
    old, young = cache_dir / "images-dead.u8.partial", cache_dir / "images-busy.u8"
    for path in (old, young):
        path.write_bytes(b"half a build")
    os.utime(old, (0, 0))
    again = _cached(folder, tmp_path, rebuild=True)
    assert not replaced.exists() and _images_file(again).exists()  # the commit replaced the old cache's file
    assert not old.exists() and young.exists()  # a young one may be another process's build, about to commit
