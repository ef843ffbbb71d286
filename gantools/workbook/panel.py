"""A widget panel that toggles every technique, runs the trainer (or the auto-tuner, `gantools.tuning`) in a
background thread (so Stop stays clickable), and keeps a comparison of every run made since the kernel started."""
from __future__ import annotations

import threading

from ..core import techniques
from ..core.config import COMPILE_MODES, Knob, TrainConfig, differences, knobs, speed_knobs, uses_cuda_graphs
from .display import LivePlot, LiveTune, comparison_chart, comparison_markdown, comparison_rows, figure_png
from ..errors import GantoolsError
from ..core.metrics import QualityCallback
from ..core.trainer import Trainer
from ..tuning.autotune import StopWhen
from ..quick import QUICK

# the fields ControlPanel shows a control for: each technique's (`techniques.TECHNIQUES`, in its order), and how
# long to train
CONTROL_FIELDS = (*techniques.panel_fields(), "steps")
RUNS: dict = {}  # every run since the kernel started: name -> History.summary()
_ACTIVE: dict = {"thread": None, "stop": None, "trainer": None}  # at most one training loop per kernel


def stop_active_run(wait: bool = True, timeout: float = 120.0) -> None:
    """Ask the panel's run to stop after its current step and, with `wait`, let it finish writing its checkpoint:
    re-running a widget cell or pressing Run again must never leave two loops training."""
    stop, thread = _ACTIVE["stop"], _ACTIVE["thread"]
    if stop is not None:
        stop.set()
    if wait and thread is not None and thread is not threading.current_thread():
        thread.join(timeout)


class _Panel:
    """What every panel shares: controls over fields of a base config (`self.controls`, `self.base`), set from code as
    a reader sets them with the mouse, and each run named by what it changed."""
    UNCHANGED = "panel defaults"  # a run's name when no control differs from the base config

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)

    def set(self, **values):
        """Change controls from code (what a reader does with the mouse)."""
        for name, value in values.items():
            self.controls[name].value = AUTO if value is None else value
        return self

    def config(self) -> TrainConfig:
        return self.base.replace(**{name: None if w.value == AUTO else w.value for name, w in self.controls.items()})

    def _named(self) -> dict:
        """The runs named so far (name -> result): a new run's name must differ from these."""
        raise NotImplementedError

    def run_name(self, cfg: TrainConfig) -> str:
        changed, taken = differences(cfg, self.base), self._named()
        name = ", ".join(f"{n}={changed[n][1]}" for n in self.controls if n in changed) or self.UNCHANGED
        return name if name not in taken else f"{name} #{sum(k.startswith(name) for k in taken) + 1}"


