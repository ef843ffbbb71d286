"""Shared fixtures: tiny configs and datasets so the whole suite runs in minutes on a 2-core CPU."""
import functools
import os
import re
import shutil
import signal
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from gantools import ImageTensorDataset, TrainConfig, render_glyphs
from gantools.core.data import write_glyph_pngs

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CUDA = torch.cuda.is_available()
PRECISIONS = ["fp32", "bf16"] + (["fp16"] if CUDA else [])

cuda_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
CHROMIUM_FLAGS = ["--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--disable-quic", "--no-first-run"]  # a closed network: ask it for nothing


@pytest.fixture(autouse=True)
def _quiet_threads():
    """At most 2 threads, and under pytest-xdist the worker's share of the cores (the root conftest.py sets
    OMP_NUM_THREADS for its workers)."""
    share = re.match(r"\d+", os.environ.get("OMP_NUM_THREADS", ""))  # OpenMP also allows a list: "4,2"
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1, int(share.group()) if share else 2)))


@pytest.fixture(autouse=True)
def _cpu_with_fast_bf16(request, monkeypatch):
    """Every test but those marked `slow_bf16` sees a CPU with native bf16 (AVX512-BF16 or AMX), whatever CPU runs
    the suite: what the tools propose on a CPU depends on it (`hardware.fast_bf16`), and the specifications must not
    change with the machine CI draws. The tests of a CPU without it say so with the mark."""
    from gantools.measuring import hardware

    fast = request.node.get_closest_marker("slow_bf16") is None
    real = hardware.fast_bf16

    @functools.wraps(real)  # the real one stays at `hardware.fast_bf16.__wrapped__`
    def pinned(device):
        return fast if device.type == "cpu" else real(device)

    monkeypatch.setattr(hardware, "fast_bf16", pinned)


@pytest.fixture(autouse=True)
def _ctrl_c_interrupts():
    """Each test starts as an interactive Python does: Ctrl-C raises KeyboardInterrupt. A shell starts a background
    job (`make test &`) with SIGINT ignored, which the Ctrl-C tests would otherwise see as the process's handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


# Pictures of the pages for a person to look at (artifacts/browser/, artifacts/book/): `make test-browser` takes them;
# `make test` only checks the pages, a tall page's picture costing seconds of Chromium's time.
SCREENSHOTS = os.environ.get("GANTOOLS_SCREENSHOTS") == "1"


def screenshot(target, path: Path, **options) -> bool:
    """`target.screenshot(path=...)` (a Playwright page or element) where pictures are asked for; whether it was."""
    if not SCREENSHOTS:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    target.screenshot(path=str(path), **options)
    return True


def chromium_path() -> str | None:
    """$GANTOOLS_CHROMIUM, else a Chromium or Chrome on PATH."""
    if os.environ.get("GANTOOLS_CHROMIUM"):
        return os.environ["GANTOOLS_CHROMIUM"]
    names = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
    return next((path for path in map(shutil.which, names) if path), None)


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium driven by Playwright (tests/test_browser.py, tests/test_book.py); the system's browser,
    since Playwright's own download needs the internet. Skips, saying how to get one, where none is found."""
    path = chromium_path()
    if path is None:
        pytest.skip("no Chromium found, so the browser test cannot run: install Debian's package "
                    "(sudo apt-get install chromium; `make test` does this where it runs as root or with sudo) "
                    "or point $GANTOOLS_CHROMIUM at a Chromium or Chrome binary")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=path, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="session")
def glyphs64():
    """64 rendered digits at 32 px: four batches of 16, so short runs wrap around an epoch."""
    return ImageTensorDataset(*render_glyphs(64, 32, 1, seed=0))


@pytest.fixture(scope="session")
def big_images(tmp_path_factory):
    """Large PNGs: decoding and resizing them per image, in the training process, starves a tiny model."""
    root = tmp_path_factory.mktemp("big")
    rng = np.random.default_rng(0)
    for i in range(48):
        Image.fromarray(rng.integers(0, 255, (640, 640, 3), dtype=np.uint8)).save(root / f"{i}.png")
    return root


@pytest.fixture(scope="session")
def pngs(tmp_path_factory):
    """64 glyphs as 128 px RGB PNGs in class folders, for the user-style scripts in tests/scripts/: ImageFolder
    decodes and resizes each one per step, as the tutorial's loop does."""
    return write_glyph_pngs(tmp_path_factory.mktemp("pngs"), n=64, image_size=128, channels=3, seed=0)


@pytest.fixture(scope="session")
def small_pngs(tmp_path_factory):
    """160 glyphs as 32 px RGB PNGs in ten class folders: ten batches of 16 an epoch (twenty of 8, a multiple of the
    WGAN-GP's five critic steps, so its G steps every fifth batch in every epoch)."""
    return write_glyph_pngs(tmp_path_factory.mktemp("small_pngs"), n=160, image_size=32, channels=3, seed=0)


class FakeClock:
    """A clock the test moves instead of the machine's load: each reading is `tick` seconds after the last (timed work
    still takes some time), and `advance(seconds)` jumps ahead (a measurement that "took" that long)."""

    def __init__(self, tick: float = 0.001):
        self.now, self.tick = 1000.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fake_clock(monkeypatch):
    """`hardware.seconds`, the clock every gantools timing and time budget reads, replaced by a `FakeClock`."""
    from gantools.measuring import hardware

    clock = FakeClock()
    monkeypatch.setattr(hardware, "seconds", clock)
    return clock


