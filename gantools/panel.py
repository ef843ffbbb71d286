"""A widget panel that toggles every technique, runs the trainer in a background thread (so Stop stays
clickable), and keeps a comparison of every run made since the kernel started."""
from __future__ import annotations

import threading

from .config import Knob, TrainConfig, knobs
from .display import LivePlot, comparison_chart, comparison_markdown, comparison_rows, figure_png
from .errors import GantoolsError
from .metrics import QualityCallback
from .train import Trainer

TECHNIQUES = ("precision", "loader", "num_workers", "pin_memory", "persistent_workers", "optimizer",
              "optimizer_impl", "grad_accum_steps", "channels_last", "compile", "batch_size", "steps")
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


class _StopWhenAsked:
    def __init__(self, event: threading.Event):
        self.event = event

    def on_step_end(self, trainer):
        if self.event.is_set():
            trainer.stop()


class ControlPanel:
    """ipywidgets bound to TrainConfig fields, Run and Stop buttons, a progress bar, a live plot and the table of
    runs against the baseline. `run()` is what the Run button does, blocking: notebooks and tests call it."""

    def __init__(self, base: TrainConfig, baseline: dict, techniques=TECHNIQUES, quality: bool = True):
        import ipywidgets as W

        stop_active_run()
        self.base, self.baseline, self.quality = base, baseline, quality
        self.controls = {}
        for name in techniques:
            w = _widget(name, knobs()[name], getattr(base, name))
            w.style.description_width = "140px"
            self.controls[name] = w
        self.run_button = W.Button(description="Run", button_style="success", icon="play")
        self.stop_button = W.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.run_button.on_click(lambda _: self.run(block=False))
        self.stop_button.on_click(lambda _: stop_active_run(wait=False))
        self.status = W.HTML("Set the knobs, then press Run.")
        self.progress = W.IntProgress(value=0, min=0, max=1, description="steps")
        self.plot = W.Image(format="png")
        self.table = W.Output()
        grid = W.GridBox(list(self.controls.values()), layout=W.Layout(grid_template_columns="repeat(3, 330px)"))
        buttons = W.HBox([self.run_button, self.stop_button, self.progress])
        self.widget = W.VBox([grid, buttons, self.status, self.plot, self.table])
        self._show_table()

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)

    def set(self, **values) -> "ControlPanel":
        """Change controls from code (what a reader does with the mouse)."""
        for name, value in values.items():
            self.controls[name].value = AUTO if value is None else value
        return self

    def config(self) -> TrainConfig:
        return self.base.replace(**{name: None if w.value == AUTO else w.value for name, w in self.controls.items()})

    def run_name(self, cfg: TrainConfig) -> str:
        changed = [f"{n}={getattr(cfg, n)}" for n in self.controls if getattr(cfg, n) != getattr(self.base, n)]
        name = ", ".join(changed) or "panel defaults"
        return name if name not in RUNS else f"{name} #{sum(k.startswith(name) for k in RUNS) + 1}"

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

        self.run_button.disabled, self.stop_button.disabled = True, False
        self.status.value = f"Running <b>{name}</b> ..."
        try:
            callbacks = [Progress(), LivePlot(name, widget=self.plot), _StopWhenAsked(stop)]
            trainer = Trainer(cfg, callbacks=callbacks + ([QualityCallback()] if self.quality else []))
            _ACTIVE["trainer"] = trainer
            history = trainer.fit(0 if stop.is_set() else None)
        except GantoolsError as e:
            self.status.value = f"<b style='color:#b00'>Run failed:</b><pre>{e}</pre>"
            return None
        finally:
            self.run_button.disabled, self.stop_button.disabled = False, True
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

    def _show_table(self):
        from IPython.display import Image, Markdown

        self.table.outputs = ()  # thread-safe way to clear an Output widget
        if not RUNS:
            return
        rows = comparison_rows(RUNS, self.baseline)
        self.table.append_display_data(Markdown(comparison_markdown(rows)))
        self.table.append_display_data(Image(figure_png(comparison_chart(rows, self.baseline))))


AUTO = "<auto>"  # what an optional switch's dropdown holds for None (no field has it as a choice)

# Modes the panel cannot run: it trains in a background thread, where CUDA graphs are refused (see Trainer.fit).
BACKGROUND_THREAD_UNSAFE = {"compile": ("reduce-overhead",)}


def _widget(name: str, knob: Knob, value):
    """The control for one config field, chosen by its Knob: a dropdown for choices (and for an optional switch:
    auto, on, off), a checkbox for a switch, a number box for a number."""
    import ipywidgets as W

    desc = name.replace("_", " ")
    if knob.choices is not None:
        options = [c for c in knob.choices if c not in BACKGROUND_THREAD_UNSAFE.get(name, ())]
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
