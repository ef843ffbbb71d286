"""The doctor's hooks and patches on a loop it did not write, recording into `Observations` (what each one sees,
and why full backward hooks are not among them: `gantools.doctor`). They are global: one doctor at a time."""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections import Counter

import torch
from torch import nn
from torch.nn.modules import module as _module
from torch.optim import optimizer as _optim
from torch.profiler import record_function
from torch.utils.data import DataLoader
from torch.utils.data import dataloader as _dataloader

from .frames import LIBRARIES, compiling, first_tensor, is_leaf, location, name_in_frames, site, yours
from .feeds import Feeds, wrap_cat
from .functions import FunctionWatch
from .lightning import TrainerWatch, is_lightning_module
from .observations import CL, NCHW, Call, Model, Observations, Optimizer
from .penalties import wrap_grad

SYNC_METHODS = ("item", "tolist", "__bool__", "__float__", "__int__", "__repr__", "__format__", "cpu")
RANGE = "gantools-doctor#"  # provisional profiler range names, renamed to phases once the loop is understood
# A read counted here is inside a profiler range: "host sync" (a phase) at the top level, this one inside a model's
# forward (whose phase it stays part of), so the profiler's syncs can be told from those counted already.
COUNTED_READ = "gantools-doctor: value read"
_ACTIVE: list = []  # the doctor running now (hooks are global: one at a time)


