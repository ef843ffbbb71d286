"""Datasets and the two loader paths. Datasets live here, not in notebooks, so DataLoader workers can import them
under spawn/forkserver. Every dataset yields `(image, label)`. With `transform="on-device"` the image is a uint8
(C, H, W) tensor and the whole batch is normalised on the device; with `transform="per-sample"` it is a normalised
float tensor made by PIL and torchvision transforms, image by image, as the PyTorch DCGAN tutorial does."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .checkpoint import atomic_save
from .distributed import World
from ..errors import ConfigError, DataError, OutOfMemory
from .recovery import is_out_of_memory
from .batches import worker_safe

GLYPH_FONTS = (  # fonts matplotlib ships that draw all ten digits
    "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSans-BoldOblique.ttf",
    "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf", "DejaVuSerif-BoldItalic.ttf",
    "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf", "DejaVuSansMono-Oblique.ttf",
    "STIXGeneral.ttf", "STIXGeneralBol.ttf", "STIXGeneralItalic.ttf", "STIXGeneralBolIta.ttf",
    "cmr10.ttf", "cmss10.ttf", "cmtt10.ttf", "cmb10.ttf",
)
GLYPH_SPLITS = {"train": (20000, 0), "test": (2000, 1)}  # split -> (images, seed offset)
GLYPHS_VERSION = 1  # bump when the renderer changes, so stale caches are not reused
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
TORCHVISION_DATASETS = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST", "cifar10": "CIFAR10"}


def data_root(root: str | os.PathLike | None = None) -> Path:
    """Where datasets and caches live: `root`, else $GANTOOLS_DATA, else the checkout's data/ (or ./data)."""
    if root:
        return Path(root)
    if os.environ.get("GANTOOLS_DATA"):
        return Path(os.environ["GANTOOLS_DATA"])
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "pyproject.toml").is_file():
        return checkout / "data"
    return Path("data")


# -- glyphs: the embedded default dataset -------------------------------------------------------------------

