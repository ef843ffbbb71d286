"""The loader paths, from a dataset (`data`) to device-ready batches: a torch DataLoader (`HostLoader`), the whole
uint8 dataset on the device (`DeviceLoader`), or uint8 images in host memory read a batch at a time into pinned
buffers (`MappedLoader`, for a folder's cache too large for the device); `make_loader` picks the one a config asks
for, `choose_loader` the one that fits. All shuffle with `EpochBatchSampler`, so a resumed run, or N processes under
torchrun, see the batches one uninterrupted process would, and all normalise and flip on the device
(`prepare_batch`)."""
from __future__ import annotations

import hashlib

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .batches import worker_safe
from .data import ImageTensorDataset, returns_cpu_tensors
from .distributed import World
from ..errors import ConfigError, DataError, OutOfMemory
from .recovery import is_out_of_memory

_HALF_RANGE = torch.tensor(127.5)  # float32 whatever the default dtype, as x.float() was
ONE_PROCESS = World()  # the default world: one process of one (a frozen dataclass, so one instance serves all)


class EpochBatchSampler(Sampler):
    """Shuffled batches whose order depends only on (seed, epoch), and which can start mid-epoch: that is what
    lets a resumed run see exactly the batches an uninterrupted run would.

    Under torchrun, `rank` of `world_size` yields its contiguous slice of every global batch: DistributedSampler's
    disjoint share of every epoch per rank, but batch-aligned and in the single-process order (DistributedSampler
    strides its own permutation across ranks and cannot start mid-epoch), so N processes train on the batches one
    process trains on, and a checkpoint resumes at its batch under any process count."""

    def __init__(self, n: int, batch_size: int, seed: int = 0, drop_last: bool = True, rank: int = 0,
                 world_size: int = 1):
        self.n, self.batch_size, self.seed, self.drop_last = n, batch_size, seed, drop_last
        self.rank, self.world_size = rank, world_size
        self.epoch, self.start = 0, 0

    def __len__(self):
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def set_position(self, epoch: int, batch: int) -> None:
        self.epoch, self.start = epoch, batch

    def epoch_order(self) -> torch.Tensor:
        """This epoch's shuffled order, from a CPU generator seeded by (seed, epoch) alone: the same on every
        machine, device and rank, so a run resumes mid-epoch anywhere (a GPU's permutation of a seed depends on
        the GPU model)."""
        key = int.from_bytes(hashlib.sha256(f"{self.seed}/{self.epoch}".encode()).digest()[:8], "little")
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(key))

    def batch_indices(self, order: torch.Tensor, b: int) -> torch.Tensor:
        """This rank's indices of global batch b (all of them for one process)."""
        local = self.batch_size // self.world_size
        start = b * self.batch_size + self.rank * local
        return order[start:start + local]

    def __iter__(self):
        order = self.epoch_order()
        for b in range(self.start, len(self)):
            yield self.batch_indices(order, b).tolist()


