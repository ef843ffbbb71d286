"""The workbook as a reader meets it: JupyterLab in headless Chromium, driven by Playwright.

nbval proves that every cell executes; this proves what a reader sees, where only a browser can: the widgets. Each
notebook (quick mode, copied to a temporary folder so the stored outputs are never touched) is opened in JupyterLab.
The first (the baseline) is run with Run > Run All Cells; in the others the cells whose stored outputs hold a widget
are run with the cells they need (`cells_to_run`: the names they read, traced back to the cells that set or change
them), since nbval runs the rest; each kind of widget in one notebook (`COVERED_ELSEWHERE`). No cell run may show an
error and every widget must render. In 01-03 the notebook's own try-it widget is pressed and must finish a run
reported against the baseline that notebook measured. In 05_all_together a control is changed with the mouse and Run
pressed: the run's loss plot and sample grid must update in place and its result must reach the comparison table;
then Tune is pressed, its path must appear in the panel, Stop must end it, and Load tuned must take its result.
With GANTOOLS_SCREENSHOTS=1 (`make test-browser`) pictures land in artifacts/browser/ for a person to look at (of a
notebook run in part, the cells that ran).

Needs Chromium (Debian's `chromium`; `make test` installs it where it can) or $GANTOOLS_CHROMIUM: the `browser`
fixture in conftest.py, shared with tests/test_book.py. Playwright's own browser download is not used: it does not
work offline.
"""
from __future__ import annotations

import ast
import base64
import io
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import symtable
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from IPython.core.inputtransformer2 import TransformerManager
from PIL import Image
from playwright.sync_api import expect

from gantools.workbook.panel import CONTROL_FIELDS
from gantools.workbook import workbook_config

