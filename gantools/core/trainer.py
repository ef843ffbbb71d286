"""The one training loop. Every technique the notebooks teach is a TrainConfig field read here, in one place.

The step itself (D's steps, then G's) is `TrainStep` in step.py, Trainer's base: its docstring says how fp16's
scalers, accumulation, n_critic, penalties and DDP meet in it.

A Trainer is self-contained: it leaves the process as it found it. Weights are initialised under a forked, seeded
RNG; noise and flips come from its own `torch.Generator` (`self.rng`, saved in checkpoints); modules that draw
random numbers themselves (dropout) draw from the global RNG, which holds this run's own stream during fit() and the
process's again after; TF32 and cudnn.benchmark are set for the duration of fit() and sampling only. So trainers
built side by side (the benchmark interleaves its variants) each run with their own settings.
"""
from __future__ import annotations

import contextlib
import logging
import math
import signal
import threading
import warnings
from pathlib import Path

import torch
from torch import nn

from . import distributed, recovery
from ..measuring import hardware
from .checkpoint import ensure_writable, load_checkpoint, save_checkpoint
from .config import TrainConfig, discriminator_norm, optimizer_kernels, uses_cuda_graphs
from .data import dataset_from_config, make_loader
from .ema import EMAGenerator
from ..errors import ConfigError, NonFiniteLossError, OutOfMemory  # noqa: F401 (still importable from here)
from .history import METRICS, History
from .losses import LOSSES, d_loss, g_loss, penalties  # noqa: F401 (d_loss, g_loss: public names)
from .models import build_dcgan
from .network_checks import check_networks, dataset_classes
from .recovery import SCALE_COLLAPSE, CompileStats, Rollback  # noqa: F401 (SCALE_COLLAPSE: importable here)
from .sampling import GRID_CLASSES, fixed_noise, generate, grid, save_png, seeded_noise  # noqa: F401 (GRID_CLASSES)
from .process import CHECKPOINT_FORMAT, RunStreams, on_interrupt
from .step import TrainStep
from ..measuring.clock import StepClock

