"""The fixes `--try` applies to your script while it runs, its source untouched: one `Fix` object per change, which
holds all of it: the findings it answers, whether it applies, how it is installed for one run (`Applied`, which removes
it after) and its edit of your source (`patching.make_patch`).

How a fix reaches code it did not write (all of it global, so one run at a time, and all of it undone on exit):

- **G and D** are recognised on their first call by their class and parameter count (as the diagnosis named them);
  each fix then changes the module in place (`Fix.on_model`) and wraps its instance `forward` (`Fix.wrap`, each
  fix's wrapper around the forward the fixes before it left; that first call has already looked its forward up, so
  it runs as written: a warm-up iteration's): under `torch.autocast` (`autocast`), and for D, with its parameters
  frozen in the calls that the diagnosis saw followed by G's optimizer step (`freeze`). A final `nn.Sigmoid` in D
  is replaced by `nn.Identity`, and `BCELoss` / `F.binary_cross_entropy` compute `binary_cross_entropy_with_logits`:
  the same loss from logits (BCELoss is refused under autocast on CUDA).
- **fp16 without bf16**, **optimizers** and **DataLoaders** (keywords at construction): `fix`.
- **Backend flags**: cudnn.benchmark and TF32 through `core.process.backend_flags`, the trainer's switch, which works
  whichever TF32 API (legacy or per-backend) the script itself used, and restores both exactly.
- **A gradient penalty taken lazily**: `torch.autograd.grad` at the penalty's lines, as the diagnosis placed them
  (`lazy_penalty`: it changes the losses by design, `Fix.changes_losses`).
- **A folder's images decoded once**: the DataLoader built over a torchvision folder with deterministic transforms
  gets its items computed once, when it is built, and served from memory (`pipeline`).
- **torch.compile**: `module.compile()` on first sight (in place; the first call runs eagerly), CUDA only: on a CPU
  compiling costs minutes per trial and rarely pays for models this small."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module

from ...core.process import backend_flags
from .fix import (BackendFlag, Fix, LoaderSetting, ModelStatement, faster_kwargs, keywords_missed, watch_backward,
                     with_kwargs)
from ..editing import logits
from ..editing.logits_file import LOGITS
from .pipeline import DECODE_ONCE, DecodeOnce
from .autocast import AUTOCAST, Autocast, no_final_sigmoid, no_models
from .detach import DETACH, DetachFakes
from .freeze import FREEZE_D, FreezeD
from .lazy_penalty import LAZY_PENALTY, penalty_sites
from ..findings.report import DoctorReport
from ..findings.rules import MachineFacts, faster_impl
from .trainer import PRECISION, TrainerPrecision

FUSED, WORKERS, PIN, CHANNELS_LAST, CUDNN, TF32, COMPILE = (
    "fused-optimizers", "loader-workers", "pin-memory", "channels-last",
    "cudnn-benchmark", "tf32", "compile")


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
    penalty_sites: frozenset = frozenset()  # (file, line) of D's gradient penalty calls (autograd.grad)
    d_step_sites: frozenset = frozenset()   # (file, line) of D's calls in its own step
    decode: tuple | None = None     # (the DataLoader's dataset class, why its items cannot be served from memory)

    def to_dict(self) -> dict:
        return {k: (sorted(map(list, v)) if isinstance(v, frozenset) else v) for k, v in self.__dict__.items()}


def context(report: DoctorReport, facts: MachineFacts) -> Context:
    """What the fixes need of the diagnosis, so a run can find G, D and their call sites again.

    Args:
        report: the diagnosis of the script.
        facts: the machine it ran on.

    Returns:
        The `Context` of every fix's run-time change and source edit.
    """
    def model(role):
        m = report.models.get(role)
        return (m["class"], m["parameters"]) if m else None
    d = report.models.get("D", {})
    g_opt = report.optimizers.get("G", {}).get("name")
    by_site: dict = {}
    for file, line, opt, _n in d.get("steps_after_call", []):
        by_site.setdefault((file, line), set()).add(opt)
    d_opt = report.optimizers.get("D", {}).get("name")
    g_sites = frozenset(at for at, opts in by_site.items() if opts == {"G"} or (g_opt and opts == {g_opt}))
    d_sites = frozenset(at for at, opts in by_site.items() if opts == {"D"} or (d_opt and opts == {d_opt}))
    loops = tuple(sorted({o["class"] for o in report.optimizers.values()
                          if o["implementation"].startswith("for-loop")}))
    bce = any(k == "aten::binary_cross_entropy" for k in report.settings.get("loss_ops_per_iteration", {}))
    loaders = tuple((x["num_workers"], x["persistent_workers"], x["pin_memory"])
                    for x in report.settings.get("dataloaders", []))
    decoded = [(x["dataset"], x["decode"]["run_time"]) for x in report.settings.get("dataloaders", [])
               if x.get("decode")]
    return Context(report.device.split(":")[0], facts.bf16, facts.workers, model("G"), model("D"),
                   report.settings.get("d_final_sigmoid"), g_sites, loops, bce, loaders, penalty_sites(report),
                   d_sites, decoded[0] if decoded else None)


# -- one object per fix ----------------------------------------------------------------------------------------------
class Logits(Fix):
    """D's final nn.Sigmoid replaced by nn.Identity, BCELoss and F.binary_cross_entropy computed from logits; its
    edit is made whole or not at all (half of it would train on another loss)."""

    whole = True

    def not_applicable(self, ctx):
        return no_final_sigmoid(ctx)

    def install(self, applied):
        applied.patch(nn.BCELoss, "forward", _bce_from_logits)
        applied.patch(F, "binary_cross_entropy", _functional_bce_from_logits)

    def on_model(self, applied, module, role):
        path = applied.ctx.d_sigmoid
        if role == "D" and path:
            parent, _, leaf = path.rpartition(".")
            owner = module.get_submodule(parent) if parent else module
            if not isinstance(getattr(owner, leaf, None), nn.Sigmoid):  # BCE on logits alone would be wrong
                raise RuntimeError(f"gantools' logits fix found no nn.Sigmoid at D.{path} in this run")
            setattr(owner, leaf, nn.Identity())

    def plan(self, plans, report, ctx, by_hand):
        logits.plan(self.name, plans, report, ctx, by_hand)

    def missed(self, plan, shown):
        return logits.missed(self.name, plan, shown)


class Fused(Fix):
    """The for-loop optimizers built with fused=True (or foreach=True where the class has no fused kernel)."""

    def not_applicable(self, ctx):
        return None if ctx.loop_optimizers else "no optimizer uses the for-loop implementation"

    def install(self, applied):
        for name in applied.ctx.loop_optimizers:
            cls = getattr(torch.optim, name, None)
            if cls is not None:
                applied.patch(cls, "__init__", with_kwargs(cls.__init__, faster_kwargs(cls)))

    def plan(self, plans, report, ctx, by_hand):
        for o in report.optimizers.values():
            if o["implementation"].startswith("for-loop") and o.get("built_at"):
                file, line = o["built_at"]
                keyword, value = faster_impl(o["class"]).split("=")
                plans[file].keywords[line] = (o["class"], {keyword: value})

    def missed(self, plan, shown):
        return keywords_missed(FUSED, plan, shown, loaders=False)


class Workers(LoaderSetting):
    """As many persistent DataLoader workers as the machine's cores support (pinned memory with them on CUDA)."""

    def not_applicable(self, ctx):
        if all(w == ctx.workers and persistent and (pin or ctx.device_type != "cuda")
               for w, persistent, pin in ctx.loaders):
            return (f"your DataLoader already has {ctx.workers} persistent workers, the most this machine's cores "
                    "support; the data itself is the cost: decode it once (above)")
        return None

    def keywords(self, ctx):
        pin = {"pin_memory": True} if ctx.device_type == "cuda" else {}
        return {"num_workers": ctx.workers, "persistent_workers": ctx.workers > 0, **pin}

    def missed(self, plan, shown):
        return keywords_missed(WORKERS, plan, shown, loaders=True)


