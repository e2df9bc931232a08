"""Each use's extra declares every package its modules import (pyproject.toml), directly.

The import graph (grimp, which import-linter uses) gives the third-party packages each part of
dispatch imports, function-level imports included; the installed distributions say which
distribution each comes from. A package reached only through another one's dependencies (aiohttp
through kopf) is not declared, and a user installing just that extra would lack it.
e2e/test_wheel.py installs the built wheel with each extra into a fresh venv and runs it.
"""

from __future__ import annotations

import re
import sys
import tomllib
from functools import cache
from importlib import metadata
from pathlib import Path

import grimp
import pytest
from packaging.requirements import Requirement

from dispatch import _registry

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# What each part of dispatch is for, and the extra that use installs ("" is the base): every
# registered backend's adapter, the Kubernetes ones with `kube`.
USES: dict[str, tuple[str, str]] = {
    "the library (import dispatch)": ("dispatch", ""),
    **{
        f"the {b.name} backend": (
            f"dispatch._backends.{b.name}._adapter",
            "kube" if b.where is _registry.Where.KUBERNETES else "",
        )
        for b in _registry.registered().values()
    },
    "the kubectl plugin (kubectl-dispatch)": ("dispatch._cli.main", "cli"),
    "the operator (dispatch-operator)": ("dispatch._controller.__main__", "operator"),
}
SCRIPT_EXTRAS = {"kubectl-dispatch": "cli", "dispatch-operator": "operator"}
"""The extra each console script needs (docs/install.md says the same)."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(extra: str) -> set[str]:
    """The distributions the base and ``extra`` name, the extras they name in turn included."""
    own = _norm(PROJECT["name"])
    names: set[str] = set()
    todo, seen = [""] if not extra else ["", extra], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        reqs = PROJECT["dependencies"] if not current else PROJECT["optional-dependencies"][current]
        for text in reqs:
            req = Requirement(text)
            if _norm(req.name) == own:
                todo.extend(req.extras)
            else:
                names.add(_norm(req.name))
    return names


@cache
def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("dispatch", include_external_packages=True, cache_dir=None)


def imported(module: str) -> set[str]:
    """The distributions of the third-party packages ``module`` imports, directly or not."""
    graph = _graph()
    externals = {m for m in graph.find_upstream_modules(module) | {module} if "." not in m}
    dists = metadata.packages_distributions()
    found: set[str] = set()
    for top in externals - {"dispatch"}:
        if top in sys.stdlib_module_names or top == "__future__":
            continue
        assert top in dists, f"{module} imports {top}, which no installed distribution provides"
        found.update(_norm(d) for d in dists[top])
    return found


@pytest.mark.parametrize("use", list(USES))
def test_each_use_imports_only_what_its_extra_declares(use: str) -> None:
    module, extra = USES[use]
    missing = imported(module) - declared(extra)
    assert not missing, (
        f"{use} ({module}) imports {sorted(missing)}, which `pip install "
        f"'{PROJECT['name']}{f'[{extra}]' if extra else ''}'` does not install: declare it"
    )


def test_every_console_script_names_the_extra_it_needs() -> None:
    scripts = PROJECT["scripts"]
    assert set(scripts) == set(SCRIPT_EXTRAS), "a new console script: say which extra it needs here"
    for script, target in scripts.items():
        module = target.partition(":")[0]
        missing = imported(module) - declared(SCRIPT_EXTRAS[script])
        assert not missing, f"{script} ({module}) needs {sorted(missing)} beyond its extra"


def test_the_base_installs_no_kubernetes_client() -> None:
    """``import dispatch`` and the Slurm backend need neither aiohttp nor kopf: the base stays small."""
    assert not declared("") & {"aiohttp", "kopf", "msgspec", "prometheus-client", "cryptography"}


def test_the_distribution_is_not_named_like_the_unrelated_pypi_project() -> None:
    # `dispatch` on PyPI is someone else's (a publishing platform); the import name stays dispatch.
    assert _norm(PROJECT["name"]) == "dispatch-jobs"
    assert (ROOT / "operator" / "dispatch" / "__init__.py").exists()
