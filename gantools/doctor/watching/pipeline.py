"""The data pipeline your loop reads from: what each DataLoader does per image on the host, and whether decoding
the images once would change the data."""
from __future__ import annotations


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


def _not_decodable_once(dataset) -> str | None:
    """Why decoding the images once into uint8 on the device would change the data (None when it would not):
    random augmentation would be frozen, and a Normalize other than (0.5, 0.5) does not map back to 0-255."""
    for ds in _dataset_chain(dataset):
        for transform in (getattr(ds, "transform", None), getattr(ds, "_pipeline", None)):
            if transform is None or isinstance(transform, str):
                continue
            for t in _steps_of(transform):
                name = type(t).__name__
                if name.startswith("Random") or name in ("AutoAugment", "RandAugment", "TrivialAugmentWide",
                                                         "AugMix", "ColorJitter"):
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
            "per_image_work": _per_image_work(ds), "not_decodable_once": _not_decodable_once(ds)}
