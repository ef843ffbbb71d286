# The two commands of the README: `make lab` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: lab test setup clean

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

test: setup
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs notebooks/runs .pytest_cache
