#!/usr/bin/env bash
# Build the test control-plane binaries (kube-apiserver, kubectl, etcd, helm) from
# Go modules, without Docker and without downloading release tarballs.
#
# Output (outside the repo, keyed by version, rebuilt only when missing):
#   ${DISPATCH_CACHE:-$HOME/.cache/dispatch}/bin/kube-apiserver-<KUBE_VERSION>/kube-apiserver
#   ${DISPATCH_CACHE:-$HOME/.cache/dispatch}/bin/kubectl-<KUBE_VERSION>/kubectl
#   ${DISPATCH_CACHE:-$HOME/.cache/dispatch}/bin/etcd-<ETCD_VERSION>/etcd
#   ${DISPATCH_CACHE:-$HOME/.cache/dispatch}/bin/helm-<HELM_VERSION>/helm
#
# Go's module and build caches stay at their defaults (GOMODCACHE, GOCACHE), so a
# second machine-local build is fast. The script is idempotent and safe to run
# concurrently (it takes a lock).
#
# Usage:
#   hack/build-bins.sh                 build whatever is missing
#   hack/build-bins.sh --print-env     print KEY=VALUE lines (versions and binary paths), build nothing
#   hack/build-bins.sh --check         exit 1 if any binary is missing, build nothing
#
# Versions can be overridden with the environment variables of the same name.
# kube-apiserver and kubectl are built from k8s.io/kubernetes with a throwaway
# wrapper go.mod (k/k's own go.mod replaces its staging modules with ./staging/...,
# which `go install pkg@version` refuses), so every staging module is replaced by
# its published v0.X.Y. etcd is built the same way (its server/go.mod has replaces too).
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.14}"
HELM_VERSION="${HELM_VERSION:-v3.19.5}"

DISPATCH_CACHE="${DISPATCH_CACHE:-${HOME}/.cache/dispatch}"
BIN_DIR="${DISPATCH_CACHE}/bin"
SRC_DIR="${DISPATCH_CACHE}/src"

KUBE_APISERVER="${BIN_DIR}/kube-apiserver-${KUBE_VERSION}/kube-apiserver"
KUBECTL="${BIN_DIR}/kubectl-${KUBE_VERSION}/kubectl"
ETCD="${BIN_DIR}/etcd-${ETCD_VERSION}/etcd"
HELM="${BIN_DIR}/helm-${HELM_VERSION}/helm"

print_env() {
  cat <<EOF
DISPATCH_CACHE=${DISPATCH_CACHE}
KUBE_VERSION=${KUBE_VERSION}
ETCD_VERSION=${ETCD_VERSION}
HELM_VERSION=${HELM_VERSION}
DISPATCH_KUBE_APISERVER=${KUBE_APISERVER}
DISPATCH_KUBECTL=${KUBECTL}
DISPATCH_ETCD=${ETCD}
DISPATCH_HELM=${HELM}
EOF
}

case "${1:-}" in
  --print-env) print_env; exit 0 ;;
  --check)
    rc=0
    for b in "${KUBE_APISERVER}" "${KUBECTL}" "${ETCD}" "${HELM}"; do
      [[ -x "$b" ]] || { echo "missing: $b" >&2; rc=1; }
    done
    exit "$rc" ;;
  "") ;;
  *) echo "usage: $0 [--print-env|--check]" >&2; exit 2 ;;
esac

