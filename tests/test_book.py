"""The book (`make book`): the stored notebooks and the docs built into a static site, then read in Chromium.

The site is built into a temporary folder with the Makefile's own Sphinx options (warnings are errors) and served
from a local HTTP server; every notebook page must show every plot stored in its notebook (each <img> loaded and
on the page, widgets' pictures included), draw each widget from its saved state, and link to the notebook in
JupyterLab; the contents must link every notebook and every docs page, search must find a word, and no page may ask
for anything beyond the local server (the site works offline).

Each page is also read as a reader sees it in a 1400 px wide window: every Markdown table a cell outputs is a
<table> (no raw `|---|` text), no line of code or output is cut (each <pre> wraps, or scrolls to its end), and each
figure is shown at its natural width (or the full reading column where it was drawn wider), never stretched. A
screenshot of each notebook page is kept in artifacts/book/.
"""
from __future__ import annotations

import functools
import http.server
import json
import re
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from conftest import screenshot

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
DOCS = sorted(p.stem for p in (ROOT / "docs").glob("*.md"))
ARTIFACTS = ROOT / "artifacts" / "book"
VIEW = "application/vnd.jupyter.widget-view+json"
IMAGE_MIMES = ("image/png", "image/jpeg", "image/gif", "image/svg+xml")
# A Markdown table's delimiter row (`|---|---:|`): how the stored notebooks' tables are counted.
TABLE_RULE = re.compile(r"^\s*\|(\s*:?-{3,}:?\s*\|)+\s*$", re.M)
# A figure is shown at its natural width; one drawn wider than the reading column (1024 px of content at the test's
# 1400 px window) may be fitted to it, but never shown narrower than this.
READABLE_WIDTH = 960


