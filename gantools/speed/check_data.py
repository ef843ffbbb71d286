"""The data `gantools check`'s rows train on besides its glyphs in memory: the same images as a dataset of your own
that returns them already on the GPU (`DeviceTensors`), and as a folder of image files (`images_folder`), which the
DDP row's processes read and the folder rows read decoded once (`data.CachedFolder`)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..core.data import CachedFolder, ImageTensorDataset, write_glyph_pngs

CUDA_TENSORS = "a dataset returning CUDA tensors"


class DeviceTensors(torch.utils.data.Dataset):
    """The check's images as a dataset of your own that returns them already on `device`, as one that moves each
    image to the GPU in __getitem__ does: the DataLoader must neither pin its batches (a CUDA tensor cannot be pinned)
    nor fork workers for it (`loaders.make_loader`)."""

    def __init__(self, dataset: ImageTensorDataset, device: torch.device):
        self.images, self.labels = dataset.images.to(device), dataset.labels.to(device)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


ROW_DATASETS = {CUDA_TENSORS: DeviceTensors}  # rows trained on their own dataset: name -> (images, device) -> dataset


def images_folder(work: Path, base: dict) -> dict:
    """The config fields of a row that reads image files: the check's images (`render_glyphs(64, ...)`, seed 0, as
    `check.run` renders them) written as PNG files under `work` the first time, and decoded once into their cache
    under a data root of the check's own, so no row, and none of DDP's processes (which would each build it at
    once), pays for the decode or leaves a cache in the user's data folder."""
    folder, root = work / "images", work / "data"
    if not folder.is_dir():
        write_glyph_pngs(folder, 64, base["image_size"], base["channels"])
        CachedFolder(folder, base["image_size"], base["channels"], root, say=None)
    return {"dataset": "folder", "data_path": str(folder), "data_root": str(root)}
