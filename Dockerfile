# syntax=docker/dockerfile:1
# The dispatch operator image. Build from the repository root (docs/install.md):
#
#   docker build -t dispatch-operator:0.1.0 .        # or: podman build / buildah bud
#   make image                                       # here: bases made from Debian packages
#
# Two stages that share one interpreter: python3.11 at the same path in both (the virtual
# environment links to it). By default both stages start from the official python:3.11-slim-bookworm
# (its interpreter is /usr/local/bin/python3.11):
#
#   builder   BUILD_IMAGE: a virtual environment at /opt/dispatch with the operator's wheel and its
#             runtime dependencies from requirements/operator.txt (hashed), byte-compiled, without pip,
#             setuptools or wheel;
#   final     RUNTIME_IMAGE: gets only /opt/dispatch (no RUN), runs as the numeric non-root user
#             65532 (the chart's runAsUser) and writes nothing outside /tmp, so it runs with a
#             read-only root filesystem. The slim default still holds a shell and dpkg; pass a
#             distroless-style base for one without (docs/install.md).
#
# `make image` (mk/image.mk) passes both bases made by hack/image-base.sh from Debian's packages
# (Debian's python3.11 at /usr/bin/python3.11; the runtime one has no shell, no package manager and
# no compiler), so it needs no registry. tests/unit/test_dockerfile.py keeps these properties true;
# e2e/test_image.py runs the built image as the operator.
#
# The defaults name the bases by tag; a reproducible build names them by digest, e.g.
# --build-arg BUILD_IMAGE=python:3.11-slim-bookworm@sha256:<digest> (docs/security.md).

ARG BUILD_IMAGE=python:3.11-slim-bookworm
ARG RUNTIME_IMAGE=python:3.11-slim-bookworm

FROM ${BUILD_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# The interpreter on PATH (/usr/local/bin in the python image, /usr/bin in Debian's); a Debian base
# without it, or without the venv module, gets Debian's python3-venv (python3.11 at /usr/bin).
RUN if ! python3.11 -c 'import ensurepip' 2>/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3-venv \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && "$(command -v python3.11)" -m venv /opt/dispatch
WORKDIR /src
# The dependencies first, from the image's hashed lock alone (requirements/operator.txt, made by
# `make lock` from pyproject.toml: the base, the kube and operator extras, the build backend), so a
# change to the operator's code rebuilds only the layers below; pip refuses any file whose sha256
# the lock does not list. A host whose TLS is intercepted passes its CA bundle as the secret pip-cert.
COPY requirements/operator.txt /src/requirements/operator.txt
RUN --mount=type=secret,id=pip-cert \
    if [ -s /run/secrets/pip-cert ]; then export PIP_CERT=/run/secrets/pip-cert; fi \
 && /opt/dispatch/bin/pip install --no-compile --require-hashes --no-deps \
      --requirement /src/requirements/operator.txt \
 && /opt/dispatch/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/dispatch/lib
COPY pyproject.toml README.md ./
COPY operator ./operator
# The wheel is built without network (setuptools is already in the venv), installed, checked, and
# the installers removed. Every module is byte-compiled with unchecked hashes (the dependencies
# above, the operator here), because the read-only root filesystem lets Python write no cache and
# copied files get new mtimes.
RUN /opt/dispatch/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /dist . \
 && /opt/dispatch/bin/pip install --no-compile --no-deps /dist/dispatch_jobs-*.whl \
 && /opt/dispatch/bin/pip uninstall --yes pip setuptools wheel \
 && rm -rf /opt/dispatch/lib/python3.11/site-packages/_distutils_hack \
      /opt/dispatch/lib/python3.11/site-packages/distutils-precedence.pth \
      /opt/dispatch/bin/Activate.ps1 /opt/dispatch/bin/activate* \
 && /opt/dispatch/bin/python -m compileall -q --invalidation-mode unchecked-hash \
      /opt/dispatch/lib/python3.11/site-packages/dispatch \
 && /opt/dispatch/bin/dispatch-operator --help > /dev/null

FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="dispatch-operator" \
      org.opencontainers.image.description="Supervises training jobs on Kubeflow and Slurm (DispatchJob)" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /opt/dispatch /opt/dispatch
ENV PATH=/opt/dispatch/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
WORKDIR /tmp
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["dispatch-operator"]
