"""Activation checkpointing: the same training in less memory, BatchNorm's running statistics kept exact."""
import copy

import pytest
import torch
from torch import nn

from gantools import ConfigError, Trainer
from gantools.core.activation_checkpointing import blocks, run
from gantools.core.models import build_dcgan
from gantools.measuring.memory import step_peak_bytes


def _pair(**size):
    torch.manual_seed(0)
    return build_dcgan(32, 1, **{"nz": 16, "ngf": 16, "ndf": 16, **size})


def test_the_built_in_networks_are_cut_before_each_convolution():
    g, d = _pair()
    for network in (g, d):
        parts = blocks(network.main)
        assert len(parts) == 4 and all(isinstance(p[0], (nn.Conv2d, nn.ConvTranspose2d)) for p in parts)
        assert sum(len(p) for p in parts) == len(network.main), "every layer in exactly one block"


def _train_g_step(g, checkpointed):
    g.checkpointed = checkpointed
    z = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    g(z).square().mean().backward()
    return {n: p.grad for n, p in g.named_parameters()}


def test_gradients_and_batchnorm_buffers_equal_an_uncheckpointed_network():
    plain, _ = _pair()
    checked = copy.deepcopy(plain)
    grads = _train_g_step(plain, False), _train_g_step(checked, True)
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=0, atol=0, msg=name)
    for (name, a), (_, b) in zip(plain.named_buffers(), checked.named_buffers(), strict=True):
        assert torch.equal(a, b), f"{name}: the recomputation folded the batch into the running statistics again"


def test_without_the_recompute_context_batchnorm_would_count_twice():
    """The failure the context exists for (pytorch/pytorch#96136): plain torch.utils.checkpoint updates twice."""
    g, _ = _pair()
    layers = g.main
    x = torch.randn(8, 16, 1, 1)
    out = x
    for block in blocks(layers)[:-1]:
        out = torch.utils.checkpoint.checkpoint(block, out, use_reentrant=False)
    blocks(layers)[-1](out).mean().backward()
    assert int(layers[1].num_batches_tracked) == 2, "had torch changed this, the context would be needless"


def test_checkpointing_lowers_a_steps_peak_tensor_memory():
    g, d = _pair(ngf=32, ndf=32)

    def step(on):
        g.checkpointed = d.checkpointed = on
        z = torch.randn(64, 16)
        d(g(z)).mean().backward()
        g.zero_grad(set_to_none=True)
        d.zero_grad(set_to_none=True)

    device = torch.device("cpu")
    kept, recomputed = step_peak_bytes(lambda: step(False), device), step_peak_bytes(lambda: step(True), device)
    assert recomputed < 0.8 * kept, (kept, recomputed)


def test_a_penalty_differentiates_through_checkpointed_blocks():
    _, plain = _pair()
    checked = copy.deepcopy(plain)
    checked.checkpointed = True
    real = torch.randn(8, 1, 32, 32)
    penalties = []
    for d in (plain, checked):
        x = real.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(d(x).sum(), x, create_graph=True)
        penalty = grad.square().sum()
        penalty.backward()
        penalties.append((penalty.detach(), [p.grad for p in d.parameters()]))
    torch.testing.assert_close(penalties[1][0], penalties[0][0])
    for a, b in zip(penalties[0][1], penalties[1][1], strict=True):
        torch.testing.assert_close(b, a)


def test_no_blocks_are_checkpointed_where_nothing_records_gradients():
    g, _ = _pair()
    g.checkpointed = True
    with torch.no_grad():
        assert torch.equal(run(g.main, torch.zeros(2, 16, 1, 1), True), g.main(torch.zeros(2, 16, 1, 1)))


def test_a_run_trains_the_same_with_and_without_checkpointing(tiny, glyphs64):
    runs = {}
    for which in ("off", "both"):
        trainer = Trainer(tiny.replace(activation_checkpointing=which, out_dir=f"{tiny.out_dir}-{which}"),
                          dataset=glyphs64)
        trainer.fit(3)
        runs[which] = {**trainer.generator.state_dict(), **{f"d.{k}": v for k, v in
                                                             trainer.discriminator.state_dict().items()}}
    for name, value in runs["off"].items():
        torch.testing.assert_close(runs["both"][name], value, msg=name)


def test_checkpointing_with_the_compiler_is_refused_before_training(tiny):
    with pytest.raises(ConfigError, match="activation_checkpointing='g' with compile='default'"):
        tiny.replace(activation_checkpointing="g", compile="default").validate()


def test_your_own_networks_are_refused_with_the_line_to_write(tiny, glyphs64):
    g = nn.Sequential(nn.Flatten(), nn.Linear(tiny.nz, 32 * 32), nn.Unflatten(1, (1, 32, 32)), nn.Tanh())
    d = nn.Sequential(nn.Flatten(), nn.Linear(32 * 32, 1), nn.Flatten(0))
    with pytest.raises(ConfigError, match=r"checkpoint\(block, x, use_reentrant=False\)"):
        Trainer(tiny.replace(activation_checkpointing="d"), generator=g, discriminator=d, dataset=glyphs64)
