# dispatch: every entry point a developer or CI needs. `make test` on a fresh clone installs
# everything (venv, Go-built control plane binaries, Debian's Slurm) and runs all three tiers.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
PYTEST := $(BIN)/pytest
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: all help venv demo test unit integration e2e lint typecheck imports verify generate bench clean

all: test

help:
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(STAMP) ## create .venv and install dispatch with its dev tools

demo: $(STAMP) ## the seed's tutorial, in-process on the memory backend
	@$(PY) examples/supervise_a_job.py

lint: $(STAMP) ## ruff over package, tests, examples
	$(BIN)/ruff check operator tests e2e examples bench hack
	$(BIN)/ruff format --check operator tests e2e examples bench hack

typecheck: $(STAMP) ## mypy --strict over package, tests, examples
	$(BIN)/mypy operator/dispatch tests e2e examples bench

imports: $(STAMP) ## the layers contract (import-linter)
	$(BIN)/lint-imports

unit: $(STAMP) ## the fast tier: core, hypothesis, recorded responses
	$(PYTEST) tests/unit

include mk/*.mk

test: lint typecheck imports verify chart-lint chart-template unit integration e2e ## everything CI runs

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis

# The integration tier needs the real components: the Go-built control plane and Debian's Slurm.
integration: $(STAMP) bins slurm-deps slurm-chroots ## the real Kubernetes lab (apiserver, scheduler, controller manager, kwok, training operator) and real Slurm 22.05, 24.11, 26.05
	$(PYTEST) -m integration tests/integration

bench: $(STAMP) ## benchmarks; results go to BENCHMARKS.md by hand, with the command
	$(PY) bench/core_bench.py
