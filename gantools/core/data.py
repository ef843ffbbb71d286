"""Datasets: the images a run learns, whatever loader then batches them (`loaders`). Datasets live here, not in
notebooks, so DataLoader workers can import them under spawn/forkserver. Every dataset yields `(image, label)`. With
`transform="on-device"` the image is a uint8 (C, H, W) tensor and the whole batch is normalised on the device; with
`transform="per-sample"` it is a normalised float tensor made by PIL and torchvision transforms, image by image, as
the PyTorch DCGAN tutorial does."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .checkpoint import atomic_save
from .folder_cache import FolderImages, bad_files_message, decode_image, list_images, load_folder, open_image
from ..errors import DataError

GLYPH_FONTS = (  # fonts matplotlib ships that draw all ten digits
    "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSans-BoldOblique.ttf",
    "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf", "DejaVuSerif-BoldItalic.ttf",
    "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf", "DejaVuSansMono-Oblique.ttf",
    "STIXGeneral.ttf", "STIXGeneralBol.ttf", "STIXGeneralItalic.ttf", "STIXGeneralBolIta.ttf",
    "cmr10.ttf", "cmss10.ttf", "cmtt10.ttf", "cmb10.ttf",
)
GLYPH_SPLITS = {"train": (20000, 0), "test": (2000, 1)}  # split -> (images, seed offset)
GLYPHS_VERSION = 1  # bump when the renderer changes, so stale caches are not reused
TORCHVISION_DATASETS = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST", "cifar10": "CIFAR10"}


def data_root(root: str | os.PathLike | None = None) -> Path:
    """Where datasets and caches live, so one setting moves them all.

    Args:
        root: the folder to use; None: $GANTOOLS_DATA, else the checkout's data/ (or ./data).
    Returns:
        That folder (not created here).
    """
    if root:
        return Path(root)
    if os.environ.get("GANTOOLS_DATA"):
        return Path(os.environ["GANTOOLS_DATA"])
    checkout = Path(__file__).resolve().parents[2]  # gantools/core/data.py -> the checkout
    if (checkout / "pyproject.toml").is_file():
        return checkout / "data"
    return Path("data")


# -- glyphs: the embedded default dataset -------------------------------------------------------------------

def render_glyphs(n: int, image_size: int = 32, channels: int = 1, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Handwriting-like digits drawn from matplotlib's fonts with random affine jitter, stroke width, blur and
    noise: a dataset that needs no download, deterministic for a seed.

    Args:
        n: how many images.
        image_size: their side in pixels.
        channels: 1 (grey) or 3 (a random ink colour on a random dark background per image).
        seed: the same seed draws the same images and labels.
    Returns:
        uint8 images (n, channels, image_size, image_size) and their int64 digit labels (n,).
    Raises:
        DataError: matplotlib's fonts are missing.
    """
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
    images, labels = render_glyphs(n, image_size, channels, seed=seed)
    return write_image_folder(root, images, labels)


def write_image_folder(root, images: torch.Tensor, labels: torch.Tensor, suffix: str = ".png", side: int | None = None,
                       quality: int = 90) -> Path:
    """uint8 images (N, C, H, W) written as image files, one sub-folder per label (root/3/00017.jpg): a folder such
    as users bring. `side` resizes each (bicubic) first, so a folder can hold images larger than the training
    resolution, as photos are; JPEGs are written at `quality`. Files already there are overwritten. Returns root."""
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    root = Path(root)
    for label in sorted(set(labels.tolist())):
        (root / str(label)).mkdir(parents=True, exist_ok=True)

    def write(i: int) -> None:
        array = images[i].permute(1, 2, 0).numpy()
        image = Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array)
        if side is not None:
            image = image.resize((side, side), Image.BICUBIC)
        image.save(root / str(int(labels[i])) / f"{i:05d}{suffix}", **({"quality": quality} if suffix in
                                                                         (".jpg", ".jpeg") else {}))

    with ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:  # PIL's encoders release the GIL
        list(pool.map(write, range(len(images))))
    return root


