"""Warm start: quality compares only between generators that already draw most classes. From scratch, a few hundred
steps leave both arms of a race drawing one to three classes, and their FIDs say little about the change raced. So
one DCGAN pair is trained first with the tutorial's loop until its G draws `MIN_CLASSES` of the 10 glyph classes,
cached per machine under the workbook's runs dir, and every arm (a plain loop's `PlainGAN`, or a gantools `Trainer`
in `train_side_by_side(..., start=...)`) starts from its own copy of it. Quick mode trains a few steps and judges no
quality."""
from __future__ import annotations

import copy
import hashlib
import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..core.checkpoint import atomic_save
from ..core.config import discriminator_norm
from ..core.data import GLYPHS_VERSION
from ..core.metrics import CLASSIFIER_VERSION
from ..errors import ConfigError
from ..measuring.hardware import resolve_device
from ..quick import QUICK
from . import tutorial
from .runs import runs_dir

MIN_CLASSES = 8  # of 10: the generator draws most classes, so a FID compares shapes, not which classes exist
CHECK_EVERY = 100  # steps between coverage checks
MAX_STEPS = 3000  # the cap, well past what the tutorial's size needs (docs/api.md); short of it: a warning
QUICK_STEPS = 4
_ADAM_FAMILY = (torch.optim.Adam, torch.optim.AdamW)  # the same moments (exp_avg, exp_avg_sq, step)


