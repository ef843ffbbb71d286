from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import gantools.core.data as gdata
import gantools.core.batches as gbatches
from gantools import (DataError, DeviceLoader, HostLoader, ImageFolderDataset, ImageTensorDataset, TrainConfig, Trainer,
                      data_root, load_glyphs, make_dataset, make_loader, render_glyphs)

from gantools.core.data import write_glyph_pngs

from conftest import SHARED_DATA

needs_shared = pytest.mark.skipif(not (SHARED_DATA / "MNIST" / "raw").is_dir(),
                                  reason="../shared/data (real MNIST) not present")


@pytest.mark.parametrize("size", [28, 32, 64])
@pytest.mark.parametrize("channels", [1, 3])
def test_glyphs_have_requested_shape_and_all_ten_labels(size, channels):
    images, labels = render_glyphs(60, size, channels, seed=3)
    assert images.shape == (60, channels, size, size) and images.dtype == torch.uint8
    assert labels.dtype == torch.int64 and set(labels.tolist()) == set(range(10))
    per_image_std = images.float().flatten(1).std(1)
    assert (per_image_std > 20).all(), "every glyph must show a digit, not a blank or flat image"


def test_glyphs_are_deterministic_per_seed_and_differ_across_seeds():
    a, la = render_glyphs(32, 32, 1, seed=7)
    b, lb = render_glyphs(32, 32, 1, seed=7)
    c, _ = render_glyphs(32, 32, 1, seed=8)
    assert torch.equal(a, b) and torch.equal(la, lb)
    assert not torch.equal(a, c)


def test_coloured_glyphs_have_colour():
    images, _ = render_glyphs(16, 32, 3, seed=0)
    channel_means = images.float().mean((2, 3))  # (N, 3)
    assert (channel_means.max(1).values - channel_means.min(1).values).mean() > 5


def test_glyph_cache_is_written_once_atomically_and_reused(tmp_path, monkeypatch):
    monkeypatch.setattr(gdata, "GLYPH_SPLITS", {"train": (40, 0), "test": (20, 1)})
    images, labels = load_glyphs(28, 1, "train", root=tmp_path)
    files = list((tmp_path / "glyphs").iterdir())
    assert len(files) == 1 and files[0].suffix == ".pt", "one cache file, no temp files left behind"
    monkeypatch.setattr(gdata, "render_glyphs", lambda *a, **k: pytest.fail("cache was not reused"))
    again, labels_again = load_glyphs(28, 1, "train", root=tmp_path)
    assert torch.equal(images, again) and torch.equal(labels, labels_again)


def test_damaged_glyph_cache_is_rendered_again(tmp_path, monkeypatch):
    monkeypatch.setattr(gdata, "GLYPH_SPLITS", {"train": (40, 0), "test": (20, 1)})
    images, _ = load_glyphs(28, 1, "train", root=tmp_path)
    cache = next((tmp_path / "glyphs").iterdir())
    cache.write_bytes(b"not a tensor file")
    again, _ = load_glyphs(28, 1, "train", root=tmp_path)
    assert torch.equal(images, again)


def test_train_and_test_glyph_splits_differ(tmp_path, monkeypatch):
    monkeypatch.setattr(gdata, "GLYPH_SPLITS", {"train": (20, 0), "test": (20, 1)})
    train, _ = load_glyphs(32, 1, "train", root=tmp_path)
    test, _ = load_glyphs(32, 1, "test", root=tmp_path)
    assert not torch.equal(train, test)


def test_data_root_prefers_argument_then_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GANTOOLS_DATA", str(tmp_path / "env"))
    assert data_root() == tmp_path / "env"
    assert data_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("GANTOOLS_DATA")
    monkeypatch.chdir(tmp_path)  # from any folder (a notebook runs in notebooks/): the checkout's data/, one cache
    checkout = Path(gdata.__file__).resolve().parents[2]
    assert (checkout / "pyproject.toml").is_file() and data_root() == checkout / "data"


@needs_shared
@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_real_torchvision_datasets_load_offline_at_any_size(name):
    ds = make_dataset(name, image_size=32, channels=1, root=SHARED_DATA)
    assert len(ds) == 60000
    image, label = ds[0]
    assert image.shape == (1, 32, 32) and image.dtype == torch.uint8 and 0 <= int(label) <= 9
    test = make_dataset(name, image_size=28, channels=3, split="test", root=SHARED_DATA, transform="per-sample")
    image, _ = test[0]
    assert len(test) == 10000 and image.shape == (3, 28, 28) and image.dtype == torch.float32
    assert -1.0 <= image.min() and image.max() <= 1.0


def test_missing_torchvision_dataset_says_where_and_how_to_download(tmp_path):
    with pytest.raises(DataError) as e:
        make_dataset("mnist", root=tmp_path)
    msg = str(e.value)
    assert str(tmp_path / "MNIST" / "raw") in msg and "--download" in msg and "GANTOOLS_DATA" in msg


