"""A folder of JPEGs such as users bring, written here from a dataset the project already has: the real
Fashion-MNIST beside the checkout (`../shared/data`) or under the data root, else the rendered glyphs. Each image is
upscaled and saved as a JPEG, so reading one costs what reading a photo costs (a JPEG decode, a resize to the
training size, a crop): notebook 03 races the per-image decode against the folder decoded once."""
from __future__ import annotations

from pathlib import Path

from ..core.data import data_root, load_glyphs, load_torchvision, write_image_folder
from ..errors import DataError


def _source(n: int):
    """(name, uint8 images, labels): Fashion-MNIST where its files are found, else the glyphs (fewer than n then)."""
    checkout = Path(__file__).resolve().parents[2]
    for root in (checkout.parent / "shared" / "data", data_root()):
        try:
            images, labels = load_torchvision("fashion-mnist", 28, 1, "train", root)
            return "fashion-mnist", images[:n], labels[:n]
        except DataError:
            continue
    images, labels = load_glyphs(28, 1, "train")
    return "glyphs", images[:n], labels[:n]


def jpeg_folder(n: int, side: int = 96, root=None) -> Path:
    """A folder of `n` JPEGs (at most the source's images) at `side` x `side`, in class sub-folders; written once
    under the data root and reused while it holds exactly those files.

    Args:
        n: how many images.
        side: each file's side in pixels (larger than the training size, as photos are).
        root: as for `data.data_root`.
    Returns:
        The folder.
    """
    name, images, labels = _source(n)
    folder = data_root(root) / f"jpeg-folder-{name}-{len(images)}-{side}px"
    done = folder / ".complete"
    if not done.is_file():
        write_image_folder(folder, images, labels, ".jpg", side=side)
        done.touch()
    return folder
