"""gantools.measuring.memory: step_peak_bytes, the peak tensor memory of a step (what the history's peak_mem_mb and
every "peak tensor MB" column hold), counts what a step holds at its busiest moment, each run its own; and
saved_activation_bytes counts what autograd keeps for backward (each storage once, parameters never), so
accumulating micro-batches shows its saving on any device."""
import pytest
import torch
from torch import nn

from gantools import Trainer
from gantools.measuring.memory import saved_activation_bytes, step_peak_bytes

from conftest import cuda_only

CPU = torch.device("cpu")


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


def _hand_counted(device):
    """A held weight with its gradient, and a step whose live bytes are known at every moment: returns (step,
    holders, expected peak). Sizes are multiples of 512 bytes, CUDA's allocation unit."""
    w = nn.Parameter(torch.zeros(1024, device=device))  # 4 KiB, and 4 KiB of gradient
    w.grad = torch.zeros_like(w)

    def step():
        w.grad = None  # as zero_grad(set_to_none=True): the old gradient is freed, not held twice
        a = torch.ones(2048, device=device)  # 8 KiB
        b = a * 2  # 16 KiB live
        b.view(32, 64).relu_()  # in place on a view: no new storage
        del a  # 8 KiB
        c = torch.empty(1536, device=device)  # 18 KiB: below the peak, unless a's freeing was missed (26)
        w.grad = c[:1024]  # a gradient that is a view of c: counted with c
        del b, c

    return step, (w,), 4096 + 16384  # the weight and b and a; not the old gradient too (it would be 24 KiB)


def test_step_peak_bytes_agrees_with_a_hand_count():
    step, holders, expected = _hand_counted(CPU)
    assert step_peak_bytes(step, CPU, holders) == expected


@cuda_only
def test_step_peak_bytes_on_cuda_agrees_with_the_same_hand_count():
    device = torch.device("cuda")
    other = torch.empty(2**20, device=device)  # another run's memory on the GPU: not this step's
    step, holders, expected = _hand_counted(device)
    assert step_peak_bytes(step, device, holders) == expected
    del other


def _history(cfg, dataset, **changes):
    # the batches held on the device: a DataLoader would start its workers again for each epoch of glyphs64
    return Trainer(cfg.replace(steps=2, log_interval=1, loader="device", **changes), dataset=dataset).fit()


def test_each_run_reports_its_own_peak_in_one_process(tiny, glyphs64):
    """A process's peak resident set would give all three the same number."""
    first = _history(tiny, glyphs64, batch_size=32)
    peaks = first.column("peak_mem_mb")
    assert peaks[0] != peaks[0] and peaks[1] > 0  # NaN until the run's second step, which is measured
    small = first.summary()["peak_mem_mb"]
    big = _history(tiny, glyphs64, batch_size=64).summary()["peak_mem_mb"]
    again = _history(tiny, glyphs64, batch_size=32).summary()["peak_mem_mb"]
    assert big > 1.5 * small  # activations dominate this DCGAN's memory, and double with the batch
    assert again == pytest.approx(small, rel=0.05)  # measured afresh, not the process's peak so far


def test_bf16_autocast_measures_below_fp32_where_activations_dominate(tiny, glyphs64):
    fp32, bf16 = (_history(tiny, glyphs64, batch_size=64, precision=p).summary()["peak_mem_mb"]
                  for p in ("fp32", "bf16"))
    assert bf16 < 0.8 * fp32  # bf16 activations take half the bytes; weights, gradients and Adam stay fp32


def test_a_graph_never_run_backward_is_freed_once_dropped():
    """tanh saves its own output: held as it is, the output's grad_fn would hold it back, a cycle the collector cannot
    break; held detached, the graph and its count go when the loop drops it (a GAN's first fake, say)."""
    import gc
    import weakref

    from gantools.measuring.memory import SavedActivations
    x = torch.randn(4096, requires_grad=True)
    with SavedActivations() as saved:
        y = x.tanh()
        gone = weakref.ref(y)
        del y
        gc.collect()
    assert gone() is None and saved.now == 0 and saved.peak == 4096 * 4
