# The operator's monitoring: the Prometheus alerting rules and the Grafana dashboard shipped in the
# chart (charts/dispatch-operator/files/). Included by the main Makefile (uses its $(PY), $(PYTEST),
# $(STAMP); mk/cluster.mk's $(BINS_DIR)).
#
#   make promtool       build Prometheus's promtool from its Go module into $(BINS_DIR), once per version
#   make rules-test     promtool check rules and promtool test rules on the alerting rules, then the
#                       unit tests that check the rules' and the dashboard's metric names against the
#                       operator's metrics module (tests/unit/test_monitoring.py)

# Pinned in hack/build-bins.sh with the lab's other binaries, which `make bins` builds in parallel.
PROMTOOL_VERSION ?= $(call _bins_pin,PROMTOOL_VERSION)
PROMTOOL = $(BINS_DIR)/promtool-$(PROMTOOL_VERSION)/promtool
RULES = charts/dispatch-operator/files/prometheus-rules.yaml
RULES_TESTS = $(wildcard tests/monitoring/*-test.yaml)

export PROMTOOL

.PHONY: promtool rules-test

# go install writes into a scratch GOBIN and the binary is moved into place last, so an
# interrupted build never leaves a binary that looks finished.
$(PROMTOOL):
	@mkdir -p $(dir $@)
	@tmp=$$(mktemp -d $(dir $@).build.XXXXXX) && \
	  echo "promtool: building github.com/prometheus/prometheus/cmd/promtool@$(PROMTOOL_VERSION)" && \
	  GOBIN=$$tmp go install github.com/prometheus/prometheus/cmd/promtool@$(PROMTOOL_VERSION) && \
	  mv $$tmp/promtool $@ && rmdir $$tmp

promtool: $(PROMTOOL) ## build promtool (Prometheus $(PROMTOOL_VERSION)) into $(BINS_DIR)

rules-test: $(PROMTOOL) $(STAMP) ## promtool check + unit-test the alerting rules; metric names checked against the code
	$(PROMTOOL) check rules $(RULES)
	$(PROMTOOL) test rules $(RULES_TESTS)
	DISPATCH_REQUIRE_PROMTOOL=1 $(PYTEST) -q -p no:cacheprovider tests/unit/test_monitoring.py
