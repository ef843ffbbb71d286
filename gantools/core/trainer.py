"""The one training loop. Every technique the notebooks teach is a TrainConfig field read here, in one place.

The step itself (D's steps, then G's) is a `TrainStep` (step.py) the Trainer builds from its parts and owns
(`trainer.stepper`): its docstring says how fp16's scalers, accumulation, n_critic, penalties and DDP meet in it.

A Trainer is self-contained: it leaves the process as it found it. Weights are initialised under a forked, seeded
RNG; noise and flips come from its own `torch.Generator` (`self.rng`, saved in checkpoints); modules that draw
random numbers themselves (dropout) draw from the global RNG, which holds this run's own stream during fit() and the
process's again after; TF32 and cudnn.benchmark are set for the duration of fit() and sampling only. So trainers
built side by side (the benchmark interleaves its variants) each run with their own settings.
"""
from __future__ import annotations

import contextlib
import math
import signal
import threading
import warnings
from pathlib import Path

import torch
from torch import nn

from . import distributed, recovery
from ..measuring import hardware
from .checkpoint import ensure_writable, load_checkpoint, load_parts, save_checkpoint
from .batches import BatchStream
from .builders import build_compiler, build_networks, build_precision
from .config import TrainConfig, optimizer_kernels, uses_cuda_graphs
from .data import dataset_from_config
from .graphed_step import GraphedStep
from .loaders import IndexBatches, make_loader
from .ema import EMAGenerator
from ..errors import ConfigError, OutOfMemory
from .history import METRICS, History
from .losses import LOSSES, penalties
from .network_checks import check_networks, dataset_classes
from .recovery import Rollback
from .sampling import fixed_noise, generate, grid, save_png, seeded_noise
from .process import CHECKPOINT_FORMAT, RunStreams, on_interrupt
from .step import MetricSums, StepParts, TrainStep
from ..measuring.clock import StepClock
from ..measuring.compile_counts import CompileStats
from .lr_schedule import ScheduledRates
from .step_memory import StepMemory


def make_optimizer(params, cfg: TrainConfig, lr: float) -> torch.optim.Optimizer:
    """Adam or AdamW with the kernel implementation the config asks for (for-loop, foreach or fused; 'auto' as
    `config.optimizer_kernels` resolves it on the config's device: fused on CUDA)."""
    cls = torch.optim.Adam if cfg.optimizer == "adam" else torch.optim.AdamW
    impl = {"auto": {}, "pytorch": {}, "for-loop": {"foreach": False}, "foreach": {"foreach": True},
            "fused": {"fused": True}}
    kernels = optimizer_kernels(cfg.optimizer_impl, hardware.resolve_device(cfg.device))
    # a CUDA-graphed step captures the optimizer's step: Optimizer._cuda_graph_capture_health_check refuses a
    # capture unless every group is `capturable` (the step counters then stay on the device)
    capture = {"capturable": True} if cfg.cuda_graphs else {}
    return cls(params, lr=lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, **impl[kernels], **capture)


def join_world(cfg: TrainConfig) -> tuple:
    """This process's place: its rank (one process of one, unless torchrun started it), device and the process
    group; the output folder is checked first, so an unwritable one is one clear error before any work.

    Returns:
        (world, device, out_dir)
    """
    world = distributed.world()
    device = distributed.device(cfg.device, world)
    out_dir = Path(cfg.out_dir)
    if world.is_main:  # before the process group, the data or the models: one clear error, no traceback
        ensure_writable(out_dir)
    distributed.init(device, world)
    return world, device, out_dir


def load_dataset(cfg: TrainConfig, world, dataset=None) -> tuple:
    """The run's dataset (the config's, unless given) and its class count (0 unless the run is conditional).

    Returns:
        (dataset, classes)
    """
    if dataset is None:
        with distributed.main_first(world):  # rank 0 fills the dataset cache, the others read it
            dataset = dataset_from_config(cfg)
    return dataset, dataset_classes(dataset) if cfg.conditional else 0


def refuse_background_thread(cuda_graphs: bool, compile_mode: str, whole_step: bool = False) -> None:
    """CUDA graph trees keep their state per thread and assert in threads Python started (a limitation of the
    torch versions users run), and a whole-step capture (`whole_step`) in torch.cuda.graph's default "global" mode
    fails when another thread allocates GPU memory meanwhile (its docs): training there is refused rather than
    guessed."""
    if not (cuda_graphs or whole_step) or threading.current_thread() is threading.main_thread():
        return
    what, instead = (("cuda_graphs=True", "cuda_graphs=False") if whole_step else
                     (f"compile='{compile_mode}' (CUDA graphs)", "compile='default'"))
    raise ConfigError(f"{what} cannot train in a background thread (the widget panel trains in one): use {instead} "
                      "there, or train from the main thread (a notebook cell, a script, the CLI)")


