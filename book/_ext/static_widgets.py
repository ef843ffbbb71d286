"""Widgets drawn from the state saved in the notebook, as static HTML that needs no JavaScript and no network.

myst-nb writes a widget output as a `<script type="application/vnd.jupyter.widget-view+json">` that ipywidgets'
embedding code, fetched from a CDN, turns into a live view. Offline that code never arrives and the output shows
nothing, so this transform replaces each such script with the widget as it was saved: boxes as boxes, an Image
widget's picture, HTML and Output widgets' content, progress bars, and the panel's controls disabled at their saved
values. A widget whose model is missing from the saved state, or of a kind drawn nowhere here, is a build warning.
"""
from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

from docutils import nodes
from markdown_it import MarkdownIt
from sphinx.transforms import SphinxTransform
from sphinx.util import logging

logger = logging.getLogger(__name__)

VIEW = "application/vnd.jupyter.widget-view+json"
STATE = "application/vnd.jupyter.widget-state+json"
_VIEW_SCRIPT = re.compile(rf'^<script type="{re.escape(VIEW)}">(.*)</script>$', re.S)
_BOXES = {"BoxModel": "box", "HBoxModel": "hbox", "VBoxModel": "vbox", "GridBoxModel": "gridbox"}
_TEXT_INPUTS = {"TextModel", "IntTextModel", "FloatTextModel", "BoundedIntTextModel", "BoundedFloatTextModel"}
_SLIDERS = {"IntSliderModel", "FloatSliderModel", "FloatLogSliderModel"}
_CHOICES = {"DropdownModel", "SelectModel", "RadioButtonsModel", "ToggleButtonsModel"}
_PROGRESS = {"IntProgressModel", "FloatProgressModel"}
_MARKDOWN = MarkdownIt("commonmark").enable("table")


class UnknownWidget(Exception):
    """A model this module cannot draw (the message says which and why)."""


class Snapshot:
    """The saved widget state of one notebook, drawn as HTML one view at a time."""

    def __init__(self, state: dict):
        self.state = state

    def view(self, model_id: str) -> str:
        """A top-level widget output: the widget's HTML in a frame that says it is a snapshot."""
        return (f'<div class="widget-snapshot">{self.model(model_id)}'
                '<p class="widget-snapshot-note">The widget as it was saved: run the notebook to use it.</p></div>')

    def model(self, model_id: str) -> str:
        """One widget, its children included, as JupyterLab showed it when the notebook was saved."""
        if model_id not in self.state:
            raise UnknownWidget(f"widget model {model_id} is not in the notebook's saved widget state: save the "
                                "notebook with its widget state (JupyterLab: Settings > Save Widget State "
                                "Automatically), or clear that output")
        saved = self.state[model_id]
        name, attrs = saved["model_name"], dict(saved["state"])
        for buffer in saved.get("buffers", []):  # binary traits (an Image's value), base64 in the notebook file
            if buffer.get("encoding") == "base64" and len(buffer.get("path", [])) == 1:
                attrs[buffer["path"][0]] = buffer["data"]
        style = self._layout(attrs.get("layout"))
        label = self._label(attrs)
        drawn = self._shown(name, attrs, style, label)
        if drawn is None:
            drawn = _control(name, attrs, style, label)
        if drawn is None:
            raise UnknownWidget(f"no static drawing for widget model {name} (add one in {Path(__file__).name})")
        return drawn

    def _shown(self, name: str, attrs: dict, style: str, label: str) -> str | None:
        """A widget that shows something (boxes, text, pictures, progress, captured output), or None for another
        kind: the controls are `_control`'s, so each of the two chains of kinds stays short enough to read."""
        if name in _BOXES:
            children = "".join(self.model(_ref(child)) for child in attrs.get("children", []))
            return f'<div class="ws-box ws-{_BOXES[name]}"{style}>{children}</div>'
        if name in {"HTMLModel", "HTMLMathModel"}:
            return f'<div class="ws-row ws-html"{style}>{label}<div>{attrs.get("value", "")}</div></div>'
        if name == "LabelModel":
            return f'<div class="ws-row ws-label"{style}>{html.escape(str(attrs.get("value", "")))}</div>'
        if name == "ImageModel":
            if not attrs.get("value"):
                return ""  # an Image widget not drawn yet shows nothing in JupyterLab either
            fmt = html.escape(str(attrs.get("format", "png")))
            return f'<img class="ws-image" alt="" src="data:image/{fmt};base64,{attrs["value"]}"{style}>'
        if name in _PROGRESS:
            bar = html.escape(str(attrs.get("bar_style") or ""))
            return (f'<div class="ws-row ws-progress"{style}>{label}<progress class="ws-bar-{bar}" '
                    f'max="{attrs.get("max", 100)}" value="{attrs.get("value", 0)}"></progress></div>')
        if name == "OutputModel":
            outputs = attrs.get("outputs", [])
            if isinstance(outputs, str):  # some front ends save the list as JSON text
                outputs = json.loads(outputs)
            return f'<div class="ws-output"{style}>{"".join(map(_output, outputs))}</div>'
        return None

    def _layout(self, ref) -> str:
        """The widget's saved layout (width, grid columns, ...) as inline CSS."""
        if not isinstance(ref, str) or _ref(ref) not in self.state:
            return ""
        layout = self.state[_ref(ref)]["state"]
        css = "; ".join(f"{key.replace('_', '-')}: {value}" for key, value in layout.items()
                        if not key.startswith("_") and value not in (None, ""))
        return f' style="{html.escape(css)}"' if css else ""

    def _label(self, attrs: dict) -> str:
        """The description beside a control, as wide as its saved style asks (the panel's labels line up)."""
        text = attrs.get("description") or ""
        if not text:
            return ""
        style = self.state.get(_ref(attrs.get("style") or ""), {}).get("state", {})
        width = style.get("description_width")
        css = f' style="width: {html.escape(width)}; min-width: {html.escape(width)}"' if width else ""
        return f'<label class="ws-description"{css}>{html.escape(text)}</label>'


