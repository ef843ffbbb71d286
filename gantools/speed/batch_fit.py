"""The largest batch that fits: a step's peak tensor memory grows by the same amount per image (activations,
D's outputs, the noise) on top of what does not depend on the batch (weights, gradients, optimizer state), so two
measured batch sizes predict every other. The prediction is then tried for real, and where it does not fit (the
allocator's rounding, a cuDNN workspace, a dataset on the device the count leaves out) the batch is bisected between
the largest that fitted and the smallest that did not. The budget is the GPU's free memory (with a margin), or on a
CPU the one you give: a CPU does not refuse an allocation the way a GPU does, it swaps, so "what fits" there is your
choice of how much memory training may use."""
from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field

import torch

from ..core.config import TrainConfig
from ..core.trainer import Trainer
from ..errors import ConfigError, OutOfMemory
from ..measuring.hardware import resolve_device
from ..measuring.results import megabytes

MARGIN = 0.9  # of a GPU's free memory: what the allocator's fragmentation and cuDNN's workspaces may need beside
TRIES = 8  # batches tried after the prediction: bisection from the largest that fitted to the smallest that did not


@dataclass
class BatchFit:
    """What `largest_batch` measured (`measured`: batch -> peak tensor MB), the line through it (`fixed_mb` +
    `per_image_mb` x batch), the budget, the batch it settled on with its own measured peak, the batches tried that
    did not fit (`backed_off`), and what limited it (`limit`: 'memory' or 'the dataset')."""
    measured: dict
    fixed_mb: float
    per_image_mb: float
    budget_mb: float
    batch: int
    peak_mb: float
    backed_off: list = field(default_factory=list)
    limit: str = "memory"

    def describe(self) -> str:
        (b1, m1), (b2, m2) = list(self.measured.items())[:2]
        tried = f" ({', '.join(map(str, self.backed_off))} did not fit)" if self.backed_off else ""
        return (f"batch {self.batch}: {megabytes(self.peak_mb)} of a {megabytes(self.budget_mb)} budget, limited "
                f"by {self.limit}{tried}; predicted from batch {b1} ({megabytes(m1)}) and {b2} ({megabytes(m2)}): "
                f"{self.per_image_mb:.3f} MB per image on top of {megabytes(self.fixed_mb)}")

    def _repr_markdown_(self) -> str:
        return self.describe()


def peak_mb(cfg: TrainConfig, batch: int, dataset=None) -> float:
    """The peak tensor memory (MB) of a training step of `cfg` at `batch` (its second step, as every run measures:
    `core.step_memory`); OutOfMemory where it does not fit."""
    return _measure(cfg, batch, dataset)[0]


def _measure(cfg: TrainConfig, batch: int, dataset=None) -> tuple:
    """`peak_mb`, and the dataset the run trained on (loaded once, then handed to the next measurement)."""
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(cfg.replace(batch_size=batch, steps=2, log_interval=1, sample_interval=0,
                                      checkpoint_interval=0, out_dir=out), dataset=dataset)
        try:
            trainer.fit(2)
            return trainer.memory.peak_mb, trainer.dataset
        finally:
            trainer.close()
            del trainer
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def largest_batch(cfg: TrainConfig, budget_mb: float | None = None, dataset=None, multiple: int = 8) -> BatchFit:
    """The largest batch (a multiple of `multiple`) whose step's peak tensor memory stays within `budget_mb` (on a
    GPU default: `MARGIN` of its free memory), from `cfg`'s batch and twice it, then tried for real.

    Raises:
        ConfigError: no budget on a CPU, or a budget smaller than what the batch-independent part already needs."""
    device = resolve_device(cfg.device)
    if budget_mb is None:
        if device.type != "cuda":
            raise ConfigError("on a CPU give budget_mb, how much memory training may use: a CPU swaps rather than "
                              "run out, so nothing tells the largest batch but your budget")
        # (free, total) bytes as the driver reports them (cudaMemGetInfo): free counts memory the caching allocator
        # holds unused as taken, so release it first; torch.cuda.mem_get_info is documented since torch 1.10
        torch.cuda.empty_cache()
        budget_mb = MARGIN * torch.cuda.mem_get_info(device)[0] / 2**20
    small, large = cfg.batch_size, 2 * cfg.batch_size
    measured = {}
    measured[small], dataset = _measure(cfg, small, dataset)
    measured[large] = peak_mb(cfg, large, dataset)
    per_image = (measured[large] - measured[small]) / (large - small)
    fixed = measured[small] - per_image * small
    if budget_mb <= fixed + per_image * multiple:
        raise ConfigError(f"budget_mb={budget_mb:.0f}: the weights, gradients and optimizer state alone take about "
                          f"{fixed:.0f} MB, and each image {per_image:.2f} MB more: give at least "
                          f"{fixed + per_image * multiple:.0f} MB")
    batch = int((budget_mb - fixed) / per_image) // multiple * multiple
    limit = "memory"
    if batch > len(dataset) // multiple * multiple:  # drop_last: a batch needs that many images
        batch, limit = len(dataset) // multiple * multiple, "the dataset"
    fits = {b: m for b, m in measured.items() if m <= budget_mb}  # both measured batches, where within it
    backed_off = []
    for _ in range(TRIES):
        try:
            peak = measured.get(batch) or peak_mb(cfg, batch, dataset)
        except OutOfMemory:
            peak = math.inf
        if peak <= budget_mb:
            fits[batch] = measured[batch] = peak
        else:
            backed_off.append(batch)
        best = max(fits, default=0)  # the largest batch known to fit; bisect towards the smallest that did not
        failed = min((b for b in backed_off if b > best), default=None)
        if failed is None or failed - best <= multiple:
            break
        batch = (best + failed) // 2 // multiple * multiple
    if not fits:
        raise ConfigError(f"no batch fitted {budget_mb:.0f} MB ({', '.join(map(str, backed_off))} did not): give "
                          f"a larger budget or a smaller start batch than {cfg.batch_size}")
    best = max(fits)
    return BatchFit(measured, fixed, per_image, budget_mb, best, fits[best], backed_off, limit)