class Hooks:
    """Installs the hooks and patches, records what they see into `obs`, and removes them all. The light ones
    (optimizer steps, DataLoader, optimizer construction) stay for the whole run; the full ones (module forward,
    value reads, gradients) are switched off while iterations are timed. `on_step(optimizer)` is called after each
    optimizer step."""

    def __init__(self, obs: Observations, on_step=None):
        self.obs, self.on_step = obs, on_step
        self.owner = (os.getpid(), threading.get_ident())  # DataLoader workers are forked with the hooks: not theirs
        self.full = False          # module hooks, value-read patches and grad hooks active
        self.profiling = False     # ranges are being recorded
        self.depth, self.top, self.in_data, self.in_sync, self.stepping = 0, None, False, False, False
        self.paramless: set = set()
        self.leaf: dict[int, bool] = {}
        self.pending_calls: list = []
        self.pending_grads: Counter = Counter()
        self.next_range = 0
        self.open_opt_range = None
        self.feeds = Feeds()                         # what made each batch a model is fed, this iteration
        self.functions = FunctionWatch(self)         # networks written as plain functions (no nn.Module)
        self._last_leaf_name = None  # the last leaf module run inside the current top-level call
        self._sigmoids: list = []  # (nn.Sigmoid, its output) run inside the last top-level call
        self._handles, self._grad_handles, self._patches, self._light_handles = [], [], [], []
        self.trainers = TrainerWatch(obs)  # Lightning's Trainer, when it runs the loop
        self.uncounted = contextlib.nullcontext  # a batch's loading, left out of the host budget's count (`Schedule`)

    def mine(self) -> bool:
        """True in the process and thread the doctor watches (hooks are global: forked workers inherit them)."""
        return (os.getpid(), threading.get_ident()) == self.owner

    # -- install / remove ---------------------------------------------------------------------------------------
    def install(self) -> None:
        self._light_handles = [_optim.register_optimizer_step_pre_hook(self._opt_pre),
                               _optim.register_optimizer_step_post_hook(self._opt_post)]
        self._patch(_dataloader._BaseDataLoaderIter, "__next__", self._wrap_next)
        self._patch(DataLoader, "__iter__", self._wrap_iter)
        self._patch(torch.optim.Optimizer, "__init__", lambda original: _optimizer_init(self.obs, original))
        self._patch(DataLoader, "__init__", lambda original: _loader_init(self.obs, original))
        self.trainers.install()
        self.set_full(True)

    def add_step_hook(self, hook) -> None:
        """One more global optimizer post-step hook, removed with the others."""
        self._light_handles.append(_optim.register_optimizer_step_post_hook(hook))

    def _patch(self, owner, name, make):
        own = name in owner.__dict__
        original = getattr(owner, name)
        setattr(owner, name, make(original))
        self._patches.append((owner, name, original, own))

    def _unpatch(self, keep_light: bool) -> None:
        kept = []
        for owner, name, original, own in reversed(self._patches):
            if keep_light and owner not in (torch.Tensor, torch, torch.autograd):
                kept.append((owner, name, original, own))
                continue
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
        self._patches = kept[::-1]

    def set_full(self, on: bool) -> None:
        """Module hooks, value-read patches, grad hooks and the gradient penalty's watch: on for warm-up and profiling,
        off while timing."""
        if on == self.full:
            return
        self.full = on
        if on:
            self._handles = [_module.register_module_forward_pre_hook(self._pre),
                             _module.register_module_forward_hook(self._post)]
            for name in SYNC_METHODS:
                self._patch(torch.Tensor, name, lambda original, n=name: _wrap_read(self, n, original))
            self._patch(torch, "cat", lambda original: wrap_cat(self, original))
            self._patch(torch.autograd, "grad", lambda original: wrap_grad(self, original))
            for m in self.obs.models.values():
                self._hook_grads(m)
            self.functions.start()
        else:
            self.functions.stop()
            for h in self._handles + self._grad_handles:
                h.remove()
            self._handles, self._grad_handles = [], []
            self._unpatch(keep_light=True)
            self.depth, self.top = 0, None

    def remove(self) -> None:
        self.functions.stop()
        for h in self._light_handles + self._handles + self._grad_handles:
            h.remove()
        self._light_handles, self._handles, self._grad_handles = [], [], []
        self._unpatch(keep_light=False)
        self.trainers.remove()
        self.full = self.profiling = False

    def new_iteration(self) -> None:
        self.functions.new_iteration()
        self.feeds.new_iteration()

    def _range(self, obj):
        self.next_range += 1
        self.obs.ranges[self.next_range] = obj
        rf = record_function(f"{RANGE}{self.next_range}")
        rf.__enter__()
        return rf

    # -- models -------------------------------------------------------------------------------------------------
    def _model(self, module: nn.Module, frame) -> Model | None:
        key = id(module)
        m = self.obs.models.get(key)
        if m is None and key not in self.paramless:
            if next(module.parameters(), None) is None:
                self.paramless.add(key)
                return None
            m = self.obs.models[key] = Model(module, name_in_frames(module, frame) or type(module).__name__)
            self._hook_grads(m)
        return m

    def _hook_grads(self, m: Model) -> None:
        if m.module is None:  # a function's parameters: see `functions`
            return

        def seen(param, model=m):
            if self.full:
                self.pending_grads[model] += 1
        for p in m.module.parameters():
            if p.requires_grad:
                self._grad_handles.append(p.register_post_accumulate_grad_hook(seen))

    def _pre(self, module, args):
        if compiling() or not self.mine() or is_lightning_module(module):  # a container: G and D are inside it
            return
        self.depth += 1
        if self.depth > 1:
            return
        self._sigmoids = []
        frame = sys._getframe(1)
        self.functions.outside(frame)
        m = self._model(module, frame)
        if m is None:
            if "Loss" in type(module).__name__:
                self.obs.losses[type(module).__name__] += 1
            return
        x = first_tensor(args)
        call, rf = self.called(m, x, frame)
        self.top = (call, rf, x)

    def called(self, m: Model, x, frame) -> tuple:
        """One top-level call of `m` on input `x` from `frame`: counted (what fed it: `feeds`), and a profiler range
        opened while profiling. Returns the Call and its range (None when not profiling)."""
        m.calls += 1
        at = location(frame)
        if m.calls <= 16:  # where your code calls it (the first calls are enough)
            m.sites[site(frame)[0]] += 1
            if at is not None:
                m.locations[at] += 1
        if x is not None and x.dim() > 0:
            self.feeds.count(m, x, self.obs.window)
        call = Call(m, at)
        self.pending_calls.append(call)
        return call, (self._range(call) if self.profiling else None)

    def returned(self, call: Call, rf, out) -> None:
        """The call's end: its range closed, and its output remembered as made by its model (for what it feeds)."""
        if rf is not None:
            rf.__exit__(None, None, None)
        if out is not None:
            call.model.out_shape = tuple(out.shape)
            self.feeds.output(call.model, out)

    def _post(self, module, args, output):
        if compiling() or not self.mine() or is_lightning_module(module):
            return
        self.depth -= 1
        key = id(module)
        leaf = self.leaf.get(key)
        if leaf is None:
            leaf = self.leaf[key] = is_leaf(module)
        if leaf and self.depth > 0:
            self._leaf_seen(module, args, output)
        if self.depth or self.top is None:
            return
        call, rf, x = self.top
        self.top = None
        self.returned(call, rf, first_tensor(output))
        call.model.last_module = self._last_leaf_name
        self._last_leaf_name = None
        if isinstance(output, (tuple, list)):
            call.model.outputs_seen(output, self._sigmoids)

    def _leaf_seen(self, module, args, output):
        self._last_leaf_name = type(module).__name__
        if isinstance(module, nn.Sigmoid) and isinstance(output, torch.Tensor):
            self._sigmoids.append((module, output))
        if isinstance(module, (nn.modules.conv._ConvNd, nn.Linear)) and isinstance(output, torch.Tensor):
            window = self.obs.window
            device_type = output.device.type
            autocast = torch.is_autocast_enabled(device_type) if device_type in ("cpu", "cuda") else False
            window.dtypes[(str(output.dtype).replace("torch.", ""), autocast)] += 1
            x = first_tensor(args)
            if x is not None and x.dim() == 4 and isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
                # The layout the convolution runs in: channels_last where its input's or its weight's strides say so
                # (ATen's _conv_suggest_memory_format_impl and mkldnn_conv_use_channels_last ask either), so
                # channels_last models fed NCHW batches or 1x1 noise count as channels_last.
                cl = _channels_last(x) or _channels_last(module.weight)
                window.formats[CL if cl else NCHW] += 1
                self.obs.conv_shapes[id(module)].add(tuple(x.shape))

    # -- optimizers ---------------------------------------------------------------------------------------------
    def _opt_pre(self, opt, args, kwargs):
        if not self.mine():
            return
        if self.depth:  # a forward that raised never closed its hooks: start clean
            self.depth, self.top = 0, None
        self.functions.stepped(sys._getframe(1))
        self.stepping = True
        o = self._optimizer(opt)
        self.open_opt_range = self._range(o) if self.profiling else None

    def _opt_post(self, opt, args, kwargs):
        if not self.mine():
            return
        self.stepping = False
        if self.open_opt_range is not None:
            self.open_opt_range.__exit__(None, None, None)
            self.open_opt_range = None
        o = self._optimizer(opt)
        o.steps += 1
        o.window_steps += self.obs.counting
        for call in self.pending_calls:
            call.next_opt = o
            if call.at is not None:
                call.model.phase_sites[(call.at, o)] += 1
        self.pending_calls = []
        for m, n in self.pending_grads.items():
            o.grads_from[m] += n
        self.pending_grads = Counter()
        if self.on_step is not None:
            self.on_step(o)

    def _optimizer(self, opt) -> Optimizer:
        o = self.obs.optimizers.get(id(opt))
        if o is None:
            o = self.obs.optimizers[id(opt)] = Optimizer(opt, name_in_frames(opt, sys._getframe(1))
                                                         or type(opt).__name__)
            self.functions.consider(o)
        return o

    # -- data -----------------------------------------------------------------------------------------------------
    def _wrap_iter(self, original):
        obs, hooks = self.obs, self

        def __iter__(loader):
            if loader not in obs.loaders:
                obs.loaders.append(loader)
            restarts = loader.num_workers > 0 and not loader.persistent_workers and hooks.mine()
            started = time.perf_counter()
            with hooks.uncounted():  # a new epoch's start (its seed drawn, workers started) is loading too
                it = original(loader)
            if restarts:  # a new iterator starts new workers: timed until its first batch is in (`__next__`)
                it._gantools_epoch_start = (loader, started)
            return it
        return __iter__

    def _wrap_next(self, original):
        hooks = self

        def __next__(it):
            if not hooks.mine():
                return original(it)
            start = it.__dict__.pop("_gantools_epoch_start", None)
            if hooks.in_data:  # inside a fetch already (`watch.data`)
                batch = original(it)
            else:
                hooks.obs.data_site = hooks.obs.data_site or site(sys._getframe(1))[0]
                batch = hooks.fetch(lambda: original(it))
            if start is not None:
                loader, started = start
                hooks.obs.epoch_starts.setdefault(id(loader), []).append(1e3 * (time.perf_counter() - started))
            return batch
        return __next__

    def fetch(self, get):
        """Fetch a batch as data wait (a labelled range while profiling) and count its images."""
        self.functions.close()
        self.in_data = True
        rf = record_function("data wait") if self.profiling else contextlib.nullcontext()
        try:
            with rf, self.uncounted():
                batch = get()
        finally:
            self.in_data = False
        x = first_tensor(batch)
        if x is not None and x.dim() > 0 and self.obs.counting:
            window = self.obs.window
            window.images_loader += x.shape[0]
            window.batches += 1
            window.batch_sizes[x.shape[0]] += 1
        return batch

    # -- value reads ----------------------------------------------------------------------------------------------


