"""One training step of a GAN, in one readable loop: D's steps, then G's. `TrainStep` is an object the `Trainer`
builds and owns, given everything the step works on (the networks, optimizers, scalers, autocast, loss, penalties,
EMA, random generator and metric sums), so the step reads on one screen; each technique is a line of it (autocast,
the scalers, accumulation's micro-batches, `no_sync`, `freeze_d`, the CUDA-graph mark), and losses, penalties and the
EMA are small objects it calls (losses.py, ema.py).

GradScaler policy (fp16): one scaler per network. D and G are stepped at different moments with losses and
gradients of very different sizes; with its own scaler each network's scale follows its own overflows, and
`update()` runs right after that network's `step()`. A single shared scaler would have to wait for both steps before
`update()`, and an overflow in D would also halve the scale that G's (healthy) gradients use.

Gradient accumulation for a GAN: the batch is split into k micro-batches. All k D micro-batches are accumulated and D
steps once; only then are the k G micro-batches accumulated, through the *updated* D, and G steps once. Each
micro-loss is weighted by its share of the batch, so k micro-batches give the same gradients as one full batch on a
model without batch statistics (BatchNorm sees k smaller batches: the notebook on accumulation shows the cost).

D steps per G step (`d_steps`, n_critic): each D step takes its own real batch, so a step reads `d_steps` batches and
the data position (`batches_seen`) advances by as many; images/s and "images trained" count real images, and a step
in the history is a G step. G's step judges the fakes of the last D step, as the tutorial's loop does with its one.

Losses and penalties live in losses.py, the EMA of G in ema.py; the step calls them. A penalty's D forward runs
through D's plain module (never compiled, never DDP-wrapped: `losses.input_gradients` says why) and its term joins
D's loss in the one backward of that micro-batch, so accumulation, `no_sync` and DDP's all-reduce see it as part of
D's gradient. Where the loss's own D forward is that plain module (no compile, no DDP), a penalty at the real or the
fake images (R1, R2) reuses it: the images go in with their gradients kept, and the penalty differentiates the
loss's outputs, one D forward fewer per penalty, as R3GAN's own code does (`reuses_d_forward`).

Under torchrun (see distributed.py) both networks are wrapped in DistributedDataParallel and each process trains on
its share of the global batch. In the G step D is called unwrapped: its weights are frozen there (or their gradients
thrown away), and a DDP-wrapped D would wait for gradients that never come. Micro-batches that do not step run
under `no_sync()`, so gradients are all-reduced once per optimizer step. Only rank 0 writes files.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from . import distributed
from .history import METRICS
from .losses import gradients_at, input_gradients, target_like
from .network_checks import forward
from .recovery import Rollback


class MetricSums:
    """The step's running sums of `METRICS` on the device, added by name and read once per log interval: the step
    never reads them back to the host. Each metric's slot is a view into the one tensor of sums, so one foreach add
    (one launch) adds a call's values, whichever metrics it names."""

    def __init__(self, device: torch.device):
        self.sums = torch.zeros(len(METRICS), device=device)
        self._slots = dict(zip(METRICS, self.sums.unbind(), strict=True))  # views: adding to one adds to `sums`

    def add(self, weight: float, **values: torch.Tensor) -> None:
        """Add each named value times `weight` (a float: the share of the step these values stand for; a weight
        of 1 multiplies nothing).

        Args:
            weight: the share of the step these values stand for.
            **values: 0-d float tensors on the device, by metric name.
        """
        slots = [self._slots[name] for name in values]
        if weight == 1:
            torch._foreach_add_(slots, list(values.values()))
        else:
            torch._foreach_add_(slots, list(values.values()), alpha=weight)

    def zero(self) -> None:
        self.sums.zero_()