def _write_images(folder, n, size=(40, 30), mode="RGB"):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
        Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8), mode).save(folder / f"{i}.png")


def test_folder_with_class_subfolders_gives_labels_and_resized_images(tmp_path):
    _write_images(tmp_path / "cats", 3)
    _write_images(tmp_path / "dogs", 2, size=(50, 70))
    (tmp_path / "notes.txt").write_text("not an image")
    ds = ImageFolderDataset(tmp_path, image_size=32, channels=3)
    assert len(ds) == 5 and ds.classes == ["cats", "dogs"]
    assert sorted(ds.labels) == [0, 0, 0, 1, 1]
    image, _ = ds[4]
    assert image.shape == (3, 32, 32) and image.dtype == torch.uint8
    grey, _ = ImageFolderDataset(tmp_path, image_size=28, channels=1, transform="per-sample")[0]
    assert grey.shape == (1, 28, 28) and grey.dtype == torch.float32


def test_glyph_pngs_are_an_image_folder_of_the_rendered_glyphs(tmp_path):
    """What a plain script's torchvision ImageFolder reads (notebook 06 gives one to `gantools doctor --try`)."""
    from torchvision.datasets import ImageFolder

    root = write_glyph_pngs(tmp_path / "pngs", n=24, image_size=40, channels=1, seed=5)
    images, labels = render_glyphs(24, 40, 1, seed=5)
    folder = ImageFolder(root, loader=lambda p: Image.open(p).copy())
    assert len(folder) == 24 and folder.classes == sorted({str(x) for x in labels.tolist()})
    for path, index in folder.samples:
        i = int(Path(path).stem)
        assert folder.classes[index] == str(labels[i].item())
        assert torch.equal(torch.from_numpy(np.asarray(Image.open(path)))[None], images[i])


def test_flat_folder_is_one_class(tmp_path):
    _write_images(tmp_path, 3, mode="L")
    ds = ImageFolderDataset(tmp_path, image_size=32, channels=1)
    assert ds.labels == [0, 0, 0]


