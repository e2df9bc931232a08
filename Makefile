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

.PHONY: all help venv demo test unit integration integration-kube integration-kueue integration-slurm e2e lint typecheck imports verify generate bench clean

all: test

help:
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# The dependencies come from the hashed lock only (requirements/dev.txt, hack/lock.py: pip refuses
# any file whose sha256 is not in it), then dispatch itself, editable, with no dependency resolved.
$(STAMP): pyproject.toml requirements/dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# A .venv made when the distribution was named `dispatch` still holds that editable install
	@# (and operator/ its egg-info, which would still answer to the old name).
	$(PY) -m pip uninstall --quiet --yes dispatch 2>/dev/null || true
	rm -rf operator/dispatch.egg-info
	$(PY) -m pip install --quiet --require-hashes --no-deps -r requirements/dev.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m pip check
	touch $@

venv: $(STAMP) ## create .venv and install dispatch with its dev tools

demo: $(STAMP) ## the tutorial (examples/supervise_a_job.py), in-process on the memory backend
	@$(PY) examples/supervise_a_job.py

lint: $(STAMP) ## ruff over package, tests, examples
	$(BIN)/ruff check operator tests e2e examples bench hack
	$(BIN)/ruff format --check operator tests e2e examples bench hack

typecheck: $(STAMP) ## mypy --strict over package, tests, examples
	$(BIN)/mypy operator/dispatch tests e2e examples bench

imports: $(STAMP) ## the layers contract (import-linter)
	$(BIN)/lint-imports

unit: $(STAMP) ## the fast tier: core, hypothesis, recorded responses
	$(PYTEST) tests/unit $(UNIT_ARGS)

include mk/*.mk

test: torch-prefetch lint typecheck imports verify chart-lint chart-template rules-test unit integration e2e ## everything CI runs
test: UNIT_ARGS = --ignore=tests/unit/test_chart.py  # chart-template has run it, with helm required

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis

# The integration tier needs the real components: the Go-built control plane and Debian's Slurm.
# Its three processes share nothing but the CPU: the Slurm half mostly waits on slurmctld, and the
# Kueue tests (marker kueue, a lab of their own with Kueue) mostly wait on Kueue's admissions, so
# they run beside the Kubernetes half (their output is printed when all are done; each has its own
# basetemp). Kueue tests that need Trainer (marker trainer) run in the Kubernetes half: Trainer's
# cert dir is machine-global, one lab at a time holds it, and that half's lab does.
INTEGRATION_TMP ?= $(or $(TMPDIR),/tmp)/dispatch-integration
KUBE_MARKERS := integration and not slurm and (not kueue or trainer)
KUEUE_MARKERS := integration and kueue and not trainer
integration: $(STAMP) bins slurm-deps slurm-chroots torch-image node-deps ## the real Kubernetes lab (apiserver, scheduler, controller manager, kwok, a real kubelet node, training operator, JobSet, Trainer, Kueue) and real Slurm 22.05, 24.11, 26.05, side by side
	@mkdir -p $(INTEGRATION_TMP); \
	$(PYTEST) -m "integration and slurm" tests/integration -p no:cacheprovider \
	  --basetemp=$(INTEGRATION_TMP)/slurm > $(INTEGRATION_TMP)/slurm.log 2>&1 & slurm=$$!; \
	$(PYTEST) -m "$(KUEUE_MARKERS)" tests/integration -p no:cacheprovider \
	  --basetemp=$(INTEGRATION_TMP)/kueue > $(INTEGRATION_TMP)/kueue.log 2>&1 & kueue=$$!; \
	$(PYTEST) -m "$(KUBE_MARKERS)" tests/integration --basetemp=$(INTEGRATION_TMP)/kube; kube=$$?; \
	wait $$kueue; kueue_status=$$?; wait $$slurm; status=$$?; \
	echo "===== the Kueue tests (integration and kueue) ====="; cat $(INTEGRATION_TMP)/kueue.log; \
	echo "===== the Slurm half (integration and slurm) ====="; cat $(INTEGRATION_TMP)/slurm.log; \
	echo "integration: kubernetes half exit $$kube, kueue exit $$kueue_status, slurm half exit $$status"; \
	test $$kube -eq 0 -a $$kueue_status -eq 0 -a $$status -eq 0

integration-kube: $(STAMP) bins torch-image node-deps ## the Kubernetes half of the integration tier only (with the Kueue tests)
	$(PYTEST) -m "integration and not slurm" tests/integration

integration-kueue: $(STAMP) bins ## the Kueue tests only (a lab with Kueue, JobSet and Trainer)
	$(PYTEST) -m "integration and kueue" tests/integration

integration-slurm: $(STAMP) slurm-deps slurm-chroots ## the Slurm half of the integration tier only
	$(PYTEST) -m "integration and slurm" tests/integration

bench: $(STAMP) ## benchmarks; results go to BENCHMARKS.md by hand, with the command
	$(PY) bench/core_bench.py
