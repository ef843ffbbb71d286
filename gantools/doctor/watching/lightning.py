"""Lightning's Trainer running your loop (`trainer.fit(model, data)`): what the doctor needs beyond the hooks of a
plain loop, and the fixes that are the Trainer's own arguments.

- **The loop is still yours.** Your LightningModule's `training_step` calls G and D and steps the optimizers (with
  manual optimization: `opt_g.step()` through a `LightningOptimizer`, which holds your optimizer as `_optimizer`:
  `frames` names it as your code does). The module itself is a container: its own forward (`self(z)`) is looked
  through, so G and D are named by its attributes (`self.generator`). Your DataLoader is built by your DataModule's
  or module's `train_dataloader` (its line is where its settings change); Lightning iterates it.
- **Where your code builds the Trainer and calls `fit`.** `Trainer.__init__`, `Trainer.fit` and
  `LightningModule.log` are wrapped while the doctor watches (`TrainerWatch`): now when Lightning is imported
  already, else by an import hook the moment your script imports it; all undone after the run.
- **Fixes that are Trainer arguments.** Lightning's precision plugin runs `training_step` under autocast (and owns
  the GradScaler of fp16), and its Trainer sets cudnn.benchmark: a loop it runs takes those changes as
  `Trainer(precision="bf16-mixed")` and `Trainer(benchmark=True)`, edited into your `Trainer(...)` line
  (`trainer_edit`), never as the doctor's own autocast wrapper, which would fight the plugin's (`trainer_owned`);
  `--try` gives your Trainer the precision argument while a run lasts (`fixes.trainer`).
- **Its own reads.** A value logged with `self.log(..., prog_bar=True)` is turned into a Python number every
  training step (a host sync each), whether or not a progress bar is shown: found where your code logs it."""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
from dataclasses import replace

from .frames import location, shown

# Lightning's packages, new and old names: the modules that define its Trainer and LightningModule
PACKAGES = ("lightning.pytorch", "pytorch_lightning")
TRAINER_MODULES = tuple(f"{p}.trainer.trainer" for p in PACKAGES)
MODULE_MODULES = tuple(f"{p}.core.module" for p in PACKAGES)
TRAINER = "Trainer"  # the callee suffix of its construction, for a keyword edit


def is_lightning_module(module) -> bool:
    """A LightningModule (found by its class's bases, without importing Lightning): the container of G and D."""
    return _lightning_module_class(type(module))


@functools.lru_cache(maxsize=64)
def _lightning_module_class(cls) -> bool:
    return any(c.__name__ == "LightningModule" and c.__module__ in MODULE_MODULES for c in cls.__mro__)


class TrainerWatch(importlib.abc.MetaPathFinder):
    """Records where your code builds Lightning's Trainer, calls its `fit` and logs values, into `obs.trainer`
    (`describe`). Installed by the hooks; a meta path finder only for Lightning's two modules, which it wraps the
    moment they are executed."""

    def __init__(self, obs):
        self.obs, self._undo, self._built, self._logged = obs, [], {}, {}

    def install(self) -> None:
        for name in TRAINER_MODULES + MODULE_MODULES:
            if name in sys.modules:
                self._wrap(sys.modules[name])
        sys.meta_path.insert(0, self)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        while self._undo:
            self._undo.pop()()

    def find_spec(self, fullname, path, target=None):
        if fullname not in TRAINER_MODULES + MODULE_MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return None
        execute, watch = spec.loader.exec_module, self

        def exec_module(module):
            execute(module)
            if watch in sys.meta_path:  # still watching
                watch._wrap(module)
        spec.loader.exec_module = exec_module  # this spec's own loader object: nothing else sees the change
        return spec

    def _wrap(self, module) -> None:
        if module.__name__ in TRAINER_MODULES:
            cls = module.Trainer
            self._set(cls, "__init__", self._init(cls.__init__))
            self._set(cls, "fit", self._fit(cls.fit))
        else:
            cls = module.LightningModule
            self._set(cls, "log", self._log(cls.log))

    def _set(self, cls, name, value) -> None:
        original = cls.__dict__[name]
        setattr(cls, name, value)
        self._undo.append(lambda: setattr(cls, name, original))

    def _init(self, init):
        built = self._built

        @functools.wraps(init)
        def __init__(trainer, *args, **kwargs):
            init(trainer, *args, **kwargs)
            built[id(trainer)] = (location(sys._getframe(1)), kwargs)
        return __init__

    def _fit(self, fit):
        watch = self

        @functools.wraps(fit)
        def fit_(trainer, *args, **kwargs):
            watch.obs.trainer = watch.describe(trainer, location(sys._getframe(1)))
            return fit(trainer, *args, **kwargs)
        return fit_

    def _log(self, log):
        logged = self._logged

        @functools.wraps(log)
        def log_(module, name, value, *args, **kwargs):
            prog_bar = kwargs.get("prog_bar", args[0] if args else False)
            at = location(sys._getframe(1))
            if prog_bar and at is not None and len(logged) < 16:
                logged.setdefault(at, name)
            return log(module, name, value, *args, **kwargs)
        return log_

    def describe(self, trainer, fit_at) -> dict:
        """What the report says of the Trainer that runs the loop (`settings["lightning"]`)."""
        built_at, given = self._built.get(id(trainer), (None, {}))
        try:
            precision = str(trainer.precision)
        except Exception:  # a Lightning whose Trainer has no precision property
            precision = None
        return {"trainer": f"{type(trainer).__module__.split('.trainer')[0]}.Trainer",
                "built_at": list(built_at) if built_at else None, "fit_at": list(fit_at) if fit_at else None,
                "precision": precision, "given": {k: repr(v) for k, v in given.items()
                                                  if k in ("precision", "benchmark", "accelerator", "devices")},
                "prog_bar_logs": self._logged}  # (file, line) -> the name logged there: filled as the loop runs


