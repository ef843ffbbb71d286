"""Checks on a user's networks and data before the first step: shapes, each network's forward contract, D's output
against the loss, and no BatchNorm in a D whose input gradient is penalised. Each mistake is one clear ConfigError
at construction, instead of a shape error deep in a step, or a run that trains silently wrong."""
from __future__ import annotations

import inspect

import torch
from torch import nn

from .data import CachedFolder, ImageFolderDataset, num_classes
from ..errors import ConfigError


def forward(net, x: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
    """A network's forward: forward(x) unconditional, forward(x, labels) conditional."""
    return net(x) if labels is None else net(x, labels)


def dataset_classes(dataset) -> int:
    """The number of classes a conditional run's labels name; at least 2, or there is nothing to condition on."""
    classes = num_classes(dataset)
    if classes >= 2:
        return classes
    if isinstance(dataset, (ImageFolderDataset, CachedFolder)):
        raise ConfigError(f"conditional=True needs class labels, but {dataset.root} has no class "
                          f"sub-folders (its images are one class): put each class's images in a sub-folder "
                          f"named after the class, or set conditional=False")
    raise ConfigError(f"conditional=True needs at least 2 classes; the dataset's labels name {classes}: set "
                      f"conditional=False")


def check_networks(cfg, generator: nn.Module, discriminator: nn.Module, dataset, device: torch.device,
                   classes: int, loss, penalties) -> None:
    """Run G and D once on two images (eval mode, no state change) so a mismatch fails now, clearly: shapes,
    each network's contract (with `conditional`, forward(z, y) and forward(x, y); else forward(z) and
    forward(x)), D's output against the loss, and no BatchNorm in a D whose input gradient is penalised."""
    item = dataset[0]
    real = item[0] if isinstance(item, (tuple, list)) else item
    expected = (cfg.channels, cfg.image_size, cfg.image_size)
    if tuple(real.shape) != expected:
        raise ConfigError(f"the dataset gives images of shape {tuple(real.shape)}, but the config asks for "
                          f"{expected} (channels, image_size, image_size)")
    if cfg.conditional and not isinstance(item, (tuple, list)):
        raise ConfigError("conditional=True needs labels, but the dataset yields bare images: make it yield "
                          "(image, label) pairs, or set conditional=False")
    y = torch.tensor([0, classes - 1], device=device) if cfg.conditional else None
    check_contract(generator, "generator", "z", cfg.conditional)
    check_contract(discriminator, "discriminator", "x", cfg.conditional)
    check_penalty_norms(discriminator, penalties)
    modes = (generator.training, discriminator.training)
    generator.eval(), discriminator.eval()
    try:
        with torch.no_grad():
            z = torch.randn(2, cfg.nz, generator=torch.Generator().manual_seed(0)).to(device)
            try:
                fake = forward(generator, z, y)
            except Exception as e:
                given = f"noise of shape (2, {cfg.nz}) (nz={cfg.nz})" + (" and labels (2,)" if y is not None
                                                                         else "")
                raise ConfigError(f"the generator fails on {given}: {e}") from e
            if tuple(fake.shape[1:]) != expected:
                raise ConfigError(f"the generator makes images of shape {tuple(fake.shape[1:])}, but the data "
                                  f"is {expected}: match image_size and channels")
        with torch.enable_grad():  # D's autograd graph shows whether its output comes out of a sigmoid
            try:
                out = forward(discriminator, fake.detach().requires_grad_(), y)
            except Exception as e:
                given = f"2 images of shape {expected}" + (" and labels (2,)" if y is not None else "")
                raise ConfigError(f"the discriminator fails on {given}: {e}") from e
        if out.numel() != 2:
            raise ConfigError(f"the discriminator must return one logit per image; for 2 images it "
                              f"returned shape {tuple(out.shape)}")
        check_d_output(out, cfg.loss, loss.outputs)
    finally:
        generator.train(modes[0]), discriminator.train(modes[1])


def check_penalty_norms(discriminator: nn.Module, penalties) -> None:
    """A gradient penalty is per image; BatchNorm normalises each image by statistics of the whole batch, so
    each image's gradient would depend on the others' and the penalty would constrain the wrong function
    (WGAN-GP's paper, section 4: "we omit batch normalization in the critic")."""
    if not penalties:
        return
    norms = [name for name, m in discriminator.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if norms:
        what = " and ".join(p.name for p in penalties)
        raise ConfigError(f"the {what} penalises D's gradient image by image, but the discriminator has "
                          f"BatchNorm ({', '.join(norms[:3])}{', ...' if len(norms) > 3 else ''}), which mixes "
                          f"the images of a batch: replace it by a per-image norm (nn.GroupNorm(1, C) is layer "
                          f"norm, nn.InstanceNorm2d) or none; the built-in discriminator does so for penalties")


def check_d_output(out: torch.Tensor, loss: str, wants: str) -> None:
    """D's output must match the loss (`wants`: its `outputs`): logits for bce, raw scores for hinge, lsgan and
    wgan-gp, probabilities for bce-sigmoid. A D ending in a Sigmoid (as the PyTorch DCGAN example's does) trained with
    BCE-with-logits runs without any error and learns the wrong thing, so it is refused here. Told apart by structure,
    never by value: the output comes out of a sigmoid op (nn.Sigmoid, torch.sigmoid; through view/squeeze-like ops),
    seen in its autograd graph; a Sigmoid module D registers but does not apply last (in a `predict()`, say) does not
    count. "All outputs in (0, 1)" is no test: an untrained logit DCGAN's two check outputs are near zero and both
    in (0, 1) about half the time (19 of 40 seeds)."""
    probabilities = comes_from_sigmoid(out)
    if wants != "probabilities" and probabilities:
        why = ("BCE-with-logits on probabilities trains silently wrong" if wants == "logits" else
               "squashed into (0, 1) they train silently wrong (hinge margins, least-squares targets and a "
               "Wasserstein critic need unbounded scores)")
        raise ConfigError(f"the discriminator ends in a Sigmoid, but loss={loss!r} expects logits (raw scores): "
                          f"{why}. Remove the final Sigmoid (BCEWithLogitsLoss applies it for you, safely under "
                          f"autocast), or use loss='bce-sigmoid' (Sigmoid + BCELoss, the tutorial's way) with "
                          f"precision='fp32'")
    if wants == "probabilities" and not probabilities:
        raise ConfigError("loss='bce-sigmoid' (BCELoss) needs probabilities, but the discriminator's output does "
                          "not come out of a sigmoid: end it with nn.Sigmoid, or use loss='bce', which takes its "
                          "logits as they are")


def check_contract(module: nn.Module, name: str, arg: str, conditional: bool) -> None:
    """Whether `module.forward` takes what the run will give it: (arg) unconditional, (arg, y) conditional. Told
    from its signature, so the error names the contract it follows; a forward taking *args is left to the call."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required, most = sum(p.default is p.empty for p in positional), len(positional)
    signature = f"forward({', '.join(p.name for p in positional)})"
    if conditional and most < 2:
        raise ConfigError(f"conditional=True gives the {name} labels, forward({arg}, y), but its {signature} takes "
                          f"none (an unconditional {name}): give it a second argument y (class indices, shape (B,)), "
                          f"or set conditional=False")
    if not conditional and required >= 2:
        raise ConfigError(f"the {name}'s {signature} needs labels (a conditional {name}, forward({arg}, y)), but "
                          f"conditional=False gives it only {arg}: set conditional=True (the labels come from the "
                          f"dataset), or give y a default")
    if required > 2 or most < 1:
        raise ConfigError(f"the {name}'s {signature} fits neither contract: forward({arg}) (unconditional) or "
                          f"forward({arg}, y) (conditional=True)")


_VIEWS = ("View", "Reshape", "UnsafeView", "Squeeze", "Unsqueeze", "Flatten", "Clone", "ToCopy", "Alias",
          "Expand", "Permute", "Transpose", "T")


def comes_from_sigmoid(out: torch.Tensor) -> bool:
    """Whether `out` is a sigmoid's output, seen through reshapes and copies, from its autograd graph."""
    node = out.grad_fn
    while node is not None and node.name().rstrip("0123456789").removesuffix("Backward") in _VIEWS:
        node = next((fn for fn, _ in node.next_functions if fn is not None), None)
    return node is not None and node.name().startswith("SigmoidBackward")
