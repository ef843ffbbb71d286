"""One training step of a GAN, in one readable loop: D's steps, then G's. `TrainStep` is `Trainer`'s base class, in a
module of its own so the step reads on one screen; each technique is a line of it (autocast, the scalers,
accumulation's micro-batches, `no_sync`, `freeze_d`, the CUDA-graph mark), and losses, penalties and the EMA are
small objects it calls (losses.py, ema.py).

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
D's gradient.

Under torchrun (see distributed.py) both networks are wrapped in DistributedDataParallel and each process trains on
its share of the global batch. In the G step D is called unwrapped: its weights are frozen there (or their gradients
thrown away), and a DDP-wrapped D would wait for gradients that never come. Micro-batches that do not step run
under `no_sync()`, so gradients are all-reduced once per optimizer step. Only rank 0 writes files.
"""
from __future__ import annotations

import contextlib

import torch

from . import distributed
from .losses import input_gradients
from .network_checks import forward


class TrainStep:
    """The step of `Trainer` (its base class). It works on the trainer's networks (`g`, `d`, `d_in_g_step` as the step
    calls them; `generator`, `discriminator` themselves), optimizers, scalers, `autocast`, `loss`, `penalties`,
    `ema`, its random generator `rng` and the metric sums on the device; it never reads a value back to the host,
    except with `sync_every_step` (the tutorial's way) and with fp16 and an optimizer that is not fused (an explicit
    optimizer_impl 'for-loop' or 'foreach'): GradScaler.step then reads found_inf back once per optimizer step
    (`config.optimizer_kernels`, which makes 'auto' fused for fp16 on CUDA, says why)."""

    def _train_step(self, *batches) -> None:
        """One optimizer step of G after one of D per batch (`d_steps` of them in training, each batch its own
        real images, or (images, labels) for a conditional run). No host sync here: metrics stay on the device
        (fp16 with a non-fused optimizer aside: see the class docstring).
        Under torchrun each batch is this rank's share; noise is drawn for the whole batch and sliced the same way."""
        cfg, phase = self.cfg, self.label_phase
        if self.cuda_graphs:
            # One CUDA-graph generation per training step. Without the mark, CUDA Graph Trees start a new generation
            # at any compiled call made with no backward pending (torch.compiler.cudagraph_mark_step_begin docs), and
            # a new generation overwrites the outputs of the last: with accumulation G runs under no_grad, and D's
            # next call would overwrite the images it is about to judge ("accessing tensor output of CUDAGraphs
            # that has been overwritten by a subsequent run", pytorch/pytorch#122192, #160281). Once marked, only
            # the mark starts a generation (MarkStepBox in torch/_inductor/cudagraph_trees.py), so G, D and their
            # backwards all share the step's generation (the d_steps D steps too, like micro-batches), and nothing
            # is kept across steps: the losses are copied out of the graphs' outputs by eager ops (the loss objects,
            # the metric sums) within the step.
            torch.compiler.cudagraph_mark_step_begin()
        for i, batch in enumerate(batches):
            real, labels = batch if isinstance(batch, (tuple, list)) else (batch, None)
            fakes, zs, ys, d_values = self._d_step(real, labels, self.batches_seen + i, 1 / len(batches),
                                                   keep_fakes=i == len(batches) - 1)
        loss_g = self._g_step(fakes, zs, ys)
        if self.ema is not None:
            with phase("EMA update"):
                self.ema.update()
        if cfg.sync_every_step:  # the tutorial's .item() calls every step: each one waits for the device
            with phase("host sync"):
                self.step_values.append((*(v.item() for v in d_values), loss_g.item()))

    def _d_step(self, real, labels, d_index: int, share: float, keep_fakes: bool):
        """One optimizer step of D on one real batch (its k micro-batches accumulated), with the penalties due at
        this D step (the `d_index`-th of the run: lazy R1 counts them). Returns G's fakes (their graph kept when
        G's step will reuse them, as the tutorial does), the noise and labels, and the last micro-batch's
        (loss_d, d_real, d_fake)."""
        cfg, k, phase = self.cfg, self.cfg.grad_accum_steps, self.label_phase
        zs = self._draw(torch.randn, real.shape[0], cfg.nz).chunk(k)
        mixes = (self._draw(torch.rand, real.shape[0]).chunk(k) if any(p.mixes for p in self.penalties)
                 else [None] * k)
        reals, ys = real.chunk(k), labels.chunk(k) if labels is not None else [None] * k
        weights = [r.shape[0] / real.shape[0] for r in reals]

        self.opt_d.zero_grad(set_to_none=True)
        fakes = []
        for i, (r, y, z, mix, w) in enumerate(zip(reals, ys, zs, mixes, weights)):
            with phase("G forward"), self.autocast():
                if k == 1 and keep_fakes:  # keep G's graph: the G step below reuses this fake, as the tutorial does
                    fake = forward(self.g, z, y)
                    fakes.append(fake)
                else:  # accumulating (holding k graphs would defeat the point: G re-runs in its step), or an
                    with torch.no_grad():  # earlier D step of several
                        fake = forward(self.g, z, y)
            with distributed.no_sync(self.ddp_d, skip=i < k - 1):  # all-reduce with the last micro-batch
                with phase("D forward"):
                    with self.autocast():
                        out_real = forward(self.d, r, y).float()
                        out_fake = forward(self.d, fake.detach(), y).float()
                    loss = self.loss.d(out_real, out_fake)
                penalty = self._penalty(r, fake, y, mix, d_index)
                logged = torch.zeros_like(loss) if penalty is None else penalty.detach()
                if penalty is not None and self.scaler_d.is_enabled():
                    # fp16: an overflow of the scaled input gradient makes the penalty inf; the GradScaler then
                    # skips this D step and lowers its scale, as for any overflow (a scale that keeps falling is
                    # warned about), so the log leaves that step's penalty out rather than stop the run
                    logged = torch.where(logged.isfinite(), logged, 0.0)
                probs = self.loss.outputs == "logits"  # D's outputs reported as probabilities for the logit loss
                d_real = (out_real.sigmoid() if probs else out_real).mean()
                d_fake = (out_fake.sigmoid() if probs else out_fake).mean()
                values = [loss.detach() + logged, d_real.detach(), d_fake.detach(), logged]
                self._metric_sum[:4] += torch.stack(values) * (w * share)
                if penalty is not None:
                    loss = loss + penalty
                with phase("D backward"):
                    self.scaler_d.scale(loss * w).backward()
        with phase("D optimizer step"):
            self.scaler_d.step(self.opt_d)
            self.scaler_d.update()
        return fakes, zs, ys, (loss, d_real, d_fake)

    def _penalty(self, real, fake, labels, mix, d_index: int):
        """The sum of D's penalties due at this D step (None when none is), each on D's gradient with respect to
        its input, taken through D's plain module (`losses.input_gradients`: AMP-correct, no host sync)."""
        total = None
        for penalty in self.penalties:
            if penalty.due(d_index):
                with self.label_phase("D penalty"):
                    grads = input_gradients(lambda x: forward(self.discriminator, x, labels),
                                            penalty.points(real, fake, mix), self.autocast, self.scaler_d)
                    with self.autocast():  # computed under autocast, as PyTorch's AMP recipe does
                        term = penalty(grads).float()
                total = term if total is None else total + term
        return total

    def _g_step(self, fakes, zs, ys) -> torch.Tensor:
        """One optimizer step of G through the updated D (frozen, with `freeze_d`); returns the last micro-batch's
        loss."""
        cfg, k, phase = self.cfg, self.cfg.grad_accum_steps, self.label_phase
        weights = [z.shape[0] / sum(z.shape[0] for z in zs) for z in zs]
        if cfg.freeze_d:  # G's backward then computes no weight gradients for D (they would be thrown away)
            self.discriminator.requires_grad_(False)
        try:
            self.opt_g.zero_grad(set_to_none=True)
            for i, (zi, yi, w) in enumerate(zip(zs, ys, weights)):
                with distributed.no_sync(self.ddp_g, skip=i < k - 1):
                    if k == 1:
                        fake = fakes[i]
                    else:
                        with phase("G forward"), self.autocast():
                            fake = forward(self.g, zi, yi)
                    # D's share of G's step has its own labels, so a profile says where that time goes: D judges
                    # a detached copy of the images, its backward stops at their gradient, and that gradient then
                    # flows through G alone. The chain rule split in two: the same gradients as one backward.
                    judged = fake.detach().requires_grad_()
                    with phase("D forward (G step)"):
                        with self.autocast():
                            out = forward(self.d_in_g_step, judged, yi).float()
                        loss_g = self.loss.g(out)
                        self._metric_sum[4] += loss_g.detach() * w
                    with phase("D backward (G step)"):
                        self.scaler_g.scale(loss_g * w).backward()
                    with phase("G backward"):
                        fake.backward(judged.grad)
            with phase("G optimizer step"):
                self.scaler_g.step(self.opt_g)
                self.scaler_g.update()
        finally:  # also after an exception (out of memory, an interrupt): D must train again next step
            self.discriminator.requires_grad_(True)
        return loss_g

    def _draw(self, sample, n: int, *shape) -> torch.Tensor:
        """Random numbers for this rank's n images from this run's generator: drawn for the whole global batch
        (n per rank) and sliced, so every process count draws the same numbers for the same images."""
        draws = sample(n * self.world.size, *shape, device=self.device, generator=self.rng)
        return self.world.shard(draws)

    @contextlib.contextmanager
    def unchanged(self):
        """Run training code (one step, to count its FLOPs) and leave no trace: the networks (buffers included, and the
        EMA generator), optimizers, scalers, this run's generator, the global RNG, the metric sums and the per-step
        values are put back as they were, so the run goes on exactly as if the block had never run."""
        snapshot, rng = self._rollback.snapshot(self.step), self.rng.get_state()
        metric_sum, values = self._metric_sum.clone(), len(self.step_values)
        try:
            with self._process_state(keep_rng=False):
                yield
        finally:
            self._rollback.restore(snapshot)
            self.rng.set_state(rng)
            self._metric_sum.copy_(metric_sum)
            del self.step_values[values:]

    @contextlib.contextmanager
    def eager(self):
        """The step calls the networks uncompiled (still DDP-wrapped under torchrun) inside the block."""
        saved = self.g, self.d, self.d_in_g_step
        self.g, self.d = self.ddp_g, self.ddp_d
        self.d_in_g_step = self.discriminator if self.world.distributed else self.d
        try:
            yield
        finally:
            self.g, self.d, self.d_in_g_step = saved
