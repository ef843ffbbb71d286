"""The GAN losses and D's regularisers, one small object each, so the step (`step.TrainStep.__call__`) stays one
readable loop.

A loss (`LOSSES[name]`) gives D's loss from its outputs on real and fake images and G's loss from its outputs on
fakes (and, for a relativistic loss, `paired`, on real images too), all in fp32, and says what D must output:
`logits` (bce: BCE-with-logits applies the sigmoid itself, safely under autocast), `probabilities` (bce-sigmoid: the
PyTorch tutorial's Sigmoid + BCELoss, fp32 only) or `scores` (hinge, lsgan, wgan-gp, rpgan: raw outputs, never
squashed).

A penalty (`penalties(cfg)`) regularises D through the gradient of its output with respect to its input, per image:
- `GradientPenalty` (WGAN-GP, Gulrajani et al. 2017): weight * E[(||grad D(x_hat)||_2 - 1)^2] at random points
  x_hat = a * real + (1 - a) * fake between real and fake images, a ~ U(0, 1) per image.
- `R1` (Mescheder et al. 2018): gamma / 2 * E[||grad D(x)||^2] on real images; `R2` the same on G's images (R3GAN,
  Huang et al. 2024, penalises both). One `ZeroCentredPenalty`, told where to take the gradient. Lazy as in StyleGAN2
  (Karras et al. 2020): computed every `interval` D steps only and weighted by `interval`, so on average it pulls as
  hard as the penalty every step, at 1/interval of its cost.
The gradient is taken per image, so D must treat each image on its own: BatchNorm (statistics over the batch) would
make each image's gradient depend on the others'. The trainer refuses a D with BatchNorm for a penalty, and builds its
own D with layer normalisation instead (as WGAN-GP's paper recommends).

`input_gradients` is the AMP-correct gradient of D with respect to its input (PyTorch's AMP examples, "Gradient
penalty"), with no host sync.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


@functools.cache
def _filled(shape: torch.Size, value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A constant target (all `value`), made once per shape, dtype and device rather than at every loss call: one
    launch fewer each time. Never evicted: a captured CUDA graph reads it by address for as long as it replays (a
    few small tensors per process: one per batch shape and value). Made outside inference mode, so a first call
    under it (sampling, a check) still gives a tensor the training's backward can save."""
    with torch.inference_mode(False):
        return torch.full(shape, value, dtype=dtype, device=device)


def target_like(x: torch.Tensor, value: float) -> torch.Tensor:
    """The cached constant target (`_filled`) of x's shape, dtype and device: never written to, so sharing is
    safe."""
    return _filled(x.shape, value, x.dtype, x.device)


class Loss:
    """What every loss says about itself: its `name`, what D must `outputs`, and whether G's loss is `paired` (needs
    D's outputs on real images beside those on its fakes: a relativistic loss). `d(real, fake)` and
    `g(fake, real)` take D's outputs; a loss that is not paired ignores `real` in `g`."""

    name, outputs, paired = "", "scores", False


