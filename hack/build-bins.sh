#!/usr/bin/env bash
# Build the test cluster's binaries from Go modules, without Docker and without release tarballs:
# etcd, kube-apiserver, kubectl, kube-scheduler, kube-controller-manager, kwok, Kubeflow's
# training operator (with the project's own main, hack/training-operator-lab/main.go), JobSet,
# Kubeflow Trainer v2, Kueue, helm and promtool (the chart's alerting rules' tests).
#
# Output (outside the repo, keyed by version, rebuilt only when missing):
#   ${DISPATCH_CACHE:-$HOME/.cache/dispatch}/bin/<name>-<version>/<name>
#   .../bin/training-operator-<TRAINING_OPERATOR_VERSION>/training-operator-lab
#       (+ main.go.sha256: rebuilt when hack/training-operator-lab/main.go changes;
#        + manifests/: the upstream CRD, RBAC and webhook manifests of that version)
#   .../bin/jobset-<JOBSET_VERSION>/jobset (+ manifests/: CRD and webhook configurations)
#   .../bin/trainer-<TRAINER_VERSION>/trainer-controller-manager
#       (+ manifests/: CRDs, webhook configurations, the torch-distributed ClusterTrainingRuntime)
#   .../bin/kueue-<KUEUE_VERSION>/kueue (+ manifests/: its CRDs)
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
# The kube-* binaries are built from k8s.io/kubernetes with a throwaway wrapper go.mod (k/k's own
# go.mod replaces its staging modules with ./staging/..., which `go install pkg@version` refuses),
# so every staging module is replaced by its published v0.X.Y. etcd is built the same way (its
# server/go.mod has replaces too). kwok, helm, Trainer and Kueue build with a plain `go install pkg@version`.
# JobSet cannot: `go install` reads the module's @v/list for deprecations, which the proxy refuses
# for sigs.k8s.io/jobset (403); a wrapper module never asks for it. JobSet, Trainer and Kueue build
# in parallel (their dependency graphs share little, so the go tool's own parallelism leaves idle time).
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.14}"
HELM_VERSION="${HELM_VERSION:-v3.19.5}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
TRAINING_OPERATOR_VERSION="${TRAINING_OPERATOR_VERSION:-v1.9.3}"
JOBSET_VERSION="${JOBSET_VERSION:-v0.11.1}"
TRAINER_VERSION="${TRAINER_VERSION:-v2.2.0}"
KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
# Prometheus tags its Go module v0.<major><minor>.<patch>: v0.316.0 is Prometheus 3.16.0.
PROMTOOL_VERSION="${PROMTOOL_VERSION:-v0.316.0}"

DISPATCH_CACHE="${DISPATCH_CACHE:-${HOME}/.cache/dispatch}"
BIN_DIR="${DISPATCH_CACHE}/bin"
SRC_DIR="${DISPATCH_CACHE}/src"
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TO_MAIN="${HACK_DIR}/training-operator-lab/main.go"

KUBE_APISERVER="${BIN_DIR}/kube-apiserver-${KUBE_VERSION}/kube-apiserver"
KUBECTL="${BIN_DIR}/kubectl-${KUBE_VERSION}/kubectl"
KUBE_SCHEDULER="${BIN_DIR}/kube-scheduler-${KUBE_VERSION}/kube-scheduler"
KUBE_CONTROLLER_MANAGER="${BIN_DIR}/kube-controller-manager-${KUBE_VERSION}/kube-controller-manager"
ETCD="${BIN_DIR}/etcd-${ETCD_VERSION}/etcd"
HELM="${BIN_DIR}/helm-${HELM_VERSION}/helm"
KWOK="${BIN_DIR}/kwok-${KWOK_VERSION}/kwok"
TO_DIR="${BIN_DIR}/training-operator-${TRAINING_OPERATOR_VERSION}"
TRAINING_OPERATOR="${TO_DIR}/training-operator-lab"
TO_MANIFESTS="${TO_DIR}/manifests"
JOBSET="${BIN_DIR}/jobset-${JOBSET_VERSION}/jobset"
JOBSET_MANIFESTS="${BIN_DIR}/jobset-${JOBSET_VERSION}/manifests"
TRAINER="${BIN_DIR}/trainer-${TRAINER_VERSION}/trainer-controller-manager"
TRAINER_MANIFESTS="${BIN_DIR}/trainer-${TRAINER_VERSION}/manifests"
KUEUE="${BIN_DIR}/kueue-${KUEUE_VERSION}/kueue"
KUEUE_MANIFESTS="${BIN_DIR}/kueue-${KUEUE_VERSION}/manifests"
PROMTOOL="${BIN_DIR}/promtool-${PROMTOOL_VERSION}/promtool"