def _ref(value: str) -> str:
    return value.removeprefix("IPY_MODEL_")


def _control(name: str, attrs: dict, style: str, label: str) -> str | None:
    """A control (button, choice, checkbox, text box, slider), disabled at its saved value, or None for another
    kind."""
    if name == "ButtonModel":
        kind = html.escape(str(attrs.get("button_style") or ""))
        return (f'<button class="ws-button ws-button-{kind}" disabled{style}>'
                f'{html.escape(str(attrs.get("description", "")))}</button>')
    if name in _CHOICES:
        chosen = attrs.get("index")
        options = "".join(f'<option{" selected" if i == chosen else ""}>{html.escape(str(o))}</option>'
                          for i, o in enumerate(attrs.get("_options_labels", [])))
        return f'<div class="ws-row ws-choice"{style}>{label}<select disabled>{options}</select></div>'
    if name == "CheckboxModel":
        checked = " checked" if attrs.get("value") else ""
        return f'<div class="ws-row ws-checkbox"{style}>{label}<input type="checkbox" disabled{checked}></div>'
    if name in _TEXT_INPUTS:
        value = html.escape(str(attrs.get("value", "")))
        return f'<div class="ws-row ws-text"{style}>{label}<input type="text" disabled value="{value}"></div>'
    if name in _SLIDERS:
        value = html.escape(str(attrs.get("value", "")))
        return (f'<div class="ws-row ws-slider"{style}>{label}<input type="range" disabled '
                f'min="{attrs.get("min", 0)}" max="{attrs.get("max", 100)}" value="{value}">'
                f'<span>{value}</span></div>')
    return None


def _output(out: dict) -> str:
    """One output captured by an Output widget, in the order JupyterLab prefers its mime types."""
    if out.get("output_type") == "stream":
        return f'<pre class="ws-stream">{html.escape("".join(out.get("text", "")))}</pre>'
    if out.get("output_type") == "error":
        return f'<pre class="ws-stream">{html.escape(out.get("ename", ""))}: {html.escape(out.get("evalue", ""))}</pre>'
    data = out.get("data", {})
    text = {mime: "".join(value) if isinstance(value, list) else value for mime, value in data.items()}
    for mime in ("image/png", "image/jpeg", "image/gif"):
        if mime in text:
            return f'<img class="ws-image" alt="" src="data:{mime};base64,{text[mime].strip()}">'
    if "image/svg+xml" in text:
        svg = base64.b64encode(text["image/svg+xml"].encode()).decode()
        return f'<img class="ws-image" alt="" src="data:image/svg+xml;base64,{svg}">'
    if "text/html" in text:
        return f'<div class="ws-html">{text["text/html"]}</div>'
    if "text/markdown" in text:
        return f'<div class="ws-markdown">{_MARKDOWN.render(text["text/markdown"])}</div>'
    if VIEW in text:
        return ""  # a widget inside an Output widget: drawn where its own view is
    return f'<pre class="ws-stream">{html.escape(text.get("text/plain", ""))}</pre>'


class StaticWidgets(SphinxTransform):
    """Replace each widget-view script in a notebook page with its saved state drawn as HTML."""

    default_priority = 500

    def apply(self, **kwargs) -> None:
        source = Path(self.env.doc2path(self.env.docname))
        if source.suffix != ".ipynb":
            return
        scripts = [node for node in self.document.findall(nodes.raw) if _VIEW_SCRIPT.match(node.astext().strip())]
        if not scripts:
            return
        saved = json.loads(source.read_text(encoding="utf-8")).get("metadata", {}).get("widgets", {})
        snapshot = Snapshot(saved.get(STATE, {}).get("state", {}))
        for node in scripts:
            view = json.loads(_VIEW_SCRIPT.match(node.astext().strip()).group(1))
            try:
                drawn = snapshot.view(view["model_id"])
            except UnknownWidget as err:
                logger.warning(str(err), location=node)
                drawn = f'<pre class="widget-snapshot-missing">{html.escape(str(err))}</pre>'
            node.replace_self(nodes.raw("", drawn, format="html"))
        # The saved state was only there for ipywidgets' JavaScript, which these pages no longer load.
        from myst_nb.sphinx_ import NbMetadataCollector
        NbMetadataCollector.get_js_files(self.env, self.env.docname).pop("ipywidgets_state", None)


def setup(app):
    app.add_transform(StaticWidgets)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
