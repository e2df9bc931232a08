"""No module imports a test module: what two suites share lives in ``tests/support/`` (or, for a
fixture, in a ``conftest.py``), so that running, moving or deleting one test module never changes
what another one tests, and pytest never collects one module's tests twice under two names.

Every Python file of the test tiers, the benches and the scripts is read with ``ast`` (nothing is
imported or run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECKED = ("tests", "e2e", "bench", "hack")


def is_test_module(dotted: str) -> bool:
    """``tests.unit.test_x``, ``.test_x``, ``test_x``: the last part names a test module."""
    return dotted.rpartition(".")[2].startswith("test_")


def imported_test_modules(source: str) -> list[str]:
    """The test modules that ``source`` imports, as written (relative ones with their dots)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if is_test_module(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if is_test_module(module):
                found.append(module)
            else:  # from tests.unit import test_x
                found += [f"{module}.{a.name}" for a in node.names if a.name.startswith("test_")]
    return found


def python_files() -> list[Path]:
    return sorted(p for top in CHECKED for p in (REPO / top).rglob("*.py") if ".venv" not in p.parts)


@pytest.mark.parametrize(
    "source",
    [
        "from tests.unit.test_decide import started",
        "from .test_decide import started",
        "import tests.integration.test_operator_ha",
        "import tests.integration.test_operator_ha as ha",
        "from tests.unit import test_decide",
        "from e2e.test_chart_e2e import start_operator",
        "def f():\n    from tests.unit.test_x import y\n",
    ],
)
def test_the_check_sees_every_form_of_such_an_import(source: str) -> None:
    assert imported_test_modules(source) != []


@pytest.mark.parametrize(
    "source",
    [
        "from tests.support.builders import manifest",
        "from tests.integration.conftest import apply",
        "import pytest",
        "from tests.support import testing_helpers",
    ],
)
def test_the_check_lets_shared_modules_be(source: str) -> None:
    assert imported_test_modules(source) == []


def test_no_module_imports_a_test_module() -> None:
    files = python_files()
    assert len(files) > 50, "the tree was not found"
    offenders = {
        str(path.relative_to(REPO)): imported
        for path in files
        if (imported := imported_test_modules(path.read_text()))
    }
    assert offenders == {}, "move what they share to tests/support/ or a conftest.py fixture"
