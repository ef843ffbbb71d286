"""The fixes `--try` applies to your script while it runs, its source untouched: one `Fix` per change, each answering
findings of the diagnosis, each installed for one run (`Applied`) and removed after it.

How a fix reaches code it did not write (all of it global, so one run at a time, and all of it undone on exit):

- **G and D** are recognised on their first call by their class and parameter count (as the diagnosis named them);
  their instance `forward` is then wrapped (that first call has already looked its forward up, so it runs as
  written: a warm-up iteration's): under `torch.autocast` (bf16 where the device runs it fast, else fp16
  with a GradScaler: below), and for D, with its parameters frozen in the calls that the diagnosis saw followed by
  G's optimizer step (those call sites, FILE:LINE, and only those: a call whose input merely carries gradients can
  be D's own step, as in WGAN-GP scripts that do not detach). Freezing for the forward alone is enough: autograd
  records at each op whether a parameter requires grad, so the backward computes no weight gradients for D there.
  A final `nn.Sigmoid` in D is replaced by `nn.Identity`, and `BCELoss` / `F.binary_cross_entropy` compute
  `binary_cross_entropy_with_logits`: the same loss from logits (BCELoss is refused under autocast on CUDA).
- **fp16 without bf16** (a GPU before Ampere): one `torch.amp.GradScaler`; each scalar `backward()` is scaled and each
  optimizer's `step` goes through `scaler.step`, followed by `scaler.update()`. Updating after every optimizer step
  keeps each loss's scale equal to the one its optimizer unscales with, since a loss's gradients are consumed by the
  next step of its own optimizer (the recipe of one scaler per network; PyTorch's AMP examples, "multiple models").
  A loop that runs both backwards before either step would see G's gradients unscaled with a scale that changed in
  between: only when the scale changes (an overflow, or every 2000 clean steps), and the guard watches the losses.
  A step the scaler skips (inf/NaN gradients) calls no optimizer step hook: `on_skipped_step` ends the iteration.
- **Optimizers**: their classes' `__init__` gets `fused=True` (or `foreach=True` where the class has no fused
  kernel). **DataLoaders**: `num_workers`, `persistent_workers` (and `pin_memory` on CUDA) set at construction.
- **Backend flags**: cudnn.benchmark and TF32 through `state.backend_flags`, the trainer's switch, which works
  whichever TF32 API (legacy or per-backend) the script itself used, and restores both exactly.
- **torch.compile**: `module.compile()` on first sight (in place; the first call runs eagerly), CUDA only: on a CPU
  compiling costs minutes per trial and rarely pays for models this small."""
from __future__ import annotations

import inspect
import sys
import types
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module

from ..core.process import backend_flags
from .frames import location
from .report import DoctorReport
from .rules import MachineFacts

AUTOCAST, LOGITS, FREEZE_D, FUSED, WORKERS, PIN, CHANNELS_LAST, CUDNN, TF32, COMPILE = (
    "autocast", "logits", "freeze-d", "fused-optimizers", "loader-workers", "pin-memory", "channels-last",
    "cudnn-benchmark", "tf32", "compile")


@dataclass(frozen=True)
class Fix:
    """One change `--try` can make at run time. `answers`: the findings it is the fix for (it is tried when one of
    them was found); `parts`: the runtime changes it applies (autocast on a BCE loop brings the logits loss)."""

    name: str
    title: str
    answers: tuple
    parts: tuple


@dataclass
class Context:
    """What the fixes need to know of the diagnosed run (`context(report, facts)`)."""

    device_type: str
    bf16: bool
    workers: int
    g: tuple | None                 # (class name, parameters) of G
    d: tuple | None
    d_sigmoid: str | None           # dotted path of D's final nn.Sigmoid
    g_step_sites: frozenset = frozenset()   # (file, line) of D's calls in G's step
    loop_optimizers: tuple = ()     # classes of the optimizers using the for-loop implementation
    bce: bool = False               # the loop calls binary_cross_entropy
    loaders: tuple = ()             # (num_workers, persistent_workers, pin_memory) of each DataLoader

    def to_dict(self) -> dict:
        return {k: (sorted(map(list, v)) if isinstance(v, frozenset) else v) for k, v in self.__dict__.items()}


