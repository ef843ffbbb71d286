"""Auto-tune: the workbook's loop (profile, apply the targeted fix, measure, repeat) run by gantools itself, on your
machine, with every step it took shown.

`tune(cfg, minutes)` starts from your config (the start) and keeps the best config so far (the incumbent):

1. Profile the incumbent for a few steps (`profiling.profile`, on the trainer already built for it).
2. The next candidate is the verdict's fix, if it has not been tried and is not already in place; otherwise the
   next untried change of the search space (`search_space`: every speed knob of `TrainConfig`, each value that
   applies on this device, and lazy R1 and R2 where they run at every D step, likeliest gain first).
3. Candidate and incumbent train side by side in this process with the benchmark's protocol (`bench.interleave`:
   warm-up excluded and reported, synchronised timing, `repeats` interleaved chunks each).
4. The candidate is kept only if it is faster by more than the measured spread (`decide`, the rule). One that
   raises (out of memory, an invalid combination, any GantoolsError, a compile failure; with your own networks,
   any error of theirs) is rejected with its reason, and the loop goes on. One out of memory is first measured
   once more with activation checkpointing (`space.checkpointed`): memory, not speed, was its limit.
5. Repeat until no candidate is left, or the next one would not fit in the time budget.

Then quality, a constraint rather than an afterthought: the start and the final config each train from scratch on
the same number of images and are scored (FID, KID, classes covered: `gantools.core.metrics`). If the final FID is
worse than `keep.QUALITY_TARGET` (1.1) times the start's, the start is first trained again with another seed: a
short run's FID moves by chance, so the limit becomes the wider of 1.1x and that second seed's distance. Then the
accepted changes are backed off, last first, one at a time (each re-trained and scored) until it holds; the start
always holds, so the final config's FID is never worse than the start's by more than that limit. Last, start and
final are measured against each other, interleaved: the speed-up the result reports.

Only speed knobs change (`config.speed_knobs()`: how fast a run trains, not what it learns), plus two equivalences:
Sigmoid + BCELoss (`loss='bce-sigmoid'`) becomes BCE with logits (`'bce'`) when 16-bit precision needs it, the same
loss computed safely; and activation checkpointing comes on for a candidate that ran out of memory without it, the
same computation with its activations recomputed in backward. One change of what is computed is in the space too: R1
or R2 taken at every D step becomes lazy (StyleGAN2's lazy regularisation, every 16 D steps and weighted by 16:
`techniques`' lazy R1 and R2), kept only as any candidate is, then held to FID by the quality phase like every kept
change. batch_size is left out by default (see `search_space`). Every other field, the loss and every other GAN
setting included, stays as given: tune tunes the config it is given (`space=config.speed_knobs()` keeps the
penalties' intervals too).

The time budget (`minutes`, wall clock) covers the whole tune, the quality runs and the final speed check included
(`budget.Budget`): those are estimated from what has been measured (each config trains `quality_images` at its
measured images/s, plus its measured warm-up, plus `SCORE_S` to score it; the start, the final and a second seed of
the start; a quality function of yours as it says, `budget`'s docstring) and reserved from the start; a candidate
starts only if its own estimate (the last measurement's wall time, plus `COMPILE_S` when it turns torch.compile on,
plus a profile when the incumbent changed) fits beside that reserve. Only backing off, when quality needs it, is not
reserved: quality outranks time. Where tune runs past the budget, the result says by how much and what took the time
(`TuneResult.seconds`).

Stopping: Ctrl-C, or `stop` (a threading.Event: the widget panel's Stop button), ends tune between measurements
(a training run in progress stops after its current step); the result holds every step so far, with the incumbent
as its final config (its quality not checked).

Where it lives: the search space in `gantools/tuning/space.py` (`search_space`), the rule in `gantools/speed/keep.py`
(`decide_in_two`, `judge_fid`), the loop in `gantools/tuning/tuner.py`
(`Tuner`), the runs it builds, measures and scores
in `gantools/tuning/trials.py` (`Trials`), the result in `gantools/tuning/result.py` (`TuneResult`).
"""
from __future__ import annotations

import threading

from ..speed.keep import decide
from ..core.config import TrainConfig
from .result import ROW_HEAD, Step, TuneResult
from .space import PRIOR, Candidate, describe, search_space
from .trials import SCORE_S, StopWhen, TuneOptions
from .tuner import COMPILE_S, PROFILE_STEPS, PROFILE_WARMUP, Tuner

__all__ = ["COMPILE_S", "PRIOR", "PROFILE_STEPS", "PROFILE_WARMUP", "ROW_HEAD", "SCORE_S",
           "Candidate", "Step", "StopWhen", "TuneOptions", "TuneResult", "decide", "describe", "search_space", "tune"]


def tune(cfg: TrainConfig | None = None, minutes: float = 15.0, *, generator=None, discriminator=None, dataset=None,
         quality=True, quality_images: int | None = None, space=None, plan=None,
         stop: threading.Event | None = None, progress=print, on_update=None, out_dir=None) -> TuneResult:
    """Find a faster config on this machine, keeping quality: the loop of this module's docstring, run for you, with
    every step it took shown. Ctrl-C ends it between measurements, as `stop` does.

    Args:
        cfg: the start; None: TrainConfig().
        minutes: the wall-clock budget, quality runs and the final check included (backing off for quality may
            run past it; the result says by how much and why).
        generator: your generator, as for `Trainer`; deep-copied for every run, so yours is left as it is.
        discriminator: your discriminator, likewise; give both or neither (the DCGAN).
        dataset: your Dataset, as for `Trainer`; None: the config's.
        quality: True trains start and final on `quality_images` each and scores them against the config's dataset;
            False skips the check (say so where you report it); or a function `TrainConfig -> {'fid': ...}` of yours
            (give it a `train_images(cfg)` saying how many images scoring `cfg` trains, and the budget reserves it).
        quality_images: images each quality run trains on; None: the plan's (the benchmark's, `bench.PLAN`).
        space: the knobs to search; None: every speed knob and the penalties' intervals (`space.default_space`; add
            'batch_size' to let the batch grow, the learning rates scaled by the square root of the batch ratio).
        plan: the measurement protocol, as changes to the benchmark's (`bench.PLAN`); None: the benchmark's.
        stop: an Event that ends tune between measurements (a panel's Stop button).
        progress: called with each line tune reports (the path table row by row, and what it is doing); default: print.
        on_update: called with the result after every change (a live view: `display.LiveTune`).
        out_dir: where runs go; None: <cfg.out_dir>/tune. Quality runs are kept, measurement runs removed.
    Returns:
        The TuneResult: start, final, every step of the path, and the quality check.
    Raises:
        ConfigError: a config, networks, space, plan, budget or quality option refused before any work.
    """
    options = TuneOptions(cfg=cfg if cfg is not None else TrainConfig(), minutes=minutes, generator=generator,
                          discriminator=discriminator, dataset=dataset, quality=quality,
                          quality_images=quality_images, space=space, plan=plan, stop=stop, progress=progress,
                          on_update=on_update, out_dir=out_dir)
    return Tuner(options).run()
