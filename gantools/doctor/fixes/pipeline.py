"""`decode-per-item` applied while your script runs (`--try`): the dataset your DataLoader is built on, where it is a
torchvision folder with deterministic transforms, has every item computed once when the DataLoader is built and
served from memory after that. Its items are the ones your code would have computed, so it changes where the data
comes from, never what it is; a dataset that draws random augmentation, or whose `__getitem__` is your own code, is
left alone and the finding's lines are shown by hand (`watching.pipeline.decoding` says why). As a patch it is never
an edit: the lines that decode once into a tensor file change how your data is built, so the finding shows them."""
from __future__ import annotations

import inspect

import torch

from ..watching.pipeline import decoding
from .fix import Fix

DECODE_ONCE = "decode-once"


class DecodedOnce(torch.utils.data.Dataset):
    """Every item of `dataset` computed once, then served from memory (by the batch's collate, which copies)."""

    def __init__(self, dataset):
        self.dataset = dataset
        self.items = [dataset[i] for i in range(len(dataset))]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]

    def __getattr__(self, name):
        """Your code may read the dataset's own attributes (`classes`, `root`) through the DataLoader."""
        if name.startswith("__") or "dataset" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["dataset"], name)


def servable(dataset, name: str | None) -> bool:
    """Whether `dataset` is the one the diagnosis saw (by class name) and its items can be served from memory."""
    if type(dataset).__name__ != name:
        return False
    seen = decoding(dataset)
    return seen is not None and seen["run_time"] is None


class DecodeOnce(Fix):
    """The items of the decoding dataset computed once, when its DataLoader is built."""

    def not_applicable(self, ctx):
        if not ctx.decode:
            return "no DataLoader's dataset decodes image files"
        return ctx.decode[1]

    def install(self, applied):
        loader = torch.utils.data.DataLoader
        init, signature = loader.__init__, inspect.signature(loader.__init__)
        name = applied.ctx.decode[0]

        def __init__(self, *args, **kwargs):
            bound = signature.bind_partial(self, *args, **kwargs)
            dataset = bound.arguments.get("dataset")
            if dataset is not None and servable(dataset, name):
                bound.arguments["dataset"] = DecodedOnce(dataset)
            return init(*bound.args, **bound.kwargs)
        __init__.__signature__ = signature  # the workers fix sets its keywords through this signature
        applied.patch(loader, "__init__", __init__)

    def plan(self, plans, report, ctx, by_hand):
        by_hand.append((self.name, "decoding once changes how your data is built: the decode-per-item finding "
                                   "shows the lines (a tensor file, indexed, normalised on the device)"))
