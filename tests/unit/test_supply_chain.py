"""The supply chain: the hashed locks agree with pyproject.toml, their SBOMs with them, the scan.

hack/lock.py --check and hack/audit.py run in `make verify`; these tests pin what they refuse.
"""

from __future__ import annotations

import copy
import importlib
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
# hack/ holds scripts, not a package: import them by path.
sys.path.insert(0, str(REPO / "hack"))
audit = importlib.import_module("audit")
lock = importlib.import_module("lock")


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_committed_locks_and_sboms_are_current(pyproject: dict[str, Any]) -> None:
    assert lock.check(pyproject) == []


def test_a_changed_requirement_makes_the_locks_stale(pyproject: dict[str, Any]) -> None:
    changed = copy.deepcopy(pyproject)
    changed["project"]["dependencies"] = [*changed["project"]["dependencies"], "rich>=13"]
    problems = lock.check(changed)
    assert any("requirements/dev.txt was not resolved from this pyproject.toml" in p for p in problems)
    assert any(
        "requirements/operator.txt: rich (pyproject.toml: rich>=13) is not in the lock" in p for p in problems
    )


def test_a_lower_bound_above_the_pin_is_refused(pyproject: dict[str, Any]) -> None:
    changed = copy.deepcopy(pyproject)
    changed["project"]["dependencies"] = [
        "pydantic>=999" if d.startswith("pydantic") else d for d in changed["project"]["dependencies"]
    ]
    assert any("does not satisfy pyproject.toml's pydantic>=999" in p for p in lock.check(changed))


def test_every_locked_package_has_hashes_and_the_image_lock_follows_dev() -> None:
    dev = lock.pins(lock.lock_path("dev").read_text())
    operator = lock.pins(lock.lock_path("operator").read_text())
    assert set(operator) < set(dev)
    assert {k: dev[k] for k in operator} == operator
    for name in ("setuptools", "wheel"):
        assert name in operator, "the image builds its wheel offline, with the locked build backend"
    for name in ("pytest", "mypy", "uv"):
        assert name not in operator, "the image holds no development tool"


def test_inputs_follow_self_referencing_extras(pyproject: dict[str, Any]) -> None:
    dev = lock.inputs(pyproject, ("dev",))
    assert any(r.startswith("kopf") for r in dev), "dev -> dispatch-jobs[cli,operator] -> operator"
    assert any(r.startswith("aiohttp") for r in dev), "... -> dispatch-jobs[kube]"
    assert not any(r.startswith("dispatch-jobs") for r in dev)


def test_sbom_is_reproducible_and_names_every_locked_package() -> None:
    bom = json.loads((REPO / "sbom" / "operator.cdx.json").read_text())
    assert bom["bomFormat"] == "CycloneDX"
    assert "serialNumber" not in bom
    assert "timestamp" not in bom["metadata"]
    names = {c["name"].lower().replace("_", "-") for c in bom["components"]}
    assert set(lock.pins(lock.lock_path("operator").read_text())) <= names


OSV: dict[str, Any] = {
    "id": "PYSEC-0-1",
    "affected": [
        {
            "package": {"ecosystem": "PyPI", "name": "PyYAML"},
            "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "5.1"}, {"fixed": "6.0.2"}]}],
        }
    ],
}


@pytest.mark.parametrize(
    ("version", "hit"), [("5.0", False), ("5.1", True), ("6.0.1", True), ("6.0.2", False), ("7", False)]
)
def test_offline_scan_matches_osv_ranges(version: str, hit: bool) -> None:
    assert (audit.affects(OSV, "pyyaml", version) is not None) is hit
    assert audit.affects(OSV, "pydantic", version) is None


def test_offline_scan_reads_a_database_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "PYSEC-0-1.json").write_text(json.dumps(OSV))
    found = audit.scan_offline(tmp_path, {"pyyaml": "6.0.1", "httpx": "0.28.1"})
    assert found == ["pyyaml==6.0.1: PYSEC-0-1 (fixed in 6.0.2)"]
    monkeypatch.setenv("DISPATCH_AUDIT_IGNORE", "PYSEC-0-1")
    assert audit.scan_offline(tmp_path, {"pyyaml": "6.0.1"}) == []


image_sbom = importlib.import_module("image_sbom")


def test_image_sbom_names_the_debian_packages_whose_files_the_image_holds(tmp_path: Path) -> None:
    base, image = tmp_path / "base", tmp_path / "image"
    info = base / "var/lib/dpkg/info"
    info.mkdir(parents=True)
    (base / "var/lib/dpkg/status").write_text(
        "Package: libc6\nStatus: install ok installed\nArchitecture: amd64\nVersion: 2.36-9\n\n"
        "Package: dpkg\nStatus: install ok installed\nArchitecture: amd64\nVersion: 1.21\n"
    )
    (info / "libc6:amd64.list").write_text("/usr\n/usr/lib\n/usr/lib/libc.so.6\n")
    (info / "dpkg.list").write_text("/usr\n/usr/bin\n/usr/bin/dpkg\n")
    for root in (base, image):
        (root / "usr/lib").mkdir(parents=True)
        (root / "usr/lib/libc.so.6").write_text("")
    (base / "usr/bin").mkdir()
    (base / "usr/bin/dpkg").write_text("")
    (image / "usr/bin").mkdir()  # a directory both share is no file of a package
    found = image_sbom.debian_components(image, base)
    assert [(c["name"], c["purl"]) for c in found] == [("libc6", "pkg:deb/debian/libc6@2.36-9?arch=amd64")]


def test_image_sbom_check_names_what_differs_from_the_lock() -> None:
    locked = lock.pins(lock.lock_path("operator").read_text())
    components = [
        {"name": n, "version": v, "purl": f"pkg:pypi/{n}@{v}"} for n, v in locked.items() if n != "httpx"
    ]
    components += [{"name": "dispatch-jobs", "version": "0.1.0", "purl": "pkg:pypi/dispatch-jobs@0.1.0"}]
    assert image_sbom.lock_differences(components) == [f"httpx: lock {locked['httpx']}, image absent"]