def _channels_last(t) -> bool:
    """Whether ATen's `suggest_memory_format`, which its convolutions ask of input and weight, says channels_last:
    c10's `is_channels_last_strides_2d` ported, since it reads strides, not contiguity, so a one-channel weight that
    `Module.to(channels_last)` re-strode counts as channels_last and a tensor both layouts describe falls back to
    NCHW, as in ATen. (torch's own Python copy, `torch._prims_common.suggest_memory_format`, is private.)"""
    if not (isinstance(t, torch.Tensor) and t.dim() == 4 and t.layout == torch.strided):
        return False
    size, stride, low = t.shape, t.stride(), 0
    if stride[1] == 0:
        return False
    for d in (1, 3, 2, 0):
        if size[d] == 0 or stride[d] < low or (d == 0 and low == stride[1]):
            return False
        low = stride[d] * size[d]
    return True


def _wrap_read(hooks: Hooks, name: str, original):
    """`Tensor.<name>` (a value read), counted at your line and timed as a host sync while the full hooks are on."""
    def read(tensor, *args, **kwargs):
        if (compiling() or hooks.in_sync or hooks.in_data or not hooks.full
                or not hooks.mine()
                or (name == "cpu" and tensor.device.type == "cpu")):
            return original(tensor, *args, **kwargs)
        caller = sys._getframe(1)
        if caller.f_code.co_filename.startswith(LIBRARIES):  # torch reading its own tensors: not your sync
            return original(tensor, *args, **kwargs)
        if tensor.device.type == "cpu" and hooks.obs.device_in_use().type != "cpu":  # a host value: no wait
            return original(tensor, *args, **kwargs)
        hooks.functions.outside(caller)
        hooks.in_sync = True
        top = hooks.depth == 0 and hooks.functions.open is None  # outside every model's forward
        rf = (record_function("host sync" if top else COUNTED_READ) if hooks.profiling
              else contextlib.nullcontext())
        try:
            with rf:
                return original(tensor, *args, **kwargs)
        finally:
            hooks.in_sync = False
            where, code = site(caller)
            window = hooks.obs.window
            window.syncs[where] += 1
            window.sites.setdefault(where, (code, name.strip("_")))
    read.__name__ = name
    return read


def _optimizer_init(obs: Observations, original):
    """Optimizer construction recorded: the order (a later run builds them alike) and the line of your code."""
    def __init__(opt, *args, **kwargs):
        original(opt, *args, **kwargs)
        obs.constructed.append(opt)
        obs.built_at[id(opt)] = location(sys._getframe(1))
    return __init__


def _loader_init(obs: Observations, original):
    """DataLoader construction recorded: the line of your code that built it (where its settings are changed)."""
    by_dataset = {}  # id(dataset) -> where your code built a DataLoader over it

    def __init__(loader, *args, **kwargs):
        original(loader, *args, **kwargs)
        caller = sys._getframe(1)
        at = location(caller)
        if yours(caller.f_code.co_filename):
            by_dataset[id(loader.dataset)] = at
        else:  # a library's DataLoader over your dataset (Accelerate's prepare rebuilds yours around it, with
            # a batch sampler of its own, and iterates that one): your DataLoader's line is where to change it
            at = by_dataset.get(id(loader.dataset), at)
        obs.built_at[id(loader)] = at
    return __init__
