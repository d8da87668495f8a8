# The two set-up commands (README "The two commands"; .ci/run runs `make test`):
#   make demo   the whole pipeline on this machine (Kafka, S3, simulated GPUs)
#   make test   the test suite
# Each checks the machine first (Python 3.11+, Java 17+, Maven: one line naming
# what is missing), then creates or reuses the virtual environment $(VENV) and
# installs into it what it needs; nothing is installed outside it.
# Pass flags with ARGS, e.g. `make demo ARGS="--gpus 4"`, `make test ARGS="tests/sink -x"`.

PYTHON ?= python3
VENV ?= .venv
ARGS ?=
PIP_INSTALL = $(VENV)/bin/python -m pip install --quiet --disable-pip-version-check

.PHONY: demo test prerequisites

demo: prerequisites $(VENV)/.installed-local
	$(VENV)/bin/tokenmill demo $(ARGS)

test: prerequisites $(VENV)/.installed-test
	$(VENV)/bin/python -m pytest -q $(ARGS)

prerequisites:
	@$(PYTHON) -m tokenmill.devstack.prerequisites

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# Reinstalled when pyproject.toml changes; the install is editable, so code
# changes need no reinstall.
$(VENV)/.installed-%: pyproject.toml | $(VENV)/bin/python
	$(PIP_INSTALL) -e '.[$*]'
	@touch $@