class ControlPanel(_Panel):
    """ipywidgets bound to TrainConfig fields, Run, Tune and Stop buttons, a progress bar, a live plot and the table
    of runs against the baseline. `run()` is what the Run button does, `tune()` the Tune button (the auto-tuner on
    the controls' config, its path drawn live) and `load()` the Load button (the tuned config into the controls),
    all blocking: notebooks and tests call them. With a few `techniques` and `tune=False` it is a notebook's "try
    it" widget: that notebook's technique alone, against the baseline it measured. With `start` (a
    `warm.warm_start()`, the one the baseline started from), every Run starts from its own copy of it, so its FID
    compares with the baseline's."""

    def __init__(self, base: TrainConfig, baseline: dict, techniques=CONTROL_FIELDS, quality: bool = True,
                 tune_minutes: float | None = None, tune: bool = True, start=None):
        import ipywidgets as W


        stop_active_run()
        tune_minutes = tune_minutes or (0.25 if QUICK else 15.0)  # quick mode (tests): seconds
        self.base, self.baseline, self.quality, self.tuned, self.start = base, baseline, quality, None, start
        self.controls = {}
        for name in techniques:
            w = _widget(name, knobs()[name], getattr(base, name))
            w.style.description_width = "140px"
            self.controls[name] = w
        self.run_button = W.Button(description="Run", button_style="success", icon="play")
        self.stop_button = W.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.tune_button = W.Button(description="Tune", button_style="info", icon="magic",
                                    tooltip="find a faster config for these settings on this machine (gantools tune)")
        self.load_button = W.Button(description="Load tuned", icon="download", disabled=True,
                                    tooltip="put the last tune's final config into the controls")
        self.minutes = W.BoundedFloatText(value=tune_minutes, min=0.1, max=10**4, step=1, description="tune minutes")
        self.run_button.on_click(lambda _: self.run(block=False))
        self.tune_button.on_click(lambda _: self.tune(block=False))
        self.load_button.on_click(lambda _: self.load())
        self.stop_button.on_click(lambda _: stop_active_run(wait=False))
        self.status = W.HTML("Set the knobs, then press Run.")
        self.progress = W.IntProgress(value=0, min=0, max=1, description="steps")
        self.plot = W.Image(format="png")
        self.table = W.Output()
        grid = W.GridBox(list(self.controls.values()), layout=W.Layout(grid_template_columns="repeat(3, 330px)"))
        buttons = W.HBox([self.run_button, self.stop_button, self.progress])
        tune_row = W.HBox([self.tune_button, self.minutes, self.load_button])
        self.tune_table, self.tune_plot = W.Output(), W.Image(format="png")
        self.tune_view = W.VBox([self.tune_table, self.tune_plot])  # shown once Tune is pressed
        rows = [grid, buttons, *([tune_row] if tune else []), self.status, self.plot, self.table]
        self.widget = W.VBox(rows)
        self._show_table()

    def _named(self) -> dict:
        return RUNS

    def run(self, block: bool = True):
        """Validate, then train with the controls' values. A bad combination is reported, not raised."""
        stop_active_run()
        try:
            cfg = self.config()
            cfg = cfg.replace(out_dir=f"{self.base.out_dir}/run{len(RUNS) + 1}").validate()
        except GantoolsError as e:
            self.status.value = f"<b style='color:#b00'>Cannot run:</b><pre>{e}</pre>"
            return None
        name, stop = self.run_name(cfg), threading.Event()
        thread = threading.Thread(target=self._train, args=(cfg, name, stop), daemon=True)
        _ACTIVE.update(thread=None if block else thread, stop=stop)
        if block:
            return self._train(cfg, name, stop)
        thread.start()
        return None

    def _train(self, cfg: TrainConfig, name: str, stop: threading.Event):
        panel = self

        class Progress:
            def on_fit_start(self, t):
                panel.progress.max, panel.progress.value = cfg.steps, t.step

            def on_step_end(self, t):
                panel.progress.value = t.step

        self._busy(True)
        self.status.value = f"Running <b>{name}</b> ..."
        try:
            callbacks = [Progress(), LivePlot(name, widget=self.plot), StopWhen(stop)]
            trainer = Trainer(cfg, callbacks=callbacks + ([QualityCallback()] if self.quality else []))
            if self.start is not None:
                self.start.load_into(trainer)
            _ACTIVE["trainer"] = trainer
            history = trainer.fit(0 if stop.is_set() else None)
        except GantoolsError as e:
            self.status.value = f"<b style='color:#b00'>Run failed:</b><pre>{e}</pre>"
            return None
        finally:
            self._busy(False)
        summary = history.summary()
        if not summary:
            self.status.value = f"Stopped <b>{name}</b> before its first step."
            return history
        RUNS[name] = summary
        stopped = " (stopped early)" if trainer.step < cfg.steps else ""
        quality = f", FID {summary['fid']:.1f}" if "fid" in summary else ""
        self.status.value = (f"Done: <b>{name}</b>{stopped}: {summary['images_per_sec']:.0f} images/s, "
                             f"{summary['images_per_sec'] / self.baseline['images_per_sec']:.2f}x the baseline"
                             f"{quality}.")
        self._show_table()
        return history

    def _busy(self, busy: bool) -> None:
        self.run_button.disabled = self.tune_button.disabled = busy
        self.stop_button.disabled = not busy

    def tune(self, block: bool = True, minutes: float | None = None):
        """Tune the controls' config (`gantools.tuning.tune`) for `minutes` (default: the panel's box), its path
        shown live in the panel; Stop ends it between measurements. The quality check trains on as many images as
        a Run (steps x batch), so its FIDs compare with the table's. Returns the TuneResult (blocking)."""
        stop_active_run()
        try:
            cfg = self.config().replace(out_dir=f"{self.base.out_dir}/tune").validate()
        except GantoolsError as e:
            self.status.value = f"<b style='color:#b00'>Cannot tune:</b><pre>{e}</pre>"
            return None
        stop = threading.Event()
        args = (cfg, minutes or self.minutes.value, stop)
        thread = threading.Thread(target=self._tune, args=args, daemon=True)
        _ACTIVE.update(thread=None if block else thread, stop=stop, trainer=None)
        if block:
            return self._tune(*args)
        thread.start()
        return None

    def _tune(self, cfg: TrainConfig, minutes: float, stop: threading.Event):
        from ..tuning.autotune import tune

        view = LiveTune(self.tune_table, self.tune_plot)

        def update(result):
            view(result)
            if result.now != "done":
                self.status.value = f"Tuning ({result.elapsed_s / 60:.1f} of {minutes:g} min): {result.now} ..."

        self._busy(True)
        if self.tune_view not in self.widget.children:
            self.widget.children = (*self.widget.children[:-1], self.tune_view, self.widget.children[-1])
        self.status.value = f"Tuning for up to {minutes:g} min ..."
        try:
            result = tune(cfg, minutes, quality=self.quality, quality_images=cfg.steps * cfg.batch_size, stop=stop,
                          progress=None, on_update=update)
        except GantoolsError as e:
            self.status.value = f"<b style='color:#b00'>Tune failed:</b><pre>{e}</pre>"
            return None
        finally:
            self._busy(False)
        self.tuned, self.load_button.disabled = result, False
        speed = f"{result.speedup:.2f}x the start's images/s" if result.speedup else "speed-up not measured"
        self.status.value = (f"{'Tune stopped' if result.stopped else 'Tuned'}: {speed}; "
                             f"{result.quality.get('note', '')}. Press <b>Load tuned</b> to put "
                             f"{describe_changes(result) or 'it'} into the controls.")
        return result

    def load(self, result=None) -> "ControlPanel":
        """Put a tune result's final config (default: the last tune's) into the controls, and its other speed
        settings into the panel's base config, so Run trains it (on the panel's own model, data and schedule)."""
        result = result or self.tuned
        if result is None:
            self.status.value = "Nothing to load yet: press Tune first."
            return self
        final = result.final_config
        for name, w in self.controls.items():
            value = getattr(final, name)
            if value in background_thread_unsafe(name):
                value = "default"  # the panel trains in a background thread (see background_thread_unsafe)
            w.value = AUTO if value is None else value
        moved = set(speed_knobs()) | set(result.changes())
        self.base = self.base.replace(**{k: getattr(final, k) for k in moved if k not in self.controls})
        self.status.value = f"Loaded the tuned config: {describe_changes(result) or 'no changes'}. Press Run."
        return self

    def _show_table(self):
        from IPython.display import Image, Markdown

        self.table.outputs = ()  # thread-safe way to clear an Output widget
        if not RUNS:
            return
        rows = comparison_rows(RUNS, self.baseline)
        self.table.append_display_data(Markdown(comparison_markdown(rows)))
        self.table.append_display_data(Image(figure_png(comparison_chart(rows, self.baseline))))


