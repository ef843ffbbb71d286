"""Image quality next to speed: FID and KID (torchmetrics) in the feature space of a small classifier trained on the
real dataset, and per-class mode coverage from the same classifier.

Inception features are the usual choice, but their weights are a download; a classifier trained here in a minute
on the dataset itself needs nothing from the network and sees exactly the classes the GAN must cover. Its scores
are comparable between runs on the same dataset and size, not with published Inception FIDs. On datasets of strokes
or items on a plain ground the classifier first sets each image's ground to black (`set_ground`), so its features
see the shapes, and a ground every sample shares (a GAN's grey) does not swamp them; the ground is measured on its
own (`background_check`). Inception FID is
offered too (`features="inception"`) when torch-fidelity and its weights file are already on this machine
(`inception_weights()` says where it looked); nothing is downloaded unless you call `download_inception_weights()`.
"""
from __future__ import annotations

import functools
import math
import os
import warnings
from pathlib import Path

import torch
from torch import nn

from .checkpoint import atomic_save
from .data import data_root, make_dataset
from .loaders import prepare_batch
from ..errors import QualityError
from ..measuring import hardware
from ..measuring.hardware import resolve_device, seeded
from ..quick import QUICK

CLASSIFIER_VERSION = 2  # part of the cache's file name: a changed feature space retrains the cached classifiers
PLAIN_GROUND = ("glyphs", "glyphs-color", "mnist", "fashion-mnist")  # shapes on a plain ground, seen at the border
MAX_GROUND_STRETCH = 8.0  # a nearly white ground is no ground: its image is stretched at most this much
MIN_SAMPLES = 2048  # FID's default sample count, and the fewest it is trusted from (docs/benchmark.md)
INCEPTION_FILE = "weights-inception-2015-12-05-6726825d.pth"  # torch-fidelity's FID Inception (TF port)
INCEPTION_URL = f"https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/{INCEPTION_FILE}"


def inception_weights(root=None) -> Path | None:
    """The local Inception weights file, if any: $GANTOOLS_INCEPTION_WEIGHTS, data/inception/, or torch's hub
    cache (where torch-fidelity keeps it). Never downloads."""
    candidates = [os.environ.get("GANTOOLS_INCEPTION_WEIGHTS"), data_root(root) / "inception" / INCEPTION_FILE,
                  Path(torch.hub.get_dir()) / "checkpoints" / INCEPTION_FILE]
    return next((Path(c) for c in candidates if c and Path(c).is_file()), None)


def download_inception_weights(root=None) -> Path:
    """Fetch the Inception weights (about 100 MB, needs internet) into data/inception/. Only ever called by you."""
    path = data_root(root) / "inception" / INCEPTION_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.hub.download_url_to_file(INCEPTION_URL, str(path))
    return path


def _inception_problem(root=None) -> str | None:
    import importlib.util

    if importlib.util.find_spec("torch_fidelity") is None:
        return "Inception FID needs torch-fidelity: pip install -c constraints.txt -e '.[inception]'"
    if inception_weights(root) is None:
        return (f"no Inception weights on this machine (looked in $GANTOOLS_INCEPTION_WEIGHTS, "
                f"{data_root(root) / 'inception'}, {Path(torch.hub.get_dir()) / 'checkpoints'}); fetch them once with "
                f"gantools.core.metrics.download_inception_weights() (needs internet), or copy {INCEPTION_FILE} there")
    return None


def set_ground(x: torch.Tensor) -> torch.Tensor:
    """Images in [-1, 1], each shifted and stretched (per channel, white kept white) so that its ground, the median of
    its border pixels, lies at -1: the same shapes whatever the grey of their ground. Identity on a black ground."""
    border = torch.cat([x[..., 0, :], x[..., -1, :], x[..., 1:-1, 0], x[..., 1:-1, -1]], dim=-1)
    ground = border.median(dim=-1).values[..., None, None]
    stretch = (2 / (1 - ground)).clamp(max=MAX_GROUND_STRETCH)
    return (-1 + (x - ground) * stretch).clamp(-1, 1)