def settings(obs) -> dict | None:
    """`obs.trainer` as plain values, for `report.settings["lightning"]` (None when no Trainer ran the loop)."""
    if obs.trainer is None:
        return None
    t = dict(obs.trainer)
    t["prog_bar_logs"] = [[*at, name] for at, name in t["prog_bar_logs"].items()]
    return t


# -- fixes that are the Trainer's arguments ---------------------------------------------------------------------------
def trainer_arguments(fix, report, bf16: bool) -> dict | None:
    """The Trainer's arguments that make `fix` (a `fixes.Fix`: its `trainer_keywords`) in a loop Lightning's Trainer
    runs; None when no Trainer runs it, or when the fix is not one of its arguments."""
    if not report.settings.get("lightning"):
        return None
    return fix.trainer_keywords(bf16) or None


def precision_keywords(bf16: bool) -> dict:
    """16-bit as the Trainer's argument: its precision plugin runs training_step under autocast."""
    return {"precision": _precision(bf16)}


def trainer_owned(fix, report, bf16: bool) -> str | None:
    """Why `--try` leaves `fix` to your Trainer's argument: in a loop Lightning's Trainer runs, the doctor's own
    autocast wrapper would fight its precision plugin (fp16's GradScaler refuses the closure it steps with)."""
    kws = trainer_arguments(fix, report, bf16)
    if kws is None:
        return None
    if "precision" in kws and bf16:  # `fixes.trainer.TrainerPrecision` sets it while a run lasts
        return f"Lightning's Trainer runs your loop and owns this setting: its fix is Trainer(..., {_listed(kws)})"
    return (f"Lightning's Trainer runs your loop and owns this setting: set Trainer(..., {_listed(kws)}) by hand "
            "(--patch makes the edit)")


def trainer_edit(fix, plans: dict, report, bf16: bool, by_hand: list) -> bool:
    """Plan `fix` as a keyword edit of your `Trainer(...)` call when the Trainer owns it. Returns whether it did (or
    said why it cannot: a Trainer built outside your code)."""
    kws = trainer_arguments(fix, report, bf16)
    if kws is None:
        return False
    at = report.settings["lightning"].get("built_at")
    if not at:
        by_hand.append((fix.name, f"Lightning's Trainer was not built in your code: pass {_listed(kws)} where it is "
                                  "configured"))
        return True
    plans[at[0]].keywords.setdefault(at[1], (TRAINER, {}))[1].update(kws)
    return True


def trainer_missed(plan, shown_file: str) -> list:
    """(the arguments, why) for each Trainer keyword edit that found no `Trainer(...)` call to edit as written."""
    return [(_listed(kws), f"{shown_file}:{line}: add {_listed(kws)} to the Trainer(...) built there")
            for line, (suffix, kws) in plan.keywords.items()
            if suffix == TRAINER and f"keywords:{line}" not in plan.done]


def precision(bf16: bool) -> str:
    """The Trainer's 16-bit precision: bf16 where the device runs it fast, else fp16 (its plugin then brings the
    GradScaler)."""
    return "bf16-mixed" if bf16 else "16-mixed"


def _precision(bf16: bool) -> str:
    """`precision` as your code writes it."""
    return f'"{precision(bf16)}"'


def _listed(kws: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in kws.items())


# -- findings in the Trainer's terms ----------------------------------------------------------------------------------
def in_trainer_terms(findings: list, report, bf16: bool) -> list:
    """The findings of a loop Lightning's Trainer runs, each change said in its terms: precision and cudnn.benchmark
    as the Trainer's arguments, the reads Lightning makes for values logged with prog_bar=True at your self.log
    lines. Other loops' findings are returned as they are."""
    trainer = report.settings.get("lightning")
    if not trainer:
        return findings
    out = []
    for f in findings:
        if f.kind == "fp32-convolutions":
            first = f.change.splitlines()[0] + "\n" if f.change.startswith("# first drop") else ""
            f = replace(f, change=f"{first}# Lightning's precision plugin runs training_step under torch.autocast\n"
                                  f"Trainer(..., precision={_precision(bf16)})")
        elif f.kind == "cudnn-benchmark":
            f = replace(f, change="Trainer(..., benchmark=True)  # Lightning sets torch.backends.cudnn.benchmark")
        elif f.kind == "host-sync" and trainer.get("prog_bar_logs") and _lightnings_reads(f, trainer):
            f = _prog_bar_reads(f, trainer)
        out.append(f)
    return out


def _lightnings_reads(f, trainer) -> bool:
    """The host-sync finding counts reads at the line that calls fit: Lightning's own, made between your steps."""
    fit_at = trainer.get("fit_at")
    return bool(fit_at) and f"{shown(fit_at[0])}:{fit_at[1]} " in f.seen


def _prog_bar_reads(f, trainer):
    logs = trainer["prog_bar_logs"]
    lines = "; ".join(f"{shown(file)}:{line} ({name!r})" for file, line, name in logs[:6])
    return replace(f, seen=f"{f.seen}; Lightning reads there each value your code logs with prog_bar=True: {lines}",
                   why=f.why + ". Lightning turns each value logged with prog_bar=True into a Python number every "
                               "training step, progress bar shown or not",
                   change="# log the values for the progress bar once an epoch (their mean), or leave prog_bar off\n"
                          + "\n".join(f'self.log("{name}", ..., prog_bar=True, on_step=False, on_epoch=True)  '
                                      f"# {os.path.basename(file)}:{line}" for file, line, name in logs[:6]))
