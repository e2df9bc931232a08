#!/usr/bin/env bash
# The real node's training image (tests/integration/test_real_training.py, examples/training/):
# PyTorch from PyPI on the node's Python test image, built without a container engine or a
# registry, like hack/build-node.sh's images:
#
#   layer 1   the Python test image's root filesystem (Debian minbase + python3.11), taken from
#             hack/build-node.sh's image tarball (built first when missing)
#   layer 2   `pip install torch==TORCH_VERSION` (PyPI's default build: its CUDA libraries come as
#             nvidia-* wheels and import without a GPU) into /usr/local/lib/python3.11/dist-packages,
#             which Debian's python3.11 has on sys.path. pip runs on the host for the image's
#             platform (cp311, manylinux x86_64), so the host's own Python version does not matter.
#             Console scripts are not installed: pods run `python3 -m torch.distributed.run`.
#
# The build streams: each intermediate (wheels, unpacked layer, layer tarball) is deleted as soon
# as the next one exists, so the peak is about two copies of the 6.6 GiB layer, not six.
# Layer 2 needs only the network and the disk, hack/build-node.sh only the CPU: they run side by
# side.
#
# Output (outside the repo, keyed by version and recipe, rebuilt only when missing):
#   ${DISPATCH_CACHE:-$HOME/.cache/dispatch}/images/torch-<TORCH_VERSION>-<key>.tar  (docker-archive)
#   tag localhost/dispatch-lab/torch:<TORCH_VERSION>-<key>
#
# Usage:
#   hack/build-torch-image.sh               build it if missing
#   hack/build-torch-image.sh --print-env   print KEY=VALUE lines (path, tag), build nothing
#   hack/build-torch-image.sh --check       exit 1 if it is missing, build nothing
#   hack/build-torch-image.sh --layer-only  build only the torch layer (network and disk; no base
#                                           image needed): `make test` starts it in the background
#                                           first, so the download overlaps the lab's Go builds
#
# TORCH_KEEP_WHEELS=1 keeps the downloaded wheels (in $DISPATCH_CACHE/src) for the next rebuild.
set -euo pipefail

TORCH_VERSION="${TORCH_VERSION:-2.9.1}"
PYTHON_VERSION=3.11
GLIBC_MINOR=36

DISPATCH_CACHE="${DISPATCH_CACHE:-${HOME}/.cache/dispatch}"
SRC_DIR="${DISPATCH_CACHE}/src"
IMAGE_DIR="${DISPATCH_CACHE}/images"
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD_NODE="${HACK_DIR}/build-node.sh"
MKIMAGE="${HACK_DIR}/node/mkimage.py"
SITE="usr/local/lib/python${PYTHON_VERSION}/dist-packages"

# pip for the image's platform: binary wheels only, for CPython PYTHON_VERSION on x86_64 Linux
# with bookworm's glibc (2.GLIBC_MINOR): every manylinux tag up to it, named one by one (pip does
# not widen a --platform to the older glibc versions it implies).
pip_for_image() {
  local platforms=() v
  for ((v = GLIBC_MINOR; v >= 17; v--)); do platforms+=(--platform "manylinux_2_${v}_x86_64"); done
  python3 -m pip "$@" --only-binary=:all: --implementation cp --python-version "${PYTHON_VERSION}" \
    "${platforms[@]}" --platform manylinux2014_x86_64 --platform linux_x86_64 \
    --disable-pip-version-check --no-input
}

# Layer 2's tree: torch and its dependencies, no bytecode (Python writes none in a read-only layer
# anyway; it would only add size), no console scripts.
torch_tree() {
  local wheels=$1 tree=$2
  pip_for_image install --quiet --no-index --find-links "${wheels}" --no-compile --no-warn-script-location \
    --target "${tree}/${SITE}" "torch==${TORCH_VERSION}"
  rm -rf "${tree:?}/${SITE}/bin"
}

python_env() { bash "${BUILD_NODE}" --print-env | sed -n "s/^$1=//p"; }
hash12() { sha256sum | cut -c1-12; }
PYTHON_TAG="$(python_env DISPATCH_NODE_TEST_TAG)"
PYTHON_IMAGE="$(python_env DISPATCH_NODE_TEST_IMAGE)"
TORCH_KEY="$( (echo "${TORCH_VERSION} ${GLIBC_MINOR} ${PYTHON_TAG}"; declare -f pip_for_image torch_tree; cat "${MKIMAGE}") | hash12)"
TORCH_IMAGE="${IMAGE_DIR}/torch-${TORCH_VERSION}-${TORCH_KEY}.tar"
TORCH_TAG="localhost/dispatch-lab/torch:${TORCH_VERSION}-${TORCH_KEY}"

print_env() {
  cat <<EOF
DISPATCH_NODE_TORCH_IMAGE=${TORCH_IMAGE}
DISPATCH_NODE_TORCH_TAG=${TORCH_TAG}
EOF
}