def context(report: DoctorReport, facts: MachineFacts) -> Context:
    def model(role):
        m = report.models.get(role)
        return (m["class"], m["parameters"]) if m else None
    d = report.models.get("D", {})
    g_opt = report.optimizers.get("G", {}).get("name")
    by_site: dict = {}
    for file, line, opt, n in d.get("steps_after_call", []):
        by_site.setdefault((file, line), set()).add(opt)
    g_sites = frozenset(at for at, opts in by_site.items() if opts == {"G"} or (g_opt and opts == {g_opt}))
    loops = tuple(sorted({o["class"] for o in report.optimizers.values()
                          if o["implementation"].startswith("for-loop")}))
    bce = any(k == "aten::binary_cross_entropy" for k in report.settings.get("loss_ops_per_iteration", {}))
    loaders = tuple((x["num_workers"], x["persistent_workers"], x["pin_memory"])
                    for x in report.settings.get("dataloaders", []))
    return Context(report.device.split(":")[0], facts.bf16, facts.workers, model("G"), model("D"),
                   report.settings.get("d_final_sigmoid"), g_sites, loops, bce, loaders)


FIXES = (
    Fix(AUTOCAST, "autocast on G's and D's forward passes", ("fp32-convolutions",), (AUTOCAST,)),
    Fix(LOGITS, "logits out of D, BCEWithLogitsLoss", ("sigmoid-bce",), (LOGITS,)),
    Fix(FREEZE_D, "D frozen in G's step", ("d-grads-in-g-step",), (FREEZE_D,)),
    Fix(FUSED, "fused (or foreach) optimizers", ("optimizer-for-loop",), (FUSED,)),
    Fix(WORKERS, "DataLoader workers", ("no-workers", "per-sample-transforms", "too-many-workers",
                                             "workers-restart"), (WORKERS,)),
    Fix(PIN, "pinned memory", ("pin-memory",), (PIN,)),
    Fix(CHANNELS_LAST, "channels_last models", ("channels-last",), (CHANNELS_LAST,)),
    Fix(CUDNN, "cudnn.benchmark", ("cudnn-benchmark",), (CUDNN,)),
    Fix(TF32, "TF32 matmuls and convolutions", ("tf32",), (TF32,)),
    Fix(COMPILE, "torch.compile on G and D", (), (COMPILE,)),
)
BY_HAND = {"host-sync": "the values your code reads each step are yours to keep on the device (a source change "
                        "with no run-time equivalent)",
           "per-sample-transforms": "decoding the images once changes how your data is built: apply by hand "
                                    "(its DataLoader workers are tried)"}


def parts_for(kind: str, ctx: Context) -> tuple:
    """The runtime parts that fix a finding (autocast brings the logits loss where the loop uses BCE); none for a
    finding whose fix is not a run-time change (`BY_HAND`)."""
    if kind in BY_HAND:
        return ()
    parts = tuple(p for fix in FIXES if kind in fix.answers for p in fix.parts)
    return ((LOGITS,) if ctx.bce and AUTOCAST in parts else ()) + parts


def candidates(report: DoctorReport, facts: MachineFacts) -> tuple[list, list]:
    """The fixes to try, in the order of the findings (ranked by estimated gain), and the ones not tried here, each
    with its reason: (fixes, [(name or finding kind, why)])."""
    ctx = context(report, facts)
    kinds = report.kinds()
    order = {k: i for i, k in enumerate(kinds)}
    tried, skipped = [], []
    for fix in FIXES:
        found = [k for k in fix.answers if k in order]
        if fix.name == COMPILE:
            if ctx.device_type != "cuda":
                skipped.append((fix.name, "not tried on a CPU: compiling costs minutes per run here and "
                                          "rarely pays for models this small; try it on a GPU"))
            elif report.settings.get("compiled"):
                skipped.append((fix.name, "your models are compiled already"))
            elif ctx.g and ctx.d:
                tried.append((len(kinds), fix))
            continue
        if not found:
            continue
        why = _not_applicable(fix, ctx)
        if why:
            skipped.append((fix.name, why))
        else:
            tried.append((min(order[k] for k in found), fix))
    tried.sort(key=lambda x: x[0])
    fixes = [f for _, f in tried]
    if any(f.name == AUTOCAST for f in fixes) and ctx.bce:  # autocast needs the logits loss: they go together
        fixes = [f for f in fixes if f.name != LOGITS]
        fixes[[f.name for f in fixes].index(AUTOCAST)] = Fix(
            AUTOCAST, "autocast on G's and D's forward passes, with logits and BCEWithLogitsLoss",
            ("fp32-convolutions", "sigmoid-bce"), (LOGITS, AUTOCAST))
    skipped += [(k, why) for k, why in BY_HAND.items() if k in order]
    return fixes, skipped