class Classifier(nn.Module):
    """A small CNN: three conv blocks, a 128-d feature layer (the FID/KID feature space), then class logits. With
    `plain_ground` every image's ground is set to black first (`set_ground`), in training and in scoring alike."""

    def __init__(self, channels: int = 1, classes: int = 10, width: int = 16, plain_ground: bool = False):
        super().__init__()
        self.plain_ground = plain_ground
        self.body = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 4 * width, 3, padding=1), nn.BatchNorm2d(4 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, 128), nn.ReLU())
        self.head = nn.Linear(128, classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(set_ground(x) if self.plain_ground else x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


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
        for x, y in zip(images.split(512), labels.split(512), strict=True):
            correct += (model(prepare_batch(x, device)).argmax(1).cpu() == y).sum().item()
    return correct / len(labels)


def load_classifier(dataset: str = "glyphs", image_size: int = 32, channels: int = 1, root=None, device="auto",
                    max_steps: int = 1500, batch_size: int = 128, verbose: bool = True) -> tuple[Classifier, float]:
    """The feature classifier for a dataset and size, and its test accuracy: loaded from the cache under
    data/classifiers (`weights_only=True`), or trained on the training split once (the slow part of a first score)."""
    device = resolve_device(device)
    path = _path(dataset, image_size, channels, root)
    train = make_dataset(dataset, image_size, channels, "train", root)
    classes = int(train.labels.max()) + 1
    with seeded(0):  # the same classifier (and feature space) whatever ran before; the caller's RNG untouched
        model = Classifier(channels, classes, plain_ground=dataset in PLAIN_GROUND)
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
    return {"classes_covered": int((share >= 0.25 / classes).sum()), "classes": classes,
            "class_evenness": entropy / math.log(classes),
            "class_shares": [round(v, 4) for v in share.tolist()]}


class QualityMeter:
    """FID, KID and coverage of images against a dataset's real images, in the classifier's feature space.
    Build it once (it holds the real features) and call `score(fake_images)` for each run."""

    def __init__(self, dataset: str = "glyphs", image_size: int = 32, channels: int = 1, root=None,
                 n: int = MIN_SAMPLES, device="auto", split: str = "train", offset: int = 0,
                 features: str = "classifier"):
        from torchmetrics.image.fid import FrechetInceptionDistance
        from torchmetrics.image.kid import KernelInceptionDistance

        if dataset == "folder":
            raise QualityError("quality metrics need a labelled dataset (glyphs, mnist, fashion-mnist, cifar10) for "
                               "the feature classifier; a folder of images has no labels")
        if features not in ("classifier", "inception"):
            raise QualityError(f"features={features!r}: choose 'classifier' or 'inception'")
        problem = _inception_problem(root) if features == "inception" else None
        if problem:
            raise QualityError(problem)
        self.device = resolve_device(device)
        self.classifier, self.classifier_accuracy = load_classifier(dataset, image_size, channels, root,
                                                                    self.device)
        self.classes = self.classifier.head.out_features
        real = make_dataset(dataset, image_size, channels, split, root)
        order = torch.randperm(len(real), generator=torch.Generator().manual_seed(1234))
        self.real = real.images[order[offset:offset + n]]
        self.n = len(self.real)
        if features == "inception":  # torchmetrics' Inception wants uint8 RGB; it resizes to 299 itself
            extractor = dict(feature=2048, feature_extractor_weights_path=str(inception_weights(root)))
            self._to_input = lambda x: _to_uint8_rgb(x, self.device)
            self.feature_space = "Inception v3 pool3 (2048-d)"
        else:
            extractor = dict(feature=ClassifierFeatures(self.classifier))
            self._to_input = lambda x: prepare_batch(x, self.device)
            self.feature_space = (f"classifier trained on {dataset} {image_size}px "
                                  f"(test accuracy {self.classifier_accuracy:.3f})")
        self.fid = FrechetInceptionDistance(**extractor, reset_real_features=False).to(self.device)
        with warnings.catch_warnings():  # "will save all extracted features": 2048 x 128 floats here, by design
            warnings.filterwarnings("ignore", message=".*will save all extracted features")
            self.kid = KernelInceptionDistance(feature=self.fid.inception, subsets=50,  # FID's extractor, shared
                                               subset_size=min(1000, self.n // 2),
                                               reset_real_features=False).to(self.device)
        for x in self.real.split(512):
            self.fid.update(self._to_input(x), real=True)
            self.kid.update(self._to_input(x), real=True)

    @torch.no_grad()
    def score(self, fake: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        """`fake`: images in [-1, 1] (float) or uint8, at least as many as the real set for a fair FID. `labels`:
        the classes a conditional generator was asked for, one per image; then `label_match` is the share of images
        the classifier puts in the class they were asked for (1 / classes by chance)."""
        self.fid.reset()
        self.kid.reset()
        predictions = []
        for x in fake.split(512):
            self.fid.update(self._to_input(x), real=False)
            self.kid.update(self._to_input(x), real=False)
            predictions.append(self.classifier(prepare_batch(x, self.device)).argmax(1).cpu())
        kid_mean, kid_std = self.kid.compute()
        n, predictions = len(fake), torch.cat(predictions)
        result = {"fid": self.fid.compute().item(), "kid": kid_mean.item(), "kid_std": kid_std.item(),
                  **class_coverage(predictions, self.classes),
                  "n_samples": min(n, self.n), "feature_space": self.feature_space}
        if labels is not None:
            result["label_match"] = (predictions == labels.cpu()).float().mean().item()
        if min(n, self.n) < MIN_SAMPLES:
            result["note"] = f"computed from {min(n, self.n)} samples (< {MIN_SAMPLES}): expect a biased, noisier FID"
        return result


def _signed(images: torch.Tensor) -> torch.Tensor:
    return images.float() / 127.5 - 1 if images.dtype == torch.uint8 else images.float()


def background_level(images: torch.Tensor) -> float:
    """The median pixel of a set of images, in [-1, 1]: on glyphs (thin strokes on a plain ground) the level of the
    background."""
    return _signed(images).median().item()


def with_background(images: torch.Tensor, level: float) -> torch.Tensor:
    """Images (uint8, or floats in [-1, 1]) stretched by one linear map so that their background (`background_level`)
    lies at `level` while white stays white: the same glyphs on another ground."""
    x = _signed(images)
    ground = background_level(x)
    return (level + (x - ground) * (1 - level) / max(1 - ground, 1e-6)).clamp(-1, 1)


def background_check(meter: QualityMeter, fake: torch.Tensor) -> dict:
    """How much of a score is the background alone: the fakes' background level and mean pixel beside the real
    images', and FID and classes covered before and after the fakes' background is set to the real one
    (`with_background`). The classifier's features set each image's ground first (`set_ground`), so there the two
    FIDs agree and the ground shows only in the pixel columns; Inception's features see the ground, and a FID that
    falls steeply when only the ground changes was measuring it."""
    real = meter.real
    before, after = meter.score(fake), meter.score(with_background(fake, background_level(real)))
    return {"background": background_level(fake), "real_background": background_level(real),
            "mean_pixel": _signed(fake).mean().item(), "real_mean_pixel": _signed(real).mean().item(),
            "fid": before["fid"], "fid_background_matched": after["fid"],
            "classes_covered": before["classes_covered"],
            "classes_covered_background_matched": after["classes_covered"]}


def _to_uint8_rgb(x: torch.Tensor, device) -> torch.Tensor:
    x = x.to(device)
    if x.is_floating_point():  # [-1, 1] -> [0, 255]
        x = ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x


def quality_meter(dataset: str = "glyphs", image_size: int = 32, channels: int = 1, root=None, device="auto",
                  n: int = MIN_SAMPLES) -> QualityMeter:
    """One shared meter per dataset, size, device and sample count, so notebooks and the widget panel hold the
    real features once."""
    return _cached_meter(dataset, image_size, channels, str(data_root(root)), str(resolve_device(device)), n)


@functools.lru_cache(maxsize=4)
def _cached_meter(dataset, image_size, channels, root, device, n) -> QualityMeter:
    return QualityMeter(dataset, image_size, channels, root, n=n, device=device)


class QualityCallback:
    """A Trainer callback: at the end of each fit(), score `n` generated images (the EMA generator's, with
    `ema_decay`; a conditional run's asked for each class in turn, with `label_match`) and put FID, KID and coverage
    into the run's `History.summary()`, so every comparison shows quality beside speed. It draws no random numbers
    from the run's generators: a scored run trains exactly as an unscored one."""

    def __init__(self, meter: QualityMeter | None = None, n: int | None = None):

        self.meter, self.n = meter, n or (256 if QUICK else MIN_SAMPLES)  # quick mode (tests): fewer samples
        self.skip_reason, self.seconds = None, 0.0

    def on_fit_start(self, trainer) -> None:  # before any training: the meter is built (or found) now
        cfg = trainer.cfg
        if self.meter is None:
            try:
                with torch.random.fork_rng(devices=_rng_devices(trainer.device)):  # classifier training seeds
                    self.meter = quality_meter(cfg.dataset, cfg.image_size, cfg.channels, cfg.data_root,
                                               trainer.device, self.n)
            except QualityError as e:  # e.g. an unlabelled folder: train anyway, say why there is no FID
                self.skip_reason = str(e)
                warnings.warn(f"no quality scores for this run: {e}", stacklevel=2)

    def on_fit_end(self, trainer) -> None:
        if self.meter is None:
            return
        t = hardware.seconds()
        n = self.meter.n  # a conditional generator is asked for every class in turn, and scored against them
        labels = torch.arange(n) % trainer.classes if trainer.cfg.conditional else None
        with torch.random.fork_rng(devices=_rng_devices(trainer.device)):  # KID subsets draw random numbers
            score = self.meter.score(trainer.generate(n, labels=labels), labels)
        self.seconds = hardware.seconds() - t  # what scoring cost (the tuner budgets with it)
        trainer.history.quality = {**{k: v for k, v in score.items() if k != "class_shares"},
                                   "images_trained": trainer.batches_seen * trainer.cfg.batch_size}  # real images


class QualityCurve(QualityCallback):
    """QualityCallback at chosen generator steps only: scores the run at the end of each fit() that ends on one of
    `at_steps`, keeps every score in `points` (step, real images trained, FID, KID, coverage), the latest in the
    run's summary. How FID falls over a run shows whether a run has settled or is still learning fast at its budget."""

    def __init__(self, at_steps, meter: QualityMeter | None = None, n: int | None = None):
        super().__init__(meter, n)
        self.at_steps, self.points = set(at_steps), []

    def on_fit_end(self, trainer) -> None:
        if trainer.step in self.at_steps:
            super().on_fit_end(trainer)
            if trainer.history.quality:
                self.points.append({"step": trainer.step, **trainer.history.quality})


def _rng_devices(device: torch.device) -> list:
    return [device] if device.type == "cuda" else []
