#!/usr/bin/env bash
# Everything the test lab's real node (tests/support/node.py, docs/real-node.md) needs besides the
# control plane of hack/build-bins.sh: a kubelet, containerd, runc, the CNI plugins, CoreDNS and
# two images. Nothing is pulled from a container registry (none is reachable from the lab):
#
#   Debian packages    containerd (1.6, CRI v1), runc, containernetworking-plugins (bridge,
#                      host-local, loopback in /usr/lib/cni), iptables, debootstrap; apt-get
#                      installs the missing ones (root; `apt-get update` first when needed)
#   kubelet            k8s.io/kubernetes/cmd/kubelet at KUBE_VERSION, from the same kind of
#                      wrapper module as hack/build-bins.sh's kube-* binaries (its Go build cache
#                      makes most of the build a cache hit)
#   coredns            CoreDNS at COREDNS_VERSION with only the plugins the lab's Corefile uses
#                      (COREDNS_PLUGINS): the kubernetes plugin and a few small ones, not the
#                      cloud back ends of the stock build
#   pause image        hack/node/pause (a static Go binary) on an empty root filesystem
#   test image         Debian NODE_IMAGE_SUITE minbase (debootstrap, the host's apt mirror) with
#                      python3.11; hack/node/mkimage.py writes both images as docker-archive
#                      tarballs, which the node imports into its own containerd when it starts
#
# Output (outside the repo, keyed by version, rebuilt only when missing):
#   ${DISPATCH_CACHE:-$HOME/.cache/dispatch}/bin/kubelet-<KUBE_VERSION>/kubelet
#   .../bin/coredns-<COREDNS_VERSION>-<key>/coredns   (key: a hash of the plugin list)
#   .../images/pause-<key>.tar, .../images/python-<suite>-<key>.tar   (key: a hash of their recipe)
#
# Usage:
#   hack/build-node.sh                 install and build whatever is missing
#   hack/build-node.sh --print-env     print KEY=VALUE lines (paths, image tags), build nothing
#   hack/build-node.sh --check         exit 1 if anything is missing, build nothing
#
# Safe to run concurrently (it takes a lock) and beside hack/build-bins.sh (its own work dirs).
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.34.4}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.12.1}"
COREDNS_PLUGINS="${COREDNS_PLUGINS:-bind ready errors log template kubernetes}"
NODE_IMAGE_SUITE="${NODE_IMAGE_SUITE:-bookworm}"
NODE_PACKAGES="containerd runc containernetworking-plugins iptables debootstrap"
PYTHON_PACKAGES="python3.11"

DISPATCH_CACHE="${DISPATCH_CACHE:-${HOME}/.cache/dispatch}"
BIN_DIR="${DISPATCH_CACHE}/bin"
SRC_DIR="${DISPATCH_CACHE}/src"
IMAGE_DIR="${DISPATCH_CACHE}/images"
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NODE_DIR="${HACK_DIR}/node"
MKIMAGE="${NODE_DIR}/mkimage.py"

