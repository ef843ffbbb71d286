"""A gradient penalty in your loop, seen and timed: `torch.autograd.grad(..., create_graph=True)` called from your code
with respect to a tensor a model was fed this iteration (R1 on the real batch, R2 on G's images, WGAN-GP on a mix of
the two), counted at your line and, while profiling, timed in a "D penalty" range (`wrap_grad`).

What that phase holds (`penalty_spans`, used by `analysis._phases`): the gradient's own backward through D (the time
inside autograd.grad), and the backward of that gradient, which runs later inside your loss's backward(): the nodes
autograd.grad made with create_graph (the double backward), told apart from the rest of that backward by autograd's
sequence numbers as every phase is. Not in it: D's forward on the penalty's input and D's first-order backward from
that forward. Your D step shares those with the penalty when the penalty is taken on a call its loss uses too (R1 on
D(real)); a penalty on a call of its own (WGAN-GP's interpolates) spends them for the penalty alone, and the phase
is then a lower bound of what the penalty costs."""
from __future__ import annotations

import bisect
import contextlib
import sys
from collections import Counter

import torch
from torch.profiler import record_function

from .frames import LIBRARIES, compiling, first_tensor, location, site

PENALTY = "D penalty"  # the phase's name, the trainer's for the same work (`measuring.protocol.PHASES`)


def creates_graph(args: tuple, kwargs: dict) -> bool:
    """Whether a call of `torch.autograd.grad(outputs, inputs, *args, **kwargs)` asks for create_graph (the third
    argument after those two: grad_outputs, retain_graph, create_graph)."""
    return bool(kwargs["create_graph"] if "create_graph" in kwargs else len(args) > 2 and args[2])


def wrap_grad(hooks, original):
    """`torch.autograd.grad`: a call from your code that creates a graph, with respect to a tensor a model was fed
    this iteration, counted at your line, and timed as the penalty while profiling (while the full hooks are on; a
    call inside a model's forward is counted but not timed apart from that forward)."""
    def grad(outputs, inputs, *args, **kwargs):
        if compiling() or not hooks.full or not hooks.mine() or not creates_graph(args, kwargs):
            return original(outputs, inputs, *args, **kwargs)
        caller = sys._getframe(1)
        x = first_tensor(inputs)
        model = hooks.feeds.fed_with_grad(x) if x is not None else None
        if model is None or caller.f_code.co_filename.startswith(LIBRARIES):  # torch's or gantools' own
            return original(outputs, inputs, *args, **kwargs)
        where, code = site(caller)
        hooks.obs.window.penalties[(model, where, location(caller), code)] += 1
        timed = hooks.profiling and hooks.depth == 0
        with record_function(PENALTY) if timed else contextlib.nullcontext():
            return original(outputs, inputs, *args, **kwargs)
    grad.__name__, grad.__doc__, grad.__wrapped__ = original.__name__, original.__doc__, original
    return grad


def penalty_spans(events: list) -> tuple[list, set]:
    """The "D penalty" ranges' (start, end), sorted, and (thread, sequence number) of each op run inside them that
    made a graph node (a forward op's record: no forward thread of its own): the nodes of the gradient's graph, whose
    backward is the double backward. On CUDA autograd.grad runs on the engine's device thread, so what is inside is
    told by time, not by the range's children."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == PENALTY)
    if not spans:
        return [], set()
    made = {(e.thread, e.sequence_nr) for e in events
            if e.sequence_nr >= 0 and not e.fwd_thread and within(spans, e)}
    return spans, made


def within(spans: list, event) -> bool:
    """Whether `event` starts inside one of the sorted `spans`."""
    start = event.time_range.start
    i = bisect.bisect_right(spans, (start, float("inf"))) - 1
    return i >= 0 and start <= spans[i][1]


def described(obs, profiled: int) -> dict | None:
    """`settings["gradient_penalty"]`: D's penalty calls per profiled iteration and your lines that make them (None
    where D took none)."""
    d = obs.role("D")
    sites: Counter = Counter()
    for (model, where, at, code), n in obs.window.penalties.items():
        if model is d and d is not None:
            sites[(where, at, code)] += n
    if not sites:
        return None
    n = max(profiled, 1)
    return {"calls_per_iteration": sum(sites.values()) / n,
            "sites": [{"where": where, "at": list(at) if at else None, "code": code, "per_step": round(k / n, 2)}
                      for (where, at, code), k in sites.most_common()]}


def grad_inputs(inputs) -> tuple:
    """`torch.autograd.grad`'s inputs as the tuple of tensors it returns one gradient for."""
    return (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