AUTO = "<auto>"  # what an optional switch's dropdown holds for None (no field has it as a choice)

def background_thread_unsafe(name: str) -> tuple:
    """The values of a field the panel cannot run: it trains in a background thread, where CUDA graphs are refused
    (see Trainer.fit). A function, not a constant: deciding it loads torch's inductor, which importing gantools
    must not."""
    return tuple(m for m in COMPILE_MODES if uses_cuda_graphs(m)) if name == "compile" else ()


def _widget(name: str, knob: Knob, value):
    """The control for one config field, chosen by its Knob: a dropdown for choices (and for an optional switch:
    auto, on, off), a checkbox for a switch, a number box for a number."""
    import ipywidgets as W

    desc = name.replace("_", " ")
    if knob.choices is not None:
        options = [c for c in knob.choices if c not in background_thread_unsafe(name)]
        w = W.Dropdown(options=options, value=value, description=desc)
    elif knob.kind is bool and knob.optional:  # None (auto) as a value of its own: ipywidgets reads None as "unset"
        w = W.Dropdown(options=[("auto", AUTO), ("on", True), ("off", False)], value=AUTO if value is None else value,
                       description=desc)
    elif knob.kind is bool:
        w = W.Checkbox(value=value, description=desc, indent=True)
    elif knob.kind is int and not knob.pair:
        w = W.BoundedIntText(value=value, min=0, max=10**7, description=desc)
    elif knob.kind is float and not knob.pair:
        w = W.FloatText(value=value, description=desc)
    else:
        raise ValueError(f"the panel has no control for {name} ({knob.kind.__name__}{' pair' if knob.pair else ''})")
    w.tooltip = knob.help
    return w


def describe_changes(result) -> str:
    """`precision: fp32 -> bf16, ...`: what a tune changed."""
    return ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in result.changes().items())


# 01's try-it controls: the fields whose change a profile shows, each technique's (`Technique.profiled`, in the
# list's order)
PROFILE_FIELDS = techniques.panel_fields("profiled")


class _Stopped(Exception):
    """Raised between steps once Stop is pressed: a profile cut short has no figures worth reporting."""


class _StopBetweenSteps:
    """Trainer callback: end the profile at the next step's end once `event` is set."""

    def __init__(self, event: threading.Event):
        self.event = event

    def on_step_end(self, trainer):
        if self.event.is_set():
            raise _Stopped


