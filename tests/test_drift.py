"""gantools.workbook.drift: the optimizer implementations agree to rounding on the same gradients, a GAN magnifies any
difference (a one-float nudge spreads, a repeat of one deterministic run does not), and accumulation is exact without
BatchNorm's batch statistics and not with them."""
import math

import torch
from torch import nn

from gantools.workbook.drift import accumulation_gap, lockstep, nudge, relative_gap, same_gradients
from gantools.workbook.tutorial import plain_gan

EPS = torch.finfo(torch.float32).eps


def _adam(**kind):
    return lambda params: torch.optim.Adam(params, lr=2e-4, betas=(0.5, 0.999), **kind)


def _net(norm: bool) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Conv2d(1, 8, 3, 2, 1), *([nn.BatchNorm2d(8)] if norm else []), nn.LeakyReLU(0.2), nn.Flatten(),
              nn.Linear(8 * 4 * 4, 1)]
    return nn.Sequential(*layers)


def test_the_three_adam_implementations_agree_to_rounding_on_the_same_gradients():
    module = _net(norm=True)
    before = [p.detach().clone() for p in module.parameters()]
    gaps = same_gradients({"for-loop": _adam(foreach=False), "foreach": _adam(foreach=True),
                           "fused": _adam(fused=True)}, module, steps=10)
    assert gaps["for-loop"] == 0.0
    assert all(gap < 100 * EPS for gap in gaps.values()), gaps
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True)), "the module was changed"


def test_same_gradients_sees_a_real_difference_in_the_update():
    gaps = same_gradients({"lr 2e-4": _adam(), "lr 3e-4": lambda p: torch.optim.Adam(p, lr=3e-4)}, _net(False),
                          steps=5)
    assert gaps["lr 3e-4"] > 1e-3


def test_same_gradients_leaves_the_callers_random_numbers_alone():
    module = _net(False)
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    same_gradients({"a": _adam()}, module, steps=2)
    assert torch.equal(torch.rand(3), expected)


def test_relative_gap_is_zero_for_equal_weights_and_relative_to_each_tensors_size():
    a = [torch.tensor([1.0, -4.0]), torch.tensor([0.0, 0.0])]
    assert relative_gap(a, [t.clone() for t in a]) == 0.0
    assert relative_gap(a, [torch.tensor([1.0, -3.0]), torch.tensor([0.0, 0.0])]) == 0.25


def test_nudge_moves_one_weight_by_one_float():
    module = _net(False)
    before = [p.detach().clone() for p in module.parameters()]
    nudge(module)
    after = list(module.parameters())
    changed = [(a != b).sum().item() for a, b in zip(before, after, strict=True)]
    assert sum(changed) == 1 and changed[0] == 1
    first, moved = before[0].view(-1)[0], after[0].view(-1)[0]
    assert moved > first and torch.nextafter(first, torch.tensor(math.inf)) == moved


def test_lockstep_copies_of_one_deterministic_run_stay_identical_and_a_nudge_spreads():
    gans = {"a": plain_gan("cpu"), "same": plain_gan("cpu"), "nudged": plain_gan("cpu")}
    nudge(gans["nudged"].G)
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    result = lockstep(gans, steps=4)
    assert torch.equal(torch.rand(2), expected), "lockstep moved the caller's random numbers"
    gaps = result.gaps
    assert result.losses["a"] == result.losses["same"] and len(result.losses["a"]) == 4
    assert "| nudged |" in result._repr_markdown_()
    assert gaps["a"] == gaps["same"] == [0.0] * 4
    assert max(gaps["nudged"]) > 10 * EPS  # one float's change, relative to a tensor's size, is at most EPS


def test_accumulation_is_exact_without_batch_statistics_and_not_with_batchnorm_in_training():
    x = torch.randn(16, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    assert accumulation_gap(_net(norm=False), x, 4) < 1e-5
    bn = _net(norm=True)
    stats = bn[1].running_mean.clone()
    assert accumulation_gap(bn, x, 4) > 1e-3
    assert torch.equal(bn[1].running_mean, stats), "the caller's BatchNorm statistics moved"
    assert accumulation_gap(bn.eval(), x, 4) < 1e-5
