# The two set-up commands (README "The two commands"; .ci/run runs `make test`):
#   make demo   the whole pipeline on this machine (Kafka, S3, simulated GPUs)
#   make test   the test suite
#   make test-containers   the exactly-once end-to-end tests on containers (podman;
#                          CI runs it before `make test`; root on Debian, see docs/tests.md)
#   make check-monitoring   promtool's checks of the shipped Prometheus files (opt-in: needs Go)
#   make docs   the manual (docs/, MkDocs) built into site/ with --strict (a broken
#               link or anchor, or a flag table naming no command, fails); it
#               needs no Java or Maven and skips the machine check
#   make lint   ruff over the tree, and mypy --strict over the packages and bench/
# Each checks the machine first (Python 3.11+, Java 17+, Maven: one line naming
# what is missing), then creates or reuses the virtual environment $(VENV) and
# installs into it what it needs; nothing is installed outside it.
# Pass flags with ARGS, e.g. `make demo ARGS="--gpus 4"`, `make test ARGS="tests/sink -x"`.

PYTHON ?= python3
VENV ?= .venv
ARGS ?=
# uv (from PyPI, into the venv) installs the extras: the packages pip would
# resolve, in seconds instead of minutes (CI installs them on every clean clone).
# --compile-bytecode: uv, unlike pip, leaves the .pyc files out, and where
# PYTHONDONTWRITEBYTECODE is set (CI's containers) Python never writes them, so
# every process compiled its imports again: a worker's took 1.0 s of CPU, 0.5 s
# with them. Every extra: uv compiles only what one install adds, and the first
# extra installed brings tokenmill's own dependencies (botocore, rich, the Kafka
# client) for all the others. The project's packages are compiled before the
# tests (below).
UV = $(VENV)/bin/uv
PIP_INSTALL = $(UV) pip install --quiet --compile-bytecode --python $(VENV)/bin/python
PACKAGES = schemas tokenmill producer consumer sink ops sglang_sim devstack

.PHONY: demo test test-containers prerequisites check-monitoring docs lint

demo: prerequisites $(VENV)/.installed-local
	$(VENV)/bin/tokenmill demo $(ARGS)

# Tests marked `alone` compare a prediction with a timed run: they run after
# the rest, with nothing beside them (exit code 5: ARGS selected none of them).
# --durations=30: the slowest tests are visible in every run's log; and
# --cpu-durations=30 the 30 that used the most CPU (tests/cpu_time.py).
# The project's packages are compiled first: the tests start hundreds of
# worker, sink and CLI processes, each of which otherwise compiles them again.
test: prerequisites $(VENV)/.installed-test
	$(VENV)/bin/python -m compileall -q -j 0 $(PACKAGES) bench
	$(VENV)/bin/python -m pytest -q --durations=30 --cpu-durations=30 -m "not alone" $(ARGS)
	$(VENV)/bin/python -m pytest -q --durations=30 --cpu-durations=30 -n 0 -m alone $(ARGS) || [ $$? -eq 5 ]

# The compose stack's exactly-once test on containers, alone (`make test` runs
# it too, beside the rest): podman set up and the
# images built by `tokenmill dev images` (installs podman when missing; cached
# after the first run), then podman-compose through podman's Docker-compatible
# API. The exactly-once test with crashes (tests/e2e/test_pipeline.py) runs
# once, natively, in `make test`; TOKENMILL_TEST_SERVICES=containers runs it
# (or any broker test) against containers by hand.
CONTAINER_TESTS = tests/e2e/test_compose.py
test-containers: prerequisites $(VENV)/.installed-test
	$(VENV)/bin/tokenmill dev images
	TOKENMILL_TEST_SERVICES=containers $(VENV)/bin/python -m pytest -q --durations=30 -n 0 $(CONTAINER_TESTS) $(ARGS)

# Ruff's rules and mypy's strictness are in pyproject.toml.
lint: prerequisites $(VENV)/.installed-lint
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy --explicit-package-bases $(PACKAGES) bench

prerequisites:
	@$(PYTHON) -m devstack.prerequisites

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# Reinstalled when pyproject.toml changes; the install is editable, so code
# changes need no reinstall.
$(UV): | $(VENV)/bin/python
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check uv

$(VENV)/.installed-%: pyproject.toml | $(UV)
	$(PIP_INSTALL) -e '.[$*]'
	@touch $@

# Prometheus's own parser on the shipped rules and config, and the rules' unit
# tests. promtool is built once from the Go module proxy into $(VENV)/bin.
PROMTOOL_VERSION ?= v0.316.0
PROMETHEUS_DIR = deploy/prometheus

$(VENV)/bin/promtool: | $(VENV)/bin/python
	GOBIN=$(abspath $(VENV))/bin GOFLAGS=-mod=mod \
		go install github.com/prometheus/prometheus/cmd/promtool@$(PROMTOOL_VERSION)

check-monitoring: $(VENV)/bin/promtool
	$(VENV)/bin/promtool check rules $(PROMETHEUS_DIR)/alerts.yml
	$(VENV)/bin/promtool check config $(PROMETHEUS_DIR)/prometheus.yml
	$(VENV)/bin/promtool test rules tests/install/alerts_test.yml

# The manual: MkDocs (Material) over docs/, with the `docs` extra in $(VENV).
# Offline; the flag tables are generated from the click commands at build
# time (docs/hooks/flags.py). No machine check: it needs neither Java nor Maven.
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d site
