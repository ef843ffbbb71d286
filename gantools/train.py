"""The one training loop. Every technique the notebooks teach is a TrainConfig field read here, in one place.

GradScaler policy (fp16): one scaler per network. D and G are stepped at different moments with losses and
gradients of very different sizes; with its own scaler each network's scale follows its own overflows, and
`update()` runs right after that network's `step()`. A single shared scaler would have to wait for both steps before
`update()`, and an overflow in D would also halve the scale that G's (healthy) gradients use.

Gradient accumulation for a GAN: the batch is split into k micro-batches. All k D micro-batches are accumulated and D
steps once; only then are the k G micro-batches accumulated, through the *updated* D, and G steps once. Each
micro-loss is weighted by its share of the batch, so k micro-batches give the same gradients as one full batch on a
model without batch statistics (BatchNorm sees k smaller batches: the notebook on accumulation shows the cost).

Under torchrun (see distributed.py) both networks are wrapped in DistributedDataParallel and each process trains on
its share of the global batch. In the G step D is called unwrapped: its weights are frozen there (or their gradients
thrown away), and a DDP-wrapped D would wait for gradients that never come. Micro-batches that do not step run
under `no_sync()`, so gradients are all-reduced once per optimizer step. Only rank 0 writes files.
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
import signal
import statistics
import threading
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from . import distributed, hardware
from .checkpoint import atomic_write, load_checkpoint, save_checkpoint
from .config import ConfigError, TrainConfig
from .data import dataset_from_config, make_loader
from .models import build_dcgan

METRICS = ("loss_d", "d_real", "d_fake", "loss_g")  # D's three first: the D step adds them as one slice


SCALE_COLLAPSE = 1.0  # an fp16 GradScaler scale below this means gradients overflow fp16 even unscaled


class NonFiniteLossError(FloatingPointError):
    """A loss became NaN or infinite; raised at the next log interval (checking every step would sync)."""


class OutOfMemory(RuntimeError):
    """The device ran out of memory; the message says what to change (batch, accumulation, 16-bit)."""


class History:
    """One record per log interval: losses, synced step time, images/sec, time waiting for data, peak memory."""

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
        warm-up (cuDNN autotuning, torch.compile, worker start-up)."""
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
            "peak_mem_mb": max(r["peak_mem_mb"] for r in self.records),
            "train_time_s": last["train_time_s"],
            **{k: last[k] for k in METRICS},
            **self.quality,
        }

    def save(self, path) -> None:
        atomic_write(path, lambda f: f.write(json.dumps(self.records, indent=1).encode()))


