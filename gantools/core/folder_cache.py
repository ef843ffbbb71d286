"""A folder of image files decoded once: every image resized and cropped to the training resolution into one uint8
file that later runs map into memory instead of decoding again. Decoding JPEGs and PNGs with PIL on every access is
what keeps a data-bound loop waiting; at the resolutions GANs train at, the decoded images are small enough to live
on the device (`loaders.DeviceLoader`) or to be read a batch at a time from a memory-mapped file
(`loaders.MappedLoader`).

The cache is a folder under the data root holding `images-<token>.u8` (N x C x H x W uint8, C-order) and
`manifest.json`, which names that file and records what it was made from: every image's path, size and modification
time, the resolution, channels and crop, and a checksum of sampled blocks. The manifest is written last and
atomically, so it is the commit: a reader sees a whole cache or none. A cache is never trusted: a changed folder,
other settings, a file of the wrong size or a failed checksum rebuilds it (docs/datasets.md).
"""
from __future__ import annotations

import hashlib
import json
import os
import contextlib
import functools
import secrets
import stat
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .checkpoint import atomic_write
from ..errors import DataError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
CACHE_VERSION = 1  # bump when the layout or the decode changes, so older caches are rebuilt
CROP = "resize shorter side, centre crop"  # as the per-sample path: Resize(image_size), CenterCrop(image_size)
DECODERS = ("pil", "nvjpeg")
_SAMPLED_BLOCKS, _BLOCK = 256, 4096  # the checksum reads 1 MiB at most, wherever the file's damage is
_NVJPEG_BATCH = 256


@dataclass(frozen=True)
class Listing:
    """The image files under a folder, in a fixed order, with their labels (class sub-folders, sorted by name; a
    flat folder is one class) and what identifies each file's version (its path, size and modification time)."""
    root: Path
    files: tuple[Path, ...]
    classes: tuple[str, ...]
    labels: tuple[int, ...]
    stamps: tuple[tuple[str, int, int], ...]


def list_images(path) -> Listing:
    """The image files under `path`, searched recursively (symbolic links to files followed), in the order of their
    paths' parts. Strings and one stat per file, not pathlib: a second run checks the folder of tens of thousands of
    files against its cache in a fraction of a second.

    Raises:
        DataError: no such folder, or no image files in it.
    """
    root = Path(path)
    if not root.is_dir():
        raise DataError(f"data_path={str(path)!r}: no such folder")
    found = []
    for folder, _, names in os.walk(root):
        parts = tuple(Path(folder).relative_to(root).parts)
        for name in names:
            if os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS:
                try:
                    st = os.stat(os.path.join(folder, name))
                except OSError:  # a dangling link
                    continue
                if stat.S_ISREG(st.st_mode):
                    found.append((parts + (name,), st.st_size, st.st_mtime_ns))
    if not found:
        raise DataError(f"no image files ({', '.join(IMAGE_EXTENSIONS)}) under {root}: "
                        "point data_path at a folder of images or of class sub-folders of images")
    found.sort()
    folders = ["/".join(parts[:-1]) or "." for parts, _, _ in found]
    classes = tuple(sorted(set(folders)))
    index = {name: i for i, name in enumerate(classes)}
    files = tuple(Path(root, *parts) for parts, _, _ in found)
    stamps = tuple(("/".join(parts), size, mtime) for parts, size, mtime in found)
    return Listing(root, files, classes, tuple(index[f] for f in folders), stamps)


@functools.lru_cache(maxsize=8)
def _fit(image_size: int):
    """Resize (shorter side) then centre-crop, on a PIL image: the per-sample pipeline's first two steps."""
    from torchvision import transforms as T

    return T.Compose([T.Resize(image_size), T.CenterCrop(image_size)])