@dataclass
class WarmStart:
    """A trained DCGAN pair and its Adam states (`state`, CPU tensors), what determined it (`key`), how far it got
    (`steps`, `classes_covered`, `fid`: None in quick mode, where quality is not judged), the seconds its training
    took, its cache file, and whether this call read it from there (`loaded`). Each `gan()` or `load_into()` gets
    its own copy: arms never share a tensor."""
    key: dict
    state: dict = field(repr=False)  # megabytes of tensors: never printed
    steps: int
    classes_covered: int | None
    fid: float | None
    seconds: float
    path: Path | None
    loaded: bool = False
    origin: str = ""  # a run of this kernel it was taken from (`of_run`), where it is not a cached warm start

    @classmethod
    def of_run(cls, trainer) -> "WarmStart":
        """A start taken from a gantools run trained in this kernel (a CPU copy of its networks and Adam moments,
        at its last step): so arms can go on from a generator that already draws its classes, e.g. an architecture
        with no cached warm start, to race a change where quality can be judged. Its coverage and FID are the run's
        last scores."""
        cfg, summary = trainer.cfg, trainer.history.summary()
        if not trainer.step:
            raise ConfigError("a start is taken from a run that has trained; this one has not taken a step yet")
        key = {"data": f"{cfg.dataset}-{cfg.image_size}px-{cfg.channels}ch", "architecture": cfg.architecture,
               "nz": cfg.nz, "ngf": cfg.ngf, "ndf": cfg.ndf, "batch_size": cfg.batch_size,
               "d_norm": discriminator_norm(cfg), "seed": cfg.seed, "min_classes": MIN_CLASSES}
        state = _to_cpu({"G": trainer.generator.state_dict(), "D": trainer.discriminator.state_dict(),
                         "opt_g": trainer.opt_g.state_dict(), "opt_d": trainer.opt_d.state_dict(),
                         **({"ema": trainer.ema.state_dict()} if trainer.ema is not None else {})})
        return cls(key, state, trainer.step, summary.get("classes_covered"), summary.get("fid"), 0.0, None,
                   origin=cfg.out_dir)

    @property
    def judged(self) -> bool:
        """Whether its G draws enough classes for a quality comparison started from it to mean something."""
        return self.classes_covered is not None and self.classes_covered >= self.key["min_classes"]

    def gan(self, device="auto", optimizer=tutorial.adam, batches=None, batch_size: int | None = None,
            seed: int | None = None) -> tutorial.PlainGAN:
        """A `tutorial.plain_gan` of its own (`optimizer`, `batches`, `batch_size` and the data order's `seed` as
        there) holding a copy of the start's networks, and of its Adam moments when `optimizer` is Adam or AdamW
        (any other optimizer starts its state afresh; its own learning rate and betas are always kept)."""
        size = {k: self.key[k] for k in ("nz", "ngf", "ndf")}
        architecture = self.key.get("architecture", "dcgan")  # cached starts are DCGAN's; `of_run` names its own
        gan = tutorial.plain_gan(device, self.key["seed"] if seed is None else seed, optimizer, batches,
                                 None if architecture == "r3gan" else self.key["d_norm"],
                                 architecture, batch_size=batch_size or self.key["batch_size"], **size)
        self._copy_into(gan.G, gan.D, gan.opt_g, gan.opt_d)
        return gan

    def load_into(self, trainer) -> None:
        """Start a gantools `Trainer` (built, not yet trained) from a copy of this start, as `gan()` does."""
        cfg = trainer.cfg
        if trainer.step:
            raise ConfigError(f"a warm start loads into a run before it trains; this one is at step {trainer.step}")
        if (cfg.dataset, cfg.image_size, cfg.channels, cfg.conditional) != ("glyphs", 32, 1, False):
            raise ConfigError(f"the warm start draws unconditional 32 px glyphs; this run trains {cfg.dataset} at "
                              f"{cfg.image_size} px, {cfg.channels} channel(s), conditional={cfg.conditional}")
        state = self._copy_into(trainer.generator, trainer.discriminator, trainer.opt_g, trainer.opt_d)
        if trainer.ema is not None and "ema" in state:  # the run's average, which its scores came from
            trainer.ema.load_state_dict(state["ema"])
        elif trainer.ema is not None:
            trainer.ema.reset()  # the average starts from the warm G

    def _copy_into(self, g, d, opt_g, opt_d) -> dict:
        """Load a copy of the start into the networks and the Adam moments; returns that copy (the arm's own)."""
        state = copy.deepcopy(self.state)  # optimizers keep the tensors they load: a copy per arm
        try:
            g.load_state_dict(state["G"])
            d.load_state_dict(state["D"])
        except RuntimeError as e:
            raise ConfigError(f"this run's networks differ from the warm start's ({self.describe_size()}): build "
                              f"one to match with warm_start(...): {str(e).splitlines()[0]}") from e
        for opt, saved in ((opt_g, state["opt_g"]), (opt_d, state["opt_d"])):
            if isinstance(opt, _ADAM_FAMILY):  # moments only; hyperparameters stay the arm's own
                opt.load_state_dict({"state": saved["state"], "param_groups": opt.state_dict()["param_groups"]})
        return state

    def describe_size(self) -> str:
        k = self.key
        return f"nz={k['nz']}, ngf={k['ngf']}, ndf={k['ndf']}, d_norm={k['d_norm']!r}"

    def describe(self) -> str:
        """One sentence for a notebook: how far the start got, and whether quality can be judged from it."""
        if self.origin:
            where = f"the run in {self.origin}, at its last step"
        elif self.loaded:
            where = f"read from {self.path}"
        else:
            where = f"trained in {self.seconds / 60:.1f} min, cached in {self.path}"
        if self.classes_covered is None or self.fid is None:
            why = "the run was not scored" if self.origin else "quick mode"
            return f"Warm start: {self.steps} steps ({where}); {why}, so quality is not judged."
        drawn = f"its G draws {self.classes_covered} of 10 classes (FID {self.fid:.1f})"
        verdict = ("quality is compared from here" if self.judged else
                   f"fewer than {self.key['min_classes']}, so quality is not judged from it")
        loop = "gantools' trainer" if self.origin else "the tutorial's loop"
        return f"Warm start: {self.steps} steps of {loop} ({where}); {drawn}: {verdict}."

    def _repr_markdown_(self) -> str:
        return self.describe()