def make_optimizer(params, cfg: TrainConfig, lr: float) -> torch.optim.Optimizer:
    """Adam or AdamW with the kernel implementation the config asks for (for-loop, foreach or fused)."""
    cls = torch.optim.Adam if cfg.optimizer == "adam" else torch.optim.AdamW
    impl = {"auto": {}, "for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
    return cls(params, lr=lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, **impl[cfg.optimizer_impl])


def d_loss(loss: str, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """Discriminator loss from its outputs on real and fake images (fp32)."""
    if loss == "hinge":
        return F.relu(1 - real).mean() + F.relu(1 + fake).mean()
    bce = F.binary_cross_entropy if loss == "bce-sigmoid" else F.binary_cross_entropy_with_logits
    return bce(real, torch.ones_like(real)) + bce(fake, torch.zeros_like(fake))


def g_loss(loss: str, fake: torch.Tensor) -> torch.Tensor:
    """Non-saturating generator loss (BCE) or the hinge generator loss."""
    if loss == "hinge":
        return -fake.mean()
    bce = F.binary_cross_entropy if loss == "bce-sigmoid" else F.binary_cross_entropy_with_logits
    return bce(fake, torch.ones_like(fake))


class Trainer:
    """Trains a GAN for any TrainConfig: the built-in DCGAN or your own `generator` and `discriminator`
    (D must return one logit per image; G must take (B, nz) noise), on the config's dataset or your `dataset`.

    `callbacks` are objects with any of `on_fit_start(trainer)`, `on_step_end(trainer)` (every step: keep it
    host-only, reading a tensor there would sync), `on_log(trainer, record)`, `on_sample(trainer, step, grid)` and
    `on_fit_end(trainer)`. `stop()` (or Ctrl-C / kernel interrupt) ends the run
    cleanly between steps and writes a checkpoint. Under torchrun callbacks run in every process; `trainer.world`
    says which one this is (`trainer.world.is_main` for rank 0)."""

    def __init__(self, cfg: TrainConfig | None = None, *, generator: nn.Module | None = None,
                 discriminator: nn.Module | None = None, dataset=None, callbacks=()):
        self.cfg = cfg = (cfg if cfg is not None else TrainConfig()).validate()
        if (generator is None) != (discriminator is None):
            raise ConfigError("pass both generator and discriminator, or neither (for the built-in DCGAN)")
        self.world = distributed.world()  # one process of one, unless torchrun started this one
        self.device = dev = distributed.device(cfg.device, self.world)
        distributed.init(dev, self.world)
        hardware.set_tf32(cfg.tf32)
        if dev.type == "cuda":
            torch.backends.cudnn.benchmark = cfg.cudnn_benchmark
        torch.manual_seed(cfg.seed)  # the same on every rank: same weights, and the same noise drawn in lockstep
        if generator is None:
            generator, discriminator = build_dcgan(cfg.image_size, cfg.channels, cfg.nz, cfg.ngf, cfg.ndf,
                                                   sigmoid=(cfg.loss == "bce-sigmoid"))
        if cfg.sync_batchnorm:  # same parameters and buffers, so checkpoints stay interchangeable
            generator = nn.SyncBatchNorm.convert_sync_batchnorm(generator)
            discriminator = nn.SyncBatchNorm.convert_sync_batchnorm(discriminator)
        fmt = torch.channels_last if cfg.channels_last else torch.preserve_format
        self.generator = generator.to(dev, memory_format=fmt)
        self.discriminator = discriminator.to(dev, memory_format=fmt)
        if dataset is None:
            with distributed.main_first(self.world):  # rank 0 fills the dataset cache, the others read it
                dataset = dataset_from_config(cfg)
        self.dataset = dataset
        self.loader = make_loader(self.dataset, cfg, dev, self.world)
        self._check_shapes()

        self.opt_g = make_optimizer(self.generator.parameters(), cfg, cfg.lr_g)
        self.opt_d = make_optimizer(self.discriminator.parameters(), cfg, cfg.lr_d)
        self.scaler_g = torch.amp.GradScaler(dev.type, enabled=(cfg.precision == "fp16"))
        self.scaler_d = torch.amp.GradScaler(dev.type, enabled=(cfg.precision == "fp16"))
        if cfg.precision == "fp32":
            self.autocast = contextlib.nullcontext
        else:
            dtype = torch.float16 if cfg.precision == "fp16" else torch.bfloat16
            self.autocast = lambda: torch.autocast(dev.type, dtype=dtype)
        mode = None if cfg.compile == "default" else cfg.compile
        compiled = (lambda m: torch.compile(m, mode=mode)) if cfg.compile != "off" else (lambda m: m)
        # the networks as the step calls them: DDP-wrapped under torchrun (for no_sync), then compiled
        self.ddp_g = distributed.wrap(self.generator, dev, self.world)
        self.ddp_d = distributed.wrap(self.discriminator, dev, self.world)
        self.g, self.d = compiled(self.ddp_g), compiled(self.ddp_d)
        self.d_in_g_step = compiled(self.discriminator) if self.world.distributed else self.d

        noise = torch.Generator().manual_seed(cfg.seed + 1)  # own generator: sampling never shifts training RNG
        self.fixed_noise = torch.randn(64, cfg.nz, generator=noise).to(dev)
        self.step = 0
        self.batches_seen = 0
        self.history = History()
        self.step_values: list[tuple] = []  # per-step losses, only filled with sync_every_step (the tutorial's way)
        self.latest_grid = None
        self.callbacks = list(callbacks)
        self.out_dir = Path(cfg.out_dir)
        self._stop_requested = self._stop_agreed = False
        self._stream = None  # the batch generator, positioned at batches_seen
        self.label_phase = _unlabelled  # profiling swaps in torch.profiler.record_function to label each phase
        self._metric_sum = torch.zeros(len(METRICS), device=dev)
        self._skips, self._good_state = 0, None  # on_nonfinite='skip': intervals skipped in a row, the rollback

    # -- public API ---------------------------------------------------------------------------------------------
    @classmethod
    def resume(cls, path, *, generator=None, discriminator=None, dataset=None, callbacks=(), **overrides):
        """A trainer restored from a checkpoint (weights, optimizers, scalers, RNG, data position), ready to
        `fit()` on to `steps` (override it to train longer)."""
        state = load_checkpoint(path)
        cfg = TrainConfig.from_dict(state["config"]).replace(**overrides)
        trainer = cls(cfg, generator=generator, discriminator=discriminator, dataset=dataset, callbacks=callbacks)
        trainer.load_state(state)
        return trainer

    def stop(self) -> None:
        """Ask the run to end after the current step (safe from a widget callback or another thread). Under
        torchrun, a stop asked on any rank ends every rank at the next log interval, where they agree on it."""
        self._stop_requested = True

    def fit(self, steps: int | None = None) -> History:
        """Train `steps` more steps (default: up to cfg.steps). Returns the history of the whole run."""
        cfg = self.cfg
        end = self.step + steps if steps is not None else cfg.steps
        self._stop_requested = self._stop_agreed = False
        if self.world.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        if self._stream is None:  # kept across fit() calls: DataLoader workers are not restarted each time
            self._stream = self._batches()
        batches = self._stream
        self.history.quality = {}  # set again by metrics.QualityCallback for this fit
        self._call("on_fit_start")
        if cfg.on_nonfinite == "skip" and self._good_state is None:
            self._good_state = self._snapshot()
        hardware.reset_peak_memory(self.device)
        self._interval_start = time.perf_counter()
        self._interval_step, self._interval_wait, self._excluded = self.step, 0.0, 0.0
        self._train_time = self.history[-1]["train_time_s"] if len(self.history) else 0.0
        with _interrupts_stop(self):
            while self.step < end and not self._stopping():
                t = time.perf_counter()
                with self.label_phase("data wait"):
                    real = next(batches)
                self._interval_wait += time.perf_counter() - t
                oom = None
                try:
                    self._train_step(real)
                except torch.OutOfMemoryError as e:
                    oom = str(e).splitlines()[0] if str(e) else "out of memory"
                if oom is not None:  # outside the except block, so the failed step's tensors can be freed
                    raise self._out_of_memory(oom)
                self.step += 1
                self.batches_seen += 1
                self._call("on_step_end")
                if self.step % cfg.log_interval == 0 or self.step == end or self._stopping():
                    self._log()
                if cfg.sample_interval and self.step % cfg.sample_interval == 0 or self.step == end:
                    with self._excluded_from_timing():
                        self.sample()
                if cfg.checkpoint_interval and self.step % cfg.checkpoint_interval == 0:
                    with self._excluded_from_timing():
                        if self._weights_finite():  # never replace a good checkpoint with NaN weights
                            self.save_checkpoint()
        if self.step > self._interval_step:
            self._log()
        if self.latest_grid is None or self._stopping():
            self.sample()
        self.save_checkpoint()
        distributed.barrier(self.world)  # every rank returns once the checkpoint is on disk
        self._call("on_fit_end")
        return self.history

    @torch.no_grad()
    def sample(self, noise: torch.Tensor | None = None):
        """A grid (H, W, 3 uint8 numpy) of the generator's images for the fixed noise; saved as a PNG (by rank 0).
        Under torchrun every rank generates the same grid, in step: SyncBatchNorm layers need all ranks there."""
        from PIL import Image
        from torchvision.utils import make_grid

        images = self._generate(self.fixed_noise if noise is None else noise.to(self.device))
        grid = make_grid(images.cpu(), nrow=8, normalize=True, value_range=(-1, 1))
        self.latest_grid = grid.mul(255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        if self.world.is_main:
            atomic_write(self.out_dir / "samples" / f"step_{self.step:06d}.png",
                         lambda f: Image.fromarray(self.latest_grid).save(f, format="PNG"))
        self._call("on_sample", self.step, self.latest_grid)
        return self.latest_grid

    @torch.no_grad()
    def generate(self, n: int, seed: int = 0, batch_size: int = 256) -> torch.Tensor:
        """n images in [-1, 1] (CPU float), from seeded noise, for quality metrics."""
        noise = torch.randn(n, self.cfg.nz, generator=torch.Generator().manual_seed(seed))
        return torch.cat([self._generate(z.to(self.device)).cpu() for z in noise.split(batch_size)])

    def _generate(self, noise: torch.Tensor) -> torch.Tensor:
        saved = [b.clone() for b in self.generator.buffers()]  # train-mode BatchNorm, as in training, but
        with self.autocast():                                  # without moving its running statistics
            images = self.generator(noise).float()
        for buffer, value in zip(self.generator.buffers(), saved):
            buffer.copy_(value)
        return images

    def state_dict(self) -> dict:
        rng = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return {
            "format": 1, "step": self.step, "batches_seen": self.batches_seen, "config": self.cfg.to_dict(),
            "generator": self.generator.state_dict(), "discriminator": self.discriminator.state_dict(),
            "opt_g": self.opt_g.state_dict(), "opt_d": self.opt_d.state_dict(),
            "scaler_g": self.scaler_g.state_dict(), "scaler_d": self.scaler_d.state_dict(),
            "rng": rng, "history": self.history.records,
        }

    def load_state(self, state: dict) -> None:
        try:
            self.generator.load_state_dict(state["generator"])
            self.discriminator.load_state_dict(state["discriminator"])
        except RuntimeError as e:
            raise ConfigError(f"the checkpoint's networks do not match this config's (image_size, channels, nz, "
                              f"ngf, ndf or your own modules differ): {str(e).splitlines()[0]}") from e
        self.opt_g.load_state_dict(state["opt_g"])
        self.opt_d.load_state_dict(state["opt_d"])
        self.scaler_g.load_state_dict(state["scaler_g"])
        self.scaler_d.load_state_dict(state["scaler_d"])
        self.step, self.batches_seen = state["step"], state["batches_seen"]
        self._stream = None  # restart the data stream at the restored position
        self._skips, self._good_state = 0, None  # a rollback point belongs to the run it was taken in
        self.history = History(state["history"])
        torch.set_rng_state(state["rng"]["cpu"])
        if self.device.type == "cuda" and "cuda" in state["rng"]:
            torch.cuda.set_rng_state(state["rng"]["cuda"], self.device)

    def save_checkpoint(self, path=None) -> Path:
        """The whole run state, atomically (the previous checkpoint stays until the new one is complete), and the
        history beside it, so a crash at any moment leaves a consistent run to resume. Under torchrun only rank 0
        writes: the networks are unwrapped (no DDP "module." prefix), so any process count can resume it."""
        path = Path(path) if path else self.out_dir / "checkpoint.pt"
        if self.world.is_main:
            save_checkpoint(self.state_dict(), path)
            self.history.save(self.out_dir / "history.json")
        return path

    # -- the step -----------------------------------------------------------------------------------------------
    def _train_step(self, real: torch.Tensor) -> None:
        """One optimizer step of D, then one of G. No host sync here: metrics stay on the device. Under torchrun
        `real` is this rank's share of the batch; the noise is drawn for the whole batch and sliced the same way."""
        cfg, k, phase = self.cfg, self.cfg.grad_accum_steps, self.label_phase
        z = self.world.shard(torch.randn(real.shape[0] * self.world.size, cfg.nz, device=self.device))
        reals, zs = real.chunk(k), z.chunk(k)
        weights = [r.shape[0] / real.shape[0] for r in reals]
        probs = cfg.loss == "bce"  # report D's outputs as probabilities for the logit losses

        self.opt_d.zero_grad(set_to_none=True)
        fakes = []
        for i, (r, zi, w) in enumerate(zip(reals, zs, weights)):
            with phase("G forward"), self.autocast():
                if k == 1:  # keep G's graph: the G step below reuses this fake, as the tutorial does
                    fake = self.g(zi)
                    fakes.append(fake)
                else:  # accumulating: holding k graphs would defeat the point, so G re-runs in the G step
                    with torch.no_grad():
                        fake = self.g(zi)
            with distributed.no_sync(self.ddp_d, skip=i < k - 1):  # all-reduce with the last micro-batch
                with phase("D forward"):
                    with self.autocast():
                        out_real, out_fake = self.d(r).float(), self.d(fake.detach()).float()
                    loss = d_loss(cfg.loss, out_real, out_fake)
                    d_real = (out_real.sigmoid() if probs else out_real).mean()
                    d_fake = (out_fake.sigmoid() if probs else out_fake).mean()
                    self._metric_sum[:3] += torch.stack([loss, d_real, d_fake]).detach() * w
                with phase("D backward"):
                    self.scaler_d.scale(loss * w).backward()
        with phase("D optimizer step"):
            self.scaler_d.step(self.opt_d)
            self.scaler_d.update()

        if cfg.freeze_d:  # G's backward then computes no weight gradients for D (they would be thrown away)
            self.discriminator.requires_grad_(False)
        try:
            self.opt_g.zero_grad(set_to_none=True)
            for i, (zi, w) in enumerate(zip(zs, weights)):
                with distributed.no_sync(self.ddp_g, skip=i < k - 1):
                    with phase("G forward"):
                        with self.autocast():
                            fake = fakes[i] if k == 1 else self.g(zi)
                            out = self.d_in_g_step(fake).float()
                        loss_g = g_loss(cfg.loss, out)
                        self._metric_sum[3] += loss_g.detach() * w
                    with phase("G backward"):
                        self.scaler_g.scale(loss_g * w).backward()
            with phase("G optimizer step"):
                self.scaler_g.step(self.opt_g)
                self.scaler_g.update()
        finally:  # also after an exception (out of memory, an interrupt): D must train again next step
            self.discriminator.requires_grad_(True)

        if cfg.sync_every_step:  # the tutorial's .item() calls every step: each one waits for the device
            with phase("host sync"):
                self.step_values.append((loss.item(), d_real.item(), d_fake.item(), loss_g.item()))

    # -- bookkeeping --------------------------------------------------------------------------------------------
    def _stopping(self) -> bool:
        """One process stops as soon as asked. Ranks must stop at the same step, so under torchrun a request (on
        any rank: a callback, Ctrl-C forwarded by torchrun) takes effect where they agree on it, at a log interval."""
        return self._stop_agreed if self.world.distributed else self._stop_requested

    def _batches(self):
        """Endless batches, starting exactly where the run left off (epoch and batch within it)."""
        while True:
            epoch, batch = divmod(self.batches_seen, len(self.loader))
            self.loader.set_position(epoch, batch)
            yield from self.loader

    def _log(self) -> None:
        hardware.synchronize(self.device)
        now = time.perf_counter()
        steps = self.step - self._interval_step
        if steps == 0:
            return
        elapsed = max(now - self._interval_start - self._excluded, 1e-9)
        self._train_time += elapsed
        values = self._metric_sum / steps
        if self.world.distributed:  # every rank logs, and decides on, the same averages
            values, self._stop_agreed = distributed.mean_and_any(values, self._stop_requested)
        values = values.tolist()  # the one host sync of the interval
        self._metric_sum.zero_()
        record = {"step": self.step, **dict(zip(METRICS, values)),
                  "step_time_ms": 1e3 * elapsed / steps,
                  "images_per_sec": steps * self.cfg.batch_size / elapsed,  # global batch: all ranks' images
                  "data_wait_ms": 1e3 * self._interval_wait / steps,
                  "peak_mem_mb": hardware.peak_memory_mb(self.device),
                  "train_time_s": self._train_time}
        for name, scaler in (("d", self.scaler_d), ("g", self.scaler_g)):
            if scaler.is_enabled():
                record[f"scale_{name}"] = scaler.get_scale()
        self.history.records.append(record)
        self._check_scales(record)
        bad = [name for name, v in (("discriminator", record["loss_d"]), ("generator", record["loss_g"]))
               if not math.isfinite(v)]
        if bad:
            self._non_finite(record, bad)
        elif self.cfg.on_nonfinite == "skip":
            with self._excluded_from_timing():
                if self._weights_finite():  # finite average losses can still end in a NaN update
                    self._skips, self._good_state = 0, self._snapshot()
        with self._excluded_from_timing(reset=True):
            self._call("on_log", record)

    def _non_finite(self, record: dict, bad: list) -> None:
        cfg = self.cfg
        scaled = [n for n in ("d", "g") if record.get(f"scale_{n}", math.inf) < SCALE_COLLAPSE]
        cause = ("fp16 overflow: the GradScaler scale collapsed (try precision='bf16')" if scaled else
                 "fp16 overflow (try precision='bf16')" if cfg.precision == "fp16" else
                 "a learning rate too high for this model and batch")
        message = (f"step {self.step}: the {' and '.join(bad)} loss is not finite (loss_d={record['loss_d']}, "
                   f"loss_g={record['loss_g']}) in the {self.step - self._interval_step} steps since the last log. "
                   f"Likely cause: {cause}; lr_d={cfg.lr_d}, lr_g={cfg.lr_g}.")
        if cfg.on_nonfinite == "stop":
            raise NonFiniteLossError(message + " Resume from the last checkpoint with a lower learning rate, "
                                               "or set on_nonfinite='skip'.")
        self._skips += 1
        self._restore(self._good_state)  # the last healthy interval's weights; step count and data go on
        if self._skips > cfg.max_skips:
            raise NonFiniteLossError(message + f" Skipping did not help: {self._skips} non-finite intervals in a "
                                     f"row (max_skips={cfg.max_skips}); the weights of step "
                                     f"{self._good_state['step']} were restored. Lower the learning rate and resume "
                                     f"from the last checkpoint.")
        record["skipped"] = True
        self._warn(message + f" Skipped: restored the weights of step {self._good_state['step']} and went on "
                   f"with the next batches ({self._skips} of {cfg.max_skips} skips in a row).", stacklevel=3)

    _ROLLBACK = ("generator", "discriminator", "opt_g", "opt_d", "scaler_g", "scaler_d")

    def _snapshot(self) -> dict:
        """A copy of the networks, optimizers and scalers to roll back to (on_nonfinite='skip'), on the device."""
        return {"step": self.step, **copy.deepcopy({k: getattr(self, k).state_dict() for k in self._ROLLBACK})}

    def _restore(self, snapshot: dict) -> None:
        for key in self._ROLLBACK:  # a copy: optimizers keep the tensors they are given, and would alter these
            getattr(self, key).load_state_dict(copy.deepcopy(snapshot[key]))

    def _weights_finite(self) -> bool:
        params = [p for m in (self.generator, self.discriminator) for p in m.parameters()]
        return bool(torch.stack([torch.isfinite(p).all() for p in params]).all())  # one sync

    def _out_of_memory(self, detail: str) -> OutOfMemory:
        import gc

        cfg = self.cfg
        self.opt_d.zero_grad(set_to_none=True)
        self.opt_g.zero_grad(set_to_none=True)
        self._metric_sum.zero_()
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # so the notebook can run again with a smaller batch
        tips = [f"a smaller batch_size (now {cfg.batch_size})"]
        if cfg.batch_size % (cfg.grad_accum_steps * 2) == 0:
            tips.append(f"the same batch in micro-batches: grad_accum_steps={cfg.grad_accum_steps * 2}")
        if cfg.precision == "fp32":
            tips.append("precision='bf16' (or 'fp16' on GPUs without bf16): about half the activation memory")
        where = (f"the last checkpoint is {self.out_dir / 'checkpoint.pt'}" if (self.out_dir / "checkpoint.pt").is_file()
                 else "no checkpoint was written yet")
        return OutOfMemory(f"out of {self.device.type} memory at step {self.step + 1} (micro-batch "
                           f"{cfg.batch_size // cfg.grad_accum_steps}, {cfg.image_size} px, precision {cfg.precision}). "
                           f"Try {'; or '.join(tips)}. This step was not completed; {where}. "
                           f"Detail: {detail}")

    def _check_scales(self, record: dict) -> None:
        for name in ("d", "g"):
            scale = record.get(f"scale_{name}")
            if scale is not None and scale < SCALE_COLLAPSE:
                record["scale_collapsed"] = True
                net = "discriminator" if name == "d" else "generator"
                self._warn(f"step {self.step}: the {net}'s fp16 GradScaler scale fell to {scale:.3g}: its "
                           f"gradients overflow fp16 even unscaled, so its steps are being skipped. Lower lr_{name} "
                           f"or use precision='bf16'.", stacklevel=4)

    def _warn(self, message: str, stacklevel: int = 3) -> None:
        if self.world.is_main:  # every rank sees the same all-reduced numbers: one warning is enough
            warnings.warn(message, stacklevel=stacklevel)

    @contextlib.contextmanager
    def _excluded_from_timing(self, reset: bool = False):
        """Sampling, checkpoints and callbacks are not training: keep their time out of the step times."""
        hardware.synchronize(self.device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            hardware.synchronize(self.device)
            if reset:
                self._interval_start, self._interval_step = time.perf_counter(), self.step
                self._interval_wait, self._excluded = 0.0, 0.0
            else:
                self._excluded += time.perf_counter() - t0

    def _check_shapes(self) -> None:
        """Run G and D once on two images (eval mode, no state change) so a mismatch fails now, clearly."""
        cfg = self.cfg
        real = self.dataset[0]
        real = real[0] if isinstance(real, (tuple, list)) else real
        expected = (cfg.channels, cfg.image_size, cfg.image_size)
        if tuple(real.shape) != expected:
            raise ConfigError(f"the dataset gives images of shape {tuple(real.shape)}, but the config asks for "
                              f"{expected} (channels, image_size, image_size)")
        modes = (self.generator.training, self.discriminator.training)
        self.generator.eval(), self.discriminator.eval()
        try:
            with torch.no_grad():
                z = torch.randn(2, cfg.nz, generator=torch.Generator().manual_seed(0)).to(self.device)
                try:
                    fake = self.generator(z)
                except Exception as e:
                    raise ConfigError(f"the generator fails on noise of shape (2, {cfg.nz}) (nz={cfg.nz}): {e}") from e
                if tuple(fake.shape[1:]) != expected:
                    raise ConfigError(f"the generator makes images of shape {tuple(fake.shape[1:])}, but the data "
                                      f"is {expected}: match image_size and channels")
                out = self.discriminator(fake)
                if out.numel() != 2:
                    raise ConfigError(f"the discriminator must return one logit per image; for 2 images it "
                                      f"returned shape {tuple(out.shape)}")
        finally:
            self.generator.train(modes[0]), self.discriminator.train(modes[1])

    def _call(self, event: str, *args) -> None:
        for cb in self.callbacks:
            fn = getattr(cb, event, None)
            if fn is not None:
                fn(self, *args)


def _unlabelled(name: str):
    return contextlib.nullcontext()


@contextlib.contextmanager
def _interrupts_stop(trainer: Trainer):
    """Ctrl-C (or Jupyter's interrupt) asks the trainer to stop after the current step instead of killing it
    mid-step; a second Ctrl-C interrupts at once. Under torchrun SIGTERM too: torchrun forwards the signal it gets
    (Ctrl-C, or a scheduler's SIGTERM) to every worker once, and kills those still running 30 s later."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM) if trainer.world.distributed else (signal.SIGINT,)
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def handler(signum, frame):
        signal.signal(signum, previous[signum])
        trainer.stop()

    for sig in signals:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig in signals:
            signal.signal(sig, previous[sig])