print_env() {
  cat <<EOF
DISPATCH_CACHE=${DISPATCH_CACHE}
KUBE_VERSION=${KUBE_VERSION}
ETCD_VERSION=${ETCD_VERSION}
HELM_VERSION=${HELM_VERSION}
KWOK_VERSION=${KWOK_VERSION}
TRAINING_OPERATOR_VERSION=${TRAINING_OPERATOR_VERSION}
JOBSET_VERSION=${JOBSET_VERSION}
TRAINER_VERSION=${TRAINER_VERSION}
KUEUE_VERSION=${KUEUE_VERSION}
PROMTOOL_VERSION=${PROMTOOL_VERSION}
DISPATCH_KUBE_APISERVER=${KUBE_APISERVER}
DISPATCH_KUBECTL=${KUBECTL}
DISPATCH_KUBE_SCHEDULER=${KUBE_SCHEDULER}
DISPATCH_KUBE_CONTROLLER_MANAGER=${KUBE_CONTROLLER_MANAGER}
DISPATCH_ETCD=${ETCD}
DISPATCH_HELM=${HELM}
DISPATCH_KWOK=${KWOK}
DISPATCH_TRAINING_OPERATOR=${TRAINING_OPERATOR}
DISPATCH_TRAINING_OPERATOR_MANIFESTS=${TO_MANIFESTS}
DISPATCH_JOBSET=${JOBSET}
DISPATCH_JOBSET_MANIFESTS=${JOBSET_MANIFESTS}
DISPATCH_TRAINER=${TRAINER}
DISPATCH_TRAINER_MANIFESTS=${TRAINER_MANIFESTS}
DISPATCH_KUEUE=${KUEUE}
DISPATCH_KUEUE_MANIFESTS=${KUEUE_MANIFESTS}
EOF
}

# The training-operator binary is current when it was built from this main.go.
to_main_sum() { sha256sum "${TO_MAIN}" | cut -d' ' -f1; }
to_current() {
  [[ -x "${TRAINING_OPERATOR}" && -f "${TO_MANIFESTS}/kubeflow.org_pytorchjobs.yaml" ]] &&
    [[ "$(cat "${TO_DIR}/main.go.sha256" 2>/dev/null)" == "$(to_main_sum)" ]]
}

# JobSet and Trainer are current when the binary and the manifests copied next to it are there.
jobset_current() { [[ -x "${JOBSET}" && -f "${JOBSET_MANIFESTS}/webhook-manifests.yaml" ]]; }
trainer_current() { [[ -x "${TRAINER}" && -f "${TRAINER_MANIFESTS}/torch_distributed.yaml" ]]; }
kueue_current() { [[ -x "${KUEUE}" && -f "${KUEUE_MANIFESTS}/kueue.x-k8s.io_workloads.yaml" ]]; }
promtool_current() { [[ -x "${PROMTOOL}" ]]; }

case "${1:-}" in
  --print-env) print_env; exit 0 ;;
  --check)
    rc=0
    for b in "${KUBE_APISERVER}" "${KUBECTL}" "${KUBE_SCHEDULER}" "${KUBE_CONTROLLER_MANAGER}" "${ETCD}" "${HELM}" "${KWOK}"; do
      [[ -x "$b" ]] || { echo "missing: $b" >&2; rc=1; }
    done
    to_current || { echo "missing or stale: ${TRAINING_OPERATOR}" >&2; rc=1; }
    jobset_current || { echo "missing: ${JOBSET} or its manifests" >&2; rc=1; }
    trainer_current || { echo "missing: ${TRAINER} or its manifests" >&2; rc=1; }
    kueue_current || { echo "missing: ${KUEUE} or its manifests" >&2; rc=1; }
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

# mod_dir MODULE@VERSION: the module's directory in the module cache (downloaded if needed).
mod_dir() {
  "${GO}" mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir":[[:space:]]*"\(.*\)",\{0,1\}$/\1/p'
}

# timed NAME CMD...: run CMD and log its wall time (the figures in docs/testing.md).
timed() {
  local name=$1 t0=$SECONDS; shift
  "$@"
  log "${name}: $((SECONDS - t0))s"
}

# --- kube-apiserver, kubectl, kube-scheduler, kube-controller-manager --------------------
KUBE_CMDS=(kube-apiserver kubectl kube-scheduler kube-controller-manager)
kube_bin() { echo "${BIN_DIR}/$1-${KUBE_VERSION}/$1"; }