# The rootfs of the test image: debootstrap's minbase with python3.11, less what no test reads
# (apt's lists and caches, docs, man pages, locales); python3 names the interpreter. Its text is
# part of the image's cache key (declare -f below), so editing it rebuilds the image.
python_rootfs() {
  local rootfs=$1 mirror=$2
  "${DEBOOTSTRAP}" --variant=minbase --include="${PYTHON_PACKAGES// /,}" "${NODE_IMAGE_SUITE}" \
    "${rootfs}" "${mirror}"
  rm -f "${rootfs}/etc/apt/sources.list"
  rm -rf "${rootfs}"/var/cache/apt/archives/*.deb "${rootfs}"/var/lib/apt/lists/* \
    "${rootfs}"/usr/share/doc/* "${rootfs}"/usr/share/man/* "${rootfs}"/usr/share/info/* \
    "${rootfs}"/usr/share/locale/* "${rootfs}"/var/log/*.log "${rootfs}"/var/cache/debconf/*-old
  ln -sf python3.11 "${rootfs}/usr/bin/python3"
}

hash12() { sha256sum | cut -c1-12; }
COREDNS_KEY="$(echo "${COREDNS_PLUGINS}" | hash12)"
PAUSE_KEY="$(cat "${NODE_DIR}/pause/main.go" "${NODE_DIR}/pause/go.mod" "${MKIMAGE}" | hash12)"
PYTHON_KEY="$( (echo "${NODE_IMAGE_SUITE} ${PYTHON_PACKAGES}"; declare -f python_rootfs; cat "${MKIMAGE}") | hash12)"

KUBELET="${BIN_DIR}/kubelet-${KUBE_VERSION}/kubelet"
COREDNS="${BIN_DIR}/coredns-${COREDNS_VERSION}-${COREDNS_KEY}/coredns"
PAUSE_IMAGE="${IMAGE_DIR}/pause-${PAUSE_KEY}.tar"
PAUSE_TAG="localhost/dispatch-lab/pause:${PAUSE_KEY}"
PYTHON_IMAGE="${IMAGE_DIR}/python-${NODE_IMAGE_SUITE}-${PYTHON_KEY}.tar"
PYTHON_TAG="localhost/dispatch-lab/python:3.11-${NODE_IMAGE_SUITE}-${PYTHON_KEY}"

print_env() {
  cat <<EOF
DISPATCH_KUBELET=${KUBELET}
DISPATCH_COREDNS=${COREDNS}
DISPATCH_CONTAINERD=$(command -v containerd || echo /usr/bin/containerd)
DISPATCH_CTR=$(command -v ctr || echo /usr/bin/ctr)
DISPATCH_RUNC=$(command -v runc || echo /usr/sbin/runc)
DISPATCH_CNI_BIN_DIR=/usr/lib/cni
DISPATCH_NODE_PAUSE_IMAGE=${PAUSE_IMAGE}
DISPATCH_NODE_PAUSE_TAG=${PAUSE_TAG}
DISPATCH_NODE_TEST_IMAGE=${PYTHON_IMAGE}
DISPATCH_NODE_TEST_TAG=${PYTHON_TAG}
EOF
}

missing_packages() {
  local p out=""
  for p in ${NODE_PACKAGES}; do dpkg -s "$p" >/dev/null 2>&1 || out+=" $p"; done
  echo "${out# }"
}

case "${1:-}" in
  --print-env) print_env; exit 0 ;;
  --check)
    rc=0
    m="$(missing_packages)"; [[ -z "$m" ]] || { echo "missing Debian packages: $m" >&2; rc=1; }
    for f in "${KUBELET}" "${COREDNS}"; do [[ -x "$f" ]] || { echo "missing: $f" >&2; rc=1; }; done
    for f in "${PAUSE_IMAGE}" "${PYTHON_IMAGE}"; do [[ -s "$f" ]] || { echo "missing: $f" >&2; rc=1; }; done
    exit "$rc" ;;
  "") ;;
  *) echo "usage: $0 [--print-env|--check]" >&2; exit 2 ;;
esac

log() { printf '[build-node %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# timed NAME CMD...: run CMD and log its wall time (the figures in docs/real-node.md).
timed() {
  local name=$1 t0=$SECONDS; shift
  "$@"
  log "${name}: $((SECONDS - t0))s"
}

install_packages() {
  local missing
  missing="$(missing_packages)"
  if [[ -z "${missing}" ]]; then
    log "Debian packages (${NODE_PACKAGES}): installed"
    return
  fi
  ((EUID == 0)) || { echo "build-node: installing${missing:+ $missing} needs root" >&2; exit 1; }
  log "apt-get install ${missing}"
  # shellcheck disable=SC2086 # one word per package
  if ! apt-get install -y --no-install-recommends --dry-run ${missing} >/dev/null 2>&1; then
    apt-get -o DPkg::Lock::Timeout=300 update >/dev/null
  fi
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends \
    ${missing} >/dev/null
}

GO="${GO:-}"
find_go() {
  [[ -n "${GO}" ]] && return
  if command -v go >/dev/null 2>&1; then GO="$(command -v go)"
  elif [[ -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go
  else echo "build-node: no Go toolchain found (set GO=/path/to/go)" >&2; exit 1
  fi
}

install_atomically() {
  mkdir -p "$(dirname "$2")"
  chmod 0755 "$1"
  mv -f "$1" "$2"
}

# --- kubelet: k/k's go.mod points its staging modules at ./staging, which a module build
# refuses; the wrapper replaces each with its published v0.X.Y (as hack/build-bins.sh does).
build_kubelet() {
  if [[ -x "${KUBELET}" ]]; then
    log "kubelet ${KUBE_VERSION}: cached"
    return
  fi
  local ver="${KUBE_VERSION#v}" rest minor staging_ver wd gomod staging ldflags pkg
  rest="${ver#*.}"; minor="${rest%%.*}"; staging_ver="v0.${rest}"
  wd="${SRC_DIR}/kubelet-${KUBE_VERSION}"
  mkdir -p "${wd}"
  gomod="$("${GO}" mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" \
    | sed -n 's/^[[:space:]]*"GoMod":[[:space:]]*"\(.*\)",\{0,1\}$/\1/p')"
  [[ -f "${gomod}" ]] || { echo "build-node: cannot locate go.mod of k8s.io/kubernetes@${KUBE_VERSION}" >&2; exit 1; }
  staging="$(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\1#p' "${gomod}" | sort -u)"
  [[ -n "${staging}" ]] || { echo "build-node: no staging replaces found in ${gomod}" >&2; exit 1; }
  {
    echo "module dispatch.local/kubelet-bin"; echo
    echo "go $(sed -n 's/^go \([0-9.]*\).*/\1/p' "${gomod}")"; echo
    echo "require k8s.io/kubernetes ${KUBE_VERSION}"; echo
    echo "replace ("
    while read -r m; do echo "	${m} => ${m} ${staging_ver}"; done <<<"${staging}"
    echo ")"
  } >"${wd}/go.mod"
  printf '//go:build tools\n\n// Package tools pins the command this wrapper module builds.\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kubelet"\n' >"${wd}/tools.go"
  rm -f "${wd}/go.sum"
  (cd "${wd}" && "${GO}" mod tidy)
  # The -X flags of k/k's hack/lib/version.sh: `kubelet --version` and the Node's kubeletVersion.
  ldflags="-s -w"
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ldflags+=" -X ${pkg}.gitVersion=${KUBE_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor} -X ${pkg}.gitTreeState=clean"
  done
  log "go build kubelet ${KUBE_VERSION}"
  timed kubelet bash -c 'cd "$1" && "$2" build -p "$3" -trimpath -ldflags "$4" -o "$1/kubelet.tmp" k8s.io/kubernetes/cmd/kubelet' \
    _ "${wd}" "${GO}" "${BUILD_JOBS}" "${ldflags}"
  install_atomically "${wd}/kubelet.tmp" "${KUBELET}"
}

