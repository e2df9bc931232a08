# The test cluster: etcd, kube-apiserver, kubectl, kube-scheduler, kube-controller-manager, kwok,
# Kubeflow's training operator (the project's own main) and helm, built from Go modules by
# hack/build-bins.sh, cached outside the repo under $(DISPATCH_CACHE)/bin, keyed by version.
# Included by the main Makefile (uses its $(PY), $(PYTEST) and $(STAMP)).
#
#   make bins          build the binaries that are missing (cold: see docs/testing.md)
#   make lab-up        start the lab (the whole real stack) in the background; prints the KUBECONFIG
#   make lab-down      stop it (by PID)
#   make record KIND=job   re-record tests/unit/data/job/ (any kind of hack/record.py) on a lab of its own
#   make cluster-up    start a bare control plane (etcd + kube-apiserver) in the background
#   make cluster-down  stop it (by PID)
#   make e2e-kind      run the integration and e2e tiers against a kind cluster (needs Docker);
#                      TRAINING_IMAGE=<an image with torch 2.9 the cluster can pull> runs the
#                      training tests too (tests/integration/test_real_training.py; else they skip)

DISPATCH_CACHE ?= $(HOME)/.cache/dispatch
BUILD_BINS := hack/build-bins.sh

# The version pins live in hack/build-bins.sh (one place); override on the command line,
# e.g. `make bins KUBE_VERSION=v1.35.4`.
_bins_pin = $(shell sed -n 's/^$(1)="$${$(1):-\(.*\)}"$$/\1/p' $(BUILD_BINS))
KUBE_VERSION ?= $(call _bins_pin,KUBE_VERSION)
ETCD_VERSION ?= $(call _bins_pin,ETCD_VERSION)
HELM_VERSION ?= $(call _bins_pin,HELM_VERSION)
KWOK_VERSION ?= $(call _bins_pin,KWOK_VERSION)
TRAINING_OPERATOR_VERSION ?= $(call _bins_pin,TRAINING_OPERATOR_VERSION)

BINS_DIR := $(DISPATCH_CACHE)/bin
KUBE_APISERVER = $(BINS_DIR)/kube-apiserver-$(KUBE_VERSION)/kube-apiserver
KUBECTL = $(BINS_DIR)/kubectl-$(KUBE_VERSION)/kubectl
ETCD = $(BINS_DIR)/etcd-$(ETCD_VERSION)/etcd
HELM = $(BINS_DIR)/helm-$(HELM_VERSION)/helm

# Where `make cluster-up` keeps certificates, kubeconfig, state.json and the daemons' logs.
CLUSTER_DIR ?= $(DISPATCH_CACHE)/cluster
CLUSTER_KUBECONFIG = $(CLUSTER_DIR)/kubeconfig
# Where `make lab-up` keeps the same, plus the audit log; LAB_NODES kwok nodes.
LAB_DIR ?= $(DISPATCH_CACHE)/lab
LAB_NODES ?= 3
# Opt-in lab extras, comma-separated: jobset, trainer (trainer implies jobset), kueue.
LAB_WITH ?=

# kind (only for e2e-kind; needs Docker). Empty KIND_NODE_IMAGE = kind's default image.
KIND_VERSION ?= v0.30.0
KIND_CLUSTER ?= dispatch-e2e
KIND_NODE_IMAGE ?=
KIND_KEEP ?= 0
KIND_BIN = $(BINS_DIR)/kind-$(KIND_VERSION)/kind
KIND_KUBECONFIG = $(DISPATCH_CACHE)/kind-$(KIND_CLUSTER).kubeconfig
E2E_KIND_MARKERS ?= (integration or e2e) and not slurm
TRAINING_IMAGE ?=

export DISPATCH_CACHE KUBE_VERSION ETCD_VERSION HELM_VERSION KWOK_VERSION TRAINING_OPERATOR_VERSION

.PHONY: bins lab-up lab-down record cluster-up cluster-down e2e-kind

bins: ## build the test cluster's binaries (kube-*, etcd, kwok, training operator, JobSet, Trainer v2, helm) into $(DISPATCH_CACHE)/bin
	@bash $(BUILD_BINS)

lab-up: bins $(STAMP) ## start the lab (apiserver, scheduler, controller manager, kwok, training operator) in $(LAB_DIR)
	$(PY) -m tests.support.lab up --dir $(LAB_DIR) --nodes $(LAB_NODES) $(if $(LAB_WITH),--with $(LAB_WITH))

lab-down: $(STAMP) ## stop what lab-up started
	$(PY) -m tests.support.lab down --dir $(LAB_DIR)

# One recorder for every Kubernetes kind (hack/record.py), each on a lab of its own with the
# extras the kind needs: `make record KIND=job`, or `make record KIND=kubeflow SCENARIOS="success"`.
RECORD_KINDS := job kubeflow jobset trainjob kueue
SCENARIOS ?=
ifneq ($(filter record,$(MAKECMDGOALS)),)
ifeq ($(filter $(RECORD_KINDS),$(KIND)),)
$(error record: KIND=<one of: $(RECORD_KINDS)> [SCENARIOS="a b"])
endif
endif
record: bins $(STAMP) ## re-record tests/unit/data/KIND/ (KIND=job, kubeflow, jobset, trainjob or kueue; SCENARIOS="a b" for a few) from the real stack, on a lab of its own (2-5 min a kind)
	$(PY) hack/record.py $(KIND) $(SCENARIOS)

cluster-up: bins $(STAMP) ## start etcd + kube-apiserver in the background (state in $(CLUSTER_DIR))
	$(PY) -m tests.support.controlplane up --dir $(CLUSTER_DIR)
	@echo "kubectl: $(KUBECTL) --kubeconfig $(CLUSTER_KUBECONFIG) ..."

cluster-down: $(STAMP) ## stop what cluster-up started
	$(PY) -m tests.support.controlplane down --dir $(CLUSTER_DIR)

$(KIND_BIN):
	GOBIN=$(dir $@) go install sigs.k8s.io/kind@$(KIND_VERSION)

e2e-kind: bins $(STAMP) ## the integration and e2e tiers against a kind cluster (needs Docker)
	@command -v docker >/dev/null 2>&1 || { \
	  echo "e2e-kind: needs Docker (kind runs nodes as containers); 'make integration' uses the local control plane"; \
	  exit 1; }
	@$(MAKE) --no-print-directory $(KIND_BIN)
	@if ! $(KIND_BIN) get clusters 2>/dev/null | grep -qx '$(KIND_CLUSTER)'; then \
	  $(KIND_BIN) create cluster --name '$(KIND_CLUSTER)' $(if $(KIND_NODE_IMAGE),--image '$(KIND_NODE_IMAGE)') --wait 180s; \
	fi
	$(KIND_BIN) get kubeconfig --name '$(KIND_CLUSTER)' > $(KIND_KUBECONFIG)
	@rc=0; DISPATCH_E2E_KUBECONFIG=$(KIND_KUBECONFIG) DISPATCH_E2E_TRAINING_IMAGE='$(TRAINING_IMAGE)' $(PYTEST) -m '$(E2E_KIND_MARKERS)' tests e2e || rc=$$?; \
	if [ '$(KIND_KEEP)' != 1 ]; then $(KIND_BIN) delete cluster --name '$(KIND_CLUSTER)'; fi; \
	exit $$rc
