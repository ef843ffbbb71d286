"""gantools.measuring.memory: saved_activation_bytes counts what autograd keeps for backward (each storage once,
parameters
never), so accumulating micro-batches shows its saving on any device."""
import torch
from torch import nn

from gantools.measuring.memory import saved_activation_bytes


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.LeakyReLU(0.2), nn.Flatten(),
                         nn.Linear(8 * 4 * 4, 1))


def test_saved_activation_bytes_counts_what_backward_needs_and_not_the_parameters():
    w = nn.Parameter(torch.ones(1000))
    x = torch.randn(1000)
    assert saved_activation_bytes(lambda: (w * x).sum().backward()) == x.nbytes  # mul saves w and x; w is held anyway


def test_saved_activation_bytes_counts_a_storage_once_however_many_views_hold_it():
    x = torch.randn(1000, requires_grad=True)

    def two_views():
        y = x.exp()  # exp saves its result
        (y[:500].sin().sum() + y[500:].cos().sum()).backward()  # sin and cos save views of y

    assert saved_activation_bytes(two_views) == x.nbytes


def test_accumulating_micro_batches_holds_a_fraction_of_the_activations():
    net, x = _net(), torch.randn(64, 1, 8, 8)
    chunks = [c.clone() for c in x.chunk(4)]  # views of x would hold (and count) all of x's storage

    def one_batch():
        net(x).mean().backward()

    def four_micro_batches():
        for chunk in chunks:
            (net(chunk).mean() / 4).backward()

    whole, micro = saved_activation_bytes(one_batch), saved_activation_bytes(four_micro_batches)
    assert 3.5 < whole / micro <= 4.0
