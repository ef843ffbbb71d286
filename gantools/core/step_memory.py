"""A run's peak tensor memory (the history's `peak_mem_mb`, every "peak tensor MB" column): one training step
measured once per trainer, on its second step, when optimizer state exists and cuDNN has chosen its algorithms.
`measuring.memory.step_peak_bytes` does the counting; this module decides which step it watches and how."""
from __future__ import annotations

import contextlib
import math

import torch

from . import recovery
from ..measuring.memory import step_peak_bytes


def holders(trainer) -> tuple:
    """What a run keeps between steps (`measuring.memory.held_tensors`): the networks, the EMA's, the optimizers."""
    p = trainer.stepper.parts
    return p.generator, p.discriminator, p.opt_g, p.opt_d, *((p.ema.module,) if p.ema is not None else ())


def measure_memory(trainer, *batches) -> float:
    """Peak tensor memory (MB) of one training step of `trainer` on `batches`, the step run on a snapshot of the
    run's state (`Trainer.unchanged`), so training keeps nothing of it. Where the count is a dispatch mode (any
    device but CUDA) or CUDA graphs would replay (a replay allocates nothing for the allocator to count), the
    networks run uncompiled: dynamo skips for good a frame it meets under a dispatch mode (see
    bench.flops_per_image), so there a compiled run's memory is its eager step's.

    Args:
        trainer: the run (a `Trainer`).
        *batches: one real batch per D step, on the trainer's device, as `Trainer.train_step` takes them.
    Returns:
        Megabytes (2**20 bytes); NaN, with a warning, when the snapshot leaves no room for the step.
    """
    eager = trainer.device.type != "cuda" or trainer.stepper.cuda_graphs
    try:
        with trainer.unchanged(), trainer.stepper.eager() if eager else contextlib.nullcontext():
            return step_peak_bytes(lambda: trainer.train_step(*batches), trainer.device, holders(trainer)) / 2**20
    except BaseException as e:
        if not recovery.is_out_of_memory(e):
            raise
    trainer._warn("peak tensor memory not measured: a copy of the run's state and one more step did not fit")
    return math.nan


class StepMemory:
    """A trainer's peak tensor memory: `peak_mb`, NaN until its second step has run."""

    def __init__(self):
        self.peak_mb, self._steps = math.nan, 0

    def train(self, trainer, reals: list) -> None:
        """`trainer.train_step(*reals)`; the trainer's second step also measures `peak_mb`. Watched as it runs
        wherever the count sees the step as it is (CUDA's allocator; elsewhere an uncompiled step's ops), at the
        cost of two syncs on CUDA and some microseconds per op elsewhere, timed with the step (in the first log
        interval, the warm-up one `History.summary` leaves out, when it holds two steps or more); else on a copy
        (`measure_memory`), untimed."""
        self._steps += 1
        if self._steps != 2:
            trainer.train_step(*reals)
        elif trainer.device.type == "cuda" and not trainer.stepper.cuda_graphs or trainer.cfg.compile == "off":
            if trainer.device.type != "cuda":  # a process's first op under a dispatch mode imports torch._dynamo
                with trainer.clock.excluded():
                    step_peak_bytes(lambda: torch.empty(1), trainer.device)
            self.peak_mb = step_peak_bytes(lambda: trainer.train_step(*reals), trainer.device, holders(trainer)) / 2**20
        else:
            trainer.train_step(*reals)
            with trainer.clock.excluded():
                self.peak_mb = measure_memory(trainer, *reals)