def book_options() -> list[str]:
    """The Sphinx options `make book` uses, read from the Makefile so that this test builds what it builds."""
    found = re.search(r"^BOOK_OPTS\s*:?=\s*(.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert found, "the Makefile has no BOOK_OPTS line"
    return found.group(1).split()


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    """The book built once for this module: its folder, the build's output and how long it took."""
    out = tmp_path_factory.mktemp("book")
    cmd = [sys.executable, "-m", "sphinx", *book_options(), "-d", str(out / "doctrees"), str(ROOT), str(out / "html")]
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return {"html": out / "html", "build": done, "seconds": time.monotonic() - start}


@pytest.fixture(scope="module")
def site(book):
    """The built site on a free localhost port (http.server in a thread)."""
    if book["build"].returncode != 0:
        pytest.fail(f"the book did not build:\n{book['build'].stderr[-3000:]}")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=book["html"]))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def stored(name: str) -> dict:
    """What the stored notebook holds that its page must show: image outputs (those inside widgets included),
    widget outputs, and Markdown tables that cells output (those inside widgets included)."""
    nb = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text(encoding="utf-8"))
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    widgets = sum(VIEW in o.get("data", {}) for o in outputs)
    state = nb["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    images = 0
    for model in state.values():
        if model["model_name"] == "ImageModel":
            images += any(b.get("data") for b in model.get("buffers", []))
        if model["model_name"] == "OutputModel":
            inner = model["state"].get("outputs", [])
            outputs += json.loads(inner) if isinstance(inner, str) else inner
    images += sum(any(m in o.get("data", {}) for m in IMAGE_MIMES) for o in outputs)
    tables = sum(len(TABLE_RULE.findall("".join(o.get("data", {}).get("text/markdown", "")))) for o in outputs)
    return {"images": images, "widgets": widgets, "tables": tables}


def new_page(browser):
    """A browser tab that records, in `page.outside`, every request to anything but the local server."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.outside = []
    page.on("request", lambda r: page.outside.append(r.url)
            if not r.url.startswith(("http://127.0.0.1:", "data:", "blob:")) else None)
    return page


def visit(page, url: str):
    """Go to `url` and wait until every image on it has loaded or failed."""
    page.goto(url, wait_until="load")
    page.wait_for_function("Array.from(document.images).every(i => i.complete)", timeout=30_000)
    return page


def open_page(browser, url: str):
    return visit(new_page(browser), url)


def page_problems(page, name: str) -> list[str]:
    """Everything a reader of a notebook page would miss: plots that did not load or are not on the page, fewer
    plots than the notebook stores, widgets not drawn, no JupyterLab link, requests beyond the local server."""
    want = stored(name)
    images = page.evaluate("""() => Array.from(document.querySelectorAll('.cell_output img'), i => ({
        src: i.currentSrc.slice(0, 80), loaded: i.complete && i.naturalWidth > 0,
        shown: i.getBoundingClientRect().width > 0 && i.getBoundingClientRect().height > 0}))""")
    found = [f"plot {i['src']} did not load" for i in images if not i["loaded"]]
    found += [f"plot {i['src']} is not on the page (zero size)" for i in images if i["loaded"] and not i["shown"]]
    if len(images) < want["images"]:
        found.append(f"{want['images']} images stored in the notebook but {len(images)} on the page")
    drawn = page.locator(".cell_output .widget-snapshot").count()
    if drawn != want["widgets"]:
        found.append(f"{want['widgets']} widget outputs in the notebook but {drawn} drawn from their saved state")
    if page.locator(f'script[type="{VIEW}"], .widget-snapshot-missing').count():
        found.append("a widget output left as an empty script or missing from the saved state")
    link = page.locator("a.open-in-jupyterlab")
    if link.count() != 1 or link.get_attribute("href") != f"http://localhost:8888/lab/tree/{name}.ipynb":
        found.append(f"no 'Open in JupyterLab' link to {name}.ipynb")
    found += [f"asked for {url} (offline it never arrives)" for url in page.outside]
    return found


# What a reader of the page sees: raw Markdown table rules left in the text (code blocks aside), each <pre> whose
# text runs past its box with no way to scroll to it or that sticks out of the reading column, and each figure's
# shown and natural width.
READ_PAGE = """() => {
    const article = document.querySelector('article.bd-article');
    const text = article.cloneNode(true);
    text.querySelectorAll('pre, code, script, style').forEach(e => e.remove());
    const column = article.getBoundingClientRect();
    const cut = [];
    for (const pre of article.querySelectorAll('pre')) {
        const style = getComputedStyle(pre), box = pre.getBoundingClientRect();
        const hidden = pre.scrollWidth > pre.clientWidth + 1 && !['auto', 'scroll'].includes(style.overflowX);
        const outside = box.width > 0 && (box.left < column.left - 1 || box.right > column.right + 1);
        if (hidden || outside) cut.push(pre.textContent.trim().split('\\n')[0].slice(0, 60));
    }
    return {
        raw_tables: (text.textContent.match(/\\|\\s*:?-{3,}:?\\s*\\|/g) || []).length,
        tables: article.querySelectorAll('.cell_output table').length,
        cut: cut,
        figures: Array.from(article.querySelectorAll('img'), i => ({src: i.currentSrc.slice(0, 80),
            natural: i.naturalWidth, shown: i.getBoundingClientRect().width})),
    };
}"""


def reading_problems(page, tables: int = 0) -> list[str]:
    """What keeps a reader from reading the page: Markdown tables left as raw pipe text, fewer tables than the
    notebook's outputs hold, code cut off, figures shrunk below their natural width (down to READABLE_WIDTH where
    drawn wider) or stretched past it."""
    seen = page.evaluate(READ_PAGE)
    found = [f"{seen['raw_tables']} Markdown table rule(s) shown as raw pipe text"] if seen["raw_tables"] else []
    if seen["tables"] < tables:
        found.append(f"{tables} Markdown tables in the notebook's outputs but {seen['tables']} shown as tables")
    found += [f"code cut off, with no way to scroll to its end: {line!r}" for line in seen["cut"]]
    for fig in seen["figures"]:
        if fig["natural"] and fig["shown"] < min(fig["natural"], READABLE_WIDTH) - 1:
            found.append(f"figure {fig['src']} drawn {fig['natural']} px wide is shown at {fig['shown']:.0f} px")
        if fig["natural"] and fig["shown"] > fig["natural"] + 1:
            found.append(f"figure {fig['src']} drawn {fig['natural']} px wide is stretched to {fig['shown']:.0f} px")
    return found


def keep_screenshot(page, name: str) -> None:
    """The whole page as a reader sees it, in artifacts/book/ (JPEG: quicker to write than a PNG this tall).

    The picture is for a person; the page's checks are the test. On a busy machine Chromium now and then answers
    "Unable to capture screenshot" for a tall page: it is asked twice, then the missing picture is a warning."""
    from playwright.sync_api import Error

    for attempt in (1, 2):
        try:
            screenshot(page, ARTIFACTS / f"{name}.jpg", full_page=True, type="jpeg", quality=70, timeout=60_000)
            return
        except Error as err:
            if attempt == 2:
                warnings.warn(f"no screenshot of {name} in {ARTIFACTS}: {str(err).splitlines()[0]}", stacklevel=2)


@pytest.mark.slow
def test_book_builds_without_warnings(book):
    """`make book`'s options, warnings as errors: the build must pass and print nothing at all."""
    done = book["build"]
    assert done.returncode == 0 and not done.stderr.strip() and not done.stdout.strip(), \
        f"sphinx exited {done.returncode}:\n{done.stderr[-3000:]}{done.stdout[-1000:]}"
    html = book["html"]
    assert (html / "index.html").is_file() and (html / "searchindex.js").is_file()
    for name in NOTEBOOKS:
        assert (html / "notebooks" / f"{name}.html").is_file(), f"no page for {name}"
    print(f"book built in {book['seconds']:.1f} s")