def _not_applicable(fix: Fix, ctx: Context) -> str | None:
    if fix.name in (AUTOCAST, CHANNELS_LAST) and not (ctx.g or ctx.d):
        return "the doctor did not tell G and D apart in this loop"
    if fix.name in (AUTOCAST, LOGITS) and ctx.bce and not ctx.d_sigmoid:
        return ("D's sigmoid is not a final nn.Sigmoid module (a torch.sigmoid in forward?): remove it by hand, "
                "then use BCEWithLogitsLoss")
    if fix.name == FREEZE_D and not ctx.g_step_sites:
        return "D is called from the same lines in its own step and in G's: freeze it by hand around G's step"
    if fix.name == FUSED and not ctx.loop_optimizers:
        return "no optimizer uses the for-loop implementation"
    if fix.name == WORKERS and all(w == ctx.workers and persistent and (pin or ctx.device_type != "cuda")
                                   for w, persistent, pin in ctx.loaders):
        return (f"your DataLoader already has {ctx.workers} persistent workers, the most this machine's cores "
                "support; the data itself is the cost: decode it once (above)")
    return None


# -- applying them for one run ---------------------------------------------------------------------------------------
@dataclass
class Applied:
    """The fixes of one run, installed on enter and removed on exit (`with Applied(parts, ctx): run the script`)."""

    parts: tuple
    ctx: Context
    on_loss: object = None   # called with each scalar your code calls backward() on, before any scaling
    on_skipped_step: object = None  # called with (optimizer, args, kwargs) when the scaler skipped its step
    seen: dict = field(default_factory=dict)   # id(module) -> "G" / "D" / None for every module with parameters
    models: dict = field(default_factory=dict)  # "G" / "D" -> the module, once called
    g_inputs: list = field(default_factory=list)  # shapes of the tensors G's first call took (noise, labels, ...)
    frozen_calls: int = 0
    _undo: list = field(default_factory=list)
    _finder: object = None
    _in_scaler_step: bool = False
    _stepped: bool = False

    def __enter__(self) -> "Applied":
        p = set(self.parts)
        try:
            self._finder = _module.register_module_forward_pre_hook(self._first_sight)  # G and D found (and fixed)
            self._undo.append(self._finder.remove)
            if LOGITS in p:
                self._set(nn.BCELoss, "forward", _bce_from_logits)
                self._set(F, "binary_cross_entropy", _functional_bce_from_logits)
            fp16 = AUTOCAST in p and not self.ctx.bf16
            if fp16 or self.on_loss is not None:
                self._watch_backward(fp16)
            if FUSED in p:
                for name in self.ctx.loop_optimizers:
                    cls = getattr(torch.optim, name, None)
                    if cls is not None:
                        self._set(cls, "__init__", _with_kwargs(cls.__init__, _faster_kwargs(cls)))
            if WORKERS in p or PIN in p:
                loader = torch.utils.data.DataLoader
                kwargs = {}
                if WORKERS in p:
                    kwargs.update(num_workers=self.ctx.workers, persistent_workers=self.ctx.workers > 0)
                if PIN in p or (WORKERS in p and self.ctx.device_type == "cuda"):
                    kwargs.update(pin_memory=True)
                self._set(loader, "__init__", _with_kwargs(loader.__init__, kwargs))
            if CUDNN in p or TF32 in p:  # the trainer's own switch: safe whichever TF32 API the script used
                flags = backend_flags(tf32=True if TF32 in p else None,
                                      cudnn_benchmark=True if CUDNN in p else None)
                flags.__enter__()
                self._undo.append(lambda: flags.__exit__(None, None, None))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> bool:
        """Every undo runs, whatever one of them raises (the first error is raised after the rest)."""
        first = None
        while self._undo:
            try:
                self._undo.pop()()
            except BaseException as e:  # a Ctrl-C landing here must not leave a patch behind
                first = first or e
        if first is not None:
            raise first
        return False

    def _set(self, owner, name, value) -> None:
        own = name in getattr(owner, "__dict__", {}) or not isinstance(owner, type)
        original = getattr(owner, name)
        setattr(owner, name, value)
        self._undo.append(lambda: setattr(owner, name, original) if own else delattr(owner, name))

    # -- G and D ------------------------------------------------------------------------------------------------
    def _first_sight(self, module, args):
        key = id(module)
        if key in self.seen:
            return None
        role = self._role(module)
        self.seen[key] = role
        if role is None:
            return None
        self.models.setdefault(role, module)
        if all(r in self.models for r, known in (("G", self.ctx.g), ("D", self.ctx.d)) if known):
            self._finder.remove()  # both found: the loop runs on without a global hook on every module call
        if role == "G" and not self.g_inputs:
            self.g_inputs = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
        p = set(self.parts)
        if LOGITS in p and role == "D" and self.ctx.d_sigmoid:
            parent, _, leaf = self.ctx.d_sigmoid.rpartition(".")
            owner = module.get_submodule(parent) if parent else module
            if not isinstance(getattr(owner, leaf, None), nn.Sigmoid):  # BCE on logits alone would be wrong
                raise RuntimeError(f"gantools' logits fix found no nn.Sigmoid at D.{self.ctx.d_sigmoid} in this run")
            setattr(owner, leaf, nn.Identity())
        if CHANNELS_LAST in p:
            module.to(memory_format=torch.channels_last)
        forward = module.forward
        autocast = AUTOCAST in p
        freeze = FREEZE_D in p and role == "D"
        if autocast or freeze:
            module.forward = self._wrapped(module, forward, autocast, freeze)
            self._undo.append(lambda: module.__dict__.pop("forward", None))
        if COMPILE in p:
            module.compile()
        return None

    def _role(self, module) -> str | None:
        if next(module.parameters(), None) is None:
            return None
        me = (type(getattr(module, "_orig_mod", module)).__name__, sum(p.numel() for p in module.parameters()))
        return "G" if me == self.ctx.g else "D" if me == self.ctx.d else None

    def _wrapped(self, module, forward, autocast: bool, freeze: bool):
        dtype = torch.bfloat16 if self.ctx.bf16 else torch.float16
        device_type, sites, applied = self.ctx.device_type, self.ctx.g_step_sites, self
        # under torch.compile the site lookup stays out of the graph (dynamo cannot trace frame inspection); made
        # here, not at import, since importing dynamo changes process-wide settings
        called_from = torch.compiler.disable(_called_from) if COMPILE in self.parts else _called_from

        def run(*args, **kwargs):
            params = []
            if freeze and called_from(sites):
                params = [p for p in module.parameters() if p.requires_grad]
                applied.frozen_calls += 1
            for p in params:
                p.requires_grad_(False)
            try:
                if autocast:
                    with torch.autocast(device_type, dtype=dtype):
                        out = forward(*args, **kwargs)
                    return _float32(out, dtype)
                return forward(*args, **kwargs)
            finally:
                for p in params:  # the graph is recorded: D's weights got no gradient edges in this call
                    p.requires_grad_(True)
        return run

    # -- fp16 ---------------------------------------------------------------------------------------------------
    def _watch_backward(self, fp16: bool) -> None:
        scaler = torch.amp.GradScaler(self.ctx.device_type) if fp16 else None
        backward, on_loss = torch.Tensor.backward, self.on_loss

        def scaled_backward(tensor, *args, **kwargs):
            if on_loss is not None:
                on_loss(tensor)
            if scaler is not None and tensor.numel() == 1 and tensor.requires_grad and tensor.is_floating_point():
                tensor = scaler.scale(tensor)
            return backward(tensor, *args, **kwargs)
        self._set(torch.Tensor, "backward", scaled_backward)
        if scaler is not None:
            self._scale_steps(scaler)

    def _scale_steps(self, scaler) -> None:
        """Each optimizer's `step` through the scaler (a bound method, as LR schedulers expect one), and gradient
        clipping on unscaled gradients: `scaler.unscale_` first for the optimizers owning what is clipped, as
        PyTorch's AMP examples do ("working with unscaled gradients")."""
        applied, built, unscaled = self, [], set()
        init = torch.optim.Optimizer.__init__

        def optimizer_init(opt, *args, **kwargs):
            init(opt, *args, **kwargs)
            built.append(opt)
            step = opt.step

            def scaled_step(self, *a, **k):
                if applied._in_scaler_step:  # GradScaler.step calls optimizer.step itself
                    applied._stepped = True
                    return step(*a, **k)
                applied._in_scaler_step, applied._stepped = True, False
                try:
                    out = scaler.step(self, *a, **k)
                finally:
                    applied._in_scaler_step = False
                scaler.update()
                unscaled.clear()
                # inf/NaN gradients: the scaler skipped optimizer.step, so no step hook saw this iteration end
                if not applied._stepped and applied.on_skipped_step is not None:
                    applied.on_skipped_step(self, a, k)
                return out
            opt.step = types.MethodType(scaled_step, opt)
        self._set(torch.optim.Optimizer, "__init__", optimizer_init)

        def unscaling(clip):
            def clip_unscaled(parameters, *args, **kwargs):
                params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
                ids = {id(p) for p in params}
                for opt in built:
                    if id(opt) not in unscaled and any(id(p) in ids for g in opt.param_groups for p in g["params"]):
                        scaler.unscale_(opt)
                        unscaled.add(id(opt))
                return clip(params, *args, **kwargs)
            return clip_unscaled
        utils = torch.nn.utils
        for name in ("clip_grad_norm_", "clip_grad_value_"):
            self._set(utils, name, unscaling(getattr(utils, name)))


