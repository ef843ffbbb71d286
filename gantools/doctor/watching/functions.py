"""Networks written as plain functions: no nn.Module holds G's or D's weights, only the optimizers do (`W =
Variable(torch.randn(...), requires_grad=True)`, `def D(X): ...`, `D_solver = optim.Adam(D_params)`).

A torch function mode, pushed only while such an optimizer exists and the full hooks are on, sees every op that
reads one of those optimizers' parameters and the frames of your code it runs in. A network is the innermost function
of yours that computes with one optimizer's parameters alone: a helper both networks call (`linear(x, W, b)`) reads
two optimizers' parameters, and the loop around an optimizer step is no network. It is named as your code calls it
(`G`, `D`). From then on each call of it is a top-level model call (`Hooks.called`): counted, fed, timed in its own
profiler range from its first op to the first op outside it, its output the last tensor made inside it. An optimizer
whose parameters no function of yours uses alone (a network written inline in the loop) stays without one
(`Observations.networks`), and the report says so."""
from __future__ import annotations

import inspect
import sys
import types
from collections import Counter, defaultdict

import torch
from torch.overrides import TorchFunctionMode, _len_torch_function_stack, _pop_mode, _push_mode

from .frames import GANTOOLS_DIR, compiling, first_tensor, yours
from .observations import FunctionModel, Optimizer


_UNASKED = object()


