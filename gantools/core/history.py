"""A run's history: one record per log interval (losses, synced step time, images/s, data wait, peak tensor memory), the
figures a run is judged by, and its JSON file beside the checkpoint."""
from __future__ import annotations

import json
import statistics

from .checkpoint import atomic_write

# D's four first: the D step adds them as one slice. loss_d includes the penalty; penalty is 0 without one.
METRICS = ("loss_d", "d_real", "d_fake", "penalty", "loss_g")


class History:
    """One record per log interval: losses, synced step time, images/sec, time waiting for data, the peak tensor
    memory of a step (`core.step_memory`: measured once per run, on its second step; NaN before it); what
    `Trainer.fit()` returns, and `summary()` the figures a run is judged by.

    Args:
        records: the records to start from (a checkpoint's, or a saved history.json's); None: none yet.
    """

    def __init__(self, records=None):
        self.records = list(records or [])
        self.quality: dict = {}  # FID, KID, coverage at the end of the last fit(), from metrics.QualityCallback

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        return self.records[i]

    def column(self, name: str) -> list:
        return [r[name] for r in self.records]

    def summary(self) -> dict:
        """The figures a run is judged by. Speed is the median over log intervals after the first, which holds
        warm-up (cuDNN autotuning, torch.compile, worker start-up). Peak memory is the last record's: the step of
        the trainer that logged it (a resumed run measures its own)."""
        if not self.records:
            return {}
        steady = self.records[1:] or self.records
        last = self.records[-1]
        return {
            "steps": last["step"],
            "images_per_sec": statistics.median(r["images_per_sec"] for r in steady),
            "step_time_ms": statistics.median(r["step_time_ms"] for r in steady),
            "data_wait_ms": statistics.median(r["data_wait_ms"] for r in steady),
            "warmup_step_time_ms": self.records[0]["step_time_ms"],
            "peak_mem_mb": last["peak_mem_mb"],
            "train_time_s": last["train_time_s"],
            **{k: last[k] for k in METRICS},
            **self.quality,
        }

    def save(self, path) -> None:
        atomic_write(path, lambda f: f.write(json.dumps(self.records, indent=1).encode()))
