"""The GitOps tools' own verdicts on DispatchJobs: Flux's kstatus and Argo CD's Lua health check.

Both are small Go programs in hack/gitops, built by `make gitops-tools` (mk/image.mk) into
``$DISPATCH_CACHE/bin/<tool>-<version>/`` where the version is a hash of their sources (computed
here the same way, so a stale binary is never used): ``kstatus-verdict`` calls
``sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute`` (what Flux's health checks use) and
``argocd-health`` runs the Lua script in gopher-lua the way Argo CD's controller does.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = REPO / "hack" / "gitops"
ARGOCD_SCRIPT = REPO / "docs" / "argocd" / "dispatchjob-health.lua"
ENV = {"kstatus-verdict": "KSTATUS_BIN", "argocd-health": "ARGOCD_HEALTH_BIN"}


def version() -> str:
    """The hash mk/image.mk keys the binaries by (sorted go.mod, go.sum and *.go files)."""
    files = sorted(
        str(p.relative_to(REPO))
        for p in SOURCES.rglob("*")
        if p.is_file() and (p.suffix == ".go" or p.name in ("go.mod", "go.sum"))
    )
    return hashlib.sha256(b"".join((REPO / f).read_bytes() for f in files)).hexdigest()[:12]


def binary(tool: str) -> Path:
    """The built tool; fails (never skips) with the command that builds it."""
    given = os.environ.get(ENV[tool])
    cache = Path(os.environ.get("DISPATCH_CACHE") or Path.home() / ".cache" / "dispatch")
    path = Path(given) if given else cache / "bin" / f"{tool}-{version()}" / tool
    if not path.is_file():
        pytest.fail(f"{path} not found: run `make gitops-tools`", pytrace=False)
    return path


def _run(argv: Sequence[str], objects: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    proc = subprocess.run(
        list(argv), input=json.dumps(list(objects)), capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode != 0:
        raise AssertionError(f"{argv[0]} exited {proc.returncode}: {proc.stderr.strip()}")
    out: list[dict[str, Any]] = json.loads(proc.stdout)
    assert len(out) == len(objects)
    return out


def kstatus(objects: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """kstatus' {status, message} for each object (InProgress, Failed, Current, Terminating...)."""
    return _run([str(binary("kstatus-verdict"))], objects)


def argocd(objects: Sequence[Mapping[str, Any]], script: Path = ARGOCD_SCRIPT) -> list[dict[str, Any]]:
    """Argo CD's {status, message} for each object, by the health script in gopher-lua."""
    return _run([str(binary("argocd-health")), str(script)], objects)