def render_glyphs(n: int, image_size: int = 32, channels: int = 1, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """n handwriting-like digits drawn from matplotlib's fonts with random affine jitter, stroke width, blur and
    noise. Deterministic for a seed. Returns uint8 images (n, channels, size, size) and int64 labels."""
    import matplotlib
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    font_dir = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    canvas = max(64, image_size * 3 // 2)
    fonts = [ImageFont.truetype(str(font_dir / name), int(canvas * 0.85))
             for name in GLYPH_FONTS if (font_dir / name).is_file()]
    if not fonts:
        raise DataError(f"no fonts found in {font_dir}: is matplotlib installed correctly?")
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    images = np.empty((n, image_size, image_size), np.uint8)
    mid = canvas / 2
    for i in range(n):
        img = Image.new("L", (canvas, canvas), 0)
        ImageDraw.Draw(img).text((mid, mid), str(labels[i]), fill=255, anchor="mm",
                                 font=fonts[rng.integers(len(fonts))],
                                 stroke_width=int(rng.integers(0, 1 + canvas // 24)), stroke_fill=255)
        angle, shear = np.deg2rad(rng.uniform(-15, 15)), rng.uniform(-0.3, 0.3)
        scale, (tx, ty) = rng.uniform(0.8, 1.1), rng.uniform(-0.07, 0.07, 2) * canvas
        a, b = np.cos(angle) / scale, (np.sin(angle) + shear) / scale
        c, d = -np.sin(angle) / scale, np.cos(angle) / scale
        img = img.transform((canvas, canvas), Image.AFFINE,
                            (a, b, mid - a * mid - b * mid + tx, c, d, mid - c * mid - d * mid + ty),
                            resample=Image.BILINEAR)
        img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0.2, 1.2) * canvas / 64))
        img = img.resize((image_size, image_size), Image.BILINEAR)
        noisy = np.asarray(img, np.float32) + rng.normal(0, rng.uniform(2, 12), (image_size, image_size))
        images[i] = np.clip(noisy, 0, 255).astype(np.uint8)
    x = torch.from_numpy(images)[:, None]
    if channels == 3:  # coloured variant: a random ink colour on a random dark background per image
        ink = torch.from_numpy(rng.uniform(0.45, 1.0, (n, 3, 1, 1)).astype(np.float32))
        paper = torch.from_numpy(rng.uniform(0.0, 0.35, (n, 3, 1, 1)).astype(np.float32))
        alpha = x.float() / 255
        x = ((paper + (ink - paper) * alpha) * 255).round().clamp(0, 255).to(torch.uint8)
    return x, torch.from_numpy(labels).long()


def write_glyph_pngs(root, n: int = 2000, image_size: int = 64, channels: int = 1, seed: int = 0) -> Path:
    """n rendered glyphs written as PNG files, one sub-folder per digit (root/3/00017.png), the layout torchvision's
    `ImageFolder` reads: data for a script written the way people write them, which opens image files. Returns root."""
    from PIL import Image

    root = Path(root)
    images, labels = render_glyphs(n, image_size, channels, seed=seed)
    for i, (image, label) in enumerate(zip(images, labels.tolist())):
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        array = image.permute(1, 2, 0).numpy()
        Image.fromarray(array[..., 0] if channels == 1 else array).save(folder / f"{i:05d}.png")
    return root


def load_glyphs(image_size: int = 32, channels: int = 1, split: str = "train", root=None, seed: int = 0):
    """Glyphs from the cache under data/glyphs, rendering (seconds) and caching them atomically on first use."""
    if split not in GLYPH_SPLITS:
        raise DataError(f"split={split!r}: glyphs has splits {', '.join(GLYPH_SPLITS)}")
    n, offset = GLYPH_SPLITS[split]
    path = data_root(root) / "glyphs" / f"glyphs-v{GLYPHS_VERSION}-{split}-{image_size}px-{channels}ch-seed{seed}.pt"
    if path.is_file():
        try:
            cached = torch.load(path, weights_only=True)
            return cached["images"], cached["labels"]
        except Exception:  # a damaged cache is re-rendered, never trusted
            pass
    images, labels = render_glyphs(n, image_size, channels, seed * 1000 + offset)
    atomic_save({"images": images, "labels": labels}, path)
    return images, labels


# -- datasets -------------------------------------------------------------------------------------------------

def _per_sample_transform(image_size: int, channels: int):
    """The tutorial's pipeline: Resize, CenterCrop, ToTensor, Normalize, run on each PIL image in a worker."""
    from torchvision import transforms as T

    return T.Compose([T.Resize(image_size), T.CenterCrop(image_size), T.ToTensor(),
                      T.Normalize((0.5,) * channels, (0.5,) * channels)])


class ImageTensorDataset(Dataset):
    """In-memory uint8 images (N, C, H, W) with labels; the only kind the device-resident loader can hold."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform: str = "on-device"):
        self.images, self.labels, self.transform = images, labels, transform
        self._pipeline = _per_sample_transform(images.shape[-1], images.shape[1]) if transform == "per-sample" else None

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = self.images[i]
        if self._pipeline is not None:
            from PIL import Image
            array = image.permute(1, 2, 0).numpy()
            image = self._pipeline(Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array))
        return image, self.labels[i]


class ImageFolderDataset(Dataset):
    """Image files decoded with PIL on every access: the realistic, CPU-bound case. Class sub-folders give
    labels (sorted by name); a flat folder is one class."""

    def __init__(self, path, image_size: int = 32, channels: int = 1, transform: str = "on-device"):
        from torchvision import transforms as T

        self.root = Path(path)
        if not self.root.is_dir():
            raise DataError(f"data_path={str(path)!r}: no such folder")
        files = sorted(p for p in self.root.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
        if not files:
            raise DataError(f"no image files ({', '.join(IMAGE_EXTENSIONS)}) under {self.root}: "
                            "point data_path at a folder of images or of class sub-folders of images")
        self.classes = sorted({p.parent.relative_to(self.root).as_posix() for p in files})
        self.files = files
        self.labels = [self.classes.index(p.parent.relative_to(self.root).as_posix()) for p in files]
        self.mode = "L" if channels == 1 else "RGB"
        self.transform = transform
        self._crop = T.Compose([T.Resize(image_size), T.CenterCrop(image_size)])
        self._pipeline = _per_sample_transform(image_size, channels) if transform == "per-sample" else None
        self._check_files()
        self[0]  # fail now, not inside a worker, if the first image cannot be decoded

    def _check_files(self) -> None:
        """Every file must be a readable image (`_check_image`), so bad files are reported now, all of them at once,
        not from inside a worker mid-run. Far cheaper than decoding them all."""
        bad = []
        for path in self.files:
            try:
                _check_image(path)
            except Exception as e:  # PIL raises many types for broken files
                bad.append(f"{path} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'unreadable'})")
        if bad:
            shown = "\n  ".join(bad[:10]) + (f"\n  ... and {len(bad) - 10} more" if len(bad) > 10 else "")
            raise DataError(f"{len(bad)} of {len(self.files)} files under {self.root} are not readable images:\n  "
                            f"{shown}\nRemove or replace them, then run again.")

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(self.files[i]) as f:
                image = f.convert(self.mode)
        except (OSError, UnidentifiedImageError) as e:
            raise DataError(f"cannot read image {self.files[i]}: {e}. Remove or replace the file.") from e
        if self._pipeline is not None:
            return self._pipeline(image), self.labels[i]
        array = np.asarray(self._crop(image), np.uint8)
        array = array[None] if array.ndim == 2 else array.transpose(2, 0, 1)
        return torch.from_numpy(array.copy()), self.labels[i]


def _check_image(path: Path) -> None:
    """Raise unless `path` is an image PIL can parse (PIL's verify: corrupt, truncated PNGs, a text file named .png);
    a JPEG must also end with its end-of-image marker (verify does not read JPEG data), or else decode."""
    from PIL import Image

    with Image.open(path) as f:
        jpeg = f.format == "JPEG"
        f.verify()
    if not jpeg:
        return
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 64))
        marker = b"\xff\xd9" in f.read()
    if not marker:  # missing end marker: truncated, or trailing data; decoding decides
        with Image.open(path) as f:
            f.load()


def _fit_images(images: torch.Tensor, image_size: int, channels: int) -> torch.Tensor:
    """uint8 (N, C, H, W) to the requested side and channel count, done once for the whole dataset."""
    from torchvision.transforms.v2 import functional as TF

    if images.shape[1] != channels:
        if channels == 3:
            images = images.expand(-1, 3, -1, -1)
        else:  # ITU-R 601 luma, as PIL's convert("L")
            w = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
            images = (images.float() * w).sum(1, keepdim=True).round().to(torch.uint8)
    if images.shape[-1] != image_size:
        images = torch.cat([TF.resize(chunk, [image_size, image_size], antialias=True)
                            for chunk in images.split(4096)])
    return images.contiguous()


def load_torchvision(name: str, image_size: int = 32, channels: int = 1, split: str = "train", root=None,
                     download: bool = False):
    """mnist, fashion-mnist or cifar10 through torchvision, as uint8 images at the requested size."""
    import torchvision

    folder = TORCHVISION_DATASETS[name]
    root = data_root(root)
    try:
        ds = getattr(torchvision.datasets, folder)(str(root), train=(split == "train"), download=download)
    except RuntimeError as e:
        where = root / ("cifar-10-batches-py" if name == "cifar10" else f"{folder}/raw")
        raise DataError(
            f"{name} not found under {where}. Put the original files there (see data/README.md), point "
            f"data_root or $GANTOOLS_DATA at a folder that has them, or pass download=True "
            f"(CLI: --download) to fetch them. torchvision said: {e}") from e
    images = torch.as_tensor(np.asarray(ds.data))
    images = images[:, None] if images.ndim == 3 else images.permute(0, 3, 1, 2)
    return _fit_images(images, image_size, channels), torch.as_tensor(np.asarray(ds.targets)).long()


def make_dataset(name: str = "glyphs", image_size: int = 32, channels: int = 1, split: str = "train", root=None,
                 path=None, download: bool = False, transform: str = "on-device") -> Dataset:
    """The dataset a config names, in the transform mode it asks for."""
    if name == "folder":
        return ImageFolderDataset(path, image_size, channels, transform)
    if name in ("glyphs", "glyphs-color"):
        images, labels = load_glyphs(image_size, channels, split, root)
    elif name in TORCHVISION_DATASETS:
        images, labels = load_torchvision(name, image_size, channels, split, root, download)
    else:
        raise DataError(f"unknown dataset {name!r}; choose glyphs, glyphs-color, mnist, fashion-mnist, cifar10 "
                        "or folder")
    return ImageTensorDataset(images, labels, transform)


def dataset_from_config(cfg, split: str = "train") -> Dataset:
    return make_dataset(cfg.dataset, cfg.image_size, cfg.channels, split, cfg.data_root, cfg.data_path,
                        cfg.download, cfg.transform)


def num_classes(dataset: Dataset) -> int:
    """How many classes a dataset's labels name: its `classes` (a folder's class sub-folders), else the largest
    of its `labels` + 1. A dataset of your own needs one of the two for a conditional run."""
    if isinstance(getattr(dataset, "classes", None), (list, tuple)):
        return len(dataset.classes)
    labels = getattr(dataset, "labels", None)
    if labels is None or len(labels) == 0:
        raise DataError("a conditional run needs to know the classes: give your dataset a `labels` tensor (one "
                        "class index per image) or a `classes` list (one name per class)")
    return int(torch.as_tensor(labels).max()) + 1


def returns_cpu_tensors(dataset: Dataset) -> bool:
    """Whether the dataset's items hold only CPU tensors (or none: numbers, arrays), judged from its first item, as
    `network_checks` judges its shape. A dataset of your own may return tensors already on the GPU; those cannot be
    pinned, nor made in a forked DataLoader worker (see `make_loader`)."""
    if len(dataset) == 0:
        return True
    pending = [dataset[0]]
    while pending:
        value = pending.pop()
        if isinstance(value, torch.Tensor):
            if value.device.type != "cpu":
                return False
        elif isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, (tuple, list)):
            pending.extend(value)
    return True


# -- loaders --------------------------------------------------------------------------------------------------

class EpochBatchSampler(Sampler):
    """Shuffled batches whose order depends only on (seed, epoch), and which can start mid-epoch: that is what
    lets a resumed run see exactly the batches an uninterrupted run would.

    Under torchrun, `rank` of `world_size` yields its contiguous slice of every global batch: DistributedSampler's
    disjoint share of every epoch per rank, but batch-aligned and in the single-process order (DistributedSampler
    strides its own permutation across ranks and cannot start mid-epoch), so N processes train on the batches one
    process trains on, and a checkpoint resumes at its batch under any process count."""

    def __init__(self, n: int, batch_size: int, seed: int = 0, drop_last: bool = True, rank: int = 0,
                 world_size: int = 1):
        self.n, self.batch_size, self.seed, self.drop_last = n, batch_size, seed, drop_last
        self.rank, self.world_size = rank, world_size
        self.epoch, self.start = 0, 0

    def __len__(self):
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def set_position(self, epoch: int, batch: int) -> None:
        self.epoch, self.start = epoch, batch

    def epoch_order(self) -> torch.Tensor:
        key = int.from_bytes(hashlib.sha256(f"{self.seed}/{self.epoch}".encode()).digest()[:8], "little")
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(key))

    def batch_indices(self, order: torch.Tensor, b: int) -> torch.Tensor:
        """This rank's indices of global batch b (all of them for one process)."""
        local = self.batch_size // self.world_size
        start = b * self.batch_size + self.rank * local
        return order[start:start + local]

    def __iter__(self):
        order = self.epoch_order()
        for b in range(self.start, len(self)):
            yield self.batch_indices(order, b).tolist()


def prepare_batch(images: torch.Tensor, device: torch.device, hflip: bool = False,
                  channels_last: bool = False, world: World = World(),
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Batch to the device, uint8 -> [-1, 1] there (a quarter of the bytes of floats to copy), flipped and laid out
    there. Flips are drawn from `generator` (the trainer's own, on `device`; the global RNG when None); under torchrun
    for the whole global batch, each rank keeping its slice: the same flips, and RNG use, as one process.
    `non_blocking=True` makes the copy asynchronous only from pinned host memory; from pageable memory it first
    waits for the work queued on the GPU (PyTorch tutorial "A guide on good usage of non_blocking and pin_memory()"),
    which is why a DataLoader feeding CUDA pins its batches by default (`make_loader`)."""
    x = images.to(device, non_blocking=True)
    if x.dtype == torch.uint8:
        x = x.float().div_(127.5).sub_(1.0)
    if hflip:
        draws = torch.rand(x.shape[0] * world.size, 1, 1, 1, device=x.device, generator=generator)
        flip = world.shard(draws) < 0.5
        x = torch.where(flip, x.flip(-1), x)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


class HostLoader:
    """A torch DataLoader with every knob exposed, yielding device-ready batches of real images (with `labels`:
    (images, labels) pairs, the labels on the device too)."""

    def __init__(self, dataset: Dataset, batch_size: int, device, *, seed: int = 0, num_workers: int = 0,
                 pin_memory: bool = False, persistent_workers: bool = False, prefetch_factor: int | None = None,
                 drop_last: bool = True, hflip: bool = False, channels_last: bool = False, world: World = World(),
                 generator: torch.Generator | None = None, labels: bool = False):
        if len(dataset) < batch_size:
            raise DataError(f"the dataset has {len(dataset)} images, fewer than one batch of {batch_size}: "
                            "lower batch_size or add images")
        self.device, self.hflip, self.channels_last, self.world = torch.device(device), hflip, channels_last, world
        self.generator, self.labels = generator, labels  # flips are drawn from it
        self.sampler = EpochBatchSampler(len(dataset), batch_size, seed, drop_last, world.rank, world.size)
        self.loader = DataLoader(dataset, batch_sampler=self.sampler, num_workers=num_workers,
                                 pin_memory=pin_memory, persistent_workers=persistent_workers,
                                 prefetch_factor=prefetch_factor,
                                 # its own generator: starting an epoch must not draw from the global RNG
                                 generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.sampler)

    def set_position(self, epoch: int, batch: int) -> None:
        self.sampler.set_position(epoch, batch)

    def __iter__(self):
        for batch in worker_safe(self.loader):  # (images, labels) pairs, or bare images from your own dataset
            images = batch[0] if isinstance(batch, (tuple, list)) else batch
            x = prepare_batch(images, self.device, self.hflip, self.channels_last, self.world, self.generator)
            yield (x, torch.as_tensor(batch[1]).to(self.device, non_blocking=True)) if self.labels else x


class DeviceLoader:
    """The whole uint8 dataset resident on the device; shuffling, normalising and flipping happen there, so no
    worker, no host decode and no host-to-device copy is left in the step. Under torchrun every GPU holds the whole
    dataset (it fits one GPU, or one process could not hold it either) and gathers only its slice of each batch.
    With `labels` the labels live there too and each batch is an (images, labels) pair, gathered alike."""

    def __init__(self, dataset: ImageTensorDataset, batch_size: int, device, *, seed: int = 0,
                 drop_last: bool = True, hflip: bool = False, channels_last: bool = False, world: World = World(),
                 generator: torch.Generator | None = None, labels: bool = False):
        if not isinstance(dataset, ImageTensorDataset) or dataset.transform != "on-device":
            raise DataError("the device loader needs in-memory uint8 images (ImageTensorDataset with "
                            "transform='on-device'); use loader='dataloader' for other datasets")
        if len(dataset) < batch_size:
            raise DataError(f"the dataset has {len(dataset)} images, fewer than one batch of {batch_size}: "
                            "lower batch_size or add images")
        self.device, self.hflip, self.channels_last, self.world = torch.device(device), hflip, channels_last, world
        self.generator = generator  # flips are drawn from it
        try:
            self.images = dataset.images.to(self.device)
            self.labels = torch.as_tensor(dataset.labels).to(self.device) if labels else None
        except RuntimeError as e:
            if not is_out_of_memory(e):
                raise
            raise OutOfMemory(f"the dataset ({dataset.images.numel() / 2**20:.0f} MB as uint8) does not fit in "
                              f"{self.device.type} memory next to the model: use loader='dataloader', which holds "
                              "one batch at a time there") from None
        self.sampler = EpochBatchSampler(len(dataset), batch_size, seed, drop_last, world.rank, world.size)

    def __len__(self):
        return len(self.sampler)

    def set_position(self, epoch: int, batch: int) -> None:
        self.sampler.set_position(epoch, batch)

    def __iter__(self):
        order = self.sampler.epoch_order().to(self.device)
        for b in range(self.sampler.start, len(self.sampler)):
            indices = self.sampler.batch_indices(order, b)
            x = prepare_batch(self.images[indices], self.device, self.hflip, self.channels_last, self.world,
                              self.generator)
            yield (x, self.labels[indices]) if self.labels is not None else x


def make_loader(dataset: Dataset, cfg, device, world: World = World(),
                generator: torch.Generator | None = None) -> HostLoader | DeviceLoader:
    """The loader a config asks for: `loader='dataloader'` or `loader='device'`; under torchrun, `world`'s share;
    with `cfg.conditional` every batch is an (images, labels) pair, else the images alone.
    `pin_memory=None` (auto) pins a DataLoader's batches when they go to CUDA from the CPU: only then is the
    non-blocking copy asynchronous (see `prepare_batch`). A dataset whose tensors are already on the GPU
    (`returns_cpu_tensors`) can be neither pinned (the DataLoader pins every tensor of a batch, and a CUDA tensor
    cannot be) nor read in workers (forked from a process that already used CUDA, which the CUDA runtime does not
    support: PyTorch docs, notes/multiprocessing); asking for either is one ConfigError here, before training."""
    common = dict(seed=cfg.seed, drop_last=cfg.drop_last, hflip=cfg.hflip, channels_last=cfg.channels_last,
                  world=world, generator=generator, labels=cfg.conditional)
    if cfg.loader == "device":
        return DeviceLoader(dataset, cfg.batch_size, device, **common)
    cuda = torch.device(device).type == "cuda"
    on_cpu = returns_cpu_tensors(dataset) if cfg.num_workers or cfg.pin_memory or (cuda and cfg.pin_memory is None) \
        else True  # the probe reads an item: only where workers or pinning hang on it
    problems = []
    if not on_cpu and cfg.num_workers:
        problems.append(f"num_workers={cfg.num_workers}: a forked DataLoader worker cannot use CUDA; set num_workers=0")
    if not on_cpu and cfg.pin_memory:
        problems.append("pin_memory=True: only CPU tensors can be pinned; set pin_memory=None (auto) or False")
    if problems:
        raise ConfigError("your dataset returns tensors that are not on the CPU (already on the GPU?): "
                          + "; ".join(problems))
    pin = cfg.pin_memory if cfg.pin_memory is not None else on_cpu
    return HostLoader(dataset, cfg.batch_size, device, num_workers=cfg.num_workers, pin_memory=pin and cuda,
                      persistent_workers=cfg.persistent_workers, prefetch_factor=cfg.prefetch_factor, **common)


def loader_images_per_sec(loader, batches: int = 20, warmup: int = 2, device=None) -> float:
    """Throughput of a loader alone (no training), timed with device synchronisation; the first `warmup`
    batches (worker start-up) are not counted. `device`: where its batches land, for any iterable of batches (a
    generator over your own DataLoader); gantools' loaders know theirs."""
    from ..measuring.hardware import Timer

    def size(batch) -> int:  # (images, labels) pairs from a conditional loader or a plain DataLoader
        return (batch[0] if isinstance(batch, (tuple, list)) else batch).shape[0]

    device = torch.device(device) if device is not None else getattr(loader, "device", None)
    if device is None:
        raise TypeError(f"{type(loader).__name__} does not say where its batches land: pass device=")
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    timer, images = Timer(device).start(), 0
    for _ in range(batches):
        try:
            images += size(next(it))
        except StopIteration:  # an epoch ran out: carry on from the next one
            it = iter(loader)
            images += size(next(it))
    return images / timer.stop()
