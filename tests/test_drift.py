"""gantools.drift, gantools.memory and gantools.balance: the measurements 04 shows as evidence. The optimizer
implementations agree to rounding, a GAN magnifies any difference, accumulation is exact without BatchNorm's batch
statistics and holds a fraction of the activations, and a setting's failure shows in who wins the game and in a FID
change beyond a second seed's."""
import math

import torch
from torch import nn

from gantools.drift import accumulation_gap, lockstep, nudge, relative_gap, same_gradients
from gantools.memory import saved_activation_bytes
from gantools.tutorial import plain_gan

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
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters())), "the module was changed"


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
    changed = [(a != b).sum().item() for a, b in zip(before, after)]
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
    net, x = _net(norm=True), torch.randn(64, 1, 8, 8)
    chunks = [c.clone() for c in x.chunk(4)]  # views of x would hold (and count) all of x's storage

    def one_batch():
        net(x).mean().backward()

    def four_micro_batches():
        for chunk in chunks:
            (net(chunk).mean() / 4).backward()

    whole, micro = saved_activation_bytes(one_batch), saved_activation_bytes(four_micro_batches)
    assert 3.5 < whole / micro <= 4.0


def _history(loss_d, loss_g, d_real=0.8, d_fake=0.2):
    from gantools.history import History

    return History([{"step": i + 1, "loss_d": d, "loss_g": g, "d_real": d_real, "d_fake": d_fake}
                    for i, (d, g) in enumerate(zip(loss_d, loss_g))])


def test_balance_names_a_d_that_overpowers_g_an_oscillating_game_and_a_balanced_one():
    from gantools.balance import balance

    start = _history([0.9, 0.5, 0.6, 0.5], [3.0, 3.2, 3.1, 3.0])
    runs = {"start": start,
            "strong D": _history([0.5, 0.1, 0.05, 0.04], [6.0, 7.0, 6.5, 7.0], d_real=0.98, d_fake=0.02),
            "swinging": _history([0.9, 0.6, 0.5, 0.6], [3.0, 1.0, 6.0, 1.0]),
            "same": _history([0.2, 0.2, 0.6, 0.5], [9.0, 9.0, 3.0, 3.1])}
    found = balance(runs)
    assert found.rows["start"]["loss_d"] == 0.55  # the mean of the second half only
    assert "D overpowers G" in found.diagnosis("strong D", "start")
    assert "0.045" in found.diagnosis("strong D", "start") and "0.550" in found.diagnosis("strong D", "start")
    assert "oscillates" in found.diagnosis("swinging", "start")
    assert "as balanced as start" in found.diagnosis("same", "start")
    assert "| strong D | 0.980 | 0.020 |" in found._repr_markdown_()


def test_a_fid_change_counts_only_beyond_what_a_second_seed_moves_it():
    from gantools.balance import fid_against_seed

    start, seed = {"fid": 100.0, "classes_covered": 9}, {"fid": 125.0, "classes_covered": 9}
    worse = fid_against_seed("x", {"fid": 300.0, "classes_covered": 1}, start, seed, "Adam")
    assert "worse than Adam" in worse and "3.00x" in worse and "classes covered 1 against 9" in worse
    assert "no different from Adam" in fid_against_seed("x", {"fid": 120.0, "classes_covered": 9}, start, seed,
                                                        "Adam")
    assert "better than Adam" in fid_against_seed("x", {"fid": 70.0, "classes_covered": 9}, start, seed, "Adam")
    assert "no different" in fid_against_seed("x", {"fid": 105.0, "classes_covered": 9}, start, start, "Adam")