@pytest.mark.parametrize("name", NOTEBOOKS)
@pytest.mark.browser
@pytest.mark.slow
def test_notebook_page_shows_its_plots(browser, site, name):
    """Every stored plot and widget shown, and the page read as a reader sees it (reading_problems); a screenshot
    of the whole page kept."""
    page = open_page(browser, f"{site}/notebooks/{name}.html")
    try:
        problems = page_problems(page, name) + reading_problems(page, stored(name)["tables"])
        keep_screenshot(page, name)
    finally:
        page.close()
    assert not problems, f"{name}.html:\n" + "\n".join(problems)


@pytest.mark.browser
@pytest.mark.slow
def test_a_missing_plot_is_caught(browser, site):
    """The checks above can fail: with one stored plot withheld by the server the page is reported."""
    name, withheld = "00_baseline", []

    def withhold_one(route):
        if withheld:
            return route.continue_()
        withheld.append(route.request.url)
        return route.abort()

    page = new_page(browser)
    try:
        page.route("**/_images/*", withhold_one)
        problems = page_problems(visit(page, f"{site}/notebooks/{name}.html"), name)
    finally:
        page.close()
    assert withheld and any("did not load" in p for p in problems), problems


@pytest.mark.browser
@pytest.mark.slow
def test_a_page_that_reads_badly_is_caught(browser, site):
    """The reading checks can fail: a page whose output table is left as raw pipe text, whose code is cut at the
    column's edge and whose figure is shrunk to 400 px is reported on each count."""
    name = "02_mixed_precision"
    page = open_page(browser, f"{site}/notebooks/{name}.html")
    try:
        assert not reading_problems(page, stored(name)["tables"])
        page.evaluate("""() => {
            const table = document.querySelector('.cell_output table').closest('.cell_output');
            const raw = document.createElement('p');
            raw.textContent = '| loop | images/s |\\n|---|---:|\\n| fp32 | 307 |';
            table.replaceWith(raw);
            const pre = document.querySelector('.cell_input pre');
            pre.style.whiteSpace = 'pre';
            pre.style.overflowX = 'hidden';
            pre.textContent = 'x = 1  # ' + 'a comment that runs past the column '.repeat(8);
            document.querySelector('.cell_output img').style.width = '400px';
        }""")
        problems = reading_problems(page, stored(name)["tables"])
    finally:
        page.close()
    for kind in ("raw pipe text", "shown as tables", "code cut off", "is shown at 400 px"):
        assert any(kind in problem for problem in problems), f"not caught: {kind}\n{problems}"


@pytest.mark.browser
@pytest.mark.slow
def test_contents_link_every_page(browser, site):
    """The site's front door leads to the contents, whose navigation links every notebook and every docs page."""
    page = open_page(browser, f"{site}/index.html")
    try:
        page.wait_for_url(re.compile(r"/book/index\.html$"), timeout=60_000)
        links = set(page.evaluate("() => Array.from(document.querySelectorAll('.bd-sidebar-primary nav a, "
                                  "article .toctree-wrapper a'), a => new URL(a.href).pathname)"))
        outside = page.outside
    finally:
        page.close()
    missing = [f"notebooks/{n}" for n in NOTEBOOKS if f"/notebooks/{n}.html" not in links]
    missing += [f"docs/{d}" for d in DOCS if f"/docs/{d}.html" not in links]
    assert not missing, f"the contents do not link {missing}"
    assert not outside, f"the contents page asked for {outside}"