log() { printf '[build-bins %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Find a Go toolchain.
GO="${GO:-}"
if [[ -z "${GO}" ]]; then
  if command -v go >/dev/null 2>&1; then GO="$(command -v go)"
  elif [[ -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go
  else echo "build-bins: no Go toolchain found (set GO=/path/to/go)" >&2; exit 1
  fi
fi
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
# Parallel package builds: all cores by default; set BUILD_JOBS to limit memory use.
BUILD_JOBS="${BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"

mkdir -p "${BIN_DIR}" "${SRC_DIR}"
exec 9>"${DISPATCH_CACHE}/.build-bins.lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi

# install_atomically TMP FINAL: move a freshly built binary into place.
install_atomically() {
  mkdir -p "$(dirname "$2")"
  chmod 0755 "$1"
  mv -f "$1" "$2"
}

# --- kube-apiserver and kubectl ---------------------------------------------------------
build_kube() {
  if [[ -x "${KUBE_APISERVER}" && -x "${KUBECTL}" ]]; then
    log "kube-apiserver and kubectl ${KUBE_VERSION}: cached"
    return
  fi
  local ver="${KUBE_VERSION#v}"                    # 1.34.4
  local major="${ver%%.*}"                         # 1
  local rest="${ver#*.}"; local minor="${rest%%.*}" # 34
  local staging_ver="v0.${rest}"                   # v0.34.4
  local wd="${SRC_DIR}/kubernetes-${KUBE_VERSION}"
  mkdir -p "${wd}"

  log "fetching k8s.io/kubernetes@${KUBE_VERSION} (for its go.mod staging list)"
  local gomod
  gomod="$("${GO}" mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" \
    | sed -n 's/^[[:space:]]*"GoMod":[[:space:]]*"\(.*\)",\{0,1\}$/\1/p')"
  [[ -f "${gomod}" ]] || { echo "build-bins: cannot locate go.mod of k8s.io/kubernetes@${KUBE_VERSION}" >&2; exit 1; }
  # Staging modules: lines like `k8s.io/api => ./staging/src/k8s.io/api`.
  local staging
  staging="$(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\1#p' "${gomod}" | sort -u)"
  [[ -n "${staging}" ]] || { echo "build-bins: no staging replaces found in ${gomod}" >&2; exit 1; }
  log "$(wc -l <<<"${staging}") staging modules -> ${staging_ver}"

  {
    echo "module dispatch.local/kube-bins"
    echo
    echo "go $(sed -n 's/^go \([0-9.]*\).*/\1/p' "${gomod}")"
    echo
    echo "require k8s.io/kubernetes ${KUBE_VERSION}"
    echo
    echo "replace ("
    while read -r m; do echo "	${m} => ${m} ${staging_ver}"; done <<<"${staging}"
    echo ")"
  } >"${wd}/go.mod"
  cat >"${wd}/tools.go" <<'EOF'
//go:build tools

// Package tools pins the commands this wrapper module builds.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
EOF
  rm -f "${wd}/go.sum"
  log "go mod tidy (kubernetes wrapper)"
  (cd "${wd}" && "${GO}" mod tidy)

  # Same -X flags as k/k's hack/lib/version.sh (kube::version::ldflags), which sets
  # them in both k8s.io/client-go/pkg/version and k8s.io/component-base/version.
  local ldflags="-s -w"
  local pkg
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ldflags+=" -X ${pkg}.gitVersion=${KUBE_VERSION}"
    ldflags+=" -X ${pkg}.gitMajor=${major}"
    ldflags+=" -X ${pkg}.gitMinor=${minor}"
    ldflags+=" -X ${pkg}.gitTreeState=clean"
  done

  if [[ ! -x "${KUBE_APISERVER}" ]]; then
    log "go build kube-apiserver ${KUBE_VERSION}"
    (cd "${wd}" && "${GO}" build -p "${BUILD_JOBS}" -trimpath -ldflags "${ldflags}" \
      -o "${wd}/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
    install_atomically "${wd}/kube-apiserver.tmp" "${KUBE_APISERVER}"
  fi
  if [[ ! -x "${KUBECTL}" ]]; then
    log "go build kubectl ${KUBE_VERSION}"
    (cd "${wd}" && "${GO}" build -p "${BUILD_JOBS}" -trimpath -ldflags "${ldflags}" \
      -o "${wd}/kubectl.tmp" k8s.io/kubernetes/cmd/kubectl)
    install_atomically "${wd}/kubectl.tmp" "${KUBECTL}"
  fi
}

# --- etcd -------------------------------------------------------------------------------
build_etcd() {
  if [[ -x "${ETCD}" ]]; then
    log "etcd ${ETCD_VERSION}: cached"
    return
  fi
  local wd="${SRC_DIR}/etcd-${ETCD_VERSION}"
  mkdir -p "${wd}"
  cat >"${wd}/go.mod" <<EOF
module dispatch.local/etcd-bin

go 1.24

require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}
EOF
  cat >"${wd}/tools.go" <<'EOF'
//go:build tools

// Package tools pins the command this wrapper module builds.
package tools

import _ "go.etcd.io/etcd/server/v3"
EOF
  rm -f "${wd}/go.sum"
  log "go mod tidy (etcd wrapper)"
  (cd "${wd}" && "${GO}" mod tidy)
  log "go build etcd ${ETCD_VERSION}"
  (cd "${wd}" && "${GO}" build -p "${BUILD_JOBS}" -trimpath -ldflags "-s -w" \
    -o "${wd}/etcd.tmp" go.etcd.io/etcd/server/v3)
  install_atomically "${wd}/etcd.tmp" "${ETCD}"
}

# --- helm -------------------------------------------------------------------------------
build_helm() {
  if [[ -x "${HELM}" ]]; then
    log "helm ${HELM_VERSION}: cached"
    return
  fi
  local gobin="${SRC_DIR}/helm-${HELM_VERSION}-gobin"
  mkdir -p "${gobin}"
  log "go install helm ${HELM_VERSION}"
  # helm's version string comes from -X helm.sh/helm/v3/internal/version.version.
  GOBIN="${gobin}" "${GO}" install -p "${BUILD_JOBS}" -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION} -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
    "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
  install_atomically "${gobin}/helm" "${HELM}"
}

start=$(date +%s)
build_etcd
build_kube
build_helm
log "done in $(( $(date +%s) - start ))s"
print_env