@dataclass(kw_only=True)
class StepParts:
    """What the step works on, all built by the Trainer: the plain networks, their optimizers and GradScalers, the
    autocast context, the loss, D's penalties, the EMA of G (or None), this run's random generator, the process
    (`world`) and its device."""

    generator: nn.Module
    discriminator: nn.Module
    opt_g: torch.optim.Optimizer
    opt_d: torch.optim.Optimizer
    scaler_g: torch.amp.GradScaler
    scaler_d: torch.amp.GradScaler
    autocast: Callable
    loss: object
    penalties: list = field(default_factory=list)
    ema: object = None
    rng: torch.Generator
    world: distributed.World
    device: torch.device

    def stateful(self) -> dict:
        """The parts a checkpoint saves and a rollback restores, by checkpoint key (the EMA only when kept)."""
        return {"generator": self.generator, "discriminator": self.discriminator, "opt_g": self.opt_g,
                "opt_d": self.opt_d, "scaler_g": self.scaler_g, "scaler_d": self.scaler_d,
                **({"ema": self.ema} if self.ema is not None else {})}


class TrainStep:
    """One training step on the parts it is given (`StepParts`). It calls the networks as `g`, `d` and
    `d_in_g_step`: DDP-wrapped under torchrun (`ddp_g`, `ddp_d`, for `no_sync`), then compiled with `compiled`. It
    never reads a value back to the host, except with `sync_every_step` (the tutorial's way) and with fp16 and an
    optimizer that is not fused (an explicit optimizer_impl 'for-loop' or 'foreach'): GradScaler.step then reads
    found_inf back once per optimizer step (`config.optimizer_kernels`, which makes 'auto' fused on CUDA,
    says why)."""

    def __init__(self, cfg, parts: StepParts, *, compiled: Callable, cuda_graphs: bool, metrics: MetricSums,
                 step_values: list, phase: Callable):
        """
        Args:
            cfg: the run's TrainConfig.
            parts: the networks, optimizers, scalers and the rest the step works on.
            compiled: (module, call site) -> the module as the step calls it there (torch.compile, or the module).
            cuda_graphs: mark each step's start as a new CUDA-graph generation.
            metrics: the sums each step adds its losses and D's outputs to.
            step_values: filled with each step's values with `sync_every_step`.
            phase: name -> a context manager each phase of the step runs in (profiling labels them).
        """
        self.cfg, self.parts, self.cuda_graphs = cfg, parts, cuda_graphs
        self.metrics, self.step_values, self.label_phase = metrics, step_values, phase
        self.ddp_g = distributed.wrap(parts.generator, parts.device, parts.world)
        self.ddp_d = distributed.wrap(parts.discriminator, parts.device, parts.world)
        self.g, self.d = compiled(self.ddp_g, "G"), compiled(self.ddp_d, "D")
        # D in G's step: a call site of its own (its input needs a gradient there: `builders.build_compiler`)
        self.d_in_g_step = compiled(parts.discriminator if parts.world.distributed else self.ddp_d, "D in G's step")
        self.reuses_d_forward = self.d is parts.discriminator  # D's loss forward can serve R1 and R2 (see above)
        self.restores = 0  # times the parts' state was put back (new optimizer state tensors: a CUDA graph recaptures)

    def __call__(self, *batches, first_d_index: int) -> None:
        """One optimizer step of G after one of D per batch (`d_steps` of them in training, each batch its own
        real images, or (images, labels) for a conditional run). No host sync here: metrics stay on the device
        (fp16 with a non-fused optimizer aside: see the class docstring).
        Under torchrun each batch is this rank's share; noise is drawn for the whole batch and sliced the same way.

        Args:
            *batches: one real batch per D step.
            first_d_index: how many D steps the run made before this step (lazy penalties count them).
        """
        cfg, phase = self.cfg, self.label_phase
        if self.cuda_graphs:
            # One CUDA-graph generation per training step. Without the mark, CUDA Graph Trees start a new generation
            # at any compiled call made with no backward pending (torch.compiler.cudagraph_mark_step_begin docs), and
            # a new generation overwrites the outputs of the last: with accumulation G runs under no_grad, and D's
            # next call would overwrite the images it is about to judge ("accessing tensor output of CUDAGraphs
            # that has been overwritten by a subsequent run"). Once marked, only the mark starts a generation
            # (MarkStepBox in torch/_inductor/cudagraph_trees.py), so G, D and their backwards all share the step's
            # generation (the d_steps D steps too, like micro-batches), and nothing is kept across steps: the losses
            # are copied out of the graphs' outputs by eager ops (the loss objects, the metric sums) within the step.
            torch.compiler.cudagraph_mark_step_begin()
        for i, batch in enumerate(batches):
            real, labels = batch if isinstance(batch, (tuple, list)) else (batch, None)
            fakes, zs, ys, d_values = self._d_step(real, labels, first_d_index + i, 1 / len(batches),
                                                   keep_fakes=i == len(batches) - 1)
        loss_g = self._g_step(fakes, zs, ys, real.chunk(cfg.grad_accum_steps))
        if self.parts.ema is not None:
            with phase("EMA update"):
                self.parts.ema.update()
        if cfg.sync_every_step:  # the tutorial's .item() calls every step: each one waits for the device
            with phase("host sync"):
                self.step_values.append((*(v.item() for v in d_values), loss_g.item()))

    def _d_step(self, real, labels, d_index: int, share: float, keep_fakes: bool):
        """One optimizer step of D on one real batch (its k micro-batches accumulated), with the penalties due at
        this D step (the `d_index`-th of the run: lazy R1 counts them). Returns G's fakes (their graph kept when
        G's step will reuse them, as the tutorial does), the noise and labels, and the last micro-batch's
        (loss_d, d_real, d_fake)."""
        cfg, k = self.cfg, self.cfg.grad_accum_steps
        zs = self._draw(torch.randn, real.shape[0], cfg.nz).chunk(k)
        mixes = (self._draw(torch.rand, real.shape[0]).chunk(k) if any(p.mixes for p in self.parts.penalties)
                 else [None] * k)
        reals, ys = real.chunk(k), labels.chunk(k) if labels is not None else [None] * k
        weights = [r.shape[0] / real.shape[0] for r in reals]

        self.parts.opt_d.zero_grad(set_to_none=True)
        fakes, keep = [], k == 1 and keep_fakes
        for i, (r, y, z, mix, w) in enumerate(zip(reals, ys, zs, mixes, weights, strict=True)):
            fake = self._fake(z, y, keep)
            if keep:
                fakes.append(fake)
            with distributed.no_sync(self.ddp_d, skip=i < k - 1):  # all-reduce with the last micro-batch
                values = self._d_micro_batch(r, fake, y, mix, w, share, d_index)
        with self.label_phase("D optimizer step"):
            self.parts.scaler_d.step(self.parts.opt_d)
            self.parts.scaler_d.update()
        return fakes, zs, ys, values

    def _fake(self, z, y, keep: bool) -> torch.Tensor:
        """G's images for one micro-batch of D's step; with `keep`, with G's graph."""
        with self.label_phase("G forward"), self.parts.autocast():
            if keep:  # keep G's graph: the G step reuses this fake, as the tutorial does
                return forward(self.g, z, y)
            with torch.no_grad():  # accumulating (holding k graphs would defeat the point: G re-runs in its step),
                return forward(self.g, z, y)  # or an earlier D step of several

    def _d_micro_batch(self, real, fake, labels, mix, w: float, share: float, d_index: int):
        """D's loss and penalties on one micro-batch (weight `w` of the batch, `share` of the step), added to the
        metric sums and backpropagated. Returns (loss_d, d_real, d_fake)."""
        phase = self.label_phase
        due = [p for p in self.parts.penalties if p.due(d_index)]
        # R1 and R2 on the loss's forward; the fakes as the penalty's own forward takes them, in the reals' dtype
        # (G's autocast output would make R2's input gradients 16-bit, unscaled in fp16)
        shared = [p for p in due if getattr(p, "on", None) in ("real", "fake") and self.reuses_d_forward]
        on = {p.on for p in shared}
        real_in = real.detach().requires_grad_(True) if "real" in on else real
        fake_in = fake.detach().to(real.dtype).requires_grad_(True) if "fake" in on else fake.detach()
        if self.d is not self.ddp_d and (fake_in.stride(), fake_in.dtype) != (real_in.stride(), real_in.dtype):
            # compiled D: one call site, one input layout and dtype, or its guards fail and it recompiles; G's
            # images (16-bit from its autocast, laid out as G's last layer left them) copied as the batch is, once
            fake_in = torch.empty_strided(real_in.shape, real_in.stride(), dtype=real_in.dtype,
                                          device=fake_in.device).copy_(fake_in).requires_grad_(fake_in.requires_grad)
        with phase("D forward"):
            with self.parts.autocast():
                out_real = forward(self.d, real_in, labels).float()
                out_fake = forward(self.d, fake_in, labels).float()
            loss = self.parts.loss.d(out_real, out_fake)
        at = {"real": (out_real, real_in), "fake": (out_fake, fake_in)}
        penalty = self._penalty(real, fake, labels, mix, due, {p: at[p.on] for p in shared})
        probs = self.parts.loss.outputs == "logits"  # D's outputs reported as probabilities for the logit loss
        d_real = (out_real.sigmoid() if probs else out_real).mean()
        d_fake = (out_fake.sigmoid() if probs else out_fake).mean()
        if penalty is None:  # the penalty's sum stays as it is: nothing to add, no zeros made to add them
            self.metrics.add(w * share, loss_d=loss.detach(), d_real=d_real.detach(), d_fake=d_fake.detach())
        else:
            logged = penalty.detach()
            if self.parts.scaler_d.is_enabled():
                # fp16: an overflow of the scaled input gradient makes the penalty inf; the GradScaler then
                # skips this D step and lowers its scale, as for any overflow (a scale that keeps falling is
                # warned about), so the log leaves that step's penalty out rather than stop the run
                logged = torch.where(logged.isfinite(), logged, 0.0)
            self.metrics.add(w * share, loss_d=loss.detach() + logged, d_real=d_real.detach(),
                             d_fake=d_fake.detach(), penalty=logged)
            loss = loss + penalty
        with phase("D backward"):
            _backward(self.parts.scaler_d.scale(_weighted(loss, w)))
        return loss, d_real, d_fake

    def _penalty(self, real, fake, labels, mix, due: list, shared: dict):
        """The sum of the penalties `due` at this D step (None when none is), each on D's gradient with respect to
        its input (AMP-correct, no host sync): of the loss forward's outputs where `shared` holds them (penalty ->
        (outputs, inputs)), else through a forward of D's plain module (`losses.input_gradients`)."""
        total = None
        for penalty in due:
            with self.label_phase("D penalty"):
                if penalty in shared:
                    grads = gradients_at(*shared[penalty], self.parts.scaler_d)
                else:
                    grads = input_gradients(lambda x: forward(self.parts.discriminator, x, labels),
                                            penalty.points(real, fake, mix), self.parts.autocast, self.parts.scaler_d)
                with self.parts.autocast():  # computed under autocast, as PyTorch's AMP recipe does
                    term = penalty(grads).float()
            total = term if total is None else total + term
        return total

    def _g_step(self, fakes, zs, ys, reals) -> torch.Tensor:
        """One optimizer step of G through the updated D (frozen, with `freeze_d`); returns the last micro-batch's
        loss. `reals`: the last D step's real micro-batches, which a paired (relativistic) loss scores G's against."""
        cfg, k = self.cfg, self.cfg.grad_accum_steps
        weights = [z.shape[0] / sum(z.shape[0] for z in zs) for z in zs]
        if cfg.freeze_d:  # G's backward then computes no weight gradients for D (they would be thrown away)
            self.parts.discriminator.requires_grad_(False)
        try:
            self.parts.opt_g.zero_grad(set_to_none=True)
            for i, (zi, yi, w) in enumerate(zip(zs, ys, weights, strict=True)):
                with distributed.no_sync(self.ddp_g, skip=i < k - 1):
                    loss_g = self._g_micro_batch(fakes[i] if k == 1 else None, zi, yi, w, reals[i])
            with self.label_phase("G optimizer step"):
                self.parts.scaler_g.step(self.parts.opt_g)
                self.parts.scaler_g.update()
        finally:  # also after an exception (out of memory, an interrupt): D must train again next step
            self.parts.discriminator.requires_grad_(True)
        return loss_g

    def _g_micro_batch(self, fake, z, labels, w: float, real) -> torch.Tensor:
        """G's loss on one micro-batch (weight `w`), through D, added to the metric sums and backpropagated; `fake`
        is D's step's kept one, or None to run G here; `real`, scored without a graph for a paired loss only (D's
        scores on real images are constants to G). Returns the loss."""
        phase = self.label_phase
        if fake is None:
            with phase("G forward"), self.parts.autocast():
                fake = forward(self.g, z, labels)
        # D's share of G's step has its own labels, so a profile says where that time goes: D judges
        # a detached copy of the images, its backward stops at their gradient, and that gradient then
        # flows through G alone. The chain rule split in two: the same gradients as one backward.
        judged = fake.detach().requires_grad_()
        with phase("D forward (G step)"):
            with self.parts.autocast():
                out = forward(self.d_in_g_step, judged, labels).float()
                against = None
                if self.parts.loss.paired:  # a relativistic loss: D's scores on real images, constants to G
                    with torch.no_grad():
                        against = forward(self.d_in_g_step, real, labels).float()
            loss_g = self.parts.loss.g(out, against)
            self.metrics.add(w, loss_g=loss_g.detach())
        with phase("D backward (G step)"):
            _backward(self.parts.scaler_g.scale(_weighted(loss_g, w)))
        with phase("G backward"):
            fake.backward(judged.grad)
        return loss_g

    def _draw(self, sample, n: int, *shape) -> torch.Tensor:
        """Random numbers for this rank's n images from this run's generator: drawn for the whole global batch
        (n per rank) and sliced, so every process count draws the same numbers for the same images."""
        draws = sample(n * self.parts.world.size, *shape, device=self.parts.device, generator=self.parts.rng)
        return self.parts.world.shard(draws)

    @contextlib.contextmanager
    def unchanged(self, process_state):
        """Run training code inside `process_state` (the run's settings and module stream, left as they were after)
        and leave no trace: the networks (buffers included, and the EMA generator), optimizers, scalers, the run's
        generator, the metric sums and the per-step values are put back as they were."""
        rollback = Rollback(self.parts.stateful)
        snapshot, rng = rollback.snapshot(0), self.parts.rng.get_state()
        metric_sums, values = self.metrics.sums.clone(), len(self.step_values)
        try:
            with process_state:
                yield
        finally:
            rollback.restore(snapshot)
            self.restores += 1
            self.parts.rng.set_state(rng)
            self.metrics.sums.copy_(metric_sums)
            del self.step_values[values:]

    def forget(self) -> None:
        """Drop what a step that failed midway left: both networks' gradients and the metric sums."""
        self.parts.opt_d.zero_grad(set_to_none=True)
        self.parts.opt_g.zero_grad(set_to_none=True)
        self.metrics.zero()

    @contextlib.contextmanager
    def eager(self):
        """The step calls the networks uncompiled (still DDP-wrapped under torchrun) inside the block."""
        saved = self.g, self.d, self.d_in_g_step
        self.g, self.d = self.ddp_g, self.ddp_d
        self.d_in_g_step = self.parts.discriminator if self.parts.world.distributed else self.d
        try:
            yield
        finally:
            self.g, self.d, self.d_in_g_step = saved


def _weighted(loss: torch.Tensor, weight: float) -> torch.Tensor:
    """A micro-batch's loss times its share of the batch: the loss itself for the whole batch (a multiplication by
    1 would be a launch, and one more in the backward, for nothing)."""
    return loss if weight == 1 else loss * weight


def _backward(loss: torch.Tensor) -> None:
    """`loss.backward()` from a cached 1 (`losses.target_like`): `backward()` alone makes the ones it starts from
    with a launch at every call."""
    loss.backward(target_like(loss, 1.0))
