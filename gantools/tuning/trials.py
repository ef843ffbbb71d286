"""What tune works with: its options, checked before any work (`TuneOptions`), and the trials it runs (`Trials`:
configs built, measured against each other and scored, and what each of those cost, for the time budget)."""
from __future__ import annotations

import contextlib
import copy
import gc
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..speed import bench, keep
from ..core.checkpoint import ensure_writable
from ..core.config import TrainConfig
from ..core.recovery import is_out_of_memory
from ..measuring import hardware
from ..errors import ConfigError, GantoolsError
from ..quick import QUICK
from .space import default_space

# Seconds to score one config (generate 2048 images, classifier features, FID and KID) on a small CPU (evidence:
# docs/tune.md); less on a GPU, so the reserve errs long there. Used until a score has been timed.
SCORE_S = 12.0


class StopWhen:
    """A Trainer callback: stop after the current step once `event` is set (a Stop button, Ctrl-C in tune)."""

    def __init__(self, event: threading.Event):
        self.event = event

    def on_step_end(self, trainer):
        if self.event.is_set():
            trainer.stop()


@dataclass(kw_only=True)
class TuneOptions:
    """`tune`'s arguments (see `tuning.tune`), each checked when built, so bad input is refused before any work:
    `plan` is completed from the benchmark's (`bench.plan_for`), `quality_images` from the plan, `space` from
    `space.default_space`, and `stop`, `progress` and `on_update` get their do-nothing defaults."""

    cfg: TrainConfig
    minutes: float = 15.0
    generator: torch.nn.Module | None = None
    discriminator: torch.nn.Module | None = None
    dataset: object = None
    quality: bool | Callable = True
    quality_images: int | None = None
    space: tuple | None = None
    plan: dict | None = None
    stop: threading.Event | None = None
    progress: Callable | None = None
    on_update: Callable | None = None
    out_dir: str | Path | None = None
    device: torch.device = field(init=False)

    def __post_init__(self):
        from ..measuring.hardware import resolve_device

        self.cfg = self.cfg.validate()
        self.device = resolve_device(self.cfg.device)
        if (self.generator is None) != (self.discriminator is None):
            raise ConfigError("pass both generator and discriminator, or neither (for the built-in DCGAN)")
        self.space = tuple(self.space) if self.space is not None else default_space()
        unknown = [k for k in self.space if k not in default_space(batch_size=True)]
        if unknown:
            raise ConfigError(f"tune changes only speed knobs, the lazy penalties' intervals and batch_size; not "
                              f"{', '.join(unknown)}: choose from {', '.join(default_space(batch_size=True))}")
        if not (isinstance(self.minutes, (int, float)) and self.minutes > 0):
            raise ConfigError(f"minutes={self.minutes!r}: give the time budget as a positive number of minutes")
        self.minutes = float(self.minutes)
        self.plan = {**bench.plan_for(self.device), **(self.plan or {})}
        if self.quality_images is None:
            self.quality_images = self.plan["quality_images"]
        counts = [*((k, self.plan[k]) for k in ("warmup_images", "images_per_repeat", "repeats")),
                  ("quality_images", self.quality_images)]
        bad = [f"{k}={v!r}" for k, v in counts if not (isinstance(v, int) and not isinstance(v, bool) and v > 0)]
        if bad:
            raise ConfigError(f"{', '.join(bad)}: each must be a whole number > 0 (images, or rounds for repeats)")
        if self.quality is True and self.dataset is not None:
            raise ConfigError("quality=True scores against the real images of cfg.dataset, but you gave your own "
                              "dataset: pass quality=False, or quality=<function: TrainConfig -> {'fid': ...}>")
        if not (isinstance(self.quality, bool) or callable(self.quality)):
            raise ConfigError(f"quality={self.quality!r}: True (train and score), False (no check) or a function "
                              f"TrainConfig -> {{'fid': ...}}")
        self.stop = self.stop if self.stop is not None else threading.Event()
        self.progress = self.progress or (lambda line: None)
        self.on_update = self.on_update or (lambda result: None)

    @property
    def own(self) -> tuple | None:
        """Your own (generator, discriminator), or None for the built-in DCGAN."""
        return (self.generator, self.discriminator) if self.generator is not None else None