@pytest.mark.browser
@pytest.mark.slow
def test_search_finds_a_word(browser, site):
    """Sphinx's search runs in the page from the built index, offline: "autocast" finds the mixed-precision
    notebook."""
    page = open_page(browser, f"{site}/search.html?q=autocast")
    try:
        results = page.locator("#search-results ul.search li a")
        results.first.wait_for(timeout=30_000)
        found = {Path(href).name for href in (a.get_attribute("href") or "" for a in results.all())}
        outside = page.outside
    finally:
        page.close()
    assert any(name.startswith("02_mixed_precision.html") for name in found), f"search for autocast found {found}"
    assert not outside, f"the search page asked for {outside}"


@pytest.mark.browser
@pytest.mark.slow
def test_docs_pages_show_their_images(browser, site):
    """The docs pages' own pictures (the benchmark chart) load too, and each docs page reads as the notebooks'
    do: tables as tables, no code cut off, pictures at their natural width."""
    problems, shown = [], 0
    page = new_page(browser)
    try:
        for name in DOCS:
            images = visit(page, f"{site}/docs/{name}.html").evaluate(
                "() => Array.from(document.querySelectorAll('article img'), i => [i.src, i.naturalWidth])")
            problems += [f"docs/{name}: {src} did not load" for src, width in images if not width]
            problems += [f"docs/{name}: {problem}" for problem in reading_problems(page)]
            shown += len(images)
        problems += [f"a docs page asked for {url}" for url in page.outside]
    finally:
        page.close()
    assert not problems, "\n".join(problems)
    assert shown >= 1, "no docs page showed an image (docs/benchmark.md has its chart)"


def test_static_widgets_draw_the_saved_state(monkeypatch):
    """The 05 panel's saved state drawn without JavaScript: its live plot as an image, its controls at their saved
    values; a model missing from the state, or of a kind not drawn, is an error that names it."""
    monkeypatch.syspath_prepend(str(ROOT / "book" / "_ext"))
    from static_widgets import Snapshot, UnknownWidget

    nb = json.loads((ROOT / "notebooks" / "05_all_together.ipynb").read_text(encoding="utf-8"))
    state = nb["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    panel = next(v["model_id"] for c in nb["cells"] for o in c.get("outputs", []) for k, v in o.get("data", {}).items()
                 if k == VIEW)
    drawn = Snapshot(state).view(panel)
    assert drawn.count('<img class="ws-image"') >= 1 and "data:image/png;base64,iVBOR" in drawn
    assert "<button" in drawn and "<select disabled>" in drawn and 'class="ws-box ws-gridbox"' in drawn
    with pytest.raises(UnknownWidget, match="not in the notebook's saved widget state"):
        Snapshot(state).view("no-such-model")
    odd = {"m": {"model_name": "ColorPickerModel", "state": {}}}
    with pytest.raises(UnknownWidget, match="ColorPickerModel"):
        Snapshot(odd).view("m")


def test_tables_printed_as_text_keep_their_lines(monkeypatch):
    """Output text in columns (torch.profiler's table) scrolls instead of wrapping; sentences, values padded one to a
    line, and a report whose long lines are prose beside a short table wrap."""
    monkeypatch.syspath_prepend(str(ROOT / "book" / "_ext"))
    from aligned_outputs import is_aligned

    rule = "-" * 55 + "  ------------" * 6
    profiler = "\n".join([rule, f"{'Name':>55}  {'Self CPU %':>12}  {'Self CPU':>12}" + "  " + "x" * 60, rule,
                          f"{'aten::convolution_backward':>55}  {'55.21%':>12}  {'1.201s':>12}" + "  " + "9" * 60])
    assert is_aligned(profiler)
    assert is_aligned("fp32        :     0.001      1e-06      1e-08\nbf16        :  0.000999   9.98e-07      1e-08")
    assert not is_aligned(" for-loop:   3.31 ms per optimizer step\n  foreach:   2.71 ms per optimizer step")
    report = ("  data wait      24.05 ms    6.4%\n  G forward      39.38 ms   10.5%\n"
              "  why: autocast runs them in 16-bit (half the bytes, and the fast units of recent CPUs and GPUs) while "
              "keeping sensitive ops in fp32")
    assert not is_aligned(report)
    assert not is_aligned("quality after 102400 images: FID 24.3, KID 2.389, 9 of 10 classes")