class ProfilePanel(_Panel):
    """01's "try it" widget, profile on click: controls for a few TrainConfig fields, Profile and Stop, a status line
    ("Done: <config>: N images/s (unprofiled), 1.23x the baseline; verdict: ...") and the config's phases drawn
    beside the baseline's on one scale. `profile()` is what Profile does, blocking (notebooks and tests call it);
    the button runs it in a background thread, as ControlPanel trains, so Stop stays clickable.

    `baseline`: a `profiling.ProfileReport` measured in this kernel (then its phases are the chart's "before"), or a
    summary dict with `images_per_sec`. A report is the better baseline: its images/s come from the same protocol
    (`profiling.profile`'s unprofiled steps) as every click's."""

    UNCHANGED = "the baseline's config"

    def __init__(self, base: TrainConfig, baseline, techniques=PROFILE_FIELDS, steps: int | None = None,
                 warmup: int = 2):
        import ipywidgets as W

        stop_active_run()
        self.base, self.baseline, self.warmup = base, baseline, warmup
        self.reports: dict = {}  # name -> ProfileReport, every profile this panel made
        self.controls = {}
        for name in techniques:
            w = _widget(name, knobs()[name], getattr(base, name))
            w.style.description_width = "140px"
            self.controls[name] = w
        self.steps = W.BoundedIntText(value=steps or (2 if QUICK else 5), min=1, max=1000,
                                      description="profiled steps", style={"description_width": "initial"},
                                      tooltip="steps under the profiler, and as many again without it for the images/s")
        self.profile_button = W.Button(description="Profile", button_style="success", icon="play")
        self.stop_button = W.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.profile_button.on_click(lambda _: self.profile(block=False))
        self.stop_button.on_click(lambda _: stop_active_run(wait=False))
        self.status = W.HTML("Set the controls, then press Profile.")
        self.image = W.Image(format="png")
        grid = W.GridBox(list(self.controls.values()), layout=W.Layout(grid_template_columns="repeat(3, 330px)"))
        buttons = W.HBox([self.profile_button, self.stop_button, self.steps])
        self.widget = W.VBox([grid, buttons, self.status, self.image])

    def _named(self) -> dict:
        return self.reports

    @property
    def baseline_images_per_sec(self) -> float:
        b = self.baseline
        return b["images_per_sec"] if isinstance(b, dict) else b.images_per_sec

    def profile(self, block: bool = True):
        """Validate, then profile the controls' config (`profiling.profile`). A bad combination is reported, not
        raised (in the words ControlPanel uses, "Cannot run"). Returns the ProfileReport (blocking)."""
        stop_active_run()
        try:
            cfg = self.config().replace(out_dir=f"{self.base.out_dir}/profile{len(self.reports) + 1}").validate()
        except GantoolsError as e:
            self.status.value = f"<b style='color:#b00'>Cannot run:</b><pre>{e}</pre>"
            return None
        stop = threading.Event()
        thread = threading.Thread(target=self._profile, args=(cfg, int(self.steps.value), stop), daemon=True)
        _ACTIVE.update(thread=None if block else thread, stop=stop, trainer=None)
        if block:
            return self._profile(cfg, int(self.steps.value), stop)
        thread.start()
        return None

    def _profile(self, cfg: TrainConfig, steps: int, stop: threading.Event):
        from .display import phases_figure
        from ..measuring.protocol import PhaseTable
        from ..speed.profiling import profile

        name, trainer = self.run_name(cfg), None
        self._busy(True)
        self.status.value = f"Profiling <b>{name}</b> ..."
        try:
            # what profiling.profile builds from a config, plus the Stop check
            trainer = Trainer(cfg.replace(sample_interval=0, log_interval=steps), callbacks=[_StopBetweenSteps(stop)])
            _ACTIVE["trainer"] = trainer
            report = profile(trainer, steps=steps, warmup=self.warmup)
        except _Stopped:
            self.status.value = f"Stopped <b>{name}</b> before its profile was complete."
            return None
        except GantoolsError as e:
            self.status.value = f"<b style='color:#b00'>Run failed:</b><pre>{e}</pre>"
            return None
        finally:
            if trainer is not None:
                trainer.close()  # its DataLoader workers end now, not when the trainer is collected
            self._busy(False)
        self.reports[name] = report
        before = self.baseline if isinstance(self.baseline, PhaseTable) else None
        title = f"{name}: ms per step in each phase" + (" (before: the baseline)" if before is not None else "")
        self.image.value = figure_png(phases_figure(report, title, before=before))  # drawn before "Done" is said
        v = report.verdict
        self.status.value = (f"Done: <b>{name}</b>: {report.images_per_sec:.0f} images/s (unprofiled), "
                             f"{report.images_per_sec / self.baseline_images_per_sec:.2f}x the baseline; "
                             f"verdict: {v.bottleneck}, try next: {v.technique} (notebook {v.notebook}).")
        return report

    def _busy(self, busy: bool) -> None:
        self.profile_button.disabled = busy
        self.stop_button.disabled = not busy
