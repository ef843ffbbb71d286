"""Whole-step CUDA graphs (`cuda_graphs=True`): D's steps and G's step, the batch's gather from device-resident data
and the noise, captured once in one CUDA graph and replayed at every step: one launch for the host to issue instead
of hundreds, so a small GAN's GPU no longer waits for Python between kernels.

How it is built, rule by rule (docs/cuda-graphs.md gives each rule's source in PyTorch's docs and code):
- Whole-network capture, as PyTorch's CUDA-graph notes show it: a few eager warm-up steps on a side stream first
  (lazy initialisation: the optimizers' state, cuDNN's and cuBLAS's handles), then the capture (`torch.cuda.graph`,
  on its own side stream), then `replay()`. The warm-up steps are real training steps; a capture only records, so
  the captured step is then run by its first replay. Nothing is trained twice or skipped.
- Static inputs: a replay reads and writes the addresses the capture saw. The step's inputs are the indices of its
  batches, copied into one static index tensor before each replay (a device-to-device copy per D step); the batch is
  gathered from the device-resident images inside the graph (`DeviceLoader.gather`), normalised and flipped there.
- Random numbers: the noise and flips come from the run's own CUDA generator, registered with the graph
  (`CUDAGraph.register_generator_state`) before the capture; a replay then advances its offset by what the captured
  step drew ("CUDA Graph-safe RNG states", aten/src/ATen/CUDAGeneratorImpl.h), so the replayed steps draw what eager
  steps would.
- The optimizers are fused Adam built `capturable=True` (`trainer.make_optimizer`): `Optimizer.step` refuses to be
  captured otherwise, and their step counters then live on the device.
- Autocast: every autocast region opens and closes inside the captured step, so its weight-cast cache never holds a
  tensor across the capture's edge (the reason `make_graphed_callables`, whose graphs sit inside a caller's region,
  asks for `cache_enabled=False`).
- Nothing in the step reads a value back (the metric sums, the EMA and the step counters stay on the device), and
  nothing in it depends on the step number: `validation._cuda_graph_problems` refuses what would (a per-step
  `.item()`, lazy penalties, a learning-rate schedule, fp16's GradScaler, DataLoader batches, DDP, a rollback that
  replaces the optimizers' state).
- Anything that replaces the optimizers' state tensors (a checkpoint loaded, a block run `unchanged()`) leaves the
  graph pointing at the old ones: the step counts such restores (`TrainStep.restores`), and a graph captured before
  the last one is dropped and captured again after fresh warm-up steps.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Callable

import torch

from ..errors import ConfigError
from .recovery import is_out_of_memory

WARMUP_STEPS = 3  # the whole-network example's warm-up iterations in PyTorch's CUDA-graph notes


def cuda_capture(run: Callable[[], None], generator: torch.Generator, device: torch.device) -> Callable[[], None]:
    """Capture `run` (one training step) in a CUDA graph with `generator` registered; returns its replay."""
    graph = torch.cuda.CUDAGraph()
    graph.register_generator_state(generator)
    with torch.cuda.device(device), torch.cuda.graph(graph):
        run()
    return graph.replay


@contextlib.contextmanager
def side_stream(device: torch.device):
    """Eager warm-up work on a side stream that waits for, and is waited for by, the current one (the notes'
    warm-up pattern); nothing on a CPU."""
    if device.type != "cuda":
        yield
        return
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        yield
    current.wait_stream(side)


class GraphedStep:
    """The trainer's step for `cuda_graphs=True`: called with each step's batch indices (`loaders.IndexBatches`),
    it runs `WARMUP_STEPS` eager steps, then captures one and replays it ever after (see the module's docstring).

    Args:
        stepper: the run's TrainStep.
        loader: its DeviceLoader (the images the graph gathers from).
        generator: the run's own CUDA generator (noise, flips).
        capture: (run, generator, device) -> replay; `cuda_capture`, or, in a test on a CPU, one that replays by
            running the step (the static inputs and the in-graph gather then run exactly as a replay would).
    """

    def __init__(self, stepper, loader, generator: torch.Generator,
                 capture: Callable = cuda_capture, warmup: int = WARMUP_STEPS):
        self.stepper, self.loader, self.generator, self.capture = stepper, loader, generator, capture
        self.warmup = warmup
        local = loader.sampler.batch_size // loader.world.size
        self.indices = torch.zeros(stepper.cfg.d_steps, local, dtype=torch.long, device=loader.device)
        self.replay, self.seen, self.eager_left = None, stepper.restores, warmup
        self.replays = 0  # steps run by a replay (the host issued one graph launch for each)

    def __call__(self, indices: list, first_d_index: int, eager: Callable) -> None:
        """One training step on the batches at `indices` (one device index tensor per D step). `eager(*batches)`
        trains a warm-up step eagerly (the trainer's own step, which also measures its memory)."""
        for slot, batch in zip(self.indices, indices, strict=True):
            slot.copy_(batch)
        if self.seen != self.stepper.restores:  # the state a graph holds by address was replaced: warm up again
            self.replay, self.eager_left, self.seen = None, self.warmup, self.stepper.restores
        if self.replay is None and self.eager_left > 0:
            self.eager_left -= 1
            with side_stream(self.loader.device), warnings.catch_warnings():
                # capturable optimizers warn when they step uncaptured: these steps are meant to
                warnings.filterwarnings("ignore", message=".*capturable=True.*")
                eager(*self.batches())
            return
        if self.replay is None:
            self.replay = self._captured(first_d_index)
        self.replay()
        self.replays += 1

    def _captured(self, first_d_index: int) -> Callable[[], None]:
        """The step captured (its replay). Every optimizer has its state by now (the warm-up made it): a capture
        that made it would record its zeros, and every replay would start Adam afresh. A step that cannot be
        captured (code of yours that reads a value back, say) is one clear error."""
        parts = self.stepper.parts
        for opt in (parts.opt_d, parts.opt_g):
            if any(p.grad is not None and p not in opt.state for g in opt.param_groups for p in g["params"]):
                raise RuntimeError("a CUDA graph would capture an optimizer's first step: warm up first")
        try:
            return self.capture(lambda: self.stepper(*self.batches(), first_d_index=first_d_index),
                                self.generator, self.loader.device)
        except RuntimeError as e:
            if is_out_of_memory(e):
                raise
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"cuda_graphs=True: the training step could not be captured in a CUDA graph ({first}); "
                              "train with cuda_graphs=False") from e

    def batches(self) -> list:
        """The step's batches, gathered from the static indices (inside the graph, once captured)."""
        return [self.loader.gather(slot) for slot in self.indices]
