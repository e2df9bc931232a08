# The operator image (Dockerfile) and the GitOps health tools. Included by the main Makefile (uses
# its $(PY), $(PYTEST), $(STAMP); mk/cluster.mk's $(DISPATCH_CACHE), $(BINS_DIR), `bins`).
#
#   make image         build $(IMAGE) with podman. IMAGE_BASES=local (default) makes both bases
#                      from Debian packages (hack/image-base.sh: debootstrap, cached in
#                      $(DISPATCH_CACHE)/image-base); IMAGE_BASES=public builds on the Dockerfile's
#                      own defaults (python:3.11-slim-bookworm for both stages)
#   make image-size    the image's size and what takes the space
#   make image-sbom    a CycloneDX SBOM of the built image (its Python distributions and the
#                      Debian packages it holds files of), checked against requirements/operator.txt
#   make gitops-tools  hack/gitops/: Flux's kstatus verdict and Argo CD's Lua health, built with
#                      `go build` into $(BINS_DIR)/<tool>-<version>/ (once per version)
#   make image-test    build the image, then run it as the operator, the chart's Deployment
#                      through it, and the GitOps tools on real DispatchJobs (e2e/test_image*.py,
#                      e2e/test_gitops*.py)

IMAGE_NAME ?= localhost/dispatch-operator
IMAGE_TAG ?= $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' operator/dispatch/_version.py)
IMAGE ?= $(IMAGE_NAME):$(IMAGE_TAG)
IMAGE_BASES ?= local
# podman as it works on this kind of machine: runc (crun refuses hybrid cgroups), cgroupfs, and
# explicit ulimits (the default ones cannot be set from here).
PODMAN ?= podman --runtime runc --cgroup-manager cgroupfs
PODMAN_LIMITS := --ulimit nofile=1024:1024 --ulimit nproc=1024:1024
# A host whose TLS is intercepted gives the builder its CA bundle as a build secret (never a layer).
IMAGE_PIP_CERT ?= $(firstword $(PIP_CERT) $(wildcard $(SSL_CERT_FILE)))

GITOPS_DIR := hack/gitops
# The tools' version: a hash of their sources (e2e/test_gitops.py computes the same to find them).
GITOPS_SOURCES := $(shell find $(GITOPS_DIR) -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) | LC_ALL=C sort)
GITOPS_VERSION := $(shell cat $(GITOPS_SOURCES) | sha256sum | cut -c1-12)
KSTATUS_BIN = $(BINS_DIR)/kstatus-verdict-$(GITOPS_VERSION)/kstatus-verdict
ARGOCD_HEALTH_BIN = $(BINS_DIR)/argocd-health-$(GITOPS_VERSION)/argocd-health

export IMAGE KSTATUS_BIN ARGOCD_HEALTH_BIN

.PHONY: image image-size image-sbom image-deps gitops-tools image-test

image-deps: ## podman, buildah, runc and debootstrap (Debian packages; needs root)
	@missing=""; for p in podman buildah runc debootstrap; do \
	  command -v $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "image-deps: installing$$missing"; \
	  apt-get install -y --no-install-recommends $$missing >/dev/null 2>&1 || { apt-get update >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; }; \
	fi

image: image-deps ## build the operator image $(IMAGE) (multi-stage, non-root, distroless-style)
	@set -e; start=$$(date +%s); mkdir -p $(DISPATCH_CACHE); \
	if [ '$(IMAGE_BASES)' = local ]; then \
	  eval "$$(bash hack/image-base.sh)"; \
	  bases="--build-arg BUILD_IMAGE=$$BUILD_BASE --build-arg RUNTIME_IMAGE=$$RUNTIME_BASE"; \
	fi; \
	$(PODMAN) build --network=host $(PODMAN_LIMITS) --layers $$bases \
	  $(if $(IMAGE_PIP_CERT),--secret id=pip-cert$(,)src=$(IMAGE_PIP_CERT)) \
	  --tag $(IMAGE) --file Dockerfile . > $(DISPATCH_CACHE)/image-build.log 2>&1 || { \
	    tail -n 40 $(DISPATCH_CACHE)/image-build.log; exit 1; }; \
	echo "image: $(IMAGE) built in $$(( $$(date +%s) - start )) s ($$($(PODMAN) image inspect --format '{{.Size}}' $(IMAGE) | awk '{printf "%.1f MB", $$1/1e6}'))"

IMAGE_SBOM ?= $(DISPATCH_CACHE)/image-sbom.cdx.json
image-sbom: $(STAMP) ## a CycloneDX SBOM of the built $(IMAGE) into $(IMAGE_SBOM); fails if it differs from the lock
	@set -e; base=""; if [ '$(IMAGE_BASES)' = local ]; then eval "$$(bash hack/image-base.sh)"; base="--base $$BUILD_BASE"; fi; \
	$(PY) hack/image_sbom.py $(IMAGE) $$base --check-lock -o $(IMAGE_SBOM)

image-size: ## the image's size and its largest parts
	@$(PODMAN) image inspect --format '{{.Size}}' $(IMAGE) | awk '{printf "$(IMAGE): %.1f MB\n", $$1/1e6}'
	@m=$$($(PODMAN) image mount $(IMAGE)); \
	  du -sh $$m/opt/dispatch $$m/usr/lib/python3.11 $$m/usr/lib/x86_64-linux-gnu $$m/usr/bin | sed "s|$$m||"; \
	  echo "largest packages in /opt/dispatch:"; \
	  du -s $$m/opt/dispatch/lib/python3.11/site-packages/* | sort -rn | head -8 \
	    | awk '{printf "  %6.1f MB  %s\n", $$1/1024, $$2}' | sed "s|$$m/opt/dispatch/lib/python3.11/site-packages/||"; \
	  $(PODMAN) image umount $(IMAGE) >/dev/null

, := ,

$(KSTATUS_BIN) $(ARGOCD_HEALTH_BIN) &: $(GITOPS_SOURCES) hack/build-gitops-tools.sh
	@bash hack/build-gitops-tools.sh $(KSTATUS_BIN) $(ARGOCD_HEALTH_BIN)

gitops-tools: $(KSTATUS_BIN) $(ARGOCD_HEALTH_BIN) ## Flux's kstatus and Argo CD's Lua health, built from Go modules

# The unit tier runs the Argo CD and kstatus checks on statuses the operator's code builds; the
# e2e tier runs the image and both tools on the lab's DispatchJobs.
unit: gitops-tools
e2e: image gitops-tools

image-test: image gitops-tools bins $(STAMP) ## the built image as the operator, the chart's pod spec run by podman, GitOps health
	DISPATCH_HELM=$(HELM) $(PYTEST) -m e2e e2e/test_image.py e2e/test_image_install.py e2e/test_gitops.py