def stop_signals(world) -> tuple:
    """The signals that stop a run after its current step instead of killing it mid-step: Ctrl-C (or Jupyter's
    interrupt), and under torchrun SIGTERM too: torchrun forwards the signal it gets (Ctrl-C, or a scheduler's
    SIGTERM) to every worker once, and kills those still running after a grace period."""
    return (signal.SIGINT, signal.SIGTERM) if world.distributed else (signal.SIGINT,)


def interval_record(step: int, values: list, times: dict, scaler_d, scaler_g, compile_stats) -> dict:
    """One log interval's history record: the averages of `METRICS` (in their order), the clock's times, each
    enabled GradScaler's scale and the compile counts (with compile on).

    Args:
        step: the step the interval ends at.
        values: the interval's averages, in the order of `METRICS`.
        times: the clock's figures for the interval.
        scaler_d, scaler_g: the networks' GradScalers.
        compile_stats: CompileStats, or None with compile off.
    """
    record = {"step": step, **dict(zip(METRICS, values, strict=True)), **times}
    for name, scaler in (("d", scaler_d), ("g", scaler_g)):
        if scaler.is_enabled():
            record[f"scale_{name}"] = scaler.get_scale()
    if compile_stats is not None:
        record.update(compile_stats.read())
    return record


class Trainer:
    """Trains a GAN for any TrainConfig: the DCGAN or your own networks and data. `stop()` (or Ctrl-C) ends a run
    cleanly between steps, with a checkpoint. Under torchrun callbacks run in every process (`world.is_main`: rank 0).

    Args:
        cfg: the run's knobs; None: TrainConfig().
        generator, discriminator: yours, or neither for the DCGAN: G takes (B, nz) noise, D returns one logit per
            image; with `conditional` G's forward is (z, y) and D's (x, y), y the labels.
        dataset: your Dataset (items: (image, label) pairs, or images); None: the config's.
        callbacks: objects with any of `on_fit_start(trainer)`, `on_step_end(trainer)` (each step; keep it host-only:
            a tensor read syncs), `on_log(trainer, record)`, `on_sample(trainer, step, grid)`, `on_fit_end(trainer)`.
    Raises:
        ConfigError, DataError: a config, dataset or pair of networks refused before any training."""

    def __init__(self, cfg: TrainConfig | None = None, *, generator: nn.Module | None = None,
                 discriminator: nn.Module | None = None, dataset=None, callbacks=()):
        self.cfg = cfg = (cfg if cfg is not None else TrainConfig()).validate()
        if (generator is None) != (discriminator is None):
            raise ConfigError("pass both generator and discriminator, or neither (for the built-in DCGAN)")
        self.world, self.device, self.out_dir = join_world(cfg)
        self.dataset, self.classes = load_dataset(cfg, self.world, dataset)
        self.loss, self.penalties = LOSSES[cfg.loss], penalties(cfg)  # penalties: wgan-gp's gradient penalty, R1
        self.generator, self.discriminator = build_networks(cfg, generator, discriminator, self.classes, self.device)
        self.ema = EMAGenerator(self.generator, cfg.ema_decay) if cfg.ema_decay else None  # samples come from it
        self.streams = RunStreams(self.device, cfg.seed)
        self.rng = self.streams.noise  # this run's own random numbers, on its device: every step's noise, the flips
        self.loader = make_loader(self.dataset, cfg, self.device, self.world, self.rng)
        with self._process_state(keep_rng=False):
            check_networks(cfg, self.generator, self.discriminator, self.dataset, self.device, self.classes,
                           self.loss, self.penalties)
        self.opt_g = make_optimizer(self.generator.parameters(), cfg, cfg.lr_g)
        self.opt_d = make_optimizer(self.discriminator.parameters(), cfg, cfg.lr_d)
        self.rates = ScheduledRates.of(cfg, {self.opt_g: cfg.lr_g, self.opt_d: cfg.lr_d})
        self.scaler_g, self.scaler_d, self.autocast = build_precision(cfg, self.device)
        self.stepper = self._build_step()
        # fit() trains through one CUDA graph of the whole step (`graphed_step`), fed its batches' indices
        self.graphed = GraphedStep(self.stepper, self.loader, self.rng) if cfg.cuda_graphs else None
        self._start_run_state(callbacks)

    def _build_step(self) -> TrainStep:
        """The step, given the parts it works on, and the metric sums it adds to."""
        parts = StepParts(generator=self.generator, discriminator=self.discriminator, opt_g=self.opt_g,
                          opt_d=self.opt_d, scaler_g=self.scaler_g, scaler_d=self.scaler_d, autocast=self.autocast,
                          loss=self.loss, penalties=self.penalties, ema=self.ema, rng=self.rng, world=self.world,
                          device=self.device)
        self.metrics = MetricSums(self.device)
        self.step_values: list[tuple] = []  # per-step losses, only filled with sync_every_step (the tutorial's way)
        self._compile_stats = CompileStats() if self.cfg.compile != "off" else None
        return TrainStep(self.cfg, parts, compiled=build_compiler(self.cfg, self.device),
                         cuda_graphs=self.device.type == "cuda" and uses_cuda_graphs(self.cfg.compile),
                         metrics=self.metrics, step_values=self.step_values,
                         phase=lambda name: self.label_phase(name))

    def _start_run_state(self, callbacks) -> None:
        """A fresh run: step 0, an empty history, the sample grid's fixed noise, no stop asked."""
        self.fixed_noise, self.fixed_labels = fixed_noise(self.cfg, self.classes, self.device)
        self.step = self.batches_seen = 0
        self.history = History()
        self.latest_grid = None
        self.callbacks = list(callbacks)
        self._stop_requested = self._stop_agreed = False
        self._stream = None  # the BatchStream, positioned at batches_seen
        self.label_phase = _unlabelled  # set with instrument(): profiling labels each phase of the step
        self.sync_data_wait = False  # set with instrument(): synchronise around every data wait
        self.clock = StepClock(self.device)
        self.memory = StepMemory()  # the peak tensor memory of this trainer's second step (a resumed run: its own)
        self._rollback = Rollback(self.stepper.parts.stateful)  # on_nonfinite='skip' rolls the parts back

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
        self.label_phase = saved[0] if label_phase is None else label_phase
        self.sync_data_wait = saved[1] if sync_data_wait is None else sync_data_wait
        try:
            yield self
        finally:
            self.label_phase, self.sync_data_wait = saved

    def train_step(self, *batches) -> None:
        """One training step on `batches` (`cfg.d_steps` of them: one per D step), as fit() runs it; outside fit()
        the step count, data position and history do not move (wrap it in `unchanged()` to leave no trace at all)."""
        self.rates.set(self.step)
        self.stepper(*batches, first_d_index=self.batches_seen)

    def unchanged(self):
        """A block that leaves no trace (`TrainStep.unchanged`), the global RNG included: e.g. a step to count FLOPs."""
        return self.stepper.unchanged(self._process_state(keep_rng=False))

    def close(self) -> None:
        """Ends the DataLoader workers (and their batch iterator); a later fit() starts them again where the run is."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def fit(self, steps: int | None = None) -> History:
        """Train `steps` more steps (default: up to cfg.steps).

        Returns:
            the history of the whole run.
        """
        end = self.step + steps if steps is not None else self.cfg.steps
        refuse_background_thread(self.stepper.cuda_graphs, self.cfg.compile, self.cfg.cuda_graphs)
        self._stop_requested = self._stop_agreed = False
        if self._stream is None:  # kept across fit() calls: DataLoader workers are not restarted each time
            # a graphed step's batches are their indices (`graphed_step`)
            self._stream = BatchStream(IndexBatches(self.loader) if self.graphed else self.loader, self.batches_seen)
        self.history.quality = {}  # set again by metrics.QualityCallback for this fit
        with self._process_state(keep_rng=True):
            self._start_fit()
            with on_interrupt(lambda signum, frame: self.stop(), stop_signals(self.world)):
                while self.step < end and not self._stopping():
                    self._fit_step(end)
            self._end_fit()
        return self.history

    def _start_fit(self) -> None:
        """What a fit() does before its first step: callbacks told, rollback point kept, clock and counters started."""
        self._call("on_fit_start")
        if self.cfg.on_nonfinite == "skip" and self._rollback.good is None:
            self._rollback.keep(self.step)
        self.clock.start(self.step, self.batches_seen,
                         self.history[-1]["train_time_s"] if len(self.history) else 0.0)
        if self._compile_stats is not None:
            self._compile_stats.start()

    def _fit_step(self, end: int) -> None:
        """One step of fit(), then what is due after it: a log record, a sample grid, a checkpoint."""
        cfg = self.cfg
        reals = self._guarded_step()
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

    def _guarded_step(self) -> list:
        """The step's batches, fetched and trained on (returned); out of device memory there is one clear error."""
        oom, reals = None, ()
        try:
            reals = self._next_batches(self._stream)  # one real batch per D step (their indices, graphed)
            if self.graphed is not None:
                self.graphed(reals, self.batches_seen, lambda *batches: self.memory.train(self, list(batches)))
            else:
                self.memory.train(self, reals)
        except BaseException as e:
            # a generator that raised is finished (its next() is StopIteration), and one that did not
            # is past this unfinished step's batches: the next fit() starts a fresh stream at them
            self.close()
            if isinstance(e, OutOfMemory) or not recovery.is_out_of_memory(e):
                raise
            oom = str(e).splitlines()[0] if str(e) else "out of memory"
        if oom is not None:  # outside the except block, so the failed step's tensors can be freed
            self.stepper.forget()
            raise recovery.out_of_memory(oom, self.cfg, self.device, self.step, self.out_dir / "checkpoint.pt")
        return reals

    def _end_fit(self) -> None:
        """What a fit() does after its last step: the last log and grid, a checkpoint every rank waits for."""
        if self.step > self.clock.interval_step:
            self._log()
        if self.latest_grid is None or self._stopping():
            self.sample()
        self.save_checkpoint()
        distributed.barrier(self.world)  # every rank returns once the checkpoint is on disk
        self._call("on_fit_end")

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
        return {"format": CHECKPOINT_FORMAT, "step": self.step, "batches_seen": self.batches_seen,
                "config": self.cfg.to_dict(), **{k: v.state_dict() for k, v in self.stepper.parts.stateful().items()},
                "rng": self.streams.state_dict(), "history": self.history.records}

    def load_state(self, state: dict) -> None:
        """Continue from a checkpoint's state (`load_checkpoint`): parts, position, history and random streams."""
        warning = load_parts(self.stepper.parts.stateful(), state)
        self.stepper.restores += 1  # the optimizers hold new state tensors (a CUDA graph captures again)
        if warning:
            self._warn(warning)
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

    def _log(self) -> None:
        times = self.clock.interval(self.step, self.batches_seen, self.cfg.batch_size)
        if times is None:
            return
        values = self.metrics.sums / (self.step - self.clock.interval_step)
        if self.world.distributed:  # every rank logs, and decides on, the same averages
            values, self._stop_agreed = distributed.mean_and_any(values, self._stop_requested)
        values = values.tolist()  # the one host sync of the interval
        self.metrics.zero()
        times["peak_mem_mb"] = self.memory.peak_mb
        record = interval_record(self.step, values, times, self.scaler_d, self.scaler_g, self._compile_stats)
        self.history.records.append(record)
        check_record(self, record)
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


