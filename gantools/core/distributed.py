"""More than one GPU: the same trainer under `torchrun`, with PyTorch's own DistributedDataParallel.

torchrun starts one process per GPU (or per CPU share) and tells each where it stands through RANK, WORLD_SIZE and
LOCAL_RANK. Without them (a notebook, a plain `python -m gantools train`) `world()` is one process of one and every
helper here returns at once: no process group, no wrapper, no collective.

How N processes stay exactly one training run (tested on the CPU with gloo):
- `batch_size` is the *global* batch. Every rank builds the same seed+epoch batch order and keeps its contiguous
  slice of each global batch (`loaders.EpochBatchSampler`), and draws the whole batch's noise and flips from the same
  seeded RNG, keeping its slice. So the ranks together see exactly the images and noise one process would.
- Losses are means over the local batch and DDP averages gradients over ranks: with equal local batches that is
  the global mean, the gradient one process computes. Only batch statistics differ: BatchNorm normalises over the
  local batch.
- Decisions (stop, skip a non-finite interval) are taken from numbers all-reduced at log intervals, so every rank
  takes the same one at the same step.
- `sync_batchnorm` (CUDA only) makes BatchNorm use the global batch's statistics, at the price of one more collective
  per BatchNorm layer in every forward and backward.
"""
from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..measuring.hardware import resolve_device


@dataclass(frozen=True)
class World:
    """This process's place: `rank` (0 writes every file), `size` (processes in all), `local_rank` (its GPU)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def shard(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous slice of a global batch (the whole batch for one process)."""
        if self.size == 1:
            return batch
        n = batch.shape[0] // self.size
        return batch[self.rank * n:(self.rank + 1) * n]


def world() -> World:
    """Where this process stands, from torchrun's environment; one process of one without it."""
    env = os.environ
    if "WORLD_SIZE" not in env:
        return World()
    return World(int(env.get("RANK", 0)), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)))


def device(name: str, where: World) -> torch.device:
    """The device a config names; under torchrun 'auto' and 'cuda' mean this process's own GPU, cuda:LOCAL_RANK."""
    dev = resolve_device(name)
    if where.distributed and dev.type == "cuda" and dev.index is None:
        return torch.device("cuda", where.local_rank)
    return dev


def init(dev: torch.device, where: World) -> None:
    """Join torchrun's process group once per process: NCCL between GPUs, gloo between CPU processes."""
    if not where.distributed:
        return
    import atexit

    from torch import distributed as dist

    if dist.is_initialized():
        return
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # NCCL works on the current device
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    atexit.register(shutdown)


def shutdown() -> None:
    """Leave the process group; `init` registers it to run at exit, so scripts and the CLI need not."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def wrap(module: nn.Module, dev: torch.device, where: World) -> nn.Module:
    """DistributedDataParallel around a network (it broadcasts rank 0's weights now and averages gradients in
    every backward); the network itself alone.

    No buffer sync in the forward: each rank keeps its own BatchNorm running statistics, and rank 0's go into the
    checkpoint. DDP's default copies rank 0's buffers into every rank, in place, before every forward; a GAN calls D
    twice (real, then fake) before one backward, so the second copy modifies statistics the first forward's graph
    still needs, and on CUDA that backward fails ("modified by an inplace operation"; gloo on a CPU lets it pass, so
    no CPU test can show it). Every rank builds the same networks from the same seed, or loads the same checkpoint,
    so no broadcast is needed at the start either. Where this torch has `forward_sync_buffers`, it turns off the
    per-forward copy alone; else `broadcast_buffers=False`. `sync_batchnorm` (CUDA) shares the statistics instead.
    Evidence: docs/torchrun.md."""
    if not where.distributed:
        return module
    import inspect

    no_forward_sync = ({"forward_sync_buffers": False}
                       if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                       else {"broadcast_buffers": False})
    return DistributedDataParallel(module, device_ids=[dev.index] if dev.type == "cuda" else None,
                                   **no_forward_sync)


def no_sync(module: nn.Module, skip: bool):
    """DDP's `no_sync()` for a micro-batch that does not step: its gradients accumulate locally and are
    all-reduced once, with the last micro-batch's, instead of once per micro-batch."""
    if skip and isinstance(module, DistributedDataParallel):
        return module.no_sync()
    return contextlib.nullcontext()


def mean_and_any(values: torch.Tensor, flag: bool) -> tuple[torch.Tensor, bool]:
    """`values` averaged over ranks and whether `flag` is set on any rank, in one all-reduce (at a log interval,
    never in the step): every rank then logs the same numbers and takes the same decision."""
    from torch import distributed as dist

    packed = torch.cat([values.float(), values.new_ones(1) * float(flag)])
    dist.all_reduce(packed)
    return packed[:-1] / dist.get_world_size(), bool(packed[-1] > 0)


def barrier(where: World) -> None:
    """Wait for every rank (e.g. until rank 0 has written the checkpoint that all will read)."""
    if where.distributed:
        from torch import distributed as dist

        dist.barrier()


@contextlib.contextmanager
def main_first(where: World):
    """Rank 0 runs the block first (rendering or downloading a dataset into its cache); the others run it after,
    reading what rank 0 left instead of all writing it at once."""
    if not where.is_main:
        barrier(where)
    yield
    if where.is_main:
        barrier(where)


def launch_command(processes: int, *args: str) -> list[str]:
    """`python -m torch.distributed.run` (torchrun) starting `processes` workers on this machine, each running
    `args` (e.g. "-m", "gantools", "train", ...), rendezvousing on a free local port."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
            "--master_addr", "127.0.0.1", "--master_port", str(port), *args]
