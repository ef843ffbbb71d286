"""The doctor's memory measure of a loop it did not write (`doctor.watching.memory`): one warm-up iteration's peak
tensor memory and its parts, checked against what the networks and Adam hold by construction; 16-bit autocast's
activations against fp32's; nothing left installed, whenever the loop ends. The rules that read it are tested on
constructed reports in test_doctor_rules."""
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from gantools import doctor

MB = 2**20


def networks():
    torch.manual_seed(0)
    g = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 3 * 16 * 16), nn.Tanh(),
                      nn.Unflatten(1, (3, 16, 16)))
    d = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 256), nn.LeakyReLU(0.2), nn.Linear(256, 1))
    return g, d


def gan_step(g, d, precision=None):
    """A plain GAN step as people write it, with Adam; `precision`: a 16-bit autocast dtype around the forwards."""
    opt_g, opt_d = torch.optim.Adam(g.parameters()), torch.optim.Adam(d.parameters())
    bce = nn.BCEWithLogitsLoss()

    def step(real):
        with torch.autocast("cpu", dtype=precision, enabled=precision is not None):
            fake = g(torch.randn(real.shape[0], 64))
            loss_d = bce(d(real).float(), torch.ones(real.shape[0], 1)) + \
                bce(d(fake.detach()).float(), torch.zeros(real.shape[0], 1))
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        with torch.autocast("cpu", dtype=precision, enabled=precision is not None):
            loss_g = bce(d(fake).float(), torch.ones(real.shape[0], 1))
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
    return step


def nothing_installed() -> bool:
    """No dispatch mode and no saved-tensor hooks left on the stacks."""
    return _get_current_dispatch_mode() is None and torch._C._autograd._top_saved_tensors_default_hooks(False) is None


@pytest.fixture(scope="module")
def measured():
    """The same loop in fp32 and under bf16 autocast: (report, G, D) each, in a process with no compiled code cached
    (earlier tests compile; the doctor then leaves the activations out, as test_doctor_compile checks)."""
    torch._dynamo.reset()
    out = {}
    for name, precision in (("fp32", None), ("bf16", torch.bfloat16)):
        g, d = networks()
        data = [torch.randn(128, 3, 16, 16) for _ in range(4)]
        out[name] = (doctor.run(gan_step(g, d, precision), data, steps=1, warmup=2), g, d)
    return out


def test_the_parts_are_what_the_networks_and_adam_hold(measured):
    report, g, d = measured["fp32"]
    m = report.settings["memory"]
    weights = sum(p.nbytes for net in (g, d) for p in net.parameters()) / MB
    parts = m["parts_mb"]
    assert parts["weights"] == pytest.approx(weights, abs=0.01)
    assert parts["gradients"] == pytest.approx(weights, abs=0.01)  # one per trained weight
    assert parts["optimizer state"] == pytest.approx(2 * weights, abs=0.01)  # Adam: two moments per weight
    assert m["peak_mb"] >= parts["weights"] + parts["optimizer state"] + parts["activations"] / 2
    assert set(m["activations_by_network_mb"]) >= {"G", "D"} and m["activations_32bit_share"] == 1.0
    assert m["largest"] == max(parts, key=parts.get) and m["room_mb"] is None  # a CPU: no room to judge
    assert "memory of one warm-up iteration's tensors, peak" in str(report) and nothing_installed()


def test_bf16_autocast_saves_smaller_activations_than_fp32(measured):
    fp32, bf16 = (measured[k][0].settings["memory"] for k in ("fp32", "bf16"))
    assert bf16["activations_32bit_share"] < 0.5
    assert bf16["parts_mb"]["activations"] < 0.75 * fp32["parts_mb"]["activations"]


def test_a_loop_that_fails_inside_the_watched_iteration_leaves_nothing_installed():
    """Your step raises in the iteration being watched: your error comes through, and no hook stays behind."""
    g, d = networks()
    step, calls = gan_step(g, d), []

    def failing(real):
        calls.append(1)
        step(real)
        if len(calls) == 2:  # the second iteration: the last warm-up one, the one watched
            raise ValueError("your own error")
    with pytest.raises(ValueError, match="your own error"):
        doctor.run(failing, [torch.randn(8, 3, 16, 16) for _ in range(4)], steps=1, warmup=2)
    assert nothing_installed()
