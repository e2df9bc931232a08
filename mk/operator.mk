# Generated files (the DispatchJob CRD, docs/api.md) and the operator's benchmark.
# Included by the main Makefile (uses its $(PY) and $(STAMP)). hack/gen.py lists the generated
# files; add new ones there (a list of (path, render function)).

.PHONY: generate verify lock lock-sbom bench-recoveries bench-operator bench-memory

generate: $(STAMP) ## regenerate crds/ and docs/api.md from the pydantic models
	$(PY) hack/gen.py

verify: $(STAMP) ## fail with a diff when a committed generated file, a lock or an SBOM is stale; scan the locks
	$(PY) hack/gen.py --check
	$(PY) hack/lock.py --check
	$(PY) hack/audit.py

lock: $(STAMP) ## resolve the hashed locks again from pyproject.toml (needs PyPI) and write their SBOMs
	$(PY) hack/lock.py

lock-sbom: $(STAMP) ## write sbom/ from the committed locks (offline)
	$(PY) hack/lock.py --sbom

bench-recoveries: bins $(STAMP) ## recoveries on the test control plane: latency and API writes per recovery
	$(PY) bench/operator_bench.py

# The operator at scale: N DispatchJobs on kwok nodes, a restart, preemptions one at a
# time and 1,000 at once through kube-scheduler, the Job controller's peer, the API server's floor.
BENCH_ARGS ?= --jobs 1000
bench-operator: bins $(STAMP) ## the operator at scale on the real stack (BENCH_ARGS="--jobs 10000"); figures to BENCHMARKS.md by hand
	$(PY) bench/operator_scale.py $(BENCH_ARGS)

# Where the operator's bytes go per DispatchJob: tracemalloc and deep sizes, live.
bench-memory: bins $(STAMP) ## the operator's memory per job by file, line and structure (BENCH_ARGS as bench-operator)
	$(PY) bench/operator_memory.py $(BENCH_ARGS)
