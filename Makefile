# The two commands of the README: `make lab` and `make test`. Both set up .venv first (so does `make book`).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: lab lint test test-fast test-browser book workbook setup chromium clean gpu-evidence gpu-wheels

# Create .venv if missing, then install the project with pinned versions.
# Re-runs only when pyproject.toml or constraints.txt change.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	@touch $(STAMP)

setup: $(STAMP)

# Jupyter refuses to run as root unless told; containers and cloud VMs often are root.
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(LAB_ARGS)

# The browser test drives a system Chromium (Playwright's own download needs the internet). Install Debian's
# package when none is found and we are root or have password-less sudo; otherwise say so (the test then skips).
SUDO := $(if $(filter 0,$(shell id -u)),,sudo -n)
chromium:
	@if [ -n "$$GANTOOLS_CHROMIUM" ] || command -v chromium >/dev/null || command -v chromium-browser >/dev/null \
	    || command -v google-chrome >/dev/null; then exit 0; fi; \
	if command -v apt-get >/dev/null && { [ -z "$(SUDO)" ] || sudo -n true 2>/dev/null; }; then \
	    echo "Installing Chromium for the browser test (apt-get install chromium) ..."; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    $(SUDO) apt-get install -y -qq chromium >/dev/null 2>&1 \
	    || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium >/dev/null; } \
	    || echo "Could not install Chromium: tests/test_browser.py will be skipped."; \
	else \
	    echo "No Chromium here and no root, sudo or apt-get to install it: tests/test_browser.py will be skipped."; \
	    echo "Install Chromium yourself (e.g. sudo apt-get install chromium) or set GANTOOLS_CHROMIUM=/path/to/chrome."; \
	fi

# The linter (ruff, configured in pyproject.toml): seconds, so make test runs it first.
lint: setup
	$(PY) -m ruff check .

# The suite runs in two pytest-xdist workers (PYTEST_WORKERS=1 for one process), a test file at a time each, so a
# file's module fixtures (a diagnosis, a JupyterLab server) are built once; the root conftest.py gives each worker
# its share of the cores. No test's verdict depends on how busy the machine is (docs/testing.md).
PYTEST_WORKERS ?= 2
XDIST := $(if $(filter-out 1,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile)

# Every test: unit tests, the notebooks in quick mode (nbval) and the browser test (JupyterLab in Chromium). The
# packages and the browser install side by side (on a new machine, minutes of mostly waiting on the disk).
test:
	@$(MAKE) --no-print-directory -j2 setup chromium
	@$(MAKE) --no-print-directory lint
	$(PY) -m pytest -q $(XDIST)

# The edit-test loop: the unit tests but those marked slow (more than a couple of seconds each) and the browser's,
# no notebooks; under 2 minutes here. `make test` still runs everything.
test-fast: setup
	$(PY) -m pytest -q $(XDIST) -m "not slow and not browser" tests

# Only the browser tests: each notebook run in JupyterLab, the widget panel clicked; the book built and every page
# read; here with pictures of what they saw for a person to look at (artifacts/browser/, artifacts/book/).
test-browser: setup chromium
	GANTOOLS_SCREENSHOTS=1 $(PY) -m pytest -q $(XDIST) -m browser tests/test_browser.py tests/test_book.py

# The book: the stored notebooks (their outputs as saved, nothing executed) and docs/ as a static site, built with
# Sphinx + myst-nb from book/conf.py. Offline, and warnings are errors. tests/test_book.py builds it with BOOK_OPTS.
BOOK      ?= build/book
BOOK_OPTS := -q -W --keep-going -b html -c book
book: setup
	$(PY) -m sphinx $(BOOK_OPTS) -d $(BOOK)/doctrees . $(BOOK)/html
	@echo "The book is in $(BOOK)/html: open $(BOOK)/html/index.html in a browser"

# One real run of the whole workbook, in order, its outputs (and widget state) stored in the notebooks: how the
# repository's copies were made, and how to make your own machine's. Each notebook's time is printed.
workbook: setup
	@cd notebooks && start=$$(date +%s) && for nb in [0-9][0-9]_*.ipynb; do \
	    t=$$(date +%s); \
	    env -u GANTOOLS_QUICK ../$(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace \
	        --ExecutePreprocessor.timeout=7200 --log-level=WARN $$nb || exit 1; \
	    echo "$$nb: $$(( $$(date +%s) - t )) s"; \
	done; echo "the whole workbook: $$(( ($$(date +%s) - start) / 60 )) min"

# The evidence a GPU machine owes the project, in one command in 9 minutes (docs/testing.md, "On a GPU"): run with
# the machine's own Python, the one that has torch (PYTHON=...), never .venv's; what it lacks comes from gpu-wheels/.
# DRY=1 runs the same parts on a CPU at tiny sizes (make test does). The report goes to $GANTOOLS_EVIDENCE_DIR.
gpu-evidence:
	$(PYTHON) gpu/evidence.py $(if $(DRY),--dry)

# The wheel folder for gpu-evidence, made here (it needs the package registry): what gantools and the notebook
# runner need beside the GPU machine's torch, for its Python (GPU_PYTHON_VERSION), under 60 MB.
GPU_PYTHON_VERSION ?= 3.12
gpu-wheels:
	$(PYTHON) gpu/wheels.py --out gpu-wheels --python-version $(GPU_PYTHON_VERSION)

clean:
	rm -rf $(VENV) runs notebooks/runs .pytest_cache artifacts build gpu-evidence gpu-wheels