@dataclass(frozen=True)
class Failure:
    """Why a candidate was rejected (shown as `why`), and whether the device ran out of memory
    (`recovery.is_out_of_memory`): the tuner then tries it once more with activation checkpointing."""

    why: str
    out_of_memory: bool = False

    def __str__(self) -> str:
        return self.why


class Trials:
    """Builds, measures and scores configs for the tuner under `<out_dir>/tune` (or the given out_dir), and
    remembers what each cost: its warm-up, its images/s when last measured, the wall time of the last measurement
    and of scoring (what the time budget's estimates come from)."""

    def __init__(self, options: TuneOptions, say: Callable):
        self.options, self.say = options, say
        self.dir = ensure_writable(Path(options.out_dir or Path(options.cfg.out_dir) / "tune"))
        self.count = 0          # measurement trainers built, each in a folder of its own
        self.meter = None       # the quality meter, built on first use
        self.measure_s = None   # wall time of the last measurement
        self.score_s = 0.0      # of scoring one config (set once the meter exists, then measured)
        self.build_s = 0.0      # of building the start's trainer
        self.warmup_s = {}      # config key -> measured warm-up seconds
        self.speed = {}         # config key -> its images/s when last measured

    def trainer(self, cfg: TrainConfig, name: str, for_quality: bool = False):
        from ..core.trainer import Trainer

        o = self.options
        self.collect()
        g, d = (copy.deepcopy(o.own[0]), copy.deepcopy(o.own[1])) if o.own else (None, None)
        args = dict(generator=g, discriminator=d, dataset=o.dataset, callbacks=[StopWhen(o.stop)])
        if for_quality:
            return Trainer(cfg.replace(steps=max(1, o.quality_images // cfg.images_per_step), sample_interval=0,
                                       checkpoint_interval=0, out_dir=str(self.dir / name)), **args)
        self.count += 1
        return bench.measurement_trainer(cfg.replace(out_dir=str(self.dir / "trials" / f"{self.count:03d}")),
                                         o.plan, **args)

    def discard(self, trainer) -> None:
        """Done with a trainer: its DataLoader workers end now (they end with their iterator) and its folder goes.
        Its memory is freed once the last reference is dropped (`collect`, before the next trainer is built)."""
        if trainer is None:
            return
        trainer.close()
        shutil.rmtree(trainer.out_dir, ignore_errors=True)

    def discard_failed(self) -> None:
        """A trial that raised: its folder goes, and what it held goes back to the device."""
        shutil.rmtree(self.dir / "trials" / f"{self.count:03d}", ignore_errors=True)
        self.collect()

    def collect(self) -> None:
        gc.collect()
        if self.options.device.type == "cuda":
            torch.cuda.empty_cache()  # what a discarded (or out-of-memory) candidate held goes back to the device

    def measure(self, contenders: dict, configs: dict) -> dict:
        """`bench.interleave` over the contenders; remembers each config's speed and warm-up for the budget."""
        p = self.options.plan
        t = hardware.seconds()
        measured = bench.interleave(contenders, p["warmup_images"], p["images_per_repeat"], p["repeats"],
                                    stop=self.options.stop.is_set)
        self.measure_s = hardware.seconds() - t
        for name, m in measured.items():
            self.warmup_s.setdefault(key(configs[name]), m.warmup_s)
            self.speed[key(configs[name])] = m.images_per_sec
        return measured

    def measure_candidate(self, incumbent, cfg: TrainConfig, inc_cfg: TrainConfig
                          ) -> tuple[dict | None, Failure | None]:
        """The candidate `cfg` measured against the incumbent's trainer: what went wrong rejects the candidate, not
        the tune (out of memory, a user's error, a compile failure; with your own networks, any error of theirs).

        Returns:
            (measured, None), or (None, the `Failure` that rejected it), its trial's folder and memory already
            freed."""
        contenders = {"incumbent": incumbent, "candidate": lambda: self.trainer(cfg, "candidate")}
        try:
            return self.measure(contenders, {"incumbent": inc_cfg, "candidate": cfg}), None
        except bench.Stopped:
            raise
        except (GantoolsError, *_compile_errors()) as e:
            failure = Failure(reason(e), is_out_of_memory(e))
        except Exception as e:  # noqa: BLE001 - with your own networks, their errors under a setting reject it
            oom = is_out_of_memory(e)  # torch's, or a CUDA library's
            if not oom and self.options.own is None:
                raise
            failure = Failure(reason(e) if oom else f"your networks failed with this change: {reason(e)}", oom)
        self.discard_failed()
        return None, failure

    def decide(self, measured: dict, configs: dict, room: Callable[[], bool], label: str) -> tuple:
        """Keep the measured candidate or not (`keep.decide_in_two`): a close call is measured again, its repeats
        added to `measured`'s, where `room()` says time is left for that.

        Returns:
            (kept, speed-up, spread, why), as `keep.decide` gives them."""
        inc, new = measured["incumbent"], measured["candidate"]

        def again(why: str) -> tuple | None:
            if not room():
                return None
            self.say("", now=f"{label}: {why}; measuring it again")
            more = self.measure({"incumbent": inc.subject, "candidate": new.subject}, configs)
            for name in ("incumbent", "candidate"):  # one series of paired repeats, the new ones after the first
                measured[name].images_per_sec_runs += more[name].images_per_sec_runs
            return more["incumbent"].images_per_sec_runs, more["candidate"].images_per_sec_runs
        return keep.decide_in_two(inc.images_per_sec_runs, new.images_per_sec_runs, again)

    def score(self, cfg: TrainConfig, name: str) -> dict:
        """`cfg` trained from scratch on `quality_images` and scored (or your own quality function's answer)."""
        if callable(self.options.quality):
            return dict(self.options.quality(cfg))
        from ..core.metrics import QualityCallback

        trainer = self.trainer(cfg, name, for_quality=True)
        trainer.callbacks.append(scorer := QualityCallback(self.quality_meter()))
        t = hardware.seconds()
        trainer.fit()
        if trainer.step < trainer.cfg.steps:
            raise bench.Stopped("stopped during the quality check")
        self.score_s = scorer.seconds
        self.speed.setdefault(key(cfg), trainer.history.summary()["images_per_sec"])
        images = trainer.batches_seen * trainer.cfg.batch_size
        self.options.progress(f"  {name}: {images:,} images in {hardware.seconds() - t:.0f} s")
        return {k: v for k, v in trainer.history.quality.items() if k in ("fid", "kid", "classes_covered",
                                                                       "classes", "images_trained", "n_samples")}

    def quality_meter(self):
        """The quality meter (real images' features; the classifier is trained on first use, about a minute on the
        2-core CPU, then cached), built once."""
        if self.meter is None:
            from ..core.metrics import MIN_SAMPLES, quality_meter

            c = self.options.cfg
            self.say("", now="building the quality meter")
            n = 256 if QUICK else MIN_SAMPLES
            self.meter = quality_meter(c.dataset, c.image_size, c.channels, c.data_root, self.options.device, n)
            self.score_s = SCORE_S * n / MIN_SAMPLES  # until a score has been timed
        return self.meter

    def quality_s(self, cfg: TrainConfig, start: TrainConfig) -> float:
        """One config's quality run: its warm-up, the images at its measured speed (or the start's), scoring. A
        quality function of yours: the images it says it trains for `cfg` (`train_images(cfg)`, as
        `workbook.reconcile.scores_from`'s does; 0, nothing to pay, where it holds the scores already), or a second
        where it says nothing."""
        images = self.options.quality_images
        if callable(self.options.quality):
            train_images = getattr(self.options.quality, "train_images", None)
            if train_images is None:
                return 1.0
            images = train_images(cfg)
            if not images:
                return 0.0
        speed = self.speed.get(key(cfg)) or self.speed.get(key(start)) or 1.0
        return self.warmup_s.get(key(cfg), 5.0) + images / speed + (self.score_s or SCORE_S)


def key(change) -> frozenset:
    """A config, or a change, as something a set holds: what tune remembers it tried and measured by."""
    items = change.to_dict().items() if isinstance(change, TrainConfig) else change.items()
    return frozenset((k, tuple(v) if isinstance(v, list) else v) for k, v in items)


def reason(e: BaseException) -> str:
    """An error in one line (at most 400 characters of its message), for a rejected step or a failed phase."""
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return f"{type(e).__name__}: {text[:400]}{'...' if len(text) > 400 else ''}"


def _compile_errors() -> tuple:
    """torch.compile's own failures (dynamo and inductor), wherever this torch defines them."""
    found = []
    for module, name in (("torch._dynamo.exc", "TorchDynamoException"), ("torch._inductor.exc", "InductorError")):
        with contextlib.suppress(ImportError, AttributeError):
            found.append(getattr(__import__(module, fromlist=[name]), name))
    return tuple(found)
