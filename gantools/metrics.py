"""Image quality next to speed: FID and KID (torchmetrics) in the feature space of a small classifier trained on the
real dataset, and per-class mode coverage from the same classifier.

Inception features are the usual choice, but their weights are a download; a classifier trained here in a minute
on the dataset itself needs nothing from the network and sees exactly the classes the GAN must cover. Its scores
are comparable between runs on the same dataset and size, not with published Inception FIDs.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .checkpoint import atomic_save
from .data import data_root, make_dataset, prepare_batch
from .hardware import resolve_device

CLASSIFIER_VERSION = 1
MIN_SAMPLES = 2048


class Classifier(nn.Module):
    """A small CNN: three conv blocks, a 128-d feature layer (the FID/KID feature space), then class logits."""

    def __init__(self, channels: int = 1, classes: int = 10, width: int = 16):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 4 * width, 3, padding=1), nn.BatchNorm2d(4 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, 128), nn.ReLU())
        self.head = nn.Linear(128, classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class ClassifierFeatures(nn.Module):
    """The classifier's 128-d features, in the form torchmetrics expects of a custom feature extractor."""

    num_features = 128

    def __init__(self, classifier: Classifier):
        super().__init__()
        self.classifier = classifier.eval()

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier.features(x.float())


def _path(dataset: str, image_size: int, channels: int, root=None):
    return data_root(root) / "classifiers" / f"{dataset}-{image_size}px-{channels}ch-v{CLASSIFIER_VERSION}.pt"


def _accuracy(model: Classifier, images: torch.Tensor, labels: torch.Tensor, device) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in zip(images.split(512), labels.split(512)):
            correct += (model(prepare_batch(x, device)).argmax(1).cpu() == y).sum().item()
    return correct / len(labels)


def load_classifier(dataset: str = "glyphs", image_size: int = 32, channels: int = 1, root=None, device="auto",
                    max_steps: int = 1500, batch_size: int = 128, verbose: bool = True) -> tuple[Classifier, float]:
    """The feature classifier for a dataset and size, and its test accuracy: loaded from the cache under
    data/classifiers (`weights_only=True`), or trained on the training split (about a minute on a 2-core CPU)."""
    device = resolve_device(device)
    path = _path(dataset, image_size, channels, root)
    train = make_dataset(dataset, image_size, channels, "train", root)
    classes = int(train.labels.max()) + 1
    torch.manual_seed(0)  # the same classifier (and feature space) whatever ran before
    model = Classifier(channels, classes)
    if path.is_file():
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            model.load_state_dict(state["model"])
            return model.to(device).eval(), state["test_accuracy"]
        except Exception:  # a damaged cache is retrained, never trusted
            pass
    model.to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=max_steps)
    gen = torch.Generator().manual_seed(0)
    step = 0
    while step < max_steps:
        for idx in torch.randperm(len(train), generator=gen).split(batch_size):
            x = prepare_batch(train.images[idx], device)
            loss = nn.functional.cross_entropy(model(x), train.labels[idx].to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            schedule.step()
            step += 1
            if step >= max_steps:
                break
    test = make_dataset(dataset, image_size, channels, "test", root)
    accuracy = _accuracy(model, test.images, test.labels, device)
    atomic_save({"model": {k: v.cpu() for k, v in model.state_dict().items()}, "test_accuracy": accuracy,
                 "steps": step}, path)
    if verbose:
        print(f"trained the {dataset} feature classifier ({step} steps): test accuracy {accuracy:.3f}")
    return model.eval(), accuracy


def class_coverage(predictions: torch.Tensor, classes: int) -> dict:
    """How many classes the generator produces (a class counts when it gets at least a quarter of its fair share)
    and how evenly (normalised entropy: 1 is uniform, 0 is one class)."""
    share = torch.bincount(predictions, minlength=classes).float() / len(predictions)
    nonzero = share[share > 0]
    entropy = -(nonzero * nonzero.log()).sum().item()
    return {"classes_covered": int((share >= 0.25 / classes).sum()), "class_evenness": entropy / math.log(classes),
            "class_shares": [round(v, 4) for v in share.tolist()]}


class QualityMeter:
    """FID, KID and coverage of images against a dataset's real images, in the classifier's feature space.
    Build it once (it holds the real features) and call `score(fake_images)` for each run."""

    def __init__(self, dataset: str = "glyphs", image_size: int = 32, channels: int = 1, root=None,
                 n: int = MIN_SAMPLES, device="auto", split: str = "train", offset: int = 0):
        from torchmetrics.image.fid import FrechetInceptionDistance
        from torchmetrics.image.kid import KernelInceptionDistance

        self.device = resolve_device(device)
        self.classifier, self.classifier_accuracy = load_classifier(dataset, image_size, channels, root,
                                                                    self.device)
        self.classes = self.classifier.head.out_features
        real = make_dataset(dataset, image_size, channels, split, root)
        order = torch.randperm(len(real), generator=torch.Generator().manual_seed(1234))
        self.real = real.images[order[offset:offset + n]]
        self.n = len(self.real)
        features = ClassifierFeatures(self.classifier)
        self.fid = FrechetInceptionDistance(feature=features, reset_real_features=False).to(self.device)
        self.kid = KernelInceptionDistance(feature=features, subsets=50, subset_size=min(1000, self.n // 2),
                                           reset_real_features=False).to(self.device)
        for x in self.real.split(512):
            batch = prepare_batch(x, self.device)
            self.fid.update(batch, real=True)
            self.kid.update(batch, real=True)
        self.feature_space = f"classifier trained on {dataset} {image_size}px (test accuracy {self.classifier_accuracy:.3f})"

    @torch.no_grad()
    def score(self, fake: torch.Tensor) -> dict:
        """`fake`: images in [-1, 1] (float) or uint8, at least as many as the real set for a fair FID."""
        self.fid.reset()
        self.kid.reset()
        predictions = []
        for x in fake.split(512):
            batch = prepare_batch(x, self.device)
            self.fid.update(batch, real=False)
            self.kid.update(batch, real=False)
            predictions.append(self.classifier(batch).argmax(1).cpu())
        kid_mean, kid_std = self.kid.compute()
        n = len(fake)
        result = {"fid": self.fid.compute().item(), "kid": kid_mean.item(), "kid_std": kid_std.item(),
                  **class_coverage(torch.cat(predictions), self.classes),
                  "n_samples": min(n, self.n), "feature_space": self.feature_space}
        if min(n, self.n) < MIN_SAMPLES:
            result["note"] = f"computed from {min(n, self.n)} samples (< {MIN_SAMPLES}): expect a biased, noisier FID"
        return result