def warm_start(device="auto", seed: int = 0, d_norm: str = "batch", min_classes: int = MIN_CLASSES,
               max_steps: int | None = None, folder=None, verbose: bool = True, **size) -> WarmStart:
    """The tutorial's DCGAN pair (`tutorial.plain_gan(device, seed, d_norm=d_norm, **size)`), trained with
    `tutorial.train_step` until `tutorial.score` finds its G drawing `min_classes` classes (checked every
    `CHECK_EVERY` steps, at most `max_steps`: `MAX_STEPS`, or `QUICK_STEPS` unjudged in quick mode). Cached in
    `folder` (runs_dir()/warm) under a name made of everything that determines it, so a second call, in any
    notebook on this machine, loads it instead of training."""
    size = {**tutorial.tutorial_size(), **size}
    device = resolve_device(device) if isinstance(device, str) else device
    max_steps = max_steps or (QUICK_STEPS if QUICK else MAX_STEPS)
    key, path = cache_entry(device, seed, d_norm, min_classes, max_steps, folder, size)
    cached = _read(path, key)
    if cached is not None:
        return cached
    gan = tutorial.plain_gan(device, seed, d_norm=d_norm, **size)
    started = time.perf_counter()
    steps, score = _train(gan, seed, min_classes, max_steps, judge=not QUICK, verbose=verbose)
    state = _to_cpu({"G": gan.G.state_dict(), "D": gan.D.state_dict(), "opt_g": gan.opt_g.state_dict(),
                     "opt_d": gan.opt_d.state_dict()})
    start = WarmStart(key, state, steps, score.get("classes_covered"), score.get("fid"),
                      time.perf_counter() - started, path)
    atomic_save({"key": key, "state": start.state, "steps": steps, "classes_covered": start.classes_covered,
                 "fid": start.fid, "seconds": start.seconds}, path)
    if not QUICK and not start.judged:
        warnings.warn(f"the warm start stopped at max_steps={max_steps} with its G drawing {start.classes_covered} "
                      f"of 10 classes (wanted {min_classes}): quality compared from it is not judged; give it more "
                      f"steps (warm_start(max_steps=...)) or a GPU", stacklevel=2)
    return start


def cache_entry(device: torch.device, seed: int, d_norm: str, min_classes: int, max_steps: int, folder,
                size: dict) -> tuple[dict, Path]:
    """What determines a warm start (its key, stored in the file and checked on reading) and the file it is cached
    in: a readable name with a digest of the whole key."""
    key = {"data": f"glyphs-v{GLYPHS_VERSION}-32px-1ch", **{k: size[k] for k in ("nz", "ngf", "ndf", "batch_size")},
           "d_norm": d_norm, "seed": seed, "device": device.type, "torch": torch.__version__.split("+")[0],
           "min_classes": min_classes, "max_steps": max_steps, "check_every": CHECK_EVERY, "judged": not QUICK,
           "classifier": CLASSIFIER_VERSION}
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    name = f"dcgan-nz{size['nz']}-ngf{size['ngf']}-ndf{size['ndf']}-b{size['batch_size']}-seed{seed}-{device.type}"
    return key, Path(folder or runs_dir() / "warm") / f"{name}-{digest}.pt"


def _train(gan: tutorial.PlainGAN, seed: int, min_classes: int, max_steps: int, judge: bool,
           verbose: bool) -> tuple[int, dict]:
    """Train until G draws `min_classes` classes (when `judge`) or `max_steps`: the steps taken and the last score.
    Its noise comes from `seed` (the caller's random numbers are left as they were)."""
    steps, score, started = 0, {}, time.perf_counter()
    with torch.random.fork_rng(devices=[gan.device] if gan.device.type == "cuda" else []):
        torch.manual_seed(seed)
        while steps < max_steps:
            for _ in range(min(CHECK_EVERY, max_steps - steps)):
                tutorial.train_step(gan, next(gan.batches))
                steps += 1
            if judge:
                score = tutorial.score(gan)
                if verbose:
                    print(f"warm start: step {steps}, G draws {score['classes_covered']} of 10 classes "
                          f"(FID {score['fid']:.1f}), {(time.perf_counter() - started) / 60:.1f} min", flush=True)
                if score["classes_covered"] >= min_classes:
                    break
    return steps, score


def _read(path: Path, key: dict) -> WarmStart | None:
    """The cached start for `key`, or None (absent, damaged, or made for another key: then it is trained again)."""
    if not path.is_file():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        return None
    if saved.get("key") != key:
        return None
    return WarmStart(key, saved["state"], saved["steps"], saved["classes_covered"], saved["fid"], saved["seconds"],
                     path, loaded=True)


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value