class Pin(LoaderSetting):
    """Batches in pinned memory, so their copies to the GPU can overlap with compute."""

    def keywords(self, ctx):
        return {"pin_memory": True}


class ChannelsLast(ModelStatement):
    """G and D in channels_last memory format."""

    statement = "{m} = {m}.to(memory_format=torch.channels_last)"

    def not_applicable(self, ctx):
        return no_models(ctx)

    def on_model(self, applied, module, role):
        module.to(memory_format=torch.channels_last)


class Compile(ModelStatement):
    """`module.compile()` on G and D; offered on CUDA whatever the findings, never on a CPU (`rank`)."""

    statement = "{m}.compile()"

    def rank(self, report, ctx, order):
        if ctx.device_type != "cuda":
            return None, ("not tried on a CPU: compiling costs minutes per run here and rarely pays for models "
                          "this small; try it on a GPU")
        if report.settings.get("compiled"):
            return None, "your models are compiled already"
        return (len(order), None) if ctx.g and ctx.d else (None, None)

    def install(self, applied):
        applied.compiles = True

    def on_model(self, applied, module, role):
        module.compile()


class Cudnn(BackendFlag):
    """cudnn.benchmark: with fixed shapes, the fastest convolution algorithms timed once and kept."""

    flag, statements = "cudnn_benchmark", ("torch.backends.cudnn.benchmark = True",)

    def trainer_keywords(self, bf16):
        return {"benchmark": "True"}