def open_image(path: Path, channels: int):
    """The image file as a PIL image in grey (1 channel) or RGB (3).

    Raises:
        DataError: the file is not a readable image (PIL's error as the cause).
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as f:
            return f.convert("L" if channels == 1 else "RGB")
    except (OSError, UnidentifiedImageError, SyntaxError, ValueError) as e:  # PIL's ways to say 'broken'
        raise DataError(f"cannot read image {path}: {e}. Remove or replace the file.") from e


def decode_image(path: Path, image_size: int, channels: int) -> np.ndarray:
    """One image file as uint8 (channels, image_size, image_size), resized and cropped as the per-sample path does:
    the one decode both the per-access folder and the folder cache use, so both see the same pixels."""
    array = np.array(_fit(image_size)(open_image(path, channels)), np.uint8)  # writable: a tensor may wrap it
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def bad_files_message(bad: list[str], total: int, root: Path) -> str:
    """The one refusal of a folder with unreadable images: every bad file named (the first ten shown)."""
    shown = "\n  ".join(sorted(bad)[:10]) + (f"\n  ... and {len(bad) - 10} more" if len(bad) > 10 else "")
    return (f"{len(bad)} of {total} files under {root} are not readable images:\n  {shown}\n"
            "Remove or replace them, then run again.")


def cache_dir_for(folder: Path, image_size: int, channels: int, cache_root: Path) -> Path:
    """Where a folder's cache lives under `cache_root`: one per folder (by its absolute path) and setting."""
    resolved = folder.resolve()
    key = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in resolved.name) or "folder"
    return cache_root / f"{name}-{key}-{image_size}px-{channels}ch"


def _sampled_checksum(path: Path, size: int) -> str:
    """blake2b of evenly spaced blocks and the last one: cheap on a large file, and it catches a damaged or
    overwritten cache that still has the right size."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        step = max(_BLOCK, size // _SAMPLED_BLOCKS)
        for offset in list(range(0, size, step)) + [max(0, size - _BLOCK)]:
            f.seek(offset)
            h.update(f.read(_BLOCK))
    return h.hexdigest()


def _settings(image_size: int, channels: int) -> dict:
    return {"version": CACHE_VERSION, "image_size": image_size, "channels": channels, "crop": CROP}


def read_cache(cache_dir: Path, listing: Listing, image_size: int, channels: int) -> tuple[torch.Tensor | None, str]:
    """The cached images when the cache matches the folder and the settings and passes its checks, else None and
    why it does not (what a rebuild says).

    Returns:
        (images mapped from the file, '') or (None, the reason).
    """
    try:
        manifest = json.loads((cache_dir / "manifest.json").read_text())
    except FileNotFoundError:
        return None, "no cache yet"
    except (OSError, ValueError) as e:
        return None, f"its manifest is unreadable ({type(e).__name__})"
    if {k: manifest.get(k) for k in _settings(image_size, channels)} != _settings(image_size, channels):
        return None, "it was made with other settings"
    reason = _changed_files(manifest.get("files"), listing)
    if reason:
        return None, reason
    path = cache_dir / str(manifest.get("images", ""))
    expected = len(listing.files) * channels * image_size * image_size
    size = path.stat().st_size if path.is_file() else -1
    if size != expected:
        return None, f"its image file has {max(size, 0):,} bytes, not {expected:,} (truncated or missing)"
    if _sampled_checksum(path, size) != manifest.get("checksum"):
        return None, "its image file fails its checksum (damaged)"
    try:
        array = np.memmap(path, np.uint8, "c", shape=(len(listing.files), channels, image_size, image_size))
    except OSError as e:  # removed just now by another process's newer build
        return None, f"its image file went away ({e.strerror})"
    return torch.from_numpy(array), ""  # mode "c": copy-on-write, writable, and writes never reach the file


def _changed_files(recorded, listing: Listing) -> str:
    """'' when the folder holds exactly the files the cache was made from, else what changed."""
    if not isinstance(recorded, list):
        return "its manifest lists no files"
    old = {str(r[0]): tuple(r[1:]) for r in recorded if isinstance(r, list) and len(r) == 3}
    new = {name: (size, mtime) for name, size, mtime in listing.stamps}
    added, removed = new.keys() - old.keys(), old.keys() - new.keys()
    replaced = [name for name in new.keys() & old.keys() if tuple(old[name]) != new[name]]
    parts = [f"{len(names)} file{'s' * (len(names) != 1)} {verb} (e.g. {sorted(names)[0]})"
             for names, verb in ((added, "added"), (removed, "removed"), (replaced, "replaced")) if names]
    return "the folder changed: " + ", ".join(parts) if parts else ""


def _why(path: Path, error: DataError) -> str:
    """A bad file as the refusal lists it: its path and PIL's reason, as `data.ImageFolderDataset` words it."""
    cause = error.__cause__ or error
    first = str(cause).splitlines()[0] if str(cause) else "unreadable"
    return f"{path} ({type(cause).__name__}: {first})"


