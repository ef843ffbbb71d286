"""The data pipeline your loop reads from: what each DataLoader does per image on the host, and whether decoding
the images once would change the data."""
from __future__ import annotations

import inspect
import re

# a file decoded in a Dataset's __getitem__: PIL, OpenCV, imageio, torchvision.io, a DatasetFolder's loader
_DECODES = re.compile(r"\b(Image\.open|imread|read_image|decode_image|decode_jpeg|decode_png|pil_loader|"
                      r"default_loader)\b|self\.loader\(")
_TO_TENSOR = ("ToTensor", "PILToTensor", "ToImage", "ToDtype", "ConvertImageDtype")
MEMORY_BUDGET = 2 * 1024 ** 3  # bytes of decoded items --try may hold in memory for each of its runs


def _dataset_chain(dataset) -> list:
    """The dataset and the datasets it wraps (Subset, ConcatDataset, ...)."""
    chain, todo = [], [dataset]
    while todo and len(chain) < 16:
        ds = todo.pop(0)
        chain.append(ds)
        if hasattr(ds, "dataset"):
            todo.append(ds.dataset)
        todo.extend(getattr(ds, "datasets", []) or [])
    return chain


def _per_image_work(dataset) -> str | None:
    """What the dataset does to each image on the host (PIL decoding, torchvision transforms), if anything."""
    from ...core.data import ImageFolderDataset, ImageTensorDataset

    for ds in _dataset_chain(dataset):
        transform = getattr(ds, "transform", None)
        if isinstance(ds, ImageTensorDataset) and ds._pipeline is not None:
            return f"{type(ds).__name__} with transform='per-sample' ({_short(ds._pipeline)})"
        if isinstance(ds, ImageFolderDataset):
            return f"{type(ds).__name__}: a PIL decode per image" + (
                f", then {_short(ds._pipeline)}" if ds._pipeline is not None else "")
        if transform is not None and not isinstance(transform, str):
            decode = ", a PIL decode per image" if hasattr(ds, "loader") else ""
            return f"{type(ds).__name__}{decode} with transform={_short(transform)}"
        if hasattr(ds, "loader") and hasattr(ds, "samples"):  # torchvision DatasetFolder without a transform
            return f"{type(ds).__name__}: a PIL decode per image"
    return None


def _short(transform) -> str:
    inner = getattr(transform, "transforms", None)  # torchvision's Compose: the names of its steps
    if isinstance(inner, (list, tuple)):
        return f"{type(transform).__name__}({', '.join(type(t).__name__ for t in inner)})"
    text = " ".join(repr(transform).split())
    return text if len(text) <= 100 else text[:97] + "..."


def _steps_of(transform) -> list:
    inner = getattr(transform, "transforms", None)  # torchvision's Compose, nested
    return [t for part in inner for t in _steps_of(part)] if isinstance(inner, (list, tuple)) else [transform]


def _random(name: str) -> bool:
    return name.startswith("Random") or name in ("AutoAugment", "RandAugment", "TrivialAugmentWide", "AugMix",
                                                 "ColorJitter")


def _not_decodable_once(dataset) -> str | None:
    """Why decoding the images once into uint8 on the device would change the data (None when it would not):
    random augmentation would be frozen, and a Normalize other than (0.5, 0.5) does not map back to 0-255."""
    for ds in _dataset_chain(dataset):
        for transform in (getattr(ds, "transform", None), getattr(ds, "_pipeline", None)):
            if transform is None or isinstance(transform, str):
                continue
            for t in _steps_of(transform):
                name = type(t).__name__
                if _random(name):
                    return f"{name} draws new augmentation every epoch"
                if name == "Normalize" and not all(abs(float(v) - 0.5) < 1e-6 for v in (*t.mean, *t.std)):
                    return f"Normalize(mean={list(t.mean)}, std={list(t.std)}) is not the [-1, 1] scaling"
    return None


def describe_loader(loader) -> dict:
    ds = loader.dataset
    # a DataLoader built with a batch sampler (Accelerate's, around yours) has batch_size None: its sampler's
    batch_size = loader.batch_size if loader.batch_size is not None else getattr(loader.batch_sampler, "batch_size",
                                                                                 None)
    return {"dataset": type(ds).__name__, "batch_size": batch_size, "num_workers": loader.num_workers,
            "pin_memory": loader.pin_memory, "persistent_workers": loader.persistent_workers,
            "per_image_work": _per_image_work(ds), "not_decodable_once": _not_decodable_once(ds),
            "decode": decoding(ds)}