class BCE(Loss):
    """Non-saturating GAN (Goodfellow et al. 2014): D classifies real against fake with binary cross-entropy on
    its logits; G maximises log D(G(z)) rather than minimising log(1 - D(G(z))), which saturates early on."""

    name, outputs = "bce", "logits"

    def _bce(self, x: torch.Tensor, target: float) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(x, target_like(x, target))

    def d(self, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
        return self._bce(real, 1.0) + self._bce(fake, 0.0)

    def g(self, fake: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
        return self._bce(fake, 1.0)


class BCESigmoid(BCE):
    """The PyTorch DCGAN tutorial's loss: D ends in a Sigmoid and BCELoss takes its probabilities (fp32 only: in
    16-bit a sigmoid rounds to exactly 1.0 and BCELoss's log(1 - p) to log(0))."""

    name, outputs = "bce-sigmoid", "probabilities"

    def _bce(self, x: torch.Tensor, target: float) -> torch.Tensor:
        return F.binary_cross_entropy(x, target_like(x, target))


class Hinge(Loss):
    """Hinge loss (Lim & Ye 2017; SAGAN, BigGAN): D pushes real scores above 1 and fake ones below -1."""

    name, outputs = "hinge", "scores"

    def d(self, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
        return F.relu(1 - real).mean() + F.relu(1 + fake).mean()

    def g(self, fake: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
        return -fake.mean()


class LSGAN(Loss):
    """Least squares (Mao et al. 2017, a = 0, b = c = 1): D regresses real images to 1 and fakes to 0; G pulls its
    fakes' scores to 1. Gradients do not vanish for fakes D already scores far from the real ones."""

    name, outputs = "lsgan", "scores"

    def d(self, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((real - 1) ** 2).mean() + 0.5 * (fake ** 2).mean()

    def g(self, fake: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
        return 0.5 * ((fake - 1) ** 2).mean()


class Wasserstein(Loss):
    """WGAN (Arjovsky et al. 2017): the critic D maximises E[D(real)] - E[D(fake)], an estimate of the Wasserstein
    distance if D is 1-Lipschitz; the gradient penalty (`GradientPenalty`) is what keeps it so in WGAN-GP."""

    name, outputs = "wgan-gp", "scores"

    def d(self, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
        return fake.mean() - real.mean()

    def g(self, fake: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
        return -fake.mean()


class RpGAN(Loss):
    """Relativistic pairing GAN (Jolicoeur-Martineau 2019; R3GAN's loss, Huang et al. 2024, with R1 and R2): each
    real image is scored against a fake one, D's loss E[softplus(-(D(real) - D(fake)))] and G's
    E[softplus(-(D(fake) - D(real)))], means over the batch's pairs (pair i: the i-th real and fake images). Only
    differences of D's outputs count, so D gives raw scores; G's loss needs D's scores on real images too (`paired`:
    the step scores the last D step's real batch again, through the updated D, with no gradient, since they are
    constants to G; R3GAN draws a fresh real batch for its G step)."""

    name, outputs, paired = "rpgan", "scores", True

    def d(self, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
        return F.softplus(-(real - fake)).mean()

    def g(self, fake: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
        if real is None:
            raise ValueError("loss='rpgan' pairs each fake with a real image: G's loss needs D's outputs on both")
        return F.softplus(-(fake - real)).mean()


LOSSES = {loss.name: loss for loss in (BCE(), Hinge(), BCESigmoid(), LSGAN(), Wasserstein(), RpGAN())}


def d_loss(loss: str, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """Discriminator loss from its outputs on real and fake images (fp32)."""
    return LOSSES[loss].d(real, fake)


def g_loss(loss: str, fake: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
    """Generator loss from D's outputs on fake images, and on real ones for a paired loss (fp32)."""
    return LOSSES[loss].g(fake, real)


# -- penalties on D's input gradient ------------------------------------------------------------------------------

def input_gradients(d, x: torch.Tensor, autocast, scaler: torch.amp.GradScaler) -> torch.Tensor:
    """grad_x D(x), one gradient per image, as a graph the penalty's backward can differentiate (`create_graph`).

    `d(x)` returns D's outputs on `x` (with the labels, for a conditional D). It must be D's plain module: not
    compiled, since torch.compile (AOTAutograd) does not support double backward (it raises "torch.compile with
    aot_autograd does not currently support double backward", pytorch/pytorch#91469 and #92348; without #181606,
    which torch 2.11 lacks, compiled gradients from `create_graph=True` silently lose their graph, #181581, so a
    compiled penalty would not train D at all); and not DistributedDataParallel's wrapper, whose
    documentation says it does not work with `torch.autograd.grad()`: the gradient here is taken with respect to
    the input only, which fires none of DDP's parameter hooks, and the penalty then joins D's loss in the one
    backward that DDP all-reduces (see `step.TrainStep.__call__`).

    Mixed precision follows PyTorch's AMP examples, "Gradient penalty" (docs.pytorch.org/docs/stable/notes/
    amp_examples.html): D's forward runs under autocast; with fp16 the output is scaled by the GradScaler before
    `autograd.grad`, so small input gradients do not underflow in fp16, and the gradients are unscaled before the
    penalty uses them. What is scaled is D's mean output, as the recipe scales a loss (see the comment below). The
    recipe unscales with `1 / scaler.get_scale()`, a Python float read from the device: a host sync ("get_scale
    incurs a CPU-GPU sync", its docstring). Dividing by `scaler.scale(ones)`, the scale as a device tensor, unscales
    the same way with no sync. An overflow makes the gradients inf; the penalty and D's
    gradients are then inf too, and the scaler skips D's step and lowers its scale, as for any overflow. Without a
    scaler (fp32, bf16) the gradients are used as they come."""
    x = x.detach().requires_grad_(True)
    with autocast():
        out = d(x)
    return gradients_at(out, x, scaler)


def gradients_at(out: torch.Tensor, x: torch.Tensor, scaler: torch.amp.GradScaler) -> torch.Tensor:
    """grad_x of D's outputs `out` (computed from `x`, a leaf that requires grad) as a graph (`create_graph`),
    AMP-correct as `input_gradients` says: the step calls it on the outputs of D's loss forward where that forward
    can serve the penalty too (R1 at the real images, R2 at the fakes; as R3GAN's own code does), saving a forward."""
    if not scaler.is_enabled():
        (grads,) = torch.autograd.grad(out.float().sum(), x, create_graph=True)
        return grads
    # the scaled mean, as the AMP recipe scales a loss: the gradient reaching each of D's fp16 outputs is then
    # scale / batch; the scaled sum would send the scale itself (2**16 at the start), past fp16's largest value
    # (65504), so every fp16 run's first penalty would overflow. D scores each image on its own (no BatchNorm with a
    # penalty), so the batch times the mean's gradient is the sum's.
    (grads,) = torch.autograd.grad(scaler.scale(out.float().mean()), x, create_graph=True)
    return grads * (out.shape[0] / scaler.scale(torch.ones((), device=x.device)))


class GradientPenalty:
    """WGAN-GP's penalty: weight * E[(||grad D(x_hat)||_2 - 1)^2] at x_hat = mix * real + (1 - mix) * fake."""

    name, mixes = "gradient penalty", True

    def __init__(self, weight: float = 10.0):
        self.weight = weight

    def due(self, d_step: int) -> bool:
        return True

    def points(self, real: torch.Tensor, fake: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
        return torch.lerp(fake.detach().to(real.dtype), real, mix.view(-1, *[1] * (real.dim() - 1)))

    def __call__(self, grads: torch.Tensor) -> torch.Tensor:
        return self.weight * ((grads.flatten(1).norm(2, dim=1) - 1) ** 2).mean()


# StyleGAN2's lazy interval for R1 (its config's d_reg_interval): the doctor's lazy form and tune's use it.
LAZY_INTERVAL = 16


class ZeroCentredPenalty:
    """gamma / 2 * E[||grad D(x)||^2] at real images (`on` 'real': R1) or at G's images ('fake': R2); lazily every
    `interval` D steps, then weighted by `interval`. Zero-centred: it pulls D's gradient towards 0 there, so D
    cannot grow steep around the data (R1) or around G's images (R2); R3GAN's local convergence needs both. A lazy
    penalty is added to the loss of the D step it is due in, so D's optimizer steps as often as without it and needs
    none of StyleGAN2's lr and beta correction, which is for its penalty run as a separate optimizer step
    (docs/gan-family.md)."""

    name, mixes, on = "zero-centred penalty", False, "real"

    def __init__(self, gamma: float, interval: int = 1):
        self.gamma, self.interval = gamma, interval

    def due(self, d_step: int) -> bool:
        return d_step % self.interval == 0

    def points(self, real: torch.Tensor, fake: torch.Tensor, mix: torch.Tensor | None) -> torch.Tensor:
        return real if self.on == "real" else fake.detach().to(real.dtype)

    def __call__(self, grads: torch.Tensor) -> torch.Tensor:
        return self.interval * self.gamma / 2 * grads.flatten(1).pow(2).sum(1).mean()


class R1(ZeroCentredPenalty):
    """R1 (Mescheder et al. 2018): the zero-centred penalty at real images."""

    name, on = "R1", "real"


class R2(ZeroCentredPenalty):
    """R2: the zero-centred penalty at G's images (detached: it trains D only, as R3GAN's does)."""

    name, on = "R2", "fake"


def penalties(cfg) -> list:
    """The penalties a config asks for, in the order they are added to D's loss."""
    found = []
    if cfg.loss == "wgan-gp":
        found.append(GradientPenalty(cfg.gp_weight))
    if cfg.r1_gamma > 0:
        found.append(R1(cfg.r1_gamma, cfg.r1_interval))
    if cfg.r2_gamma > 0:
        found.append(R2(cfg.r2_gamma, cfg.r2_interval))
    return found


# -- what D's normalisation lets it see ---------------------------------------------------------------------------

def ground_sensitivity(discriminator: torch.nn.Module, real: torch.Tensor, fake: torch.Tensor,
                       ground: float = -0.5) -> dict:
    """D's mean score on a batch of `real` images, on the same images with their background lifted to `ground` (a
    grey that every image of the batch shares; `metrics.with_background`), and on a batch of `fake` images, D in
    training mode as in a step (BatchNorm: each batch's own statistics); `share`: how far the grey ground alone moves
    the real images' score towards the fakes' (0: D cannot see it; 1: as far as a fake).

    D sees real and fake images in separate batches, so BatchNorm normalises each batch by its own statistics:
    whatever every image of a batch shares is largely subtracted away after D's first layer. A per-image norm (layer
    norm) or none keeps it visible. Scored on a copy of D, so the run's D and its BatchNorm statistics are
    untouched."""
    import copy

    from .metrics import _signed, with_background

    d = copy.deepcopy(discriminator).train()
    device = next(d.parameters()).device
    with torch.no_grad():
        score = lambda x: d(x.to(device)).float().mean().item()  # noqa: E731
        on_real, on_grey, on_fake = score(_signed(real)), score(with_background(real, ground)), score(_signed(fake))
    return {"real": on_real, "real_on_grey": on_grey, "fake": on_fake,
            "share": (on_real - on_grey) / (on_real - on_fake)}
