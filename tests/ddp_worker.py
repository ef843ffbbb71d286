"""The torchrun side of tests/test_distributed.py: `python -m torch.distributed.run --nproc_per_node 2
tests/ddp_worker.py OUT ONE_PROCESS_CHECKPOINT` trains every scenario in 2 CPU processes (gloo), and the tests import
the same configs to train them in one process. Once training is over each rank saves what it saw to OUT/rankR.pt;
until then an audit hook records every file the rank creates, opens for writing or renames under OUT."""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import torch

from conftest import TINY, BatchFreeD, BatchFreeG, CondBatchFreeD, CondBatchFreeG, FlakyD, weights
from gantools import ImageTensorDataset, TrainConfig, Trainer, render_glyphs
from gantools.core import distributed


def dataset() -> ImageTensorDataset:
    return ImageTensorDataset(*render_glyphs(64, 32, 1, seed=0))  # four batches of 16: runs cross epochs


def configs(out: Path) -> dict[str, TrainConfig]:
    base = TrainConfig(**TINY, out_dir=str(out))
    plain = base.replace(steps=4, loader="device", hflip=True, sample_interval=2, checkpoint_interval=2,
                         out_dir=str(out / "plain"))
    return {
        "plain": plain,  # device loader, flips drawn per global batch, samples and checkpoints on the way
        "accum": base.replace(steps=3, grad_accum_steps=2, out_dir=str(out / "accum")),  # the DataLoader path
        "half": plain.replace(steps=2, out_dir=str(out / "half")),  # resumed below to plain's 4 steps
        "stop": base.replace(steps=50, loader="device", out_dir=str(out / "stop")),
        "skip": base.replace(steps=8, loader="device", on_nonfinite="skip", out_dir=str(out / "skip")),
        "dcgan": base.replace(steps=3, out_dir=str(out / "dcgan")),  # with BatchNorm
        # the GAN family: a penalty's input gradient beside DDP, 2 D steps per G step, EMA, labels sliced per rank
        "family": base.replace(steps=3, loss="wgan-gp", r1_gamma=1.0, r1_interval=2, d_steps=2, ema_decay=0.9,
                               conditional=True, grad_accum_steps=2, loader="device", out_dir=str(out / "family")),
    }


def batch_free(cfg: TrainConfig, data, **kw) -> Trainer:
    """A trainer whose networks have no batch statistics, built from the same seed in every process."""
    torch.manual_seed(0)
    return Trainer(cfg, generator=BatchFreeG(), discriminator=BatchFreeD(), dataset=data, **kw)


def family(cfg: TrainConfig, data) -> Trainer:
    """A conditional trainer without batch statistics (the penalties need none), the same in every process."""
    torch.manual_seed(0)
    return Trainer(cfg, generator=CondBatchFreeG(), discriminator=CondBatchFreeD(), dataset=data)


def resume(path, data, **overrides) -> Trainer:
    return Trainer.resume(path, generator=BatchFreeG(), discriminator=BatchFreeD(), dataset=data, **overrides)


def summary(trainer: Trainer) -> dict:
    return {"step": trainer.step, "generator": weights(trainer.generator),
            "discriminator": weights(trainer.discriminator), "history": trainer.history.records}


class StopOnRank0:
    """Asks for a stop at step 3 on rank 0 only, as a Stop button or a Ctrl-C on one process would."""

    def on_step_end(self, trainer):
        if trainer.world.is_main and trainer.step == 3:
            trainer.stop()


def count_all_reduces(trainer: Trainer) -> dict:
    """How often each network's gradients are all-reduced (a DDP communication hook that counts, then reduces)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    calls = {"generator": 0, "discriminator": 0}

    def counting(name):
        def hook(state, bucket):
            calls[name] += 1
            return allreduce_hook(state, bucket)
        return hook

    trainer.stepper.ddp_g.register_comm_hook(None, counting("generator"))
    trainer.stepper.ddp_d.register_comm_hook(None, counting("discriminator"))
    return calls


def main(out: Path, one_process_checkpoint: Path) -> None:
    rank = distributed.world().rank
    writes, recording = [], [True]

    def audit(event, args):
        if not recording[0]:
            return
        if event == "open":
            path, flags = args[0], args[2]
            if not (isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)):
                return
        elif event in ("os.mkdir", "os.rename", "os.replace"):
            path = args[-3] if event != "os.mkdir" else args[0]
        else:
            return
        if isinstance(path, (str, bytes, os.PathLike)) and os.path.abspath(os.fsdecode(path)).startswith(str(out)):
            writes.append(f"{event} {os.fsdecode(path)}")

    sys.addaudithook(audit)
    data, cfgs, results = dataset(), configs(out), {}

    trainer = batch_free(cfgs["plain"], data)
    trainer.fit()
    results["plain"] = summary(trainer)

    trainer = batch_free(cfgs["accum"], data)
    calls = count_all_reduces(trainer)
    trainer.fit()
    results["accum"] = {**summary(trainer), "all_reduces": dict(calls)}

    batch_free(cfgs["half"], data).fit()  # 2 processes to step 2, then on to 4 in 2 processes
    trainer = resume(Path(cfgs["half"].out_dir) / "checkpoint.pt", data, steps=4, out_dir=str(out / "resumed-2-2"))
    trainer.fit()
    results["resumed 2 -> 2"] = summary(trainer)
    trainer = resume(one_process_checkpoint, data, steps=4, out_dir=str(out / "resumed-1-2"))
    trainer.fit()
    results["resumed 1 -> 2"] = summary(trainer)

    trainer = batch_free(cfgs["stop"], data, callbacks=[StopOnRank0()])
    trainer.fit()
    results["stop"] = summary(trainer)

    with warnings.catch_warnings(record=True) as caught:  # NaN on rank 1 only, in step 3
        warnings.simplefilter("always")
        torch.manual_seed(0)
        trainer = Trainer(cfgs["skip"], generator=BatchFreeG(), discriminator=FlakyD([3] if rank == 1 else []),
                          dataset=data)
        trainer.discriminator.calls = 0
        trainer.fit()
    results["skip"] = {**summary(trainer), "warnings": [str(w.message) for w in caught]}

    trainer = Trainer(cfgs["dcgan"], dataset=data)
    trainer.fit()
    results["dcgan"] = {**summary(trainer), "buffer_sync": trainer.stepper.ddp_d.broadcast_buffers}

    trainer = family(cfgs["family"], data)
    trainer.fit()
    results["family"] = {**summary(trainer), "ema": weights(trainer.ema.module)}

    recording[0] = False
    torch.save({"results": results, "writes": writes}, out / f"rank{rank}.pt")
    distributed.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]))
