"""Every import-linter contract in pyproject.toml holds, and fails when the import it forbids appears.

Each contract is checked on a copy of the package, once as it is (kept) and once with one import
added that breaks it (broken): a contract that a mutation cannot break would be a check that cannot
fail. A contract added to pyproject.toml without a mutation here fails
:func:`test_every_contract_has_a_mutation`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

MUTATIONS: Mapping[str, tuple[str, str]] = {
    # contract name (a prefix of it) -> (file under operator/dispatch, the line appended to it)
    "Layers:": ("_decide.py", "from . import _supervisor"),
    "The core and the embedded default": ("_decide.py", "import httpx"),
    "Each backend's declaration": ("_backends/job/__init__.py", "import httpx"),
    "Backends do not import each other": ("_backends/job/_kind.py", "from ..slurm import SLURM"),
    "import dispatch (the root package itself)": ("__init__.py", "import kopf"),
    "Nothing in dispatch imports kubernetes_asyncio": ("_cli/main.py", "import kubernetes_asyncio"),
    "The controller and the plugin never import the memory": (
        "_cli/main.py",
        "from .._backends.memory import _adapter",
    ),
    "The controller and the kubectl plugin do not import": ("_cli/main.py", "from .. import _controller"),
    "No import cycles among sibling modules": ("_workload/_mask.py", "from . import _kind"),
    "A package's private modules": ("_cli/main.py", "from .._kubeclient import _transport"),
}


def contracts() -> list[dict[str, object]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    found: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return found


def mutation_of(name: str) -> tuple[str, str] | None:
    return next((m for prefix, m in MUTATIONS.items() if name.startswith(prefix)), None)


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, Sequence):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def lint(root: Path, *checked: Mapping[str, object]) -> str:
    """import-linter's report on the ``checked`` contracts, over the package copy under ``root``."""
    lines = ["[tool.importlinter]", 'root_packages = ["dispatch"]', "include_external_packages = true"]
    for contract in checked:
        lines += ["", "[[tool.importlinter.contracts]]"]
        lines += [f"{key} = {toml_value(value)}" for key, value in contract.items()]
    config = root / "contracts.toml"
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(config)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("contracts")
    shutil.copytree(
        REPO / "operator" / "dispatch", root / "dispatch", ignore=shutil.ignore_patterns("__pycache__")
    )
    return root


def test_every_contract_has_a_mutation() -> None:
    missing = [str(c["name"]) for c in contracts() if mutation_of(str(c["name"])) is None]
    assert missing == [], f"add a breaking import to MUTATIONS for: {missing}"


def test_the_copy_keeps_every_contract(package_copy: Path) -> None:
    every = contracts()
    report = lint(package_copy, *every)
    assert f"{len(every)} kept, 0 broken" in report, report


@pytest.mark.parametrize("contract", contracts(), ids=lambda c: str(c["name"])[:48])
def test_contract_fails_when_broken(contract: dict[str, object], package_copy: Path) -> None:
    mutation = mutation_of(str(contract["name"]))
    assert mutation is not None
    relative, line = mutation
    target = package_copy / "dispatch" / relative
    original = target.read_text(encoding="utf-8")
    target.write_text(original + f"\n{line}  # noqa\n", encoding="utf-8")
    try:
        broken = lint(package_copy, contract)
    finally:
        target.write_text(original, encoding="utf-8")
    assert "0 kept, 1 broken" in broken, broken
