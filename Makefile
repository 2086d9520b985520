# Two commands a newcomer needs: `make demo` and `make test`. Everything installs into .venv.
# While working: `make lint` (ruff + mypy) and `make test-fast` (no end-to-end, tool-driving or slow tests).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# torch is pinned to the CPU build the tests use; an unpinned torch could pull a CUDA build.
TORCH_PIN ?= torch==2.13.0
# The manifest scanner lives in its own venv: its pinned dependencies clash with the project's.
SCAN_VENV ?= .venv-scan
CHECKOV_PIN ?= checkov==3.3.30

# Releases (docs/release.md): the image's name, and the platform the lock files are compiled for.
IMAGE ?= ccl-health-exporter
LOCK_PLATFORM ?= x86_64-manylinux_2_28
LOCK_PYTHON ?= 3.11
LOCK = $(BIN)/uv pip compile --quiet --python-version $(LOCK_PYTHON) --python-platform $(LOCK_PLATFORM) \
	--generate-hashes --no-emit-index-url --no-emit-find-links --custom-compile-command 'make lock'
# The version from the git tag (setuptools-scm, as the wheel gets it) and the commit, read when used;
# the build time once per make run (one value for all the images of a release).
VERSION = $(shell $(BIN)/python -m setuptools_scm)
REVISION = $(shell git rev-parse HEAD)
CREATED := $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
IMAGE_ARGS = --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) --build-arg CREATED=$(CREATED)

.PHONY: demo test test-fast lint bench venv clean chart-files lock dist image sbom release

venv: $(VENV)/.installed

# Constrained to the image's locked versions (requirements/exporter.txt without its hashes, which
# pip would then demand of every package): the tests run what the image runs.
$(VENV)/.installed: pyproject.toml sim/pyproject.toml Makefile requirements/exporter.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	sed -n 's/^\([A-Za-z0-9][^ ]*==[^ ]*\).*/\1/p' requirements/exporter.txt > $(VENV)/constraints.txt
	$(BIN)/python -m pip install -q -e '.[test,probe]' -e ./sim '$(TORCH_PIN)' -c $(VENV)/constraints.txt
	touch $@

demo: venv
	$(BIN)/python -m devtools.demo

$(SCAN_VENV)/.installed: Makefile
	$(PYTHON) -m venv $(SCAN_VENV)
	$(SCAN_VENV)/bin/python -m pip install -q '$(CHECKOV_PIN)'
	touch $@

# Settings in pyproject.toml.
lint: venv
	$(BIN)/ruff check exporter sim devtools bench tests
	$(BIN)/ruff format --check exporter sim devtools bench tests
	$(BIN)/mypy

test: venv $(SCAN_VENV)/.installed lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Everything but the end-to-end (e2e), tool-driving (tool) and slow tests (tests/tiers.py says which is
# which), on every core, each Hypothesis property with a tenth of its examples (tests/conftest.py).
test-fast: venv
	$(BIN)/python -m pytest -m "not e2e and not tool and not slow" -n auto --hypothesis-profile=fast $(PYTEST_ARGS)

bench: venv
	$(BIN)/python -m bench.run_all

# The Helm chart's copies of alerts/ccl-health-rules.yaml and dashboards/*.json (Helm reads no
# file outside the chart); run after alerts/sync.py or dashboards/generate.py.
chart-files: venv
	$(BIN)/python -m devtools.chart_files

# The image's dependencies, with hashes (requirements/*.in and pyproject.toml in, requirements/*.txt
# out); run after changing a dependency. Never names an index: pip's own configuration says where
# packages come from. The venv above is constrained to the same versions.
lock: venv
	$(LOCK) pyproject.toml -o requirements/exporter.txt
	$(LOCK) requirements/probe.in -c requirements/exporter.txt -o requirements/probe.txt
	$(LOCK) requirements/sbom.in -o requirements/sbom.txt

# The wheel, versioned from the git tag (dist/ccl_health_exporter-VERSION-py3-none-any.whl).
dist: venv
	rm -f dist/ccl_health_exporter-*.whl
	$(BIN)/python -m pip wheel -q --no-deps --wheel-dir dist .

# The exporter and probe images from that wheel and the lock files (needs docker with BuildKit).
image: dist
	docker build $(IMAGE_ARGS) --target exporter -t $(IMAGE):$(VERSION) .
	docker build $(IMAGE_ARGS) --target probe -t $(IMAGE):$(VERSION)-probe .

# The exporter image's SBOM, CycloneDX JSON from its own Python environment:
# dist/ccl-health-exporter-VERSION.cdx.json.
sbom: dist
	docker build $(IMAGE_ARGS) --target sbom --output type=local,dest=dist .
	mv dist/sbom.cdx.json dist/ccl-health-exporter-$(VERSION).cdx.json

# A release: `make release RELEASE=0.2.0` moves the changelog's Unreleased entries under 0.2.0,
# sets the chart's appVersion and the kustomize image tag, commits and tags v0.2.0; then the wheel,
# the images and the SBOM of the tagged commit. Pushing the tag and the images is left to you.
release: venv
	@test -n "$(RELEASE)" || { echo "make release RELEASE=X.Y.Z" >&2; exit 2; }
	$(BIN)/python -m devtools.release $(RELEASE)
	$(MAKE) image sbom

clean:
	rm -rf $(VENV) $(SCAN_VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
