"""Whole-step CUDA graphs checked against the eager step they replace (`core.graphed_step`): the same seeded
training, graphed and not, compared step by step and weight by weight. What `make gpu-evidence` runs on a GPU."""
from __future__ import annotations

import math
import tempfile
from typing import Callable

from ..core.graphed_step import GraphedStep
from ..core.trainer import Trainer


def replay_matches_eager(cfg, steps: int = 20, tolerance: float = 1e-3, capture: Callable | None = None,
                         **trainer_args) -> dict:
    """Train `cfg` for `steps` seeded steps with `cuda_graphs` on and off, and compare: each step's logged losses
    and every weight at the end. The graphed run replays from its fourth step on, so most of its steps are replays.
    `capture`: another capture than CUDA's (a test's, on a CPU, where the switch itself is refused).

    Returns:
        {"steps", "max_loss_diff", "max_weight_rel_diff", "matches"}: the largest difference of a logged value,
        the largest relative difference of a weight (to the weights' scale), and whether both are within
        `tolerance`.
    """
    runs = {}
    with tempfile.TemporaryDirectory() as scratch:
        for graphs in (False, True):
            trainer = Trainer(cfg.replace(cuda_graphs=graphs and capture is None, steps=steps, log_interval=1,
                                          sample_interval=0, checkpoint_interval=0, out_dir=f"{scratch}/{graphs}"),
                              **trainer_args)
            if graphs and capture is not None:
                trainer.graphed = GraphedStep(trainer.stepper, trainer.loader, trainer.rng, capture)
            records = trainer.fit().records
            runs[graphs] = ([[r[k] for k in ("loss_d", "loss_g", "d_real", "d_fake")] for r in records],
                            [p.detach().float().cpu() for net in (trainer.generator, trainer.discriminator)
                             for p in net.parameters()])
    (losses, weights), (g_losses, g_weights) = runs[False], runs[True]
    loss_diff = max((abs(a - b) for row, g_row in zip(losses, g_losses, strict=True)
                     for a, b in zip(row, g_row, strict=True)), default=math.nan)
    weight_diff = max(float((a - b).abs().max() / a.abs().max().clamp(min=1e-12))
                      for a, b in zip(weights, g_weights, strict=True))
    return {"steps": steps, "max_loss_diff": loss_diff, "max_weight_rel_diff": weight_diff,
            "matches": loss_diff <= tolerance and weight_diff <= tolerance}