# --- CoreDNS: its own main (coremain.Run) with only COREDNS_PLUGINS imported; the directive
# order stays CoreDNS's own (dnsserver.Directives), a Corefile can use only the imported ones.
build_coredns() {
  if [[ -x "${COREDNS}" ]]; then
    log "coredns ${COREDNS_VERSION} (${COREDNS_PLUGINS}): cached"
    return
  fi
  local wd="${SRC_DIR}/coredns-${COREDNS_VERSION}-${COREDNS_KEY}" p
  mkdir -p "${wd}"
  printf 'module dispatch.local/coredns-bin\n\ngo 1.24\n\nrequire github.com/coredns/coredns %s\n' "${COREDNS_VERSION}" >"${wd}/go.mod"
  {
    echo "// Command coredns is CoreDNS with the test lab's plugins only."
    echo "package main"
    echo
    echo "import ("
    for p in ${COREDNS_PLUGINS}; do echo "	_ \"github.com/coredns/coredns/plugin/${p}\""; done
    echo "	\"github.com/coredns/coredns/coremain\""
    echo ")"
    echo
    echo "func main() { coremain.Run() }"
  } >"${wd}/main.go"
  rm -f "${wd}/go.sum"
  (cd "${wd}" && "${GO}" mod tidy)
  log "go build coredns ${COREDNS_VERSION} (${COREDNS_PLUGINS})"
  timed coredns bash -c 'cd "$1" && "$2" build -p "$3" -trimpath -ldflags "-s -w" -o "$1/coredns.tmp" .' \
    _ "${wd}" "${GO}" "${BUILD_JOBS}"
  install_atomically "${wd}/coredns.tmp" "${COREDNS}"
}