def make_optimizer(params, cfg: TrainConfig, lr: float) -> torch.optim.Optimizer:
    """Adam or AdamW with the kernel implementation the config asks for (for-loop, foreach or fused; 'auto' as
    `config.optimizer_kernels` resolves it on the config's device: fused for fp16 on CUDA)."""
    cls = torch.optim.Adam if cfg.optimizer == "adam" else torch.optim.AdamW
    impl = {"auto": {}, "for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
    kernels = optimizer_kernels(cfg.optimizer_impl, cfg.precision, hardware.resolve_device(cfg.device))
    return cls(params, lr=lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, **impl[kernels])


def _import_cpp_extension_quietly() -> None:
    """Inductor on a CPU imports torch.utils.cpp_extension, which logs "No CUDA runtime is found, using CUDA_HOME=..."
    on a machine with a CUDA toolkit and no GPU: true, and nothing to do with CPU code, yet it shows in every
    notebook that compiles. The import happens once per process, so doing it here with that logger quiet silences only
    that line, and the logger's level is given back."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import torch.utils.cpp_extension  # noqa: F401
    finally:
        logger.setLevel(level)


class Trainer(TrainStep):
    """Trains a GAN for any TrainConfig: the built-in DCGAN or your own `generator` and `discriminator`
    (D must return one logit per image; G must take (B, nz) noise; with `conditional`, G's forward is (z, y) and
    D's (x, y), y the labels), on the config's dataset or your `dataset`.

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
        self.out_dir = Path(cfg.out_dir)
        if self.world.is_main:  # before the process group, the data or the models: one clear error, no traceback
            ensure_writable(self.out_dir)
        distributed.init(dev, self.world)
        if dataset is None:
            with distributed.main_first(self.world):  # rank 0 fills the dataset cache, the others read it
                dataset = dataset_from_config(cfg)
        self.dataset = dataset
        self.classes = dataset_classes(dataset) if cfg.conditional else 0
        self.loss = LOSSES[cfg.loss]
        self.penalties = penalties(cfg)  # D's regularisers: the gradient penalty of wgan-gp, R1
        if generator is None:  # the same weights on every rank; the caller's RNG is not touched
            with hardware.seeded(cfg.seed):  # a penalty is per image: 'auto' gives D layer norm, not BatchNorm
                generator, discriminator = build_dcgan(cfg.image_size, cfg.channels, cfg.nz, cfg.ngf, cfg.ndf,
                                                       sigmoid=(cfg.loss == "bce-sigmoid"),
                                                       d_norm=discriminator_norm(cfg), classes=self.classes)
        if cfg.sync_batchnorm:  # same parameters and buffers, so checkpoints stay interchangeable
            generator = nn.SyncBatchNorm.convert_sync_batchnorm(generator)
            discriminator = nn.SyncBatchNorm.convert_sync_batchnorm(discriminator)
        fmt = torch.channels_last if cfg.channels_last else torch.preserve_format
        self.generator = generator.to(dev, memory_format=fmt)
        self.discriminator = discriminator.to(dev, memory_format=fmt)
        self.ema = EMAGenerator(self.generator, cfg.ema_decay) if cfg.ema_decay else None  # samples come from it
        self.streams = RunStreams(dev, cfg.seed)
        self.rng = self.streams.noise  # this run's own random numbers, on its device: every step's noise, the flips
        self.loader = make_loader(self.dataset, cfg, dev, self.world, self.rng)
        with self._process_state(keep_rng=False):
            check_networks(cfg, self.generator, self.discriminator, self.dataset, dev, self.classes, self.loss,
                           self.penalties)

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
        if cfg.compile != "off" and dev.type == "cpu":
            _import_cpp_extension_quietly()
        compiled = (lambda m: torch.compile(m, mode=mode)) if cfg.compile != "off" else (lambda m: m)
        # the networks as the step calls them: DDP-wrapped under torchrun (for no_sync), then compiled
        self.ddp_g = distributed.wrap(self.generator, dev, self.world)
        self.ddp_d = distributed.wrap(self.discriminator, dev, self.world)
        self.g, self.d = compiled(self.ddp_g), compiled(self.ddp_d)
        self.d_in_g_step = compiled(self.discriminator) if self.world.distributed else self.d
        self._compile_stats = CompileStats() if cfg.compile != "off" else None
        self.cuda_graphs = dev.type == "cuda" and uses_cuda_graphs(cfg.compile)  # the step marks each step's start

        self.fixed_noise, self.fixed_labels = fixed_noise(cfg, self.classes, dev)
        self.step = 0
        self.batches_seen = 0
        self.history = History()
        self.step_values: list[tuple] = []  # per-step losses, only filled with sync_every_step (the tutorial's way)
        self.latest_grid = None
        self.callbacks = list(callbacks)
        self._stop_requested = self._stop_agreed = False
        self._stream = None  # the batch generator, positioned at batches_seen
        self.label_phase = _unlabelled  # set with instrument(): profiling labels each phase of the step
        self.sync_data_wait = False  # set with instrument(): synchronise around every data wait
        self._metric_sum = torch.zeros(len(METRICS), device=dev)
        self.clock = StepClock(dev)
        # on_nonfinite='skip' rolls back the networks (and the EMA generator), optimizers and scalers
        self._rollback = Rollback(lambda: {k: getattr(self, k) for k in ("generator", "discriminator", "opt_g",
                                           "opt_d", "scaler_g", "scaler_d") + (("ema",) if self.ema else ())})

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

    @contextlib.contextmanager
    def instrument(self, label_phase=None, sync_data_wait: bool | None = None):
        """For the block: each phase of the step runs inside `label_phase(name)` (e.g. torch.profiler's
        record_function, so a profile names the phases), and with `sync_data_wait` the device is synchronised around
        every data wait (see StepClock.data_wait). None leaves a setting as it is; both are put back after."""
        saved = self.label_phase, self.sync_data_wait
        if label_phase is not None:
            self.label_phase = label_phase
        if sync_data_wait is not None:
            self.sync_data_wait = sync_data_wait
        try:
            yield self
        finally:
            self.label_phase, self.sync_data_wait = saved

    def train_step(self, *batches) -> None:
        """One training step on `batches` (`cfg.d_steps` of them: one per D step), outside fit(): the step count,
        data position and history do not move (wrap it in `unchanged()` to leave no trace at all)."""
        self._train_step(*batches)

    def close(self) -> None:
        """Done with this trainer's data for now: its DataLoader workers end (with their batch iterator); a later
        fit() starts them again at the current position."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def fit(self, steps: int | None = None) -> History:
        """Train `steps` more steps (default: up to cfg.steps). Returns the history of the whole run."""
        cfg = self.cfg
        end = self.step + steps if steps is not None else cfg.steps
        if self.cuda_graphs and threading.current_thread() is not threading.main_thread():
            # CUDA graph trees keep their state per thread and assert in threads Python started
            # (pytorch/pytorch#123177, "torch.compile+cudagraphs asserts in multithreaded context"; its fix cannot be
            # assumed in the torch versions our users run). Refused rather than guessed.
            raise ConfigError(f"compile='{cfg.compile}' (CUDA graphs) cannot train in a background thread (the "
                              "widget panel trains in one): use compile='default' there, or train from the main "
                              "thread (a notebook cell, a script, the CLI)")
        self._stop_requested = self._stop_agreed = False
        if self._stream is None:  # kept across fit() calls: DataLoader workers are not restarted each time
            self._stream = self._batches()
        batches = self._stream
        self.history.quality = {}  # set again by metrics.QualityCallback for this fit
        with self._process_state(keep_rng=True):
            self._call("on_fit_start")
            if cfg.on_nonfinite == "skip" and self._rollback.good is None:
                self._rollback.keep(self.step)
            hardware.reset_peak_memory(self.device)
            self.clock.start(self.step, self.batches_seen,
                             self.history[-1]["train_time_s"] if len(self.history) else 0.0)
            if self._compile_stats is not None:
                self._compile_stats.start()
            # Ctrl-C (or Jupyter's interrupt) stops after the current step instead of killing it mid-step. Under
            # torchrun SIGTERM too: torchrun forwards the signal it gets (Ctrl-C, or a scheduler's SIGTERM) to every
            # worker once, and kills those still running 30 s later.
            signals = (signal.SIGINT, signal.SIGTERM) if self.world.distributed else (signal.SIGINT,)
            with on_interrupt(lambda signum, frame: self.stop(), signals):
                while self.step < end and not self._stopping():
                    oom, reals = None, ()
                    try:  # fetching a batch can run out of device memory too (its copy to the GPU)
                        reals = self._next_batches(batches)  # one real batch per D step
                        self._train_step(*reals)
                    except BaseException as e:
                        # a generator that raised is finished (its next() is StopIteration), and one that did not
                        # is past this unfinished step's batches: the next fit() starts a fresh stream at them
                        self.close()
                        if isinstance(e, OutOfMemory) or not recovery.is_out_of_memory(e):
                            raise
                        oom = str(e).splitlines()[0] if str(e) else "out of memory"
                    if oom is not None:  # outside the except block, so the failed step's tensors can be freed
                        self.opt_d.zero_grad(set_to_none=True)
                        self.opt_g.zero_grad(set_to_none=True)
                        self._metric_sum.zero_()
                        raise recovery.out_of_memory(oom, cfg, self.device, self.step,
                                                     self.out_dir / "checkpoint.pt")
                    self.step += 1
                    self.batches_seen += len(reals)
                    self._call("on_step_end")
                    if self.step % cfg.log_interval == 0 or self.step == end or self._stopping():
                        self._log()
                    if cfg.sample_interval and self.step % cfg.sample_interval == 0 or self.step == end:
                        with self.clock.excluded():
                            self.sample()
                    if cfg.checkpoint_interval and self.step % cfg.checkpoint_interval == 0:
                        with self.clock.excluded():  # never replace a good checkpoint with NaN weights
                            if recovery.weights_finite(self.generator, self.discriminator):
                                self.save_checkpoint()
            if self.step > self.clock.interval_step:
                self._log()
            if self.latest_grid is None or self._stopping():
                self.sample()
            self.save_checkpoint()
            distributed.barrier(self.world)  # every rank returns once the checkpoint is on disk
            self._call("on_fit_end")
        return self.history

    def _next_batches(self, batches) -> list:
        """The step's `d_steps` batches (one per D step), their wait timed as one (see StepClock.data_wait)."""
        with self.clock.data_wait(self.step, self.sync_data_wait, self.label_phase):
            return [next(batches) for _ in range(self.cfg.d_steps)]

    def _process_state(self, keep_rng: bool):
        """This run's settings and module stream for the block (see RunStreams.applied)."""
        return self.streams.applied(keep_rng, self.cfg.tf32, self.cfg.cudnn_benchmark, _BUSY)

    @torch.no_grad()
    def sample(self, noise: torch.Tensor | None = None, labels: torch.Tensor | None = None):
        """A grid (H, W, 3 uint8 numpy) of the generator's images (the EMA generator's, with `ema_decay`) for the
        fixed noise, 8 per row (a conditional run: one row per class); saved as a PNG (by rank 0). Under torchrun
        every rank generates the same grid, in step: SyncBatchNorm layers need all ranks there."""
        if noise is None:
            noise, labels = self.fixed_noise, self.fixed_labels
        elif self.cfg.conditional and labels is None:
            labels = torch.arange(len(noise)) % self.classes
        with self._process_state(keep_rng=False):
            images = self._generate(noise.to(self.device), None if labels is None else labels.to(self.device))
        self.latest_grid = grid(images)
        if self.world.is_main:
            save_png(self.latest_grid, self.out_dir / "samples" / f"step_{self.step:06d}.png")
        self._call("on_sample", self.step, self.latest_grid)
        return self.latest_grid

    @torch.no_grad()
    def generate(self, n: int, seed: int = 0, batch_size: int = 256, labels: torch.Tensor | None = None,
                 ema: bool = True):
        """n images in [-1, 1] (CPU float), from seeded noise, for quality metrics; by the EMA generator when
        `ema_decay` is set (`ema=False`: by the trained generator itself). A conditional run draws them for `labels`
        (default: each class in turn, `torch.arange(n) % classes`)."""
        if self.cfg.conditional and labels is None:
            labels = torch.arange(n) % self.classes
        with self._process_state(keep_rng=False):
            return torch.cat([self._generate(z.to(self.device), None if y is None else y.to(self.device), ema).cpu()
                              for z, y in seeded_noise(n, self.cfg.nz, seed, batch_size, labels)])

    def _generate(self, noise: torch.Tensor, labels: torch.Tensor | None = None, ema: bool = True) -> torch.Tensor:
        """The generator's images (the EMA generator's, unless `ema=False`) for `noise` and `labels`."""
        return generate(self.ema.module if self.ema is not None and ema else self.generator, noise, labels,
                        self.autocast)

    def state_dict(self) -> dict:
        """Everything a resumed run needs to continue exactly; `rng`: see RunStreams.state_dict."""
        return {
            "format": CHECKPOINT_FORMAT, "step": self.step, "batches_seen": self.batches_seen,
            "config": self.cfg.to_dict(),
            "generator": self.generator.state_dict(), "discriminator": self.discriminator.state_dict(),
            "opt_g": self.opt_g.state_dict(), "opt_d": self.opt_d.state_dict(),
            "scaler_g": self.scaler_g.state_dict(), "scaler_d": self.scaler_d.state_dict(),
            "rng": self.streams.state_dict(), "history": self.history.records,
            **({"ema": self.ema.state_dict()} if self.ema is not None else {}),
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
        if self.ema is not None and "ema" in state:
            try:
                self.ema.load_state_dict(state["ema"])
            except RuntimeError as e:
                raise ConfigError(f"the checkpoint's EMA generator does not match this config's generator: "
                                  f"{str(e).splitlines()[0]}") from e
        elif self.ema is not None:
            self.ema.reset()
            self._warn(f"the checkpoint has no EMA generator (it was trained without ema_decay): the average starts "
                       f"now, from the generator of step {state['step']}")
        self.step, self.batches_seen = state["step"], state["batches_seen"]
        self._stream = None  # restart the data stream at the restored position
        self._rollback.forget()
        self.history = History(state["history"])
        warning = self.streams.load_state_dict(state["rng"], state["format"], self.step)
        if warning:
            self._warn(warning, stacklevel=2)

    def save_checkpoint(self, path=None) -> Path:
        """The whole run state, atomically (the previous checkpoint stays until the new one is complete), and the
        history beside it, so a crash at any moment leaves a consistent run to resume. Under torchrun only rank 0
        writes: the networks are unwrapped (no DDP "module." prefix), so any process count can resume it."""
        path = Path(path) if path else self.out_dir / "checkpoint.pt"
        if self.world.is_main:
            save_checkpoint(self.state_dict(), path)
            self.history.save(self.out_dir / "history.json")
        return path

    # -- bookkeeping --------------------------------------------------------------------------------------------
    def _stopping(self) -> bool:
        """One process stops as soon as asked. Ranks must stop at the same step, so under torchrun a request (on
        any rank: a callback, Ctrl-C forwarded by torchrun) takes effect where they agree on it, at a log interval."""
        return self._stop_agreed if self.world.distributed else self._stop_requested

    def _batches(self):
        """Endless batches, starting exactly where the run left off (epoch and batch within it). The position is
        counted here, batch by batch: `batches_seen` only moves once a step is done, and a step of several D steps
        can cross the end of an epoch."""
        position = self.batches_seen
        while True:
            epoch, batch = divmod(position, len(self.loader))
            self.loader.set_position(epoch, batch)
            for real in self.loader:
                position += 1
                yield real

    def _log(self) -> None:
        times = self.clock.interval(self.step, self.batches_seen, self.cfg.batch_size)
        if times is None:
            return
        values = self._metric_sum / (self.step - self.clock.interval_step)
        if self.world.distributed:  # every rank logs, and decides on, the same averages
            values, self._stop_agreed = distributed.mean_and_any(values, self._stop_requested)
        values = values.tolist()  # the one host sync of the interval
        self._metric_sum.zero_()
        record = {"step": self.step, **dict(zip(METRICS, values)), **times}
        for name, scaler in (("d", self.scaler_d), ("g", self.scaler_g)):
            if scaler.is_enabled():
                record[f"scale_{name}"] = scaler.get_scale()
        if self._compile_stats is not None:
            record.update(self._compile_stats.read())
        self.history.records.append(record)
        recovery.check_scales(record, self.step, self._warn, self.device)
        if self._compile_stats is not None:
            recovery.check_compiles(self.history.records, self.step, self.cfg.compile, self._warn)
        bad = [name for name, v in (("discriminator", record["loss_d"]), ("generator", record["loss_g"]))
               if not math.isfinite(v)]
        if bad:
            self._rollback.non_finite(record, bad, self.cfg, self.step, self.step - self.clock.interval_step,
                                      self._warn)
        elif self.cfg.on_nonfinite == "skip":
            with self.clock.excluded():  # finite average losses can still end in a NaN update
                if recovery.weights_finite(self.generator, self.discriminator):
                    self._rollback.keep(self.step)
        with self.clock.excluded(restart_at=(self.step, self.batches_seen)):
            self._call("on_log", record)

    def _warn(self, message: str, stacklevel: int = 3) -> None:
        if self.world.is_main:  # every rank sees the same all-reduced numbers: one warning is enough
            warnings.warn(message, stacklevel=stacklevel)

    def _call(self, event: str, *args) -> None:
        for cb in self.callbacks:
            fn = getattr(cb, event, None)
            if fn is not None:
                fn(self, *args)


_BUSY = ("another Trainer is training in this process right now (the widget panel's run, in its background "
         "thread?): TF32, cuDNN and RNG settings are process-wide, so two at once would run with each other's. Stop "
         "it first (the panel's Stop button), then run this one")


def _unlabelled(name: str):
    return contextlib.nullcontext()
