# The lab's real node (tests/support/node.py, docs/real-node.md): kubelet, containerd, runc, the CNI
# plugins, CoreDNS and the pause and test images, for the integration tests marked `node`.
# Included by the main Makefile. Needs root (apt-get). Debian packages are installed when missing;
# binaries and image tarballs are built by hack/build-node.sh into $(DISPATCH_CACHE)/bin and
# $(DISPATCH_CACHE)/images, keyed by version, and reused afterwards (like `make bins`).
#
#   make node-deps    install and build what is missing (cold: see docs/real-node.md)

BUILD_NODE := hack/build-node.sh

.PHONY: node-deps

node-deps: ## the real node's parts: Debian's containerd, runc, CNI plugins; kubelet, CoreDNS, pause and test images
	@bash $(BUILD_NODE)

# The e2e tier runs the chart's operator as a pod on the real node (e2e/test_chart_real_node.py).
e2e: node-deps