# --- the pause image: one static binary, user 65535 (what Kubernetes' own pause image runs as).
build_pause_image() {
  if [[ -s "${PAUSE_IMAGE}" ]]; then
    log "pause image ${PAUSE_TAG}: cached"
    return
  fi
  local wd="${SRC_DIR}/pause-${PAUSE_KEY}"
  rm -rf "${wd}" && mkdir -p "${wd}/rootfs" "${IMAGE_DIR}"
  (cd "${NODE_DIR}/pause" && "${GO}" build -trimpath -ldflags "-s -w" -o "${wd}/rootfs/pause" .)
  tar -C "${wd}/rootfs" --numeric-owner --owner=0 --group=0 --mtime=@0 -cf "${wd}/rootfs.tar" .
  python3 "${MKIMAGE}" --tag "${PAUSE_TAG}" --layer "${wd}/rootfs.tar" --entrypoint '["/pause"]' \
    --user 65535:65535 -o "${PAUSE_IMAGE}"
  rm -rf "${wd}"
}

# The first Debian mirror the host's apt uses for the suite (the image's packages come from it;
# nothing of it stays in the image).
host_mirror() {
  apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Identifier: Packages' 2>/dev/null \
    | awk -v suite="${NODE_IMAGE_SUITE}" '$2 == suite { print $1; exit }'
}

build_python_image() {
  if [[ -s "${PYTHON_IMAGE}" ]]; then
    log "test image ${PYTHON_TAG}: cached"
    return
  fi
  local wd="${SRC_DIR}/python-${NODE_IMAGE_SUITE}-${PYTHON_KEY}" mirror
  mirror="${NODE_IMAGE_MIRROR:-$(host_mirror)}"
  [[ -n "${mirror}" ]] || { echo "build-node: no apt source for ${NODE_IMAGE_SUITE}; set NODE_IMAGE_MIRROR" >&2; exit 1; }
  DEBOOTSTRAP="$(command -v debootstrap || echo /usr/sbin/debootstrap)"
  rm -rf "${wd}" && mkdir -p "${wd}" "${IMAGE_DIR}"
  log "debootstrap --variant=minbase ${NODE_IMAGE_SUITE} (${mirror}) + ${PYTHON_PACKAGES}"
  local t0=$SECONDS
  python_rootfs "${wd}/rootfs" "${mirror}" >"${wd}/debootstrap.log" 2>&1 || {
    tail -n 20 "${wd}/debootstrap.log" >&2; exit 1; }
  log "debootstrap: $((SECONDS - t0))s"
  tar -C "${wd}/rootfs" --numeric-owner -cf "${wd}/rootfs.tar" .
  rm -rf "${wd}/rootfs"
  python3 "${MKIMAGE}" --tag "${PYTHON_TAG}" --layer "${wd}/rootfs.tar" --cmd '["/usr/bin/python3"]' \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    -o "${PYTHON_IMAGE}"
  rm -rf "${wd}"
}

mkdir -p "${BIN_DIR}" "${SRC_DIR}" "${IMAGE_DIR}"
exec 9>"${DISPATCH_CACHE}/.build-node.lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi

export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
BUILD_JOBS="${BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"

start=$SECONDS
timed packages install_packages
# The image needs only debootstrap and the network, the binaries only Go and the CPU: side by side.
build_python_image & image_pid=$!
if [[ ! -x "${KUBELET}" || ! -x "${COREDNS}" || ! -s "${PAUSE_IMAGE}" ]]; then find_go; fi
build_pause_image
build_kubelet
build_coredns
wait "${image_pid}" || { echo "build-node: the test image failed (see above)" >&2; exit 1; }
log "done in $((SECONDS - start))s"
print_env