def load_glyphs(image_size: int = 32, channels: int = 1, split: str = "train", root=None, seed: int = 0):
    """Glyphs from the cache under data/glyphs, rendering (seconds) and caching them atomically on first use, so
    every later run reads the same images at once.

    Args:
        image_size: the images' side in pixels.
        channels: 1 (grey) or 3 (colour), as for `render_glyphs`.
        split: 'train' or 'test', each its own images.
        root: as for `data_root`.
        seed: the images' seed; each split draws its own from it.
    Returns:
        uint8 images (N, channels, image_size, image_size) and int64 labels (N,).
    Raises:
        DataError: an unknown split.
    """
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
    """In-memory uint8 images (N, C, H, W) with labels; the only kind the device-resident loader can hold.

    Args:
        images: uint8 (N, C, H, W).
        labels: one class index per image.
        transform: 'on-device' (uint8 items, normalised by the loader on the device) or 'per-sample' (the
            tutorial's PIL and torchvision pipeline, image by image).
    """

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
    """Image files decoded with PIL on every access: the realistic, CPU-bound case that the folder cache
    (`CachedFolder`) replaces by one decode.

    Args:
        path: the folder, searched recursively (`list_images`).
        image_size: every image resized and centre-cropped to this side.
        channels: 1 (grey) or 3 (RGB).
        transform: as for `ImageTensorDataset`.
    Raises:
        DataError: no such folder, no image files, or files that are not readable images (all named at once).
    """

    def __init__(self, path, image_size: int = 32, channels: int = 1, transform: str = "on-device"):
        listing = list_images(path)
        self.root, self.files, self.classes = listing.root, list(listing.files), list(listing.classes)
        self.labels = list(listing.labels)
        self.image_size, self.channels, self.transform = image_size, channels, transform
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
            raise DataError(bad_files_message(bad, len(self.files), self.root))

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        if self._pipeline is not None:
            return self._pipeline(open_image(self.files[i], self.channels)), self.labels[i]
        return torch.from_numpy(decode_image(self.files[i], self.image_size, self.channels)), self.labels[i]


class CachedFolder(ImageTensorDataset):
    """A folder's images decoded once (`folder_cache`): uint8 images mapped from the cache's file, the folder's
    labels and class names, and how this run got them (`folder`: built or reused, why, how long). An
    ImageTensorDataset, so the device loader and the memory-mapped loader hold it as it is.

    Args:
        path: the folder (class sub-folders give labels).
        image_size, channels: the training resolution and channels.
        root: the data root its cache lives under (`data_root`).
        say: where the one line about the cache goes (None: nowhere).
        options: `folder_cache.load_folder`'s (workers, progress, decoder, device, rebuild).
    """

    def __init__(self, path, image_size: int = 32, channels: int = 1, root=None, say=print, **options):
        self.folder: FolderImages = load_folder(path, image_size, channels, data_root(root) / "folder-cache",
                                                **options)
        listing = self.folder.listing
        super().__init__(self.folder.images, torch.tensor(listing.labels, dtype=torch.long))
        self.root, self.classes, self.files = listing.root, list(listing.classes), list(listing.files)
        if say is not None:
            say(self.folder.describe())


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
    """The dataset a config names, in the transform mode it asks for.

    Args:
        name: glyphs, glyphs-color, mnist, fashion-mnist, cifar10, or folder (the image files under `path`).
        image_size: every image fitted to this side.
        channels: 1 (grey) or 3 (colour).
        split: 'train' or 'test' (a folder has only its images).
        root: as for `data_root`.
        path: the folder, for name='folder'.
        download: fetch a torchvision dataset when it is missing.
        transform: as for `ImageTensorDataset`.
    Returns:
        An ImageTensorDataset; for a folder a CachedFolder (decoded once), or with transform='per-sample' an
        ImageFolderDataset (decoded by PIL on every access).
    Raises:
        DataError: an unknown name, or the images are not there.
    """
    if name == "folder":  # decoded once into a cache, unless each image is to go through PIL's transforms
        if transform == "per-sample":
            return ImageFolderDataset(path, image_size, channels, transform)
        cached = CachedFolder(path, image_size, channels, root, say=None)
        if cached.folder.built:  # the one line worth a run's output: a cache read as it is says nothing
            print(cached.folder.describe())
        return cached
    if name in ("glyphs", "glyphs-color"):
        images, labels = load_glyphs(image_size, channels, split, root)
    elif name in TORCHVISION_DATASETS:
        images, labels = load_torchvision(name, image_size, channels, split, root, download)
    else:
        raise DataError(f"unknown dataset {name!r}; choose glyphs, glyphs-color, mnist, fashion-mnist, cifar10 "
                        "or folder")
    return ImageTensorDataset(images, labels, transform)


def dataset_from_config(cfg, split: str = "train") -> Dataset:
    """`make_dataset` for a TrainConfig's data fields: the images a Trainer trains on when given no dataset.

    Args:
        cfg: the TrainConfig.
        split: as for `make_dataset`.
    Returns:
        The dataset.
    """
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
    pinned, nor made in a forked DataLoader worker (see `loaders.make_loader`)."""
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