def _called_from(sites) -> bool:
    """Whether the model was called from one of `sites` (FILE, LINE) of your code."""
    return location(sys._getframe(2)) in sites


def _bce_from_logits(self, input, target):
    return F.binary_cross_entropy_with_logits(input, target, weight=self.weight, reduction=self.reduction)


def _functional_bce_from_logits(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    return F.binary_cross_entropy_with_logits(input, target, weight=weight, size_average=size_average,
                                              reduce=reduce, reduction=reduction)


def _faster_kwargs(cls) -> dict:
    """fused=True where the class takes it (Adam, AdamW, SGD, ...), else foreach=True (every built-in)."""
    return {"fused": True, "foreach": None} if "fused" in inspect.signature(cls).parameters else {"foreach": True}


def _with_kwargs(init, changes: dict):
    """`init` with keyword arguments set, whether the caller passed them by keyword or by position."""
    signature = inspect.signature(init)

    def __init__(self, *args, **kwargs):
        bound = signature.bind_partial(self, *args, **kwargs)
        for k, v in changes.items():
            if k in signature.parameters:
                bound.arguments[k] = v
        return init(*bound.args, **bound.kwargs)
    return __init__


def _float32(out, dtype):
    """The outputs of G's or D's forward under autocast, back in float32 where autocast made them 16-bit, as
    torch.autocast's documentation advises for tensors used outside the autocast region: your loss then sees one
    dtype (MSELoss's backward refuses a bf16 input beside a float32 target before torch 2.14, pytorch/pytorch#36553;
    the patch puts the loss inside the block instead, where autocast runs losses in float32 anyway)."""
    if isinstance(out, torch.Tensor):
        return out.float() if out.dtype == dtype else out
    if isinstance(out, (tuple, list)) and not hasattr(out, "_fields"):
        return type(out)(_float32(x, dtype) for x in out)
    return out
