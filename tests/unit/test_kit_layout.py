"""The import contract that keeps the workload kit's parts acyclic fails on a cycle, not only passes.

The contract (``id = "acyclic"`` in pyproject.toml) is run by ``make imports`` on the real tree, where
it is kept; that alone cannot tell a contract that checks nothing from one that holds. So the test
runs it on a copy of the package, once as it is (kept) and once with one import added that makes
two of the kit's modules import each other (broken).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "dispatch"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONTRACT_ID = "acyclic"


def contract() -> dict[str, Any]:
    """The contract as pyproject.toml declares it."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    found: dict[str, Any] = next(c for c in config["contracts"] if c.get("id") == CONTRACT_ID)
    return found


def toml_value(value: Any) -> str:
    """A string, or a list of strings, as TOML (a JSON string is a TOML basic string)."""
    return json.dumps(value)


def lint(tmp_path: Path, *, cycle: bool) -> subprocess.CompletedProcess[str]:
    """lint-imports with only the acyclic contract, over a copy of ``dispatch`` in ``tmp_path``."""
    tree = tmp_path / ("cyclic" if cycle else "as-is")
    copy = tree / "dispatch"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    if cycle:
        # _kind reads masks from _mask; _mask importing _kind back is the cycle.
        assert "from ._mask import" in (copy / "_workload" / "_kind.py").read_text()
        with (copy / "_workload" / "_mask.py").open("a") as mask:
            mask.write("\nfrom . import _kind  # noqa: E402, F401\n")
    lines = ["[tool.importlinter]", 'root_packages = ["dispatch"]', "include_external_packages = true", ""]
    lines.append("[[tool.importlinter.contracts]]")
    lines += [f"{key} = {toml_value(value)}" for key, value in contract().items()]
    config = tree / "contract.toml"
    config.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(config)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_contract_names_the_kit() -> None:
    declared = contract()
    assert declared["type"] == "acyclic_siblings"
    assert any("dispatch._workload".startswith(a) for a in declared["ancestors"])


def test_the_contract_is_kept_on_the_package_as_it_is(tmp_path: Path) -> None:
    result = lint(tmp_path, cycle=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "KEPT" in result.stdout
    assert "BROKEN" not in result.stdout


def test_the_contract_is_broken_by_a_cycle_between_two_kit_modules(tmp_path: Path) -> None:
    result = lint(tmp_path, cycle=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout
    assert "dispatch._workload" in result.stdout
    assert "._mask -> ._kind" in result.stdout
