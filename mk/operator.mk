# Generated files (the DispatchJob CRD, docs/api.md) and the operator's benchmark.
# Included by the main Makefile (uses its $(PY) and $(STAMP)). hack/gen.py lists the generated
# files; add new ones there (a list of (path, render function)).

.PHONY: generate verify operator-bench

generate: $(STAMP) ## regenerate crds/ and docs/api.md from the pydantic models
	$(PY) hack/gen.py

verify: $(STAMP) ## fail with a diff when a committed generated file is stale
	$(PY) hack/gen.py --check

operator-bench: bins $(STAMP) ## recoveries on the test control plane: latency and API writes per recovery
	$(PY) bench/operator_bench.py