class Tf32(BackendFlag):
    """TF32 matmuls and convolutions on Ampere and newer GPUs."""

    flag, statements = "tf32", ('torch.set_float32_matmul_precision("high")', "torch.backends.cudnn.allow_tf32 = True")


FIXES = (
    Autocast(name=AUTOCAST, title="autocast on G's and D's forward passes", answers=("fp32-convolutions",)),
    TrainerPrecision(name=PRECISION, title='Trainer(..., precision="bf16-mixed")', answers=("fp32-convolutions",)),
    Logits(name=LOGITS, title="logits out of D, BCEWithLogitsLoss", answers=("sigmoid-bce",)),
    FreezeD(name=FREEZE_D, title="D frozen in G's step", answers=("d-grads-in-g-step",)),
    DetachFakes(name=DETACH, title="G's images detached in D's step", answers=("g-grads-in-d-step",)),
    Fused(name=FUSED, title="fused (or foreach) optimizers", answers=("optimizer-for-loop",)),
    DecodeOnce(name=DECODE_ONCE, title="each image decoded once, served from memory", answers=("decode-per-item",)),
    Workers(name=WORKERS, title="DataLoader workers",
            answers=("no-workers", "per-sample-transforms", "decode-per-item", "too-many-workers",
                     "workers-restart")),
    Pin(name=PIN, title="pinned memory", answers=("pin-memory",)),
    ChannelsLast(name=CHANNELS_LAST, title="channels_last models", answers=("channels-last",)),
    Cudnn(name=CUDNN, title="cudnn.benchmark", answers=("cudnn-benchmark",)),
    Tf32(name=TF32, title="TF32 matmuls and convolutions", answers=("tf32",)),
    Compile(name=COMPILE, title="torch.compile on G and D"),
    LAZY_PENALTY,
)
BY_HAND = {"host-sync": "the values your code reads each step are yours to keep on the device (a source change "
                        "with no run-time equivalent)",
           "read-feeds-training": "a value your loop computes with is kept on the device by its source rewrite "
                                  "(shown); read less often, it would change the training",
           "per-sample-transforms": "decoding the images once changes how your data is built: apply by hand "
                                    "(its DataLoader workers are tried)"}

SHOWN = ("decode-per-item",)  # tried at run time, but its change is lines that build your data: shown, not a patch


def parts_for(kind: str, ctx: Context) -> tuple:
    """The runtime parts that fix a finding (autocast brings the logits loss where the loop uses BCE); none for a
    finding whose fix is not a run-time change (`BY_HAND`).

    Args:
        kind: the finding's kind.
        ctx: what the fixes know of the run.

    Returns:
        The names of the fixes to apply, as `Applied` and `patching.make_patch` take them.
    """
    if kind in BY_HAND or kind in SHOWN:
        return ()
    parts = tuple(p for fix in FIXES if kind in fix.answers for p in fix.parts)
    return tuple(dict.fromkeys(n for fix in by_name(parts) for n in fix.needs(ctx))) + parts