build_kube() {
  local need=() c
  for c in "${KUBE_CMDS[@]}"; do [[ -x "$(kube_bin "$c")" ]] || need+=("$c"); done
  if ((${#need[@]} == 0)); then
    log "kubernetes ${KUBE_VERSION} (${KUBE_CMDS[*]}): cached"
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
  {
    echo "//go:build tools"
    echo
    echo "// Package tools pins the commands this wrapper module builds."
    echo "package tools"
    echo
    echo "import ("
    for c in "${KUBE_CMDS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/${c}\""; done
    echo ")"
  } >"${wd}/tools.go"
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

  for c in "${need[@]}"; do
    log "go build ${c} ${KUBE_VERSION}"
    timed "${c}" bash -c 'cd "$1" && "$2" build -p "$3" -trimpath -ldflags "$4" -o "$1/$5.tmp" "k8s.io/kubernetes/cmd/$5"' \
      _ "${wd}" "${GO}" "${BUILD_JOBS}" "${ldflags}" "${c}"
    install_atomically "${wd}/${c}.tmp" "$(kube_bin "${c}")"
  done
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

# --- kwok (the nodes and their kubelet, see tests/support/kwok.yaml) ----------------------
build_kwok() { go_install kwok "${KWOK_VERSION}" sigs.k8s.io/kwok/cmd/kwok "${KWOK}"; }

# --- Kubeflow's training operator --------------------------------------------------------
# Upstream's cmd/training-operator.v1 cannot run outside a Pod (webhook on all interfaces, certs
# only through a kubelet-mounted Secret volume): hack/training-operator-lab/main.go is the
# project's main over the same upstream packages. The upstream manifests of the same version are
# copied next to the binary, so the test lab needs no Go toolchain.
build_training_operator() {
  if to_current; then
    log "training-operator ${TRAINING_OPERATOR_VERSION}: cached"
    return
  fi
  local wd="${SRC_DIR}/training-operator-${TRAINING_OPERATOR_VERSION}-dispatch"
  mkdir -p "${wd}/cmd/training-operator-lab"
  cat >"${wd}/go.mod" <<EOF
module dispatch.local/training-operator-bin

go 1.23

require github.com/kubeflow/training-operator ${TRAINING_OPERATOR_VERSION}
EOF
  cp "${TO_MAIN}" "${wd}/cmd/training-operator-lab/main.go"
  rm -f "${wd}/go.sum"
  log "go mod tidy (training-operator wrapper)"
  (cd "${wd}" && "${GO}" mod tidy)
  log "go build training-operator-lab ${TRAINING_OPERATOR_VERSION}"
  timed training-operator bash -c 'cd "$1" && "$2" build -p "$3" -trimpath -ldflags "-s -w" -o "$1/training-operator-lab.tmp" ./cmd/training-operator-lab' \
    _ "${wd}" "${GO}" "${BUILD_JOBS}"
  local mod
  mod="$(mod_dir "github.com/kubeflow/training-operator@${TRAINING_OPERATOR_VERSION}")"
  [[ -d "${mod}/manifests/base" ]] || { echo "build-bins: no manifests in ${mod}" >&2; exit 1; }
  mkdir -p "${TO_MANIFESTS}"
  local f
  for f in crds/kubeflow.org_pytorchjobs.yaml rbac/role.yaml rbac/service-account.yaml webhook/manifests.yaml; do
    install -m 0644 "${mod}/manifests/base/${f}" "${TO_MANIFESTS}/$(basename "${f}")"
  done
  install_atomically "${wd}/training-operator-lab.tmp" "${TRAINING_OPERATOR}"
  to_main_sum >"${TO_DIR}/main.go.sha256"
}

# --- JobSet and Kubeflow Trainer v2 ------------------------------------------------------
# The upstream manifests the lab needs are copied next to each binary (no Go toolchain at test
# time): JobSet's CRD and webhook configurations; Trainer's CRDs, webhook configurations and the
# torch-distributed ClusterTrainingRuntime. A binary already built into the same path (by another
# script, say) is kept; only missing manifests are copied then.
build_jobset() {
  local mod
  if [[ ! -x "${JOBSET}" ]]; then
    local wd="${SRC_DIR}/jobset-${JOBSET_VERSION}-dispatch"
    mkdir -p "${wd}"
    printf 'module dispatch.local/jobset-bin\n\ngo 1.25.0\n\nrequire sigs.k8s.io/jobset %s\n' "${JOBSET_VERSION}" >"${wd}/go.mod"
    printf '//go:build tools\n\n// Package tools pins the command this wrapper module builds.\npackage tools\n\nimport _ "sigs.k8s.io/jobset"\n' >"${wd}/tools.go"
    rm -f "${wd}/go.sum"
    log "go mod tidy (jobset wrapper)"
    (cd "${wd}" && "${GO}" mod tidy)
    log "go build jobset ${JOBSET_VERSION}"
    timed jobset bash -c 'cd "$1" && "$2" build -p "$3" -trimpath -ldflags "-s -w" -o "$1/jobset.tmp" sigs.k8s.io/jobset' \
      _ "${wd}" "${GO}" "${BUILD_JOBS}"
    install_atomically "${wd}/jobset.tmp" "${JOBSET}"
  else
    log "jobset ${JOBSET_VERSION}: cached"
  fi
  mod="$(mod_dir "sigs.k8s.io/jobset@${JOBSET_VERSION}")"
  mkdir -p "${JOBSET_MANIFESTS}"
  install -m 0644 "${mod}/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml" "${JOBSET_MANIFESTS}/"
  install -m 0644 "${mod}/config/components/webhook/manifests.yaml" "${JOBSET_MANIFESTS}/webhook-manifests.yaml"
}

# go_install NAME VERSION PKG FINAL: `go install PKG@VERSION` into FINAL unless it is there.
go_install() {
  local name=$1 version=$2 pkg=$3 final=$4
  if [[ -x "${final}" ]]; then
    log "${name} ${version}: cached"
    return
  fi
  local gobin="${SRC_DIR}/${name}-${version}-gobin"
  mkdir -p "${gobin}"
  log "go install ${pkg##*/} ${version}"
  timed "${name}" env GOBIN="${gobin}" "${GO}" install -p "${BUILD_JOBS}" -trimpath -ldflags "-s -w" "${pkg}@${version}"
  install_atomically "${gobin}/${pkg##*/}" "${final}"
}

build_trainer() {
  local mod f
  go_install trainer "${TRAINER_VERSION}" github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager "${TRAINER}"
  mod="$(mod_dir "github.com/kubeflow/trainer/v2@${TRAINER_VERSION}")"
  mkdir -p "${TRAINER_MANIFESTS}"
  for f in "${mod}"/manifests/base/crds/trainer.kubeflow.org_*.yaml; do
    install -m 0644 "${f}" "${TRAINER_MANIFESTS}/"
  done
  install -m 0644 "${mod}/manifests/base/webhook/manifests.yaml" "${TRAINER_MANIFESTS}/webhook-manifests.yaml"
  install -m 0644 "${mod}/manifests/base/runtimes/torch_distributed.yaml" "${TRAINER_MANIFESTS}/"
}

# Kueue's CRDs go next to it; the lab patches their conversion webhooks (see tests/support/lab.py).
build_kueue() {
  local mod f
  go_install kueue "${KUEUE_VERSION}" sigs.k8s.io/kueue/cmd/kueue "${KUEUE}"
  mod="$(mod_dir "sigs.k8s.io/kueue@${KUEUE_VERSION}")"
  mkdir -p "${KUEUE_MANIFESTS}"
  for f in "${mod}"/config/components/crd/bases/kueue.x-k8s.io_*.yaml; do
    install -m 0644 "${f}" "${KUEUE_MANIFESTS}/"
  done
}

# All in the background, then wait for each (a failure of any fails the script).
build_extras() {
  local pids=() rc=0 p
  jobset_current || { build_jobset & pids+=($!); }
  trainer_current || { build_trainer & pids+=($!); }
  kueue_current || { build_kueue & pids+=($!); }
  # promtool (the chart's alerting rules' tests): built beside the others, not serially after them.
  promtool_current || {
    go_install promtool "${PROMTOOL_VERSION}" github.com/prometheus/prometheus/cmd/promtool "${PROMTOOL}" &
    pids+=($!)
  }
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  ((rc == 0)) || { echo "build-bins: jobset, trainer, kueue or promtool build failed (see above)" >&2; exit 1; }
  jobset_current && trainer_current && kueue_current && promtool_current &&
    log "jobset ${JOBSET_VERSION}, trainer ${TRAINER_VERSION}, kueue ${KUEUE_VERSION}, promtool ${PROMTOOL_VERSION}: ready"
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
build_kwok
build_training_operator
build_extras
build_helm
log "done in $(( $(date +%s) - start ))s"
print_env