def measurements_take(seconds: float, clock: FakeClock, monkeypatch) -> None:
    """Each of tune's measurements takes `seconds` more on `clock` than its real work: a test spends tune's budget
    itself, measurement by measurement, whatever the machine's load."""
    from gantools.tuning.trials import Trials

    measure = Trials.measure

    def timed(self, *args, **kwargs):
        measured = measure(self, *args, **kwargs)
        clock.advance(seconds)
        self.measure_s += seconds
        return measured

    monkeypatch.setattr(Trials, "measure", timed)


STEADY_PHASE_MS, STEADY_COMPUTE_SHARE = 10.0, 0.4


@pytest.fixture(scope="module")
def steady_doctor():
    """The doctor's rules judge what a loop does, never how busy the machine was when it ran: every phase the doctor
    measured in a loop run in this process (and the rest of the iteration) is taken to cost the same 10 ms, and so do
    a DataLoader's epoch start and the copies to the device; the device is taken to be busy whenever the loop is not
    waiting for data, and convolutions and matmuls 40% of that. What the doctor saw (the phases, the settings, the
    sites) stays as it ran; so a finding appears because its evidence was observed, and its gate is tested on its
    own in test_doctor_rules.py. The machine is taken to be quiet (`analysis.timing_doubts` finds nothing: the
    steady times above are not the profiler's), so the report reads as on one; test_doctor_load.py tests the doubts.
    The verdict is the doctor's own (`analysis._verdict`) on these numbers. The fixture
    keeps what was measured: `measured[id(report)]` is (its phases, its step time), for what a test asks of the
    measuring itself."""
    from gantools.doctor.diagnosis import analysis

    measure, measured = analysis._profile_into, {}

    def steady(r, obs, sched, run):
        measure(r, obs, sched, run)
        measured[id(r)] = dict(r.phases_ms), r.step_time_ms
        r.phases_ms = {k: STEADY_PHASE_MS for k, ms in r.phases_ms.items() if ms > 0 or k == analysis.OTHER}
        r.step_time_ms = sum(r.phases_ms.values())
        wait = r.phases_ms.get("data wait", 0.0)
        r.device_busy_ms, r.compute_share = r.step_time_ms - wait, STEADY_COMPUTE_SHARE
        for loader in r.settings["dataloaders"]:
            if loader.get("epoch_start_ms"):
                loader["epoch_start_ms"] = STEADY_PHASE_MS
        if r.settings.get("h2d_copy_ms"):
            r.settings["h2d_copy_ms"] = STEADY_PHASE_MS
        r.verdict = analysis._verdict(r, wait, r.device_busy_ms, r.top_ops, obs.device_in_use().type == "cuda")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(analysis, "_profile_into", steady)
        patch.setattr(analysis, "timing_doubts", lambda report: [])
        yield measured


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from a second thread, and a single one is not thrown off by a busy neighbour."""
    torch.set_num_threads(1)


# A DCGAN small enough that a step takes milliseconds (also used by ddp_worker.py, which has no fixtures)
TINY = dict(image_size=32, channels=1, nz=8, ngf=8, ndf=8, batch_size=16, steps=6, log_interval=2, sample_interval=0)


@pytest.fixture
def tiny(tmp_path):
    return TrainConfig(**TINY, out_dir=str(tmp_path / "run"))


class BatchFreeG(nn.Module):
    """A generator without batch statistics (for exact accumulation checks)."""

    def __init__(self, nz=8, size=32):
        super().__init__()
        self.size = size
        self.net = nn.Sequential(nn.Linear(nz, 64), nn.ReLU(), nn.Linear(64, size * size), nn.Tanh())

    def forward(self, z):
        return self.net(z.flatten(1)).view(-1, 1, self.size, self.size)


class BatchFreeD(nn.Module):
    def __init__(self, size=32):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 4, 4, 2, 1), nn.LeakyReLU(0.2), nn.Flatten(),
                                 nn.Linear(4 * (size // 2) ** 2, 1))

    def forward(self, x):
        return self.net(x).view(-1)


def weights(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


class FlakyD(BatchFreeD):
    """Returns NaN on the calls of chosen steps (D runs three times a step: real, fake, and in G's step).
    Reset `calls` after building the Trainer: its shape check calls D once."""

    def __init__(self, bad_steps):
        super().__init__()
        self.calls, self.bad_steps = 0, set(bad_steps)

    def forward(self, x):
        self.calls += 1
        out = super().forward(x)
        return out * float("nan") if (self.calls - 1) // 3 + 1 in self.bad_steps else out


class CondBatchFreeG(BatchFreeG):
    """A conditional generator without batch statistics, forward(z, y): the label's embedding added to z."""

    def __init__(self, nz=8, size=32, classes=10):
        super().__init__(nz, size)
        self.embed = nn.Embedding(classes, nz)

    def forward(self, z, y):
        return super().forward(z.flatten(1) + self.embed(y))


class CondBatchFreeD(BatchFreeD):
    """A conditional discriminator without batch statistics, forward(x, y): a learned score per class added."""

    def __init__(self, size=32, classes=10):
        super().__init__(size)
        self.embed = nn.Embedding(classes, 1)

    def forward(self, x, y):
        return super().forward(x) + self.embed(y).view(-1)


class HostReads:
    """Every value read from a tensor to the host (`.item()`, `bool(t)`, `float(t)`, `.tolist()` all dispatch
    `aten::_local_scalar_dense`, a host sync on a GPU), seen by a TorchDispatchMode, in the forward and backward
    passes alike (the autograd engine carries the mode into backward): `reads` holds the tensors read."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        reads = self.reads = []

        class Watch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func is torch.ops.aten._local_scalar_dense.default:
                    reads.append(args[0])
                return func(*args, **(kwargs or {}))

        self._mode = Watch()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self._mode.__exit__(*exc)
