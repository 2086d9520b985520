# Two commands a newcomer needs: `make demo` and `make test`. Everything installs into .venv.
# While working: `make lint` (ruff + mypy) and `make test-fast` (no end-to-end or tool-driving tests).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# torch is pinned to the CPU build the tests use; an unpinned torch could pull a CUDA build.
TORCH_PIN ?= torch==2.13.0
# The manifest scanner lives in its own venv: its pinned dependencies clash with the project's.
SCAN_VENV ?= .venv-scan
CHECKOV_PIN ?= checkov==3.3.30

.PHONY: demo test test-fast lint bench venv clean chart-files

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,probe]' '$(TORCH_PIN)'
	touch $@

demo: venv
	$(BIN)/python -m devtools.demo

$(SCAN_VENV)/.installed: Makefile
	$(PYTHON) -m venv $(SCAN_VENV)
	$(SCAN_VENV)/bin/python -m pip install -q '$(CHECKOV_PIN)'
	touch $@

# Settings in pyproject.toml. tests/ is not linted yet.
lint: venv
	$(BIN)/ruff check exporter devtools bench
	$(BIN)/ruff format --check exporter devtools bench
	$(BIN)/mypy

test: venv $(SCAN_VENV)/.installed lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Everything but the end-to-end (e2e) and tool-driving (tool) tests; tests/tiers.py says which is which.
test-fast: venv
	$(BIN)/python -m pytest -m "not e2e and not tool" $(PYTEST_ARGS)

bench: venv
	$(BIN)/python -m bench.run_all

# The Helm chart's copies of alerts/ccl-health-rules.yaml and dashboards/*.json (Helm reads no
# file outside the chart); run after alerts/sync.py or dashboards/generate.py.
chart-files: venv
	$(BIN)/python -m devtools.chart_files

clean:
	rm -rf $(VENV) $(SCAN_VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