case "${1:-}" in
  --print-env) print_env; exit 0 ;;
  --check) [[ -s "${TORCH_IMAGE}" ]] || { echo "missing: ${TORCH_IMAGE}" >&2; exit 1; }; exit 0 ;;
  --layer-only | "") ;;
  *) echo "usage: $0 [--print-env|--check|--layer-only]" >&2; exit 2 ;;
esac

log() { printf '[build-torch-image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

mkdir -p "${SRC_DIR}" "${IMAGE_DIR}"
exec 9>"${DISPATCH_CACHE}/.build-torch-image.lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi

if [[ -s "${TORCH_IMAGE}" ]]; then
  log "torch image ${TORCH_TAG}: cached"
  print_env
  exit 0
fi

WD="${SRC_DIR}/torch-${TORCH_VERSION}-${TORCH_KEY}"
WHEELS="${SRC_DIR}/torch-wheels-${TORCH_VERSION}"
start=$SECONDS

# The torch layer as a tarball: download, install, tar, deleting each input once used.
build_layer() {
  local t0=$SECONDS
  if [[ ! -f "${WHEELS}/.complete" ]]; then
    log "pip download torch==${TORCH_VERSION} (cp${PYTHON_VERSION/./}, manylinux x86_64 up to glibc 2.${GLIBC_MINOR})"
    rm -rf "${WHEELS}" && mkdir -p "${WHEELS}"
    pip_for_image download --quiet --dest "${WHEELS}" "torch==${TORCH_VERSION}"
    touch "${WHEELS}/.complete"
    log "wheels: $((SECONDS - t0))s, $(du -sh "${WHEELS}" | cut -f1)"
  fi
  t0=$SECONDS
  rm -rf "${WD}/tree" && mkdir -p "${WD}/tree"
  torch_tree "${WHEELS}" "${WD}/tree"
  log "pip install: $((SECONDS - t0))s, $(du -sh "${WD}/tree" | cut -f1)"
  [[ "${TORCH_KEEP_WHEELS:-0}" == 1 ]] || rm -rf "${WHEELS}"
  t0=$SECONDS
  tar -C "${WD}/tree" --sort=name --numeric-owner --owner=0 --group=0 --mtime=@0 -cf "${WD}/torch.tar.tmp" .
  mv "${WD}/torch.tar.tmp" "${WD}/torch.tar"
  rm -rf "${WD}/tree"
  log "layer tar: $((SECONDS - t0))s"
}

mkdir -p "${WD}"
if [[ "${1:-}" == --layer-only ]]; then
  [[ -s "${WD}/torch.tar" ]] || build_layer
  log "torch layer ready in ${WD} ($((SECONDS - start))s)"
  exit 0
fi
if [[ -s "${WD}/torch.tar" ]]; then
  log "torch layer: cached in ${WD}"
  layer_pid=
else
  build_layer & layer_pid=$!
fi
# The base layer: the node's Python test image. When it is missing, hack/build-node.sh builds it
# and the rest of the node (it takes its own lock); with TORCH_WAIT_FOR_NODE=1 this waits for
# another build of it instead (a `make node-deps` already under way).
node_rc=0
if [[ ! -s "${PYTHON_IMAGE}" && "${TORCH_WAIT_FOR_NODE:-0}" == 1 ]]; then
  log "waiting for ${PYTHON_IMAGE}"
  while [[ ! -s "${PYTHON_IMAGE}" ]]; do sleep 10; done
elif [[ ! -s "${PYTHON_IMAGE}" ]]; then
  bash "${BUILD_NODE}" >/dev/null || node_rc=$?  # its log is on stderr; stdout is --print-env's
fi
if [[ -n "${layer_pid}" ]]; then
  wait "${layer_pid}" || { echo "build-torch-image: the torch layer failed (see above)" >&2; exit 1; }
fi
((node_rc == 0)) || { echo "build-torch-image: hack/build-node.sh failed (see above)" >&2; exit 1; }

t0=$SECONDS
base_layer="$(tar -tf "${PYTHON_IMAGE}" | grep '/layer.tar$')"
[[ "$(wc -l <<<"${base_layer}")" == 1 ]] || { echo "build-torch-image: ${PYTHON_IMAGE} must have one layer" >&2; exit 1; }
tar -C "${WD}" -xf "${PYTHON_IMAGE}" "${base_layer}"
python3 "${MKIMAGE}" --tag "${TORCH_TAG}" --layer "${WD}/${base_layer}" --layer "${WD}/torch.tar" \
  --cmd '["/usr/bin/python3"]' \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
  --env OMP_NUM_THREADS=1 -o "${TORCH_IMAGE}"
rm -rf "${WD}"
log "mkimage: $((SECONDS - t0))s"
log "done in $((SECONDS - start))s: ${TORCH_IMAGE} ($(du -h "${TORCH_IMAGE}" | cut -f1))"
print_env