def test_empty_folder_is_a_clear_error(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(DataError, match="no image files"):
        ImageFolderDataset(tmp_path)


def test_corrupt_first_image_fails_at_construction_naming_the_file(tmp_path):
    (tmp_path / "broken.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(DataError, match="broken.png"):
        ImageFolderDataset(tmp_path)


def test_device_and_host_loaders_give_the_same_batches(glyphs64):
    host = HostLoader(glyphs64, 16, "cpu", seed=5)
    device = DeviceLoader(glyphs64, 16, "cpu", seed=5)
    host_batches, device_batches = list(host), list(device)
    assert len(host_batches) == len(device_batches) == 4
    for h, d in zip(host_batches, device_batches, strict=True):
        assert torch.equal(h, d) and h.dtype == torch.float32
        assert -1.0 <= h.min() and h.max() <= 1.0


def test_loader_order_depends_only_on_seed_and_epoch_and_can_start_mid_epoch(glyphs64):
    loader = HostLoader(glyphs64, 16, "cpu", seed=1)
    loader.set_position(2, 0)
    epoch2 = list(loader)
    loader.set_position(2, 3)
    assert torch.equal(list(loader)[0], epoch2[3])
    loader.set_position(3, 0)
    assert not torch.equal(list(loader)[0], epoch2[0])


def test_worker_processes_load_the_same_batches(glyphs64):
    per_sample = ImageTensorDataset(glyphs64.images, glyphs64.labels, transform="per-sample")
    in_process = list(HostLoader(per_sample, 16, "cpu", seed=2))
    workers = list(HostLoader(per_sample, 16, "cpu", seed=2, num_workers=2, prefetch_factor=2,
                              persistent_workers=True))
    assert all(torch.equal(a, b) for a, b in zip(in_process, workers, strict=True))
    on_device = list(HostLoader(glyphs64, 16, "cpu", seed=2))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(in_process, on_device, strict=True)), \
        "per-sample PIL transforms and on-device normalisation must give the same images"


def test_hflip_flips_about_half_the_images(glyphs64):
    torch.manual_seed(0)
    plain = torch.cat(list(DeviceLoader(glyphs64, 16, "cpu", seed=0)))
    flipped = torch.cat(list(DeviceLoader(glyphs64, 16, "cpu", seed=0, hflip=True)))
    mirrored = (flipped == plain.flip(-1)).flatten(1).all(1)
    same = (flipped == plain).flatten(1).all(1)
    assert (mirrored | same).all() and 10 < int(mirrored.sum()) < 54


def test_dataset_smaller_than_a_batch_is_a_clear_error(glyphs64):
    with pytest.raises(DataError, match="fewer than one batch"):
        HostLoader(glyphs64, 65, "cpu")
    with pytest.raises(DataError, match="fewer than one batch"):
        DeviceLoader(glyphs64, 65, "cpu")


def test_device_loader_refuses_streaming_datasets(tmp_path):
    _write_images(tmp_path, 3)
    with pytest.raises(DataError, match="loader='dataloader'"):
        DeviceLoader(ImageFolderDataset(tmp_path), 2, "cpu")


def test_make_loader_follows_the_config(glyphs64):
    cfg = TrainConfig(batch_size=16, loader="device", channels_last=True)
    loader = make_loader(glyphs64, cfg, "cpu")
    batch = next(iter(loader))
    assert isinstance(loader, DeviceLoader) and batch.is_contiguous(memory_format=torch.channels_last)
    assert isinstance(make_loader(glyphs64, cfg.replace(loader="dataloader"), "cpu"), HostLoader)


class OffHostImages(torch.utils.data.Dataset):
    """A dataset of your own whose items are already on an accelerator (as a dataset that moves its images to the GPU
    in __getitem__ would return). No GPU here: "meta" tensors stand in, since what counts is that they are not on the
    CPU."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.empty(1, 32, 32, dtype=torch.uint8, device="meta"), torch.tensor(i % 2, device="meta")


def test_only_a_dataset_of_cpu_tensors_is_pinned_or_given_workers(glyphs64):
    from gantools import ConfigError

    cfg = TrainConfig(batch_size=16)  # the defaults: loader='dataloader', pin_memory auto, no workers
    assert make_loader(glyphs64, cfg, "cuda").loader.pin_memory is True  # host batches bound for CUDA: pinned
    # pinning a batch pins every tensor in it, and a GPU tensor cannot be pinned ("only dense CPU tensors can be
    # pinned"): auto leaves such a dataset unpinned
    assert make_loader(OffHostImages(), cfg, "cuda").loader.pin_memory is False
    with pytest.raises(ConfigError, match=r"not on the CPU.*pin_memory=True: .*pin_memory=None"):
        make_loader(OffHostImages(), cfg.replace(pin_memory=True), "cuda")
    with pytest.raises(ConfigError, match=r"not on the CPU.*num_workers=2: .*num_workers=0"):
        make_loader(OffHostImages(), cfg.replace(num_workers=2, persistent_workers=True), "cuda")
    with pytest.raises(ConfigError, match=r"num_workers=1: "):  # whatever the device trained on
        make_loader(OffHostImages(), cfg.replace(num_workers=1), "cpu")
    assert gdata.returns_cpu_tensors(glyphs64) and not gdata.returns_cpu_tensors(OffHostImages())


@pytest.mark.parametrize("loader", ["device", "dataloader"])
def test_under_torchrun_the_ranks_batches_together_are_the_one_process_batch(glyphs64, loader):
    from gantools.core.distributed import World

    cfg = TrainConfig(batch_size=16, loader=loader, hflip=True)  # flips too: drawn per global batch, sliced
    batches = {}
    for world in (World(), World(0, 2, 0), World(1, 2, 1)):
        it = make_loader(glyphs64, cfg, "cpu", world)
        it.set_position(1, 2)  # mid-epoch, as after a resume
        torch.manual_seed(0)
        batches[world.rank, world.size] = next(iter(it))
    whole, first, second = batches[0, 1], batches[0, 2], batches[1, 2]
    assert first.shape[0] == second.shape[0] == 8
    assert torch.equal(torch.cat([first, second]), whole)
    assert not torch.equal(first, second)


def test_workers_of_a_collected_trainer_are_shut_down_outside_the_garbage_collector(tiny, glyphs64):
    """A Trainer dropped inside a reference cycle used to cost 5 s per worker inside gc.collect() (the queues'
    feeder threads were stopped before the workers were told to stop). Now its iterator survives the collector and
    the next loader to start shuts its workers down."""
    import gc
    import weakref

    trainer = Trainer(tiny.replace(num_workers=2, steps=2), dataset=glyphs64)
    trainer.fit()
    iterator = weakref.ref(next(e for e in gbatches._LIVE_WORKERS if e[1])[0])
    workers = list(iterator()._workers)
    trainer.cycle = trainer  # garbage only the collector can free
    del trainer
    gc.collect()
    assert [e[1] for e in gbatches._LIVE_WORKERS if e[0] is iterator()] == [False]  # held, not torn down in gc
    assert all(w.is_alive() for w in workers)
    next(iter(gbatches.worker_safe(torch.utils.data.DataLoader(range(4)))))  # the next loader reaps it
    assert iterator() is None
    for w in workers:
        w.join(timeout=60)
    assert not any(w.is_alive() for w in workers)
