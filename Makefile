# Two commands a newcomer needs: `make demo` and `make test`. Everything installs into .venv.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# torch is pinned to the CPU build the tests use; an unpinned torch could pull a CUDA build.
TORCH_PIN ?= torch==2.13.0

.PHONY: demo test bench venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,probe]' '$(TORCH_PIN)'
	touch $@

demo: venv
	$(BIN)/python -m exporter.demo

test: venv
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: venv
	$(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