def _decode_pil(listing: Listing, out: np.ndarray, image_size: int, channels: int, workers: int, bar) -> list[str]:
    """Every file decoded, resized and cropped by PIL into `out`, in `workers` threads (PIL's decoders and resize
    release the GIL); returns the files that failed, each with why."""
    bad: list[str] = []

    def chunk(start: int) -> None:
        for i in range(start, min(start + 64, len(listing.files))):
            try:
                out[i] = decode_image(listing.files[i], image_size, channels)
            except DataError as e:
                bad.append(_why(listing.files[i], e))
        bar.update(min(64, len(listing.files) - start))

    with ThreadPoolExecutor(max(1, workers)) as pool:
        list(pool.map(chunk, range(0, len(listing.files), 64)))
    return bad


def _decode_nvjpeg(listing: Listing, out: np.ndarray, image_size: int, channels: int, device, bar) -> list[str]:
    """JPEGs decoded in batches by `torchvision.io.decode_jpeg` on `device` (nvJPEG on a GPU), resized and cropped
    there; other files, and any batch the decoder refuses, go through PIL file by file (which names a bad file).
    torchvision's docs for decode_jpeg (0.19 on): a list of encoded CPU tensors and a device in, decoded tensors on
    that device out; on CUDA one call with a list beats repeated calls; an error returns no partial results, hence
    the whole batch's fallback."""
    import torchvision.io as tio
    from torchvision.transforms.v2 import functional as TF

    mode = tio.ImageReadMode.GRAY if channels == 1 else tio.ImageReadMode.RGB
    jpegs = [i for i, p in enumerate(listing.files) if p.suffix.lower() in (".jpg", ".jpeg")]
    others = sorted(set(range(len(listing.files))) - set(jpegs))
    for start in range(0, len(jpegs), _NVJPEG_BATCH):
        batch = jpegs[start:start + _NVJPEG_BATCH]
        try:
            with warnings.catch_warnings():  # torchvision 0.29 deprecates its decoders for TorchCodec's; they work
                warnings.simplefilter("ignore", DeprecationWarning)
                encoded = [tio.read_file(str(listing.files[i])) for i in batch]
                decoded = tio.decode_jpeg(encoded, mode=mode, device=device)
        except RuntimeError:
            others.extend(batch)
            continue
        fitted = [TF.center_crop(TF.resize(x, image_size, antialias=True), [image_size, image_size])
                  for x in decoded]
        out[batch] = torch.stack(fitted).cpu().numpy()
        bar.update(len(batch))
    bad: list[str] = []
    for i in others:
        try:
            out[i] = decode_image(listing.files[i], image_size, channels)
        except DataError as e:
            bad.append(_why(listing.files[i], e))
        bar.update(1)
    return bad


def build_cache(cache_dir: Path, listing: Listing, image_size: int, channels: int, *, workers: int | None = None,
                progress: bool | None = None, decoder: str = "pil", device=None) -> torch.Tensor:
    """Decode every file once into a new cache and commit it (the manifest last, atomically); an older cache's
    image files are removed after.

    Args:
        cache_dir: the cache's folder (created).
        listing: the folder's files (`list_images`).
        image_size, channels: the images' side and channel count.
        workers: decoding threads; None: this process's cores.
        progress: a progress bar; None: only on a terminal.
        decoder: 'pil' (the per-sample path's decode, exactly) or 'nvjpeg' (JPEGs decoded on `device` in batches).
        device: where nvjpeg decodes (a CUDA device; 'cpu' runs the same batched path on the CPU).
    Returns:
        The images, mapped from the committed file.
    Raises:
        DataError: files that are not readable images, all named at once; nothing is committed.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    name = _decode_into(cache_dir, listing, image_size, channels, workers, progress, decoder, device)
    size = len(listing.files) * channels * image_size * image_size
    checksum = _sampled_checksum(cache_dir / (name + ".partial"), size)
    manifest = dict(_settings(image_size, channels), images=name, decoder=decoder, classes=list(listing.classes),
                    checksum=checksum, files=[list(s) for s in listing.stamps])
    replaced = _committed_images(cache_dir)
    os.replace(cache_dir / (name + ".partial"), cache_dir / name)
    atomic_write(cache_dir / "manifest.json", lambda f: f.write(json.dumps(manifest).encode()))
    _remove_stale(cache_dir, name, replaced)
    for _ in range(3):  # another process building the same cache may have just committed its own: read that
        images, reason = read_cache(cache_dir, listing, image_size, channels)
        if images is not None:
            return images
    # the folder changed while it was decoded, or other processes kept replacing the cache
    raise DataError(f"the cache under {cache_dir} changed while this run built it ({reason}); run again")


def _decode_into(cache_dir: Path, listing: Listing, image_size: int, channels: int, workers, progress, decoder,
                 device) -> str:
    """Every image decoded into a new `images-<token>.u8.partial` file, flushed to disk; returns its final name.
    On any failure (bad files, Ctrl-C) the partial file is removed."""
    from tqdm.auto import tqdm

    name = f"images-{secrets.token_hex(6)}.u8"
    partial = cache_dir / (name + ".partial")
    shape = (len(listing.files), channels, image_size, image_size)
    try:
        array = np.memmap(partial, np.uint8, "w+", shape=shape)  # raw bytes: the manifest holds the shape
        with tqdm(total=shape[0], desc=f"decoding {listing.root.name} once", unit="img",
                  disable={True: False, False: True, None: None}[progress], file=sys.stderr) as bar:
            bad = (_decode_nvjpeg(listing, array, image_size, channels, device, bar) if decoder == "nvjpeg" else
                   _decode_pil(listing, array, image_size, channels, workers or len(os.sched_getaffinity(0)), bar))
        if bad:
            raise DataError(bad_files_message(bad, shape[0], listing.root))
        array.flush()
        del array
        with open(partial, "rb") as f:
            os.fsync(f.fileno())
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return name


def _committed_images(cache_dir: Path) -> str | None:
    """The image file the cache's manifest names now, if any: the one a new commit replaces."""
    try:
        return str(json.loads((cache_dir / "manifest.json").read_text()).get("images")) or None
    except (OSError, ValueError, AttributeError):
        return None