def candidates(report: DoctorReport, facts: MachineFacts) -> tuple[list, list]:
    """The fixes to try, in the order of the findings (ranked by estimated gain), and the ones not tried here.

    Args:
        report: the diagnosis, its findings ranked.
        facts: the machine it ran on.

    Returns:
        (the `Fix` objects to try, in order; [(fix name or finding kind, why it is not tried)]).
    """
    ctx = context(report, facts)
    order = {k: i for i, k in enumerate(report.kinds())}
    tried, skipped = [], []
    for fix in FIXES:
        rank, why = fix.rank(report, ctx, order)
        if why:
            skipped.append((fix.name, why))
        elif rank is not None:
            tried.append((rank, fix))
    tried.sort(key=lambda x: x[0])
    fixes = [f for _, f in tried]
    sixteen = [f.name for f in fixes if f.name in (AUTOCAST, PRECISION)]
    if sixteen and ctx.bce:  # autocast needs the logits loss (BCE is refused under it on CUDA): they go together
        fixes = [f for f in fixes if f.name != LOGITS]
        at = [f.name for f in fixes].index(sixteen[0])
        fixes[at] = replace(fixes[at], title=f"{fixes[at].title}, with logits and BCEWithLogitsLoss",
                            answers=(*fixes[at].answers, "sigmoid-bce"), parts=(LOGITS, sixteen[0]))
    skipped += [(k, why) for k, why in BY_HAND.items() if k in order]
    return fixes, skipped


def by_name(parts) -> list:
    """The fix objects that `Applied` and `patching.make_patch` loop over.

    Args:
        parts: fix names.

    Returns:
        The fixes named in `parts`, in `FIXES`' order.
    """
    return [fix for fix in FIXES if fix.name in set(parts)]


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
    frozen_calls: int = 0    # D's calls frozen (the freeze-d fix's)
    loader_kwargs: dict = field(default_factory=dict)  # set on every DataLoader built (the loader fixes')
    flags: dict = field(default_factory=dict)          # `backend_flags` keywords (the backend fixes')
    scaled: bool = False     # fp16: each loss through one GradScaler (the autocast fix, without fast bf16)
    state: dict = field(default_factory=dict)  # each fix's own state for this run, under its name
    compiles: bool = False   # G and D compiled (the compile fix's): wrappers keep frame inspection out of the graph
    _undo: list = field(default_factory=list)
    _finder: object = None

    def __enter__(self) -> "Applied":
        try:
            self._finder = _module.register_module_forward_pre_hook(self._first_sight)  # G and D found (and fixed)
            self._undo.append(self._finder.remove)
            for fix in by_name(self.parts):
                fix.install(self)
            if self.scaled or self.on_loss is not None:
                watch_backward(self, self.scaled)
            if self.loader_kwargs:
                loader = torch.utils.data.DataLoader
                self.patch(loader, "__init__", with_kwargs(loader.__init__, self.loader_kwargs))
            if self.flags:  # the trainer's own switch: safe whichever TF32 API the script used
                flags = backend_flags(**self.flags)
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

    def patch(self, owner, name, value) -> None:
        """`owner.name = value` until exit."""
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
        forward = module.forward
        wrapped = forward
        for fix in by_name(self.parts):  # in `FIXES`' order, each wrapping the forward as the ones before left it
            fix.on_model(self, module, role)
            wrapped = fix.wrap(self, module, role, wrapped) or wrapped
        if wrapped is not forward:
            module.forward = wrapped
            self._undo.append(lambda: module.__dict__.pop("forward", None))
        return None

    def _role(self, module) -> str | None:
        if next(module.parameters(), None) is None:
            return None
        me = (type(getattr(module, "_orig_mod", module)).__name__, sum(p.numel() for p in module.parameters()))
        return "G" if me == self.ctx.g else "D" if me == self.ctx.d else None


def _bce_from_logits(self, input, target):
    return F.binary_cross_entropy_with_logits(input, target, weight=self.weight, reduction=self.reduction)


def _functional_bce_from_logits(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    return F.binary_cross_entropy_with_logits(input, target, weight=weight, size_average=size_average,
                                              reduce=reduce, reduction=reduction)