def _torchvision_folder(ds) -> bool:
    """A torchvision DatasetFolder (ImageFolder) whose __getitem__ is torchvision's own: its loader, then its
    transforms, nothing else."""
    getitem = getattr(type(ds), "__getitem__", None)
    return (hasattr(ds, "loader") and hasattr(ds, "samples")
            and getattr(getitem, "__module__", "").startswith("torchvision."))


def _decodes(ds) -> str | None:
    """How a dataset decodes an image file per item: a torchvision folder's loader, or a decoding call in your own
    __getitem__ (read from its source); None when it decodes nothing (tensors in memory, gantools' own datasets)."""
    if _torchvision_folder(ds):
        return f"{type(ds).__name__}'s loader (PIL) opens and decodes each image file"
    if type(ds).__module__.startswith(("torch.", "gantools.")):
        return None
    try:
        found = _DECODES.search(inspect.getsource(type(ds).__getitem__))
    except (OSError, TypeError, AttributeError):
        return None
    return (f"{type(ds).__name__}.__getitem__ decodes each image file ({found.group(0).rstrip('(')})"
            if found else None)


def decoding(dataset) -> dict | None:
    """What decoding the images once means for this dataset, when it decodes image files per item.

    Args:
        dataset: the DataLoader's dataset.

    Returns:
        None when no dataset in it decodes files; else {"dataset": its class, "how": what it does, "wrapped":
        whether the DataLoader reads it through another dataset (Subset, ...), "composed": its transform is a
        Compose, "steps": the transform's step names, "keep": how many leading steps decoding once can keep (those
        before ToTensor and before the first random one), "random": the random steps, "after": the other steps
        after those kept, "normalize": (mean, std) of its Normalize, "size": the size its kept steps make, "root":
        its folder, "run_time": why --try cannot serve its items from memory (None when it can)}.
    """
    for ds in _dataset_chain(dataset):
        how = _decodes(ds)
        if not how:
            continue
        transform = getattr(ds, "transform", None)
        steps = _steps_of(transform) if transform is not None and not isinstance(transform, str) else []
        names = [type(t).__name__ for t in steps]
        keep = next((i for i, n in enumerate(names) if n in _TO_TENSOR or _random(n)), len(names))
        norm = next((t for t in steps if type(t).__name__ == "Normalize"), None)
        sized = [getattr(t, "size", None) for t in steps[:keep] if getattr(t, "size", None) is not None]
        size = sized[-1] if sized else None
        return {"dataset": type(ds).__name__, "how": how, "wrapped": ds is not dataset,
                "composed": isinstance(getattr(transform, "transforms", None), (list, tuple)),
                "steps": names, "keep": keep, "random": [n for n in names if _random(n)],
                "after": [n for n in names[keep:] if not _random(n) and n not in (*_TO_TENSOR, "Normalize")],
                "normalize": [[float(v) for v in norm.mean], [float(v) for v in norm.std]] if norm else None,
                "size": size if isinstance(size, int) or size is None else int(list(size)[0]),
                "root": str(getattr(ds, "root", "")) or None, "run_time": _not_at_run_time(ds)}
    return None


def _not_at_run_time(ds) -> str | None:
    """Why --try cannot decode this dataset's items once and serve them from memory while your script runs (None
    when it can: a torchvision folder with deterministic transforms, small enough)."""
    if not _torchvision_folder(ds):
        return (f"{type(ds).__name__}.__getitem__ is your own code: the doctor cannot tell it returns the same "
                "item every time")
    for transform in (getattr(ds, "transform", None), getattr(ds, "target_transform", None)):
        drawn = [type(t).__name__ for t in (_steps_of(transform) if transform is not None else [])
                 if _random(type(t).__name__)]
        if drawn:
            return (f"{drawn[0]} draws new augmentation for each image every epoch: items served from memory would "
                    "repeat the first draw")
    first = ds[0][0] if len(ds) else None
    size = first.numel() * first.element_size() * len(ds) if hasattr(first, "numel") else None
    if size is None:
        return f"{type(ds).__name__}'s items are not tensors"
    if size > MEMORY_BUDGET:
        return f"its {len(ds)} items would take {size / 1e9:.1f} GB of memory in each of --try's runs"
    return None