def prepare_batch(images: torch.Tensor, device: torch.device, hflip: bool = False,
                  channels_last: bool = False, world: World = ONE_PROCESS,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Batch to the device, uint8 -> [-1, 1] there (a quarter of the bytes of floats to copy), flipped and laid out
    there. Flips are drawn from `generator` (the trainer's own, on `device`; the global RNG when None); under torchrun
    for the whole global batch, each rank keeping its slice: the same flips, and RNG use, as one process.
    `non_blocking=True` makes the copy asynchronous only from pinned host memory; from pageable memory it first
    waits for the work queued on the GPU (PyTorch tutorial "A guide on good usage of non_blocking and pin_memory()"),
    which is why a DataLoader feeding CUDA pins its batches by default (`make_loader`)."""
    x = images.to(device, non_blocking=True)
    if x.dtype == torch.uint8:  # uint8 / a float32 0-d tensor computes in float32: x.float() / 127.5 in one launch
        x = torch.div(x, _HALF_RANGE).sub_(1.0)
    if hflip:
        draws = torch.rand(x.shape[0] * world.size, 1, 1, 1, device=x.device, generator=generator)
        flip = world.shard(draws) < 0.5
        x = torch.where(flip, x.flip(-1), x)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


class HostLoader:
    """A torch DataLoader with every knob exposed, yielding device-ready batches of real images (with `labels`:
    (images, labels) pairs, the labels on the device too).

    Args:
        dataset: any Dataset of (image, label) pairs or of bare images.
        batch_size: the global batch; under torchrun each process loads its share.
        device: where the batches land.
        seed: the shuffle's seed: the same seed gives the same batches, resumed or not.
        num_workers: worker processes that load batches (0: this process does).
        pin_memory: page-locked host batches, so the copy to a GPU runs asynchronously.
        persistent_workers: keep the workers from one epoch to the next.
        prefetch_factor: batches each worker loads ahead; None: the DataLoader's default.
        drop_last: drop each epoch's last, short batch.
        hflip: flip half the images at random (on the device).
        channels_last: lay each batch out channels-last.
        world: this process under torchrun (the default: one process).
        generator: the RNG flips are drawn from; None: the global one.
        labels: yield (images, labels) pairs instead of bare images.
    Raises:
        DataError: the dataset holds fewer images than one batch.
    """

    def __init__(self, dataset: Dataset, batch_size: int, device, *, seed: int = 0, num_workers: int = 0,
                 pin_memory: bool = False, persistent_workers: bool = False, prefetch_factor: int | None = None,
                 drop_last: bool = True, hflip: bool = False, channels_last: bool = False, world: World = ONE_PROCESS,
                 generator: torch.Generator | None = None, labels: bool = False):
        if len(dataset) < batch_size:
            raise DataError(f"the dataset has {len(dataset)} images, fewer than one batch of {batch_size}: "
                            "lower batch_size or add images")
        self.device, self.hflip, self.channels_last, self.world = torch.device(device), hflip, channels_last, world
        self.generator, self.labels = generator, labels  # flips are drawn from it
        self.sampler = EpochBatchSampler(len(dataset), batch_size, seed, drop_last, world.rank, world.size)
        self.loader = DataLoader(dataset, batch_sampler=self.sampler, num_workers=num_workers,
                                 pin_memory=pin_memory, persistent_workers=persistent_workers,
                                 prefetch_factor=prefetch_factor,
                                 # its own generator: starting an epoch must not draw from the global RNG
                                 generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.sampler)

    def set_position(self, epoch: int, batch: int) -> None:
        self.sampler.set_position(epoch, batch)

    def __iter__(self):
        for batch in worker_safe(self.loader):  # (images, labels) pairs, or bare images from your own dataset
            images = batch[0] if isinstance(batch, (tuple, list)) else batch
            x = prepare_batch(images, self.device, self.hflip, self.channels_last, self.world, self.generator)
            yield (x, torch.as_tensor(batch[1]).to(self.device, non_blocking=True)) if self.labels else x


class DeviceLoader:
    """The whole uint8 dataset resident on the device; shuffling, normalising and flipping happen there, so no
    worker, no host decode and no host-to-device copy is left in the step. Under torchrun every GPU holds the whole
    dataset (it fits one GPU, or one process could not hold it either) and gathers only its slice of each batch.
    With `labels` the labels live there too and each batch is an (images, labels) pair, gathered alike.

    Args:
        dataset: an ImageTensorDataset with transform='on-device'.
        batch_size, device, seed, drop_last, hflip, channels_last, world, generator, labels: as for `HostLoader`.
    Raises:
        DataError: another kind of dataset, or fewer images than one batch.
        OutOfMemory: the dataset does not fit in the device's memory.
    """

    def __init__(self, dataset: ImageTensorDataset, batch_size: int, device, *, seed: int = 0,
                 drop_last: bool = True, hflip: bool = False, channels_last: bool = False, world: World = ONE_PROCESS,
                 generator: torch.Generator | None = None, labels: bool = False):
        _check_in_memory(dataset, batch_size, "device")
        self.device, self.hflip, self.channels_last, self.world = torch.device(device), hflip, channels_last, world
        self.generator = generator  # flips are drawn from it
        try:
            self.images = dataset.images.to(self.device)
            self.labels = torch.as_tensor(dataset.labels).to(self.device) if labels else None
        except RuntimeError as e:
            if not is_out_of_memory(e):
                raise
            raise OutOfMemory(f"the dataset ({dataset.images.numel() / 2**20:.0f} MB as uint8) does not fit in "
                              f"{self.device.type} memory next to the model: use loader='memmap' (or 'auto'), which "
                              "holds one batch at a time there") from None
        self.sampler = EpochBatchSampler(len(dataset), batch_size, seed, drop_last, world.rank, world.size)

    def __len__(self):
        return len(self.sampler)

    def set_position(self, epoch: int, batch: int) -> None:
        self.sampler.set_position(epoch, batch)

    def __iter__(self):
        for indices in self.batch_indices():
            yield self.gather(indices)

    def batch_indices(self):
        """The indices of each batch's images, from the current position to the epoch's end: device tensors (views
        of the epoch's order, copied there once an epoch)."""
        order = self.sampler.epoch_order()
        # to a GPU from pinned memory, asynchronously: a pageable copy would wait for the queued work (prepare_batch)
        order = (order.pin_memory() if self.device.type == "cuda" else order).to(self.device, non_blocking=True)
        for b in range(self.sampler.start, len(self.sampler)):
            yield self.sampler.batch_indices(order, b)

    def gather(self, indices: torch.Tensor):
        """The batch of the images at `indices` (a device tensor), normalised, flipped and laid out on the device
        (with `labels`: an (images, labels) pair): no host work but the launches, so a CUDA graph can hold it."""
        # index_select copies whole images (rows), where images[indices]'s general indexing gathers byte by byte
        x = prepare_batch(torch.index_select(self.images, 0, indices), self.device, self.hflip, self.channels_last,
                          self.world, self.generator)
        return (x, self.labels[indices]) if self.labels is not None else x


class MappedLoader:
    """uint8 images in host memory, most often mapped from a folder's cache (`data.CachedFolder`: a file larger than
    the device, or than this machine's memory, still serves), gathered a batch at a time by one `index_select` into
    pinned memory and copied to the device asynchronously, one batch ahead: no worker, no per-image Python and no
    decode in the step. Normalising and flipping happen on the device (`prepare_batch`) when a batch is handed out,
    in the order the other loaders draw them, so the same seed trains on the same batches.

    Reusing pinned buffers is safe without a wait: each batch's buffer is a fresh allocation from PyTorch's caching
    host allocator, which records an event on the stream of every asynchronous copy from it and hands the block out
    again only once that event has completed (CachingHostAllocator_recordEvent, called by the CUDA copy kernel).

    Args:
        dataset: an ImageTensorDataset with transform='on-device' whose images are on the CPU.
        batch_size, device, seed, drop_last, hflip, channels_last, world, generator, labels: as for `HostLoader`.
    Raises:
        DataError: another kind of dataset, or fewer images than one batch.
    """

    def __init__(self, dataset: ImageTensorDataset, batch_size: int, device, *, seed: int = 0,
                 drop_last: bool = True, hflip: bool = False, channels_last: bool = False, world: World = ONE_PROCESS,
                 generator: torch.Generator | None = None, labels: bool = False):
        _check_in_memory(dataset, batch_size, "memmap")
        self.device, self.hflip, self.channels_last, self.world = torch.device(device), hflip, channels_last, world
        self.generator, self.images = generator, dataset.images
        self.labels = torch.as_tensor(dataset.labels) if labels else None
        self.pin = self.device.type == "cuda"  # only a copy to a GPU is asynchronous, and only from pinned memory
        self.sampler = EpochBatchSampler(len(dataset), batch_size, seed, drop_last, world.rank, world.size)

    def __len__(self):
        return len(self.sampler)

    def set_position(self, epoch: int, batch: int) -> None:
        self.sampler.set_position(epoch, batch)

    def _copy(self, order: torch.Tensor, b: int) -> tuple:
        """Batch b's uint8 images (and labels) gathered into pinned memory, their copy to the device queued."""
        indices = self.sampler.batch_indices(order, b)
        images = torch.empty((len(indices), *self.images.shape[1:]), dtype=torch.uint8, pin_memory=self.pin)
        torch.index_select(self.images, 0, indices, out=images)  # one gather, parallel over the batch
        labels = None
        if self.labels is not None:
            labels = self.labels[indices].pin_memory() if self.pin else self.labels[indices]
            labels = labels.to(self.device, non_blocking=True)
        return images.to(self.device, non_blocking=True), labels

    def __iter__(self):
        order, end = self.sampler.epoch_order(), len(self.sampler)
        ahead = self._copy(order, self.sampler.start) if self.sampler.start < end else None
        for b in range(self.sampler.start, end):
            (images, labels), ahead = ahead, (self._copy(order, b + 1) if b + 1 < end else None)
            x = prepare_batch(images, self.device, self.hflip, self.channels_last, self.world, self.generator)
            yield (x, labels) if self.labels is not None else x


def _check_in_memory(dataset, batch_size: int, loader: str) -> None:
    """What the device and memory-mapped loaders hold: uint8 images in one tensor, at least a batch of them."""
    if not isinstance(dataset, ImageTensorDataset) or dataset.transform != "on-device":
        raise DataError(f"loader={loader!r} needs uint8 images in one tensor (ImageTensorDataset with "
                        "transform='on-device', or a folder decoded once: CachedFolder); use loader='dataloader' "
                        "for other datasets")
    if len(dataset) < batch_size:
        raise DataError(f"the dataset has {len(dataset)} images, fewer than one batch of {batch_size}: "
                        "lower batch_size or add images")


def data_budget(device: torch.device, budget_mb: float | None = None) -> int:
    """Bytes of the device's memory the images may take for loader='auto': `budget_mb` when given; else what is
    free on the device now (the networks are already there), less a quarter of its total for activations and the
    optimizer's state; on a CPU the same from the kernel's MemAvailable (0 where it cannot be read)."""
    if budget_mb is not None:
        return int(budget_mb * 2**20)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return max(0, free - total // 4)
    try:
        info = dict(line.split(":", 1) for line in open("/proc/meminfo").read().splitlines() if ":" in line)
        available, total = (int(info[k].split()[0]) * 1024 for k in ("MemAvailable", "MemTotal"))
    except (OSError, KeyError, ValueError):
        return 0
    return max(0, available - total // 4)


def choose_loader(dataset: Dataset, device, budget_mb: float | None = None) -> tuple[str, str]:
    """loader='auto''s choice and why: the whole dataset on the device when its uint8 images fit the budget
    (`data_budget`), else batches read from host memory (`MappedLoader`); a dataset that is not uint8 images in
    one tensor takes the DataLoader.

    Returns:
        (loader, a line that says why, with the sizes that decided it)
    """
    device = torch.device(device)
    if not isinstance(dataset, ImageTensorDataset) or dataset.transform != "on-device":
        return "dataloader", "loader='auto': the dataset is not uint8 images in one tensor, so a DataLoader reads it"
    size, budget = dataset.images.numel(), data_budget(device, budget_mb)
    where = f"{size / 2**20:,.1f} MB of uint8 images; {budget / 2**20:,.1f} MB of {device.type} memory for them"
    if size <= budget:
        return "device", f"loader='auto': {where}: the whole dataset on the {device.type} (loader='device')"
    return "memmap", f"loader='auto': {where}: batches read from host memory into pinned buffers (loader='memmap')"


class IndexBatches:
    """A device loader's batches as the indices of their images, for a step that gathers them itself
    (`DeviceLoader.gather` inside a CUDA graph: `graphed_step.GraphedStep`); positioned like the loader."""

    def __init__(self, loader: DeviceLoader):
        self.loader = loader

    def __len__(self):
        return len(self.loader)

    def set_position(self, epoch: int, batch: int) -> None:
        self.loader.set_position(epoch, batch)

    def __iter__(self):
        return self.loader.batch_indices()


def make_loader(dataset: Dataset, cfg, device, world: World = ONE_PROCESS,
                generator: torch.Generator | None = None) -> HostLoader | DeviceLoader:
    """The loader a config asks for: `loader='dataloader'`, `'device'`, `'memmap'` or `'auto'` (`choose_loader`, which
    prints its choice and the sizes that made it); under torchrun, `world`'s share;
    with `cfg.conditional` every batch is an (images, labels) pair, else the images alone.
    `pin_memory=None` (auto) pins a DataLoader's batches when they go to CUDA from the CPU: only then is the
    non-blocking copy asynchronous (see `prepare_batch`). A dataset whose tensors are already on the GPU
    (`returns_cpu_tensors`) can be neither pinned (the DataLoader pins every tensor of a batch, and a CUDA tensor
    cannot be) nor read in workers (forked from a process that already used CUDA, which the CUDA runtime does not
    support: PyTorch docs, notes/multiprocessing); asking for either is one ConfigError here, before training.

    Args:
        dataset: the images (`data.make_dataset`, or your own Dataset).
        cfg: the TrainConfig whose loader knobs apply.
        device: where the batches land.
        world: this process under torchrun (the default: one process).
        generator: the RNG flips are drawn from; None: the global one.
    Returns:
        A HostLoader, a DeviceLoader or a MappedLoader.
    Raises:
        ConfigError: workers or pinned memory asked for a dataset whose tensors are not on the CPU.
        DataError, OutOfMemory: as for `HostLoader` and `DeviceLoader`.
    """
    common = dict(seed=cfg.seed, drop_last=cfg.drop_last, hflip=cfg.hflip, channels_last=cfg.channels_last,
                  world=world, generator=generator, labels=cfg.conditional)
    kind = cfg.loader
    if kind == "auto":
        kind, why = choose_loader(dataset, device, cfg.data_budget_mb)
        if world.is_main:
            print(why)
    if kind in ("device", "memmap"):
        return (DeviceLoader if kind == "device" else MappedLoader)(dataset, cfg.batch_size, device, **common)
    cuda = torch.device(device).type == "cuda"
    on_cpu = returns_cpu_tensors(dataset) if cfg.num_workers or cfg.pin_memory or (cuda and cfg.pin_memory is None) \
        else True  # the probe reads an item: only where workers or pinning hang on it
    problems = []
    if not on_cpu and cfg.num_workers:
        problems.append(f"num_workers={cfg.num_workers}: a forked DataLoader worker cannot use CUDA; set num_workers=0")
    if not on_cpu and cfg.pin_memory:
        problems.append("pin_memory=True: only CPU tensors can be pinned; set pin_memory=None (auto) or False")
    if problems:
        raise ConfigError("your dataset returns tensors that are not on the CPU (already on the GPU?): "
                          + "; ".join(problems))
    pin = cfg.pin_memory if cfg.pin_memory is not None else on_cpu
    return HostLoader(dataset, cfg.batch_size, device, num_workers=cfg.num_workers, pin_memory=pin and cuda,
                      persistent_workers=cfg.persistent_workers, prefetch_factor=cfg.prefetch_factor, **common)


def loader_images_per_sec(loader, batches: int = 20, warmup: int = 2, device=None) -> float:
    """Throughput of a loader alone (no training), timed with device synchronisation; the first `warmup`
    batches (worker start-up) are not counted. `device`: where its batches land, for any iterable of batches (a
    generator over your own DataLoader); gantools' loaders know theirs."""
    from ..measuring.hardware import Timer

    def size(batch) -> int:  # (images, labels) pairs from a conditional loader or a plain DataLoader
        return (batch[0] if isinstance(batch, (tuple, list)) else batch).shape[0]

    device = torch.device(device) if device is not None else getattr(loader, "device", None)
    if device is None:
        raise TypeError(f"{type(loader).__name__} does not say where its batches land: pass device=")
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    timer, images = Timer(device).start(), 0
    for _ in range(batches):
        try:
            images += size(next(it))
        except StopIteration:  # an epoch ran out: carry on from the next one
            it = iter(loader)
            images += size(next(it))
    return images / timer.stop()
