# syntax=docker/dockerfile:1
# The dispatch operator image. Build from the repository root (docs/install.md):
#
#   docker build -t dispatch-operator:0.1.0 .
#
# Stage 1 builds a wheel and installs it with its runtime dependencies ("kube" extra) into a
# virtual environment; stage 2 copies only that environment onto a clean Python base image. The
# final image has no pip, no compiler, no build tools, no package manager cache, and runs as the
# non-root user 65532 (the chart's runAsUser) with a read-only root filesystem.
# tests/unit/test_dockerfile.py keeps these properties true.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/dispatch \
 && /opt/dispatch/bin/pip install --upgrade pip build
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN /opt/dispatch/bin/python -m build --wheel --outdir /dist . \
 && /opt/dispatch/bin/pip install "$(ls /dist/dispatch-*.whl)[kube]" \
 && /opt/dispatch/bin/pip uninstall --yes pip setuptools wheel build \
 && /opt/dispatch/bin/python -m compileall -q /opt/dispatch \
 && /opt/dispatch/bin/dispatch-operator --help > /dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="dispatch-operator" \
      org.opencontainers.image.description="Supervises training jobs on Kubeflow and Slurm (DispatchJob)" \
      org.opencontainers.image.licenses="Apache-2.0"
# The base image's own pip and setuptools are removed too: nothing can be installed at run time.
RUN python -m pip uninstall --yes pip setuptools wheel 2>/dev/null; \
    rm -rf /usr/local/lib/python3.11/ensurepip /root/.cache \
 && groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin nonroot
COPY --from=builder /opt/dispatch /opt/dispatch
ENV PATH=/opt/dispatch/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
WORKDIR /tmp
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["dispatch-operator"]
