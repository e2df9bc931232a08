# The Helm chart (charts/dispatch-operator) and the end-to-end tier. Included by the main Makefile
# (uses its $(PY), $(PYTEST), $(STAMP)) after mk/cluster.mk (uses its $(HELM) and `bins`).
#
#   make chart-lint      helm lint --strict, with the defaults and every charts/.../ci/*-values.yaml
#   make chart-template  render the chart and validate every object; the schema rejects unknown keys
#   make e2e             helm install into the test control plane, the operator under the chart's
#                        ServiceAccount, upgrade/uninstall, leader-election takeover (e2e/)
#   make e2e-kind        the same against a kind cluster (mk/cluster.mk; needs Docker)
#
# The chart's generated files (templates/crds.yaml from crds/, README.md from values.yaml) are
# written by `make generate` and checked by `make verify` (hack/gen.py includes hack/gen_chart.py).

CHART ?= charts/dispatch-operator
CHART_KUBE_VERSION ?= $(patsubst v%,%,$(KUBE_VERSION))
CHART_CI_VALUES = $(wildcard $(CHART)/ci/*-values.yaml)

.PHONY: chart-lint chart-template e2e

chart-lint: bins ## helm lint --strict (defaults and every ci/*-values.yaml)
	$(HELM) lint --strict $(CHART) --kube-version $(CHART_KUBE_VERSION)
	@set -e; for values in $(CHART_CI_VALUES); do \
	  echo "helm lint --strict -f $$values"; \
	  $(HELM) lint --strict --quiet $(CHART) --kube-version $(CHART_KUBE_VERSION) -f $$values; \
	done

chart-template: bins $(STAMP) ## helm template: every object parses and checks out; unknown keys rejected
	@set -e; for values in $(CHART_CI_VALUES); do \
	  $(HELM) template dispatch $(CHART) --namespace dispatch-system \
	    --kube-version $(CHART_KUBE_VERSION) -f $$values > /dev/null; \
	done
	@if $(HELM) template dispatch $(CHART) --kube-version $(CHART_KUBE_VERSION) \
	    --set no-such-value=1 >/dev/null 2>&1; then \
	  echo "chart-template: values.schema.json accepted an unknown key" >&2; exit 1; \
	fi
	DISPATCH_HELM=$(HELM) DISPATCH_REQUIRE_HELM=1 $(PYTEST) -q tests/unit/test_chart.py

e2e: bins $(STAMP) ## the chart installed into a real control plane, the operator under its identity
	DISPATCH_HELM=$(HELM) $(PYTEST) -m e2e e2e
