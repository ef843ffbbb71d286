"""What a doctor fix is (`Fix`: each of `fixes.FIXES` is one, holding all of its change), the templates that several
fixes share (DataLoader keywords, a statement on G and D, a backend switch), and the run-time mechanisms the fixes
install through (`fixes.Applied` undoes each on exit):

- **Keywords at construction**: a class's `__init__` with keyword arguments set, whether the caller passed them by
  keyword or by position (`with_kwargs`): the optimizers' `fused=True` (or `foreach=True` where the class has no fused
  kernel), the DataLoaders' `num_workers`, `persistent_workers` and `pin_memory`.
- **fp16 without bf16** (a GPU before Ampere): one `torch.amp.GradScaler`; each scalar `backward()` is scaled and each
  optimizer's `step` goes through `scaler.step`, followed by `scaler.update()`. Updating after every optimizer step
  keeps each loss's scale equal to the one its optimizer unscales with, since a loss's gradients are consumed by the
  next step of its own optimizer (the recipe of one scaler per network; PyTorch's AMP examples, "multiple models").
  A loop that runs both backwards before either step would see G's gradients unscaled with a scale that changed in
  between: only when the scale changes (an overflow, or every 2000 clean steps), and the guard watches the losses.
  A step the scaler skips (inf/NaN gradients) calls no optimizer step hook: `on_skipped_step` ends the iteration."""
from __future__ import annotations

import inspect
import os
import sys
import types
from dataclasses import dataclass

import torch

from ..watching.frames import location
from ..watching.lightning import TRAINER, trainer_edit, trainer_owned
from ..findings.report import DoctorReport


@dataclass(frozen=True, kw_only=True)
class Fix:
    """One change `--try` can make, whole, in one class: the findings it answers (it is tried when one of them was
    found), whether it applies to this loop, how it is installed for one run and undone (`install`, `on_model`,
    `wrap`, each change made through `fixes.Applied`), its edit of your source (`plan`, into its own `editing.Edit`
    that the patch's one pass makes: `patching.make_patch`) and, in a loop Lightning's Trainer runs, the Trainer's
    arguments that make it (`trainer_keywords`). `Applied`, `make_patch` and `candidates` only loop over the fixes.
    `parts`: the fixes it applies, by name (autocast on a BCE loop brings the logits loss); its own name if not
    given. A subclass overrides what its fix does; the base does nothing. `ctx` below is the diagnosed run's
    `fixes.Context`, `applied` the run's `fixes.Applied`."""

    name: str
    title: str
    answers: tuple = ()
    parts: tuple = ()
    changes_losses = ""  # not a field: why a fix changes your losses by design (the guard then asks only that they
    #                      stay finite); empty for a fix that keeps what your code computes
    whole = False        # its edit is made whole or not at all: one part missed, `make_patch` leaves it all out
    needs_why = ""       # why it is not made without the fixes `needs` names, when one of those is left by hand

    def __post_init__(self):
        if not self.parts:
            object.__setattr__(self, "parts", (self.name,))

    def rank(self, report: DoctorReport, ctx, order: dict) -> tuple:
        """Where it goes among the fixes tried.

        Args:
            report: the diagnosis.
            ctx: what the fixes know of the run.
            order: finding kind -> its rank among the findings.

        Returns:
            (rank of its best-ranked finding, None) when it is tried; (None, why) when it answers a finding but
            cannot apply here; (None, None) when it answers none.
        """
        found = [k for k in self.answers if k in order]
        if not found:
            return None, None
        why = trainer_owned(self, report, ctx.bf16) or self.not_applicable(ctx)
        return (None, why) if why else (min(order[k] for k in found), None)

    def not_applicable(self, ctx) -> str | None:
        """Why this loop cannot take the fix at run time; None when it can."""
        return None

    def needs(self, ctx) -> tuple:
        """The fixes, by name, it is applied and written with in this loop (autocast with the logits loss on BCE)."""
        return ()

    def trainer_keywords(self, bf16: bool) -> dict:
        """The Lightning Trainer's arguments that make it (keyword -> source), where the Trainer owns the change."""
        return {}

    def workers(self, ctx) -> int:
        """The DataLoader workers a run with it has (`try_fixes` warms up past what they prepare ahead)."""
        return 0

    def install(self, applied) -> None:
        """Its process-wide changes, each made through `applied` so that it is undone on exit."""

    def on_model(self, applied, module: torch.nn.Module, role: str) -> None:
        """Its change, in place, to G or D (`role`) on first sight."""

    def wrap(self, applied, module: torch.nn.Module, role: str, forward):
        """Its change to G's or D's forward (`role`), on first sight: a function that runs `forward` (the forward as
        the fixes before it left it) its way, or None to leave it as it is. `Applied` sets the result as the
        module's forward until exit."""
        return None

    def plan(self, plans: dict, report: DoctorReport, ctx, by_hand: list) -> None:
        """Its source edits, planned in `plans` (file -> `patching._Plan`: its own `editing.Edit` is `.of(ItsEdit)`,
        the templates several fixes share are its fields); (name, why) into `by_hand` for what cannot be an
        edit."""

    def edits(self, plans: dict, report: DoctorReport, ctx, by_hand: list) -> None:
        """Its source edits (what `patching.make_patch` calls): one of the Trainer's arguments where Lightning's
        Trainer runs the loop and owns the change (`lightning.trainer_edit`), else `plan`'s."""
        if not trainer_edit(self, plans, report, ctx.bf16, by_hand):
            self.plan(plans, report, ctx, by_hand)

    def missed(self, plan, shown: str) -> list:
        """(name, why) for each edit of its plan, in the file `shown`, that found nothing to edit."""
        return []