class FunctionWatch(TorchFunctionMode):
    """The mode and what it found (see the module docstring); `Hooks` switches it with the full hooks."""

    def __init__(self, hooks):
        super().__init__()
        self.hooks = hooks
        self.owner: dict = {}     # id(parameter) -> the Optimizer holding it, for parameters no module holds
        self.reads: dict = {}     # Optimizer -> Counter of the code chains (innermost first) that read its parameters
        self.names: dict = {}     # code -> the name your code calls its function by
        self.loops: set = set()   # the codes an optimizer stepped inside: never a network
        self.found: dict = {}     # code -> FunctionModel, once decided
        self.decided = False
        self.iterations = 0       # iteration marks seen before deciding
        self.open: list | None = None  # [frame, Call, profiler range, last tensor made] of the call in progress
        self.on = False
        self.mine: dict = {}      # code -> whether it is your code (None: gantools' own), asked once per code

    # -- switched by the hooks --------------------------------------------------------------------------------------
    def consider(self, o: Optimizer) -> None:
        """A new optimizer: the parameters of it that no module seen so far holds are watched for."""
        held = set().union(*(m.param_ids for m in self.hooks.obs.models.values() if m.module is not None))
        loose = o.param_ids - held
        if not loose or self.decided:
            return
        for group in o.opt.param_groups:
            for p in group["params"]:
                if id(p) in loose:
                    self.owner[id(p)] = o
        if self.hooks.full:
            self.start()

    def start(self) -> None:
        if self.owner and not self.on and not (self.decided and not self.found):
            _push_mode(self)
            self.on = self.hooks.obs.function_mode = True

    def stop(self) -> None:
        """Closed and off the mode stack (where a mode of your code's was pushed after it, that one stays)."""
        self.close()
        if not self.on:
            return
        self.on = False
        above = []
        while _len_torch_function_stack():
            mode = _pop_mode()
            if mode is self:
                break
            above.append(mode)
        for mode in reversed(above):
            _push_mode(mode)

    def new_iteration(self) -> None:
        """Once every watched optimizer's parameters have been read (or a whole iteration has gone by since the
        first mark), each one's network is decided."""
        self.close()
        if self.decided or not self.owner:
            return
        self._held_by_modules()
        if not self.owner:
            return
        self.iterations += 1
        if self.iterations > 1 or all(o in self.reads for o in set(self.owner.values())):
            self._decide()

    def _held_by_modules(self) -> None:
        """Parameters a module seen since holds are no function's: a module the hooks did not see at first (called
        only inside compiled code, where they do nothing) is one after all. With none left the mode comes off: left
        on, dynamo would trace it inside your compiled code, breaking graphs and guarding on the mode stack."""
        held = set().union(*(m.param_ids for m in self.hooks.obs.models.values() if m.module is not None))
        self.owner = {pid: o for pid, o in self.owner.items() if pid not in held}
        watched = set(self.owner.values())
        self.reads = {o: chains for o, chains in self.reads.items() if o in watched}
        if not self.owner:
            self.stop()

    def stepped(self, frame) -> None:
        """An optimizer steps: the call in progress is over, and your frames around the step are the loop's."""
        self.close()
        if not self.decided:
            self.loops.update(f.f_code for f in self._your_frames(frame) or ())

    def outside(self, frame) -> None:
        """Code at `frame` (a module call, a value read) runs: the call in progress is over unless it runs inside."""
        if self.open is None:
            return
        while frame is not None:
            if frame is self.open[0]:
                return
            frame = frame.f_back
        self.close()

    def close(self) -> None:
        if self.open is not None:
            _, call, rf, out = self.open
            self.open = None
            self.hooks.returned(call, rf, out)

    # -- the mode ---------------------------------------------------------------------------------------------------
    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        h = self.hooks
        # compiling() first: while dynamo traces this mode it reads it as True and stops here, guarding on none of
        # the doctor's own state (a dict keyed by code objects cannot even be guarded)
        if (compiling() or h.stepping or h.in_data or h.in_sync or h.depth or not h.full
                or (self.decided and not self.found) or not h.mine()):
            return func(*args, **kwargs)
        frames = self._your_frames(sys._getframe(1))
        if frames is None:  # gantools' own code
            return func(*args, **kwargs)
        if not self.decided:
            result = func(*args, **kwargs)
            self._read(args, result, frames)
            return result
        frame = next((f for f in frames if f.f_code in self.found), None)
        if frame is None:
            self.close()
            return func(*args, **kwargs)
        if self.open is None or self.open[0] is not frame:
            self.close()
            self._call(frame)
        result = func(*args, **kwargs)
        if isinstance(result, torch.Tensor) and self.open is not None:
            self.open[3] = result
        return result

    def _read(self, args, result, frames: list) -> None:
        """An op that computed, with gradients, from a watched optimizer's parameters: the chain of your code's
        functions it ran in, counted for that optimizer."""
        if not (isinstance(result, torch.Tensor) and result.requires_grad):
            return
        o = next((self.owner[id(a)] for a in _flat(args) if id(a) in self.owner), None)
        if o is None:
            return
        chain = tuple(f.f_code for f in frames)
        self.reads.setdefault(o, Counter())[chain] += 1
        for f in frames:
            if f.f_code not in self.names:
                self.names[f.f_code] = _name(f)

    def _decide(self) -> None:
        users = defaultdict(set)  # code -> the optimizers whose parameters it computed with
        for o, chains in self.reads.items():
            for chain in chains:
                for code in chain:
                    users[code].add(o)
        for o in self.owner.values():
            self.hooks.obs.networks.setdefault(o, None)
        for o, chains in self.reads.items():
            votes = Counter()
            for chain, n in chains.items():
                code = next((c for c in chain if users[c] == {o} and c not in self.loops
                             and c.co_name != "<module>"), None)
                if code is not None:
                    votes[code] += n
            if votes:
                code = votes.most_common(1)[0][0]
                params = [p for group in o.opt.param_groups for p in group["params"] if self.owner.get(id(p)) is o]
                m = self.found[code] = FunctionModel(code, self.names.get(code) or code.co_qualname, params)
                self.hooks.obs.models[id(code)] = self.hooks.obs.networks[o] = m
        self.decided = True
        self.reads.clear()

    def _your_frames(self, frame) -> list | None:
        """Your code's frames from `frame` out, innermost first; None where gantools' own code is innermost (the
        doctor's hooks reading a tensor)."""
        frames = []
        while frame is not None:
            code = frame.f_code
            mine = self.mine.get(code, _UNASKED)
            if mine is _UNASKED:
                name = code.co_filename
                mine = self.mine[code] = yours(name) or (None if name.startswith(GANTOOLS_DIR) else False)
            if mine:
                frames.append(frame)
            elif mine is None and not frames:
                return None
            frame = frame.f_back
        return frames

    def _call(self, frame) -> None:
        """The first op of a call of a network function: its call counted, with the tensor it was given."""
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect.CO_VARARGS)
        local = frame.f_locals
        x = first_tensor([local.get(name) for name in code.co_varnames[:count]])
        call, rf = self.hooks.called(self.found[code], x, frame.f_back or frame)
        self.open = [frame, call, rf, None]


def _flat(args):
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


def _name(frame) -> str:
    """The name your code calls the function of `frame` by: a local or global of a caller bound to it (or to a method
    of it); else its own name."""
    code, caller = frame.f_code, frame.f_back
    while caller is not None:
        if yours(caller.f_code.co_filename):
            for scope in (caller.f_locals, caller.f_globals):
                for name, value in list(scope.items()):
                    function = value.__func__ if isinstance(value, types.MethodType) else value
                    if isinstance(function, types.FunctionType) and function.__code__ is code and name.isidentifier():
                        return name
        caller = caller.f_back
    return code.co_qualname
