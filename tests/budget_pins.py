"""The host budgets the ladder's eager rows are pinned to (tests/data/host_budget_pins.json): every row of the GPU
preset (`bench.SIZES['gpu']`, at small widths: a count does not depend on them) counted as a GPU would run it,
per kind and per (kind, op, function) site. Run as a script to write the file from the code as it is, when a change
to the step's launches is meant (test_host_budget says which sites moved)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

FILE = Path(__file__).parent / "data" / "host_budget_pins.json"
SMALL = dict(ngf=4, ndf=4, batch_size=8, device="cpu")
ITERATIONS = 2
LEAN = "gantools' defaults, device data"  # the GPU preset's device-data step as gantools' own loop runs it


def rows() -> dict:
    """name -> config changes from the reference: the ladder's rows on a GPU that run eagerly, and 'all together'
    without compile (its eager step)."""
    import torch

    from gantools.speed.bench import ladder

    steps = ladder(torch.device("cpu"), compile_variants=False)
    steps["all together"] = {k: v for k, v in steps["all together"].items() if k != "compile"}
    steps.pop("max throughput (batch x2)")  # the same step at twice the batch: the same counts
    steps[LEAN] = {"loader": "device"}  # from TrainConfig(), not the reference: gantools' own loop
    return steps


def budget(name: str, changes: dict, out_dir: Path):
    """The HostBudget of one row."""
    from gantools.core.config import preset
    from gantools.core.trainer import Trainer
    from gantools.speed import iteration_budget
    from gantools.speed.bench import SIZES

    cfg = preset("default" if name == LEAN else "reference", **{**SIZES["gpu"], **SMALL}).replace(
        **changes, out_dir=str(out_dir))
    trainer = Trainer(iteration_budget.on_gpu(cfg).replace(sample_interval=0, checkpoint_interval=0))
    try:
        return iteration_budget.count(trainer, ITERATIONS, as_on_gpu=True)[0]
    finally:
        trainer.close()


def pins(out_dir: Path) -> dict:
    out = {}
    for name, changes in rows().items():
        b = budget(name, changes, out_dir / str(len(out)))
        out[name] = {"counts": b.per_iteration(),
                     "sites": {" ".join(key): n for key, n in sorted(b.sites.items())}}
    return out


if __name__ == "__main__":
    import tempfile

    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        FILE.write_text(json.dumps(pins(Path(tmp)), indent=1) + "\n")
    print(f"wrote {FILE}", file=sys.stderr)