def called_from(sites) -> bool:
    """Whether G or D, whose forward a fix wrapped, was called from one of `sites` (FILE, LINE) of your code."""
    return location(sys._getframe(1)) in sites


def site_lookup(applied):
    """`called_from`, kept out of the graph where the models are compiled (dynamo cannot trace frame inspection);
    made per run, not at import, since importing dynamo changes process-wide settings."""
    return torch.compiler.disable(called_from) if applied.compiles else called_from


def keywords_missed(name: str, plan, shown: str, loaders: bool) -> list:
    """The keyword edits that found no call to edit, for a fix's `missed`.

    Args:
        name: the fix named in each line.
        plan: the file's `patching._Plan`, edited.
        shown: the file as shown.
        loaders: the DataLoaders' edits, or else the optimizers'.

    Returns:
        (name, why) per call not edited.
    """
    return [(name, f"{shown}:{line}: add " + ", ".join(f"{k}={v}" for k, v in kws.items())
             + f" to the {suffix}(...) built there") for line, (suffix, kws) in plan.keywords.items()
            if f"keywords:{line}" not in plan.done and (suffix == "DataLoader") == loaders and suffix != TRAINER]


class LoaderSetting(Fix):
    """DataLoader keywords set at construction (`keywords`); the loader fixes share one patch of DataLoader.__init__
    (`Applied.loader_kwargs`) and one edit per DataLoader line."""

    def keywords(self, ctx) -> dict:
        return {}

    def workers(self, ctx):
        return self.keywords(ctx).get("num_workers", 0)

    def install(self, applied):
        applied.loader_kwargs.update(self.keywords(applied.ctx))

    def plan(self, plans, report, ctx, by_hand):
        for loader in report.settings.get("dataloaders", []):
            if loader.get("built_at"):
                file, line = loader["built_at"]
                kws = plans[file].keywords.setdefault(line, ("DataLoader", {}))[1]
                kws.update({k: str(v) for k, v in self.keywords(ctx).items()})


class ModelStatement(Fix):
    """A statement on G and D after their module-level assignment (`statement`, {m} the model's name); the same
    change is made at run time on first sight (`on_model`)."""

    statement = ""

    def plan(self, plans, report, ctx, by_hand):
        script = os.path.abspath(report.source)
        for m in (report.models.get("G", {}), report.models.get("D", {})):
            if m.get("name"):
                plans[script].after_assign.setdefault(m["name"], []).append(self.statement.format(m=m["name"]))

    def missed(self, plan, shown):
        return [(self.name, f"{shown}: no module-level `{name} = ...`: add " + "; ".join(statements))
                for name, statements in plan.after_assign.items()
                if f"assign:{name}" not in plan.done and statements[0] == self.statement.format(m=name)]


