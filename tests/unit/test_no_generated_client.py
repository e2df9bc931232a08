"""The operator, its client and the Kubernetes adapters never load kubernetes_asyncio:
importing its thousand generated model modules was ~35 MiB of the operator's RSS. Each check runs
in a fresh interpreter, as the operator starts, so nothing this test process imported counts."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

GENERATED = "kubernetes_asyncio"


def loaded(code: str) -> object:
    """What ``sys.modules`` holds under kubernetes_asyncio after ``code`` ran in a new interpreter:
    ``"absent"``, ``"blocked"`` (None: an import of it fails) or ``"loaded"``."""
    probe = (
        f"{code}\nimport sys, json\n"
        f"m = sys.modules.get({GENERATED!r}, 'absent')\n"
        "print(json.dumps(m if m == 'absent' else 'blocked' if m is None else 'loaded'))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "modules",
    [
        "dispatch",
        "dispatch._kubeclient",
        "dispatch._controller.store, dispatch._controller.leader, dispatch._controller.events",
        "dispatch._backends.kubeflow._adapter, dispatch._backends.job._adapter, "
        "dispatch._backends.jobset._adapter, dispatch._backends.trainjob._adapter, dispatch._workload",
        "dispatch._cli.main",
    ],
)
def test_dispatch_and_the_adapters_do_not_import_it(modules: str) -> None:
    assert loaded(f"import {modules}") == "absent"


def test_the_operator_entry_point_keeps_kopf_from_importing_it() -> None:
    # As `python -m dispatch._controller` and the dispatch-operator console script start: kopf is
    # imported (by dispatch._controller.main) and would import it for its isinstance checks.
    started = (
        "import runpy, sys\n"
        "sys.argv = ['dispatch-operator', '--help']\n"
        "try:\n"
        "    runpy.run_module('dispatch._controller', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "import kopf, dispatch._controller.main\n"
    )
    assert loaded(started) == "blocked"
    assert loaded("from dispatch._controller.__main__ import main\nimport kopf") == "blocked"


def test_the_image_does_not_install_it() -> None:
    # The image installs the kube and operator extras (Dockerfile): 27 MB of byte code nothing
    # would import.
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    installed = extras["kube"] + extras["operator"]
    assert [r for r in installed if r.lower().replace("-", "_").startswith(GENERATED)] == []
