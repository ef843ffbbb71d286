"""The values a few seeded training steps leave (each step's logged losses, and every weight's sum and norm), for
configs that exercise each part of the step: what test_host_budget compares a leaner step against. Run as a script
to write tests/data/step_fingerprints.json from the code as it is (only when the step's math is meant to change)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

FILE = Path(__file__).parent / "data" / "step_fingerprints.json"
STEPS = 4
SMALL = dict(image_size=32, channels=1, dataset="glyphs", ngf=8, ndf=8, nz=16, batch_size=16, steps=STEPS,
             log_interval=1, sample_interval=0, checkpoint_interval=0, device="cpu", seed=3)
DEVICE_DATA = dict(loader="device", transform="on-device", num_workers=0)
CASES = {
    "reference": ("reference", dict(num_workers=0)),
    "device data": ("reference", dict(DEVICE_DATA, sync_every_step=False)),
    "all together": ("reference", dict(DEVICE_DATA, sync_every_step=False, precision="bf16", loss="bce",
                                       channels_last=True, freeze_d=True, optimizer_impl="foreach")),
    "fused adam": ("dcgan", dict(DEVICE_DATA, optimizer_impl="fused")),
    "accumulation hinge": ("default", dict(DEVICE_DATA, loss="hinge", grad_accum_steps=2)),
    "lsgan hflip": ("lsgan", dict(DEVICE_DATA, hflip=True)),
    "wgan-gp": ("wgan-gp", dict(DEVICE_DATA, d_steps=2)),
    "r3gan": ("r3gan", dict(DEVICE_DATA, ngf=8, ndf=8)),
    "r1 lazy ema": ("dcgan", dict(DEVICE_DATA, d_norm="layer", r1_gamma=1.0, r1_interval=2, ema_decay=0.9)),
}


def fingerprint(name: str, tmp: Path) -> dict:
    from gantools.core.config import preset
    from gantools.core.trainer import Trainer

    base, changes = CASES[name]
    cfg = preset(base, **{**SMALL, **changes, "out_dir": str(tmp / name.replace(" ", "-"))})
    trainer = Trainer(cfg)
    history = trainer.fit()
    logged = [[r[k] for k in ("loss_d", "loss_g", "d_real", "d_fake", "penalty")] for r in history.records]
    nets = {"G": trainer.generator, "D": trainer.discriminator}
    weights = {f"{n}.{k}": [float(p.double().sum()), float(p.double().norm())]
               for n, net in nets.items() for k, p in net.state_dict().items() if p.is_floating_point()}
    return {"logged": logged, "weights": weights}


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        out = {name: fingerprint(name, Path(tmp)) for name in CASES}
    FILE.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {FILE} ({len(out)} configs)", file=sys.stderr)