class BackendFlag(Fix):
    """A backend switch (`flag`), set through the trainer's `backend_flags` (one call for all of them, which works
    whichever TF32 API the script itself used and restores both exactly), and `statements` after your imports."""

    flag = ""
    statements: tuple = ()

    def install(self, applied):
        applied.flags[self.flag] = True

    def plan(self, plans, report, ctx, by_hand):
        plans[os.path.abspath(report.source)].after_imports.extend(self.statements)


def faster_kwargs(cls) -> dict:
    """The keywords of an optimizer class's fastest implementation.

    Args:
        cls: a torch.optim class.

    Returns:
        fused=True where the class takes it (Adam, AdamW, SGD, ...), else foreach=True (every built-in).
    """
    return {"fused": True, "foreach": None} if "fused" in inspect.signature(cls).parameters else {"foreach": True}


def with_kwargs(init, changes: dict):
    """A constructor that sets keywords whatever its caller passed.

    Args:
        init: the class's `__init__`.
        changes: keyword -> value; keywords `init` does not take are left out.

    Returns:
        `init` with the keyword arguments set, whether the caller passed them by keyword or by position.
    """
    signature = inspect.signature(init)

    def __init__(self, *args, **kwargs):
        bound = signature.bind_partial(self, *args, **kwargs)
        for k, v in changes.items():
            if k in signature.parameters:
                bound.arguments[k] = v
        return init(*bound.args, **bound.kwargs)
    return __init__


def watch_backward(applied, fp16: bool) -> None:
    """Every backward your code calls through `applied.on_loss` (the guard reads the losses there), and with `fp16`
    each scalar loss scaled by one GradScaler whose steps go through each optimizer (`_scale_steps`).

    Args:
        applied: the run's `fixes.Applied`: its `patch` makes each change, undone on exit.
        fp16: autocast runs in fp16 (a GPU without fast bf16): scale the losses.
    """
    scaler = torch.amp.GradScaler(applied.ctx.device_type) if fp16 else None
    backward, on_loss = torch.Tensor.backward, applied.on_loss

    def scaled_backward(tensor, *args, **kwargs):
        if on_loss is not None:
            on_loss(tensor)
        if scaler is not None and tensor.numel() == 1 and tensor.requires_grad and tensor.is_floating_point():
            tensor = scaler.scale(tensor)
        return backward(tensor, *args, **kwargs)
    applied.patch(torch.Tensor, "backward", scaled_backward)
    if scaler is not None:
        _scale_steps(applied, scaler)


def _scale_steps(applied, scaler) -> None:
    """Each optimizer's `step` through the scaler (a bound method, as LR schedulers expect one), and gradient
    clipping on unscaled gradients: `scaler.unscale_` first for the optimizers owning what is clipped, as
    PyTorch's AMP examples do ("working with unscaled gradients")."""
    built, unscaled, state = [], set(), {"in_step": False, "stepped": False}
    init = torch.optim.Optimizer.__init__

    def optimizer_init(opt, *args, **kwargs):
        init(opt, *args, **kwargs)
        built.append(opt)
        step = opt.step

        def scaled_step(self, *a, **k):
            if state["in_step"]:  # GradScaler.step calls optimizer.step itself
                state["stepped"] = True
                return step(*a, **k)
            state.update(in_step=True, stepped=False)
            try:
                out = scaler.step(self, *a, **k)
            finally:
                state["in_step"] = False
            scaler.update()
            unscaled.clear()
            # inf/NaN gradients: the scaler skipped optimizer.step, so no step hook saw this iteration end
            if not state["stepped"] and applied.on_skipped_step is not None:
                applied.on_skipped_step(self, a, k)
            return out
        opt.step = types.MethodType(scaled_step, opt)
    applied.patch(torch.optim.Optimizer, "__init__", optimizer_init)

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
        applied.patch(utils, name, unscaling(getattr(utils, name)))
