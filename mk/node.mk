# The lab's real node (tests/support/node.py, docs/real-node.md): kubelet, containerd, runc, the CNI
# plugins, CoreDNS and the pause and test images, for the integration tests marked `node`; and the
# training image (PyTorch on the test image) for tests/integration/test_real_training.py.
# Included by the main Makefile. Needs root (apt-get). Debian packages are installed when missing;
# binaries and image tarballs are built by hack/build-node.sh and hack/build-torch-image.sh into
# $(DISPATCH_CACHE)/bin and $(DISPATCH_CACHE)/images, keyed by version, and reused afterwards (like
# `make bins`).
#
#   make node-deps    install and build what is missing (cold: see docs/real-node.md)
#   make torch-image  the training image (6.6 GiB; cold: see BENCHMARKS.md). Its torch layer (pip:
#                     the network and the disk) is built beside hack/build-node.sh (the CPU), which
#                     it runs for its base layer: listed before node-deps, it makes that one a no-op

BUILD_NODE := hack/build-node.sh
BUILD_TORCH := hack/build-torch-image.sh

.PHONY: node-deps torch-image torch-prefetch

node-deps: ## the real node's parts: Debian's containerd, runc, CNI plugins; kubelet, CoreDNS, pause and test images
	@bash $(BUILD_NODE)

# The e2e tier runs the chart's operator as a pod on the real node (e2e/test_chart_real_node.py).
e2e: node-deps

torch-image: ## the real node's training image: PyTorch from PyPI on the test image (hack/build-torch-image.sh)
	@bash $(BUILD_TORCH)

# The training image's torch layer only needs the network and the disk; the lab's Go builds only
# the CPU. `make test` starts the layer in the background first (its log in $(DISPATCH_CACHE)), so
# a cold run downloads and unpacks torch while the binaries compile; `torch-image` later waits on
# the script's lock and finds the layer built. Nothing to do when the image is cached.
torch-prefetch:
	@bash $(BUILD_TORCH) --check 2>/dev/null || { \
	  mkdir -p $(DISPATCH_CACHE); \
	  echo "torch-prefetch: building the torch layer in the background (log: $(DISPATCH_CACHE)/torch-prefetch.log)"; \
	  nohup bash $(BUILD_TORCH) --layer-only > $(DISPATCH_CACHE)/torch-prefetch.log 2>&1 & }
