"""Sphinx configuration of the book: the workbook's stored notebooks and the docs as one static site (`make book`).

The source folder is the repository itself (`-c book .`), so every page is read from where it lives and every
relative link between the README, docs/ and notebooks/ resolves as it does on GitHub. Nothing is executed: the pages
show the outputs stored in the notebooks.
"""
from __future__ import annotations

import sys
from pathlib import Path

BOOK = Path(__file__).resolve().parent
ROOT = BOOK.parent
sys.path.insert(0, str(BOOK / "_ext"))

project = "gantools"
author = "the gantools authors"
copyright = "the gantools authors, MIT licence"

root_doc = "book/index"
include_patterns = ["README.md", "book/index.md", "notebooks/[0-9][0-9]_*.ipynb", "docs/*.md", "data/README.md"]
# Sphinx walks every folder it does not exclude, whatever include_patterns says: leave out the rest of the repository
# (.venv, build/, runs, cached datasets) at the top level and below the folders that hold pages.
_PAGE_DIRS = {"book", "docs", "notebooks", "data"}
exclude_patterns = [p.name for p in ROOT.iterdir() if p.is_dir() and p.name not in _PAGE_DIRS]
exclude_patterns += [f"{d}/{p.name}" for d in sorted(_PAGE_DIRS) if (ROOT / d).is_dir()
                     for p in (ROOT / d).iterdir() if p.is_dir()]

extensions = ["myst_nb", "static_widgets", "open_in_jupyterlab", "aligned_outputs"]

# The notebooks' stored outputs are the content: never run them to build the site.
nb_execution_mode = "off"
# ipywidgets' own embedding loads its JavaScript from a CDN, which an offline reader cannot reach; static_widgets
# draws each widget from the state saved in the notebook instead.
nb_ipywidgets_js = {}
nb_merge_streams = True
# Markdown that a cell outputs (the races' tables, the conclusions) is read as MyST, as the notebooks' own Markdown
# cells are: myst-nb's default, plain CommonMark, has no tables and would print them as raw pipe text.
nb_render_markdown_format = "myst"
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

html_theme = "sphinx_book_theme"
html_title = "gantools: the book"
html_static_path = ["_static"]
html_css_files = ["book.css"]
html_last_updated_fmt = None
html_show_sourcelink = False
html_theme_options = {
    "home_page_in_toc": True,
    "use_download_button": True,  # the .ipynb itself, with its outputs
    "use_fullscreen_button": False,
    "show_toc_level": 2,
    "navigation_with_keys": False,
}

# `make lab` serves notebooks/ at the root of JupyterLab's default address.
jupyterlab_url = "http://localhost:8888/lab/tree/"
jupyterlab_root = "notebooks"


def _redirect_to_contents(app, exception) -> None:
    """The site's own index.html: the root document lives at book/index.html, so send the reader there."""
    if exception is None and app.builder.format == "html":
        (Path(app.outdir) / "index.html").write_text(
            '<!DOCTYPE html>\n<meta charset="utf-8">\n<title>gantools: the book</title>\n'
            '<meta http-equiv="refresh" content="0; url=book/index.html">\n'
            '<a href="book/index.html">gantools: the book</a>\n', encoding="utf-8")


def setup(app):
    app.connect("build-finished", _redirect_to_contents)