from conftest import SCREENSHOTS, screenshot

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ARTIFACTS = ROOT / "artifacts" / "browser"
# JupyterLab settings: every cell in the DOM (no virtual scrolling), no news or update checks (offline).
LAB_SETTINGS = {"@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
                "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False}}
APP = "window.jupyterapp?.shell?.currentWidget"  # the open notebook panel (the app is exposed for tests; undefined
# while the page is still loading, so every step is optional: a predicate that throws ends wait_for_function)
RUN_TIMEOUT_S = 240
WIDGET = "application/vnd.jupyter.widget-view+json"
BASE = workbook_config("default")  # what 05's panel starts from; its run names list what differs from this

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _names(source: str, modules: frozenset = frozenset()) -> tuple[set[str], set[str]]:
    """The top-level names a cell sets or changes, and those it reads (in its functions too). A name is changed by
    `x[k] = v`, `x.a = v`, `x += v` and a method call whose result is dropped (`x.fit()`, `x.append(v)`), unless `x`
    is one of the notebook's imported `modules` (`data_parallel.show_scaling(...)` draws; it changes no module)."""
    code = TransformerManager().transform_cell(source)  # IPython's magics and shell escapes as Python
    table = symtable.symtable(code, "<cell>", "exec")
    sets = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    reads = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    scopes = list(table.get_children())
    while scopes:
        scope = scopes.pop()
        scopes.extend(scope.get_children())
        reads |= {s.get_name() for s in scope.get_symbols() if s.is_referenced() and (s.is_global() or s.is_free())}
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            targets = [] if _root(node.value.func) in modules else [node.value.func]
        else:
            continue
        sets |= {_root(target) for target in targets if isinstance(target, (ast.Attribute, ast.Subscript))} - {None}
    return sets, reads


def _root(node) -> str | None:
    """The name at the root of `x.a[k].f()`: x; None where it is not a name."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _imported(source: str) -> set[str]:
    """The names a cell binds by `import`: modules and what they hold, never changed by calling them."""
    table = symtable.symtable(TransformerManager().transform_cell(source), "<cell>", "exec")
    return {s.get_name() for s in table.get_symbols() if s.is_imported()}


def cells_to_run(notebook: dict) -> tuple[list[int], list[int]] | None:
    """(the cells whose stored outputs hold a widget, the cells to run: those, every earlier cell that sets or changes
    a name they read, and so on back, and the later cells that use what the widget cells set and need no other
    cell), as indexes into the notebook's cells; None for a notebook with no stored widget."""
    cells = notebook["cells"]
    code = [i for i, c in enumerate(cells) if c["cell_type"] == "code"]
    widgets = [i for i in code if any(WIDGET in out.get("data", {}) for out in cells[i]["outputs"])]
    if not widgets:
        return None
    modules = frozenset().union(*(_imported("".join(cells[i]["source"])) for i in code))
    names = {i: _names("".join(cells[i]["source"]), modules) for i in code}
    needed, todo = set(widgets), list(widgets)
    while todo:
        i = todo.pop()
        for j in code:
            if j < i and j not in needed and names[j][0] & names[i][1]:
                needed.add(j)
                todo.append(j)
    shown = set().union(*(names[i][0] for i in widgets))  # e.g. a panel the notebook goes on to use
    for j in code:
        if j > widgets[0] and j not in needed and names[j][1] & shown and all(
                k in needed for k in code if k < j and names[k][0] & names[j][1]):
            needed.add(j)
    return widgets, sorted(needed)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on a free localhost port with a token, serving a copy of the notebooks in quick mode."""
    home = tmp_path_factory.mktemp("lab")
    notebooks = home / "notebooks"
    notebooks.mkdir()
    for name in NOTEBOOKS:
        shutil.copy(ROOT / "notebooks" / name, notebooks / name)
    for plugin, values in LAB_SETTINGS.items():
        path = home / "settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--port={port}",
           "--port-retries=0", f"--IdentityProvider.token={token}", f"--notebook-dir={notebooks}",
           "--expose-app-in-browser", f"--LabApp.user_settings_dir={home / 'settings'}",
           f"--LabApp.workspaces_dir={home / 'workspaces'}"] + (["--allow-root"] if os.geteuid() == 0 else [])
    env = dict(os.environ, GANTOOLS_QUICK="1", JUPYTER_CONFIG_DIR=str(home / "config"))
    log = open(home / "lab.log", "wb")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited with {server.returncode}:\n{(home / 'lab.log').read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer in 90 s:\n{(home / 'lab.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield {"url": url, "token": token, "dir": notebooks}
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


class Notebook:
    """One notebook open in JupyterLab: run it as a reader does and read back what the page shows."""

    def __init__(self, browser, lab, name: str):
        self.name = name
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.page.goto(f"{lab['url']}/lab/tree/{name}?token={lab['token']}&reset")
        self.page.wait_for_function(f"{APP}?.context?.path === '{name}' && "
                                    f"{APP}.sessionContext?.session?.kernel?.status === 'idle'", timeout=90_000)

    def run_all(self) -> dict:
        """Clear the stored outputs, then Run > Run All Cells through the menus; wait until a cell has run and
        nothing is queued or running; return the notebook's JSON as the page holds it."""
        self.page.evaluate("window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
        self.page.click('.lm-MenuBar-itemLabel:text-is("Run")')
        self.page.click('.lm-Menu-itemLabel:text-is("Run All Cells")')
        return self._finished()

    def run_cells(self, indexes: list[int]) -> dict:
        """Clear the stored outputs, select these cells and run them (the Run menu's Run Selected Cell, as a
        command: the selection is not contiguous); wait and return as `run_all` does."""
        self.page.evaluate("""(indexes) => { const app = window.jupyterapp, nb = app.shell.currentWidget.content;
            app.commands.execute('notebook:clear-all-cell-outputs');
            nb.activeCellIndex = indexes[0];
            nb.deselectAll();
            for (const i of indexes) nb.select(nb.widgets[i]);
            return app.commands.execute('notebook:run-cell'); }""", indexes)
        return self._finished()

    def _finished(self) -> dict:
        self.page.wait_for_function(
            f"{APP}.context.model.toJSON().cells.some(c => c.execution_count) && "
            "!Array.from(document.querySelectorAll('.jp-InputPrompt')).some(e => e.textContent.includes('*')) && "
            f"{APP}.sessionContext.session.kernel.status === 'idle'", timeout=RUN_TIMEOUT_S * 1000, polling=250)
        self.page.wait_for_timeout(500)  # let the last widget views attach
        return self.page.evaluate(f"{APP}.context.model.toJSON()")

    def problems(self, notebook: dict, ran: list[int] | None = None) -> list[str]:
        """Everything a reader would see go wrong: error outputs, cells that never ran (of those run: `ran`, indexes
        into the cells; None: all), widgets that did not render."""
        found = []
        code = [i for i, c in enumerate(notebook["cells"]) if c["cell_type"] == "code"]
        for n, i in enumerate(code):
            cell = notebook["cells"][i]
            head = "".join(cell["source"]).strip().splitlines()[:1]
            for out in cell["outputs"]:
                if out["output_type"] == "error":
                    found.append(f"code cell {n + 1} ({head}) shows {out['ename']}: {out['evalue']}")
            if cell["execution_count"] is None and "".join(cell["source"]).strip() and (ran is None or i in ran):
                found.append(f"code cell {n + 1} ({head}) never ran")
        wanted = sum(WIDGET in out.get("data", {})
                     for c in notebook["cells"] if c["cell_type"] == "code" for out in c["outputs"])
        shown = self.page.locator(".jp-OutputArea-output:has(.jupyter-widgets)").count()
        if shown < wanted:
            found.append(f"{wanted} widget outputs in the notebook but only {shown} rendered")
        for text in ("Error displaying widget", "Loading widget..."):
            if self.page.locator(f".jp-OutputArea-output:has-text('{text}')").count():
                found.append(f"an output shows '{text}'")
        return found

    def screenshot(self, path: Path) -> None:
        """The whole notebook in one picture: grow the viewport to the notebook's height, then put it back."""
        if not SCREENSHOTS:
            return
        height = self.page.evaluate("Math.max(...Array.from(document.querySelectorAll("
                                    "'.jp-NotebookPanel .jp-WindowedPanel-outer, .jp-NotebookPanel-notebook'), "
                                    "e => e.scrollHeight))")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.set_viewport_size({"width": 1400, "height": min(max(int(height) + 200, 1000), 12000)})
        self.page.evaluate("window.jupyterapp.shell.collapseLeft(); document.querySelectorAll("
                           "'.jp-NotebookPanel .jp-WindowedPanel-outer').forEach(e => e.scrollTop = 0)")
        self.page.wait_for_timeout(300)
        screenshot(self.page, path)
        self.page.set_viewport_size({"width": 1400, "height": 1000})

    def close(self) -> None:
        self.page.evaluate(f"{APP}.sessionContext.shutdown()")
        self.page.close()


def _png(page, img) -> np.ndarray:
    """The pixels an <img> shows (its blob: URL read back in the page)."""
    data = page.evaluate("""async (img) => {
        const bytes = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
        let s = ''; for (const b of bytes) s += String.fromCharCode(b); return btoa(s); }""", img.element_handle())
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("L"), dtype=np.float32)


def check_panel(nb: Notebook) -> None:
    """05: the panel renders its controls; change precision with the mouse, press Run, watch it train in place."""
    page = nb.page
    panel = page.locator(".widget-vbox:has(> .widget-hbox button:has-text('Run'))").first
    assert panel.is_visible(), "the ControlPanel did not render"
    labels = panel.locator(".widget-label, .widget-label-basic").all_inner_texts()
    missing = [t for t in CONTROL_FIELDS if t.replace("_", " ") not in labels]
    assert not missing, f"panel renders without controls for {missing} (labels seen: {labels})"
    for button in ("Run", "Stop"):
        assert panel.locator(f"button:has-text('{button}')").is_visible(), f"no {button} button"

    plot, status = panel.locator("img.widget-image"), panel.locator(".widget-html").first
    assert plot.count() == 1
    before_status, before_png = status.inner_text(), _png(page, plot)
    rows_before = panel.locator(".widget-output table tbody tr").count()
    cell_outputs = page.locator(".jp-OutputArea-output:not(.jupyter-widgets *)")  # not those inside widgets
    outputs_before = cell_outputs.count()
    screenshot(panel, ARTIFACTS / f"{Path(nb.name).stem}-panel-before.png")
    # Watch the plot: every new picture must arrive in the same <img> (in place), none through a new output.
    plot.evaluate("""img => { img.dataset.watched = 'yes'; window.__plotUpdates = 0;
        new MutationObserver(m => { window.__plotUpdates += m.length; })
            .observe(img, {attributes: true, attributeFilter: ['src']}); }""")

    precision = panel.locator(".widget-dropdown:has(label:text-is('precision')) select")
    new = next(o for o in ("fp32", "bf16") if o != precision.input_value())
    precision.select_option(new)
    panel.locator("button:has-text('Run')").click()
    page.wait_for_function("([s, before]) => s.innerText !== before && /^(Done|Run failed|Cannot run|Stopped)/"
                           ".test(s.innerText)", arg=[status.element_handle(), before_status],
                           timeout=RUN_TIMEOUT_S * 1000, polling=200)
    after_status = status.inner_text()
    assert after_status.startswith("Done"), f"pressing Run did not finish a run: {after_status}"
    changed = f"precision={new}" in after_status if new != BASE.precision else "precision=" not in after_status
    assert changed, f"the run did not use precision={new} set with the mouse: {after_status}"

    rows = panel.locator(".widget-output table tbody tr")
    try:  # the table is redrawn just after the status line
        expect(rows).to_have_count(rows_before + 1, timeout=60_000)
    except AssertionError:
        pytest.fail(f"the run's result did not reach the comparison table ({rows.count()} rows, {rows_before} before)")
    updates = page.evaluate("window.__plotUpdates")
    assert updates >= 2, f"the live plot updated {updates} time(s) during the run; expected at the start and end"
    assert page.locator("img.widget-image[data-watched='yes']").count() == 1, "the plot's <img> was replaced"
    assert cell_outputs.count() == outputs_before, "the run added or removed cell outputs"
    after_png = _png(page, plot)
    assert after_png.shape != before_png.shape or np.abs(after_png - before_png).mean() > 0.5, \
        "the plot shows the same picture as before the run"
    width = after_png.shape[1]
    loss, grid = after_png[:, : width // 2], after_png[:, int(width * 0.62):]
    assert (loss < 128).mean() > 0.01, "no loss curves drawn on the left of the live plot"
    assert grid.std() > 10, "no sample grid drawn on the right of the live plot"

    run_name = after_status.split(":")[1].strip()
    assert any(run_name in row for row in rows.all_inner_texts()), f"no row for '{run_name}' in the comparison"
    screenshot(panel, ARTIFACTS / f"{Path(nb.name).stem}-panel-after.png")
    check_tune(page, panel, status)


def check_tune(page, panel, status) -> None:
    """05: Tune pressed with a budget far longer than the test waits: the path table appears in the panel as it runs,
    Stop ends the search there (how far a budget goes is not this test's question: tests/test_tune.py spends one on a
    fake clock), the chart is beside the live plot, and Load tuned puts the result into the controls."""
    minutes = panel.locator(".widget-text:has(label:text-is('tune minutes')) input")
    minutes.fill("30")
    minutes.press("Enter")
    before = status.inner_text()
    panel.locator("button[title^='find a faster config']").click()  # the Tune button ('Load tuned' has "Tune" too)
    path = panel.locator(".widget-output table:has(th:text-is('vs start')) tbody tr")
    try:
        expect(path.first).to_be_visible(timeout=RUN_TIMEOUT_S * 1000)
    except AssertionError:
        pytest.fail(f"the tune's path table did not appear in the panel: {status.inner_text()}")
    panel.locator("button:has-text('Stop')").click()
    page.wait_for_function("([s, before]) => s.innerText !== before && /^(Tuned|Tune stopped|Tune failed|Cannot)/"
                           ".test(s.innerText)", arg=[status.element_handle(), before],
                           timeout=RUN_TIMEOUT_S * 1000, polling=200)
    assert re.match("^(Tune stopped|Tuned)", status.inner_text()), f"Stop did not end the tune: {status.inner_text()}"
    assert path.count() >= 1, f"the tune's path table left the panel: {status.inner_text()}"
    assert panel.locator("img.widget-image").count() == 2, "no tune chart beside the live plot"
    panel.locator("button[title^='put the last tune']").click()  # Load tuned
    expect(status).to_have_text(re.compile("^Loaded the tuned config"), timeout=60_000)
    screenshot(panel, ARTIFACTS / "05_all_together-panel-tuned.png")


# each notebook's "try it" widget and its button
TRY_IT = {"01_profiling.ipynb": "Profile", "02_mixed_precision.ipynb": "Run", "03_data_loading.ipynb": "Run"}


def check_try_it(nb: Notebook, button: str) -> None:
    """01-03: the notebook's own "try it" widget (its technique's controls, a button, Stop, a status line and the
    live plot): press its button with the mouse and watch the run finish in place, reported against the baseline
    this notebook measured."""
    page = nb.page
    widget = page.locator(f".widget-vbox:has(> .widget-hbox button:text-is('{button}'))").last
    assert widget.is_visible(), f"no try-it widget with a {button} button"
    assert widget.locator("button:has-text('Stop')").is_visible(), "the try-it widget has no Stop button"
    assert widget.locator(".widget-dropdown, .widget-checkbox, .widget-text").count() >= 1, "no controls to try"
    status = widget.locator(".widget-html").first
    before = status.inner_text()
    widget.locator(f"button:text-is('{button}')").click()
    page.wait_for_function("([s, before]) => s.innerText !== before && /^(Done|Run failed|Cannot run|Stopped)/"
                           ".test(s.innerText)", arg=[status.element_handle(), before], timeout=RUN_TIMEOUT_S * 1000)
    text = status.inner_text()
    assert text.startswith("Done"), f"pressing {button} did not finish: {text}"
    assert "baseline" in text, f"the result is not set against the notebook's baseline: {text}"
    image = widget.locator("img.widget-image").first
    assert image.evaluate("img => img.naturalWidth") > 0, "no plot in the try-it widget after the run"
    screenshot(widget, ARTIFACTS / f"{Path(nb.name).stem}-try-it.png")


# One notebook for each kind of widget and each path a click takes. 04's, 07's, 08's, 09's and 11's try-it widget
# is the ControlPanel that 02 renders and clicks here (03 too: its Run starts DataLoader workers from the kernel's
# thread), and 06's is 00's progress bar under a Trainer's fit; nbval runs all six whole in quick mode, and
# tests/test_panel.py clicks the panel's paths (a warm start, Stop, Tune) in-process. Here they would add the
# minutes of the cells their widgets need (09's compiles, 11's R3GAN runs), not a widget or a path the others do
# not cover.
COVERED_ELSEWHERE = ("04_optimizers_and_accumulation.ipynb", "06_your_own_gan.ipynb", "07_gan_variants.ipynb",
                     "08_memory.ipynb", "09_compiler.ipynb", "11_modern_gan.ipynb")


@pytest.mark.parametrize("name", [n for n in NOTEBOOKS if n not in COVERED_ELSEWHERE])
def test_notebook_in_browser(browser, lab, name):
    part = None if name == NOTEBOOKS[0] else cells_to_run(json.loads((ROOT / "notebooks" / name).read_text()))
    nb = Notebook(browser, lab, name)
    try:
        notebook = nb.run_all() if part is None else nb.run_cells(part[1])
        nb.screenshot(ARTIFACTS / f"{Path(name).stem}.png")
        problems = nb.problems(notebook, None if part is None else part[1])
        for i in part[0] if part else []:
            if not any(WIDGET in out.get("data", {}) for out in notebook["cells"][i]["outputs"]):
                problems.append(f"cell {i + 1} held a widget when the notebook was stored, and holds none now")
        assert not problems, f"{name} in JupyterLab:\n" + "\n".join(problems)
        if name == "05_all_together.ipynb":
            check_panel(nb)
        if name in TRY_IT:
            check_try_it(nb, TRY_IT[name])
    finally:
        nb.close()


def test_a_failing_cell_is_caught(browser, lab):
    """The checks above can fail: a notebook with an error and a cell it never reaches is reported as such."""
    bad = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": src}
                     for src in ("x = 1", "1 / 0", "print('never')")],
           "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
           "nbformat": 4, "nbformat_minor": 5}
    (lab["dir"] / "broken.ipynb").write_text(json.dumps(bad))
    nb = Notebook(browser, lab, "broken.ipynb")
    try:
        problems = nb.problems(nb.run_all())
        part = nb.run_cells([0, 2])  # a run in part: these two only
        in_part, as_if_whole = nb.problems(part, [0, 2]), nb.problems(part)
    finally:
        nb.close()
    assert any("ZeroDivisionError" in p for p in problems), problems
    assert any("cell 3" in p and "never ran" in p for p in problems), problems
    assert [c["execution_count"] is not None for c in part["cells"]] == [True, False, True]
    assert in_part == [] and len(as_if_whole) == 1 and "cell 2" in as_if_whole[0] and "never ran" in as_if_whole[0]


def test_the_cells_run_in_part_are_the_widget_cells_and_all_they_need():
    sources = ["import math", "unused = 1", "x = [math.pi]", "x.append(2)  # changes x", "y, z = len(x), 5",
               "%time w = 3", "def f():\n    return y\nshow(f())", "after = x", "f()  # uses the widget cell's f",
               "g = f() + unused  # and a cell not run", "math.floor(2.5)  # calls a module: changes nothing"]
    cells = [{"cell_type": "code", "source": src, "outputs": []} for src in sources]
    cells[6]["outputs"] = [{"output_type": "display_data", "data": {WIDGET: {"model_id": "m"}}}]
    cells.insert(1, {"cell_type": "markdown", "source": "text"})
    assert cells_to_run({"cells": cells}) == ([7], [0, 3, 4, 5, 7, 9])
    cells[7]["outputs"] = []
    assert cells_to_run({"cells": cells}) is None  # no stored widget: the notebook is run in full