def _remove_stale(cache_dir: Path, keep: str, replaced: str | None) -> None:
    """The image file this commit replaced (a reader still mapping it keeps it until it lets go: POSIX), and any
    other image file, whole or partial, an hour old or more: a killed build's. A younger one may be another
    process's build of the same cache, between its rename and its commit, so it is left alone."""
    if replaced and replaced != keep and "/" not in replaced:
        (cache_dir / replaced).unlink(missing_ok=True)
    for stale in cache_dir.glob("images-*"):
        with contextlib.suppress(OSError):
            if stale.name != keep and time.time() - stale.stat().st_mtime > 3600:
                stale.unlink()


@dataclass
class FolderImages:
    """A folder's decoded images and how this run got them.

    Attributes:
        listing: the folder's files and labels.
        images: uint8 (N, C, H, W) mapped from the cache's file (pages read on demand, so a cache larger than
            memory still serves).
        cache_dir: the cache's folder.
        built: True when this run decoded the folder (the first run, or a rebuild), False when it reused the cache.
        reason: why it was built ('' when reused).
        seconds: how long getting it took.
    """
    listing: Listing
    images: torch.Tensor
    cache_dir: Path
    built: bool
    reason: str
    seconds: float

    def describe(self) -> str:
        """One line: what the cache holds, and whether this run decoded it (and why) or reused it."""
        n, c, h, w = self.images.shape
        what = f"{n:,} images at {h} x {w} x {c}, {self.images.numel() / 2**20:,.1f} MB of uint8 in {self.cache_dir}"
        if self.built:
            return (f"decoded {self.listing.root} once ({self.reason}) in {self.seconds:.1f} s: {what}; "
                    "later runs read it")
        return f"read {self.listing.root} from its cache ({self.seconds:.2f} s to check): {what}"


def load_folder(path, image_size: int, channels: int, cache_root: Path, *, workers: int | None = None,
                progress: bool | None = None, decoder: str = "pil", device=None, rebuild: bool = False) -> FolderImages:
    """A folder's images decoded once: its cache when that matches, else decoded now and cached for the next run.

    Args:
        path: the folder of images (class sub-folders give labels).
        image_size, channels: the training resolution and channels (1 grey, 3 RGB).
        cache_root: the folder caches live under (`data.data_root(...) / 'folder-cache'`).
        workers, progress, decoder, device: as for `build_cache`.
        rebuild: decode again even when the cache matches.
    Returns:
        The images and how they were got.
    Raises:
        DataError: no such folder, no images, unreadable images (named), or an unknown decoder.
    """
    if decoder not in DECODERS:
        raise DataError(f"decoder={decoder!r}: choose {' or '.join(DECODERS)}")
    start = time.perf_counter()
    listing = list_images(path)
    cache_dir = cache_dir_for(listing.root, image_size, channels, cache_root)
    images, reason = (None, "asked to rebuild") if rebuild else read_cache(cache_dir, listing, image_size, channels)
    built = images is None
    if built:
        images = build_cache(cache_dir, listing, image_size, channels, workers=workers, progress=progress,
                             decoder=decoder, device=device)
    return FolderImages(listing, images, cache_dir, built, reason if built else "", time.perf_counter() - start)