def check_record(trainer: Trainer, record: dict) -> None:
    """What a new log record may call for: a warning on a collapsing GradScaler scale or on recompiles, and for
    losses that are not finite, `on_nonfinite`'s answer (stop, or roll back); a healthy interval is the one
    `on_nonfinite='skip'` rolls back to."""
    recovery.check_scales(record, trainer.step, trainer._warn, trainer.device)
    if trainer._compile_stats is not None:
        recovery.check_compiles(trainer.history.records, trainer.step, trainer.cfg.compile, trainer._warn)
    bad = [name for name, v in (("discriminator", record["loss_d"]), ("generator", record["loss_g"]))
           if not math.isfinite(v)]
    if bad:
        trainer._rollback.non_finite(record, bad, trainer.cfg, trainer.step,
                                     trainer.step - trainer.clock.interval_step, trainer._warn)
    elif trainer.cfg.on_nonfinite == "skip":
        with trainer.clock.excluded():  # finite average losses can still end in a NaN update
            if recovery.weights_finite(trainer.generator, trainer.discriminator):
                trainer._rollback.keep(trainer.step)


_BUSY = ("another Trainer is training in this process right now (the widget panel's run, in its background "
         "thread?): TF32, cuDNN and RNG settings are process-wide, so two at once would run with each other's. Stop "
         "it first (the panel's Stop button), then run this one")


def _unlabelled(name: str):
    return contextlib.nullcontext()
