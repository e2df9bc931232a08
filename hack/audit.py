#!/usr/bin/env python3
"""Scan the hashed locks (requirements/*.txt) for known vulnerabilities; part of `make verify`.

Two sources, tried in this order:

1. ``DISPATCH_VULN_DB=PATH``: an OSV database on disk, offline. PATH is a directory of OSV JSON
   files or a zip of them, e.g. the PyPI export of the OSV project (``PyPI/all.zip``), copied onto a
   machine that has no network. Each locked ``name==version`` is matched against the entries'
   affected versions and ``ECOSYSTEM`` ranges.
2. Otherwise ``pip-audit`` against PyPI's vulnerability data (the package index this project
   installs from, reached the same way pip reaches it). When the index cannot be reached the scan
   is **skipped** with a message that says so, and `make verify` goes on: no result is better than
   an old one passed off as current.

A vulnerability found fails the scan (exit 1) and names the package, the version, the advisory and
the fixed versions. ``DISPATCH_AUDIT_IGNORE=ID,ID`` accepts advisories that do not apply, each
one to be explained in docs/security.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lock import pins

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LOCKS = ("requirements/operator.txt", "requirements/dev.txt")
UNREACHABLE = (
    "ConnectionError",
    "ProxyError",
    "Max retries exceeded",
    "NameResolutionError",
    "ConnectTimeout",
)


def locked() -> dict[str, str]:
    out: dict[str, str] = {}
    for path in LOCKS:
        out.update(pins((REPO / path).read_text()))
    return out


def ignored() -> set[str]:
    return {i.strip() for i in os.environ.get("DISPATCH_AUDIT_IGNORE", "").split(",") if i.strip()}


def osv_entries(path: Path) -> Iterator[dict[str, Any]]:
    if path.is_dir():
        for f in sorted(path.rglob("*.json")):
            yield json.loads(f.read_text())
    else:
        with zipfile.ZipFile(path) as z:
            for name in sorted(z.namelist()):
                if name.endswith(".json"):
                    yield json.loads(z.read(name))


def _in_range(version: Version, events: list[dict[str, str]]) -> bool:
    """OSV's ECOSYSTEM range: introduced/fixed/last_affected events, in version order."""
    affected = False
    for event in sorted(events, key=lambda e: _version(next(iter(e.values())))):
        if "introduced" in event and version >= _version(event["introduced"]):
            affected = True
        elif _ends(version, event):
            affected = False
    return affected


def _ends(version: Version, event: dict[str, str]) -> bool:
    if "fixed" in event:
        return version >= _version(event["fixed"])
    return "last_affected" in event and version > _version(event["last_affected"])


def _version(text: str) -> Version:
    return Version(text)


def affects(entry: dict[str, Any], name: str, version: str) -> list[str] | None:
    """The fixed versions when ``entry`` affects ``name==version``, else None."""
    try:
        v = Version(version)
    except InvalidVersion:
        return None
    for affected in entry.get("affected", []):
        package = affected.get("package", {})
        if package.get("ecosystem") != "PyPI" or canonicalize_name(package.get("name", "")) != name:
            continue
        fixed = [e["fixed"] for r in affected.get("ranges", []) for e in r.get("events", []) if "fixed" in e]
        if version in affected.get("versions", []):
            return fixed
        for r in affected.get("ranges", []):
            if r.get("type") == "ECOSYSTEM":
                try:
                    hit = _in_range(v, r.get("events", []))
                except InvalidVersion:
                    continue
                if hit:
                    return fixed
    return None


def scan_offline(db: Path, versions: dict[str, str]) -> list[str]:
    found = []
    skip = ignored()
    for entry in osv_entries(db):
        ids = {entry.get("id", "?"), *entry.get("aliases", [])}
        if ids & skip or entry.get("withdrawn"):
            continue
        for name, version in versions.items():
            fixed = affects(entry, name, version)
            if fixed is not None:
                found.append(
                    f"{name}=={version}: {entry.get('id')} (fixed in {', '.join(fixed) or 'no release'})"
                )
    return sorted(found)


def scan_index() -> tuple[list[str], str | None]:
    """pip-audit over both locks; (findings, why it was skipped)."""
    found: list[str] = []
    for lock in LOCKS:
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "audit.json"
            cmd = [str(BIN / "pip-audit"), "--disable-pip", "--require-hashes", "-r", str(REPO / lock)]
            cmd += ["--vulnerability-service", "pypi", "--progress-spinner", "off", "-f", "json"]
            cmd += ["-o", str(report)]
            for vuln in sorted(ignored()):
                cmd += ["--ignore-vuln", vuln]
            run = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if any(s in run.stderr for s in UNREACHABLE):
                return [], "the package index's vulnerability data cannot be reached from here"
            if not report.exists():
                sys.exit(f"audit: pip-audit failed on {lock}:\n{run.stderr[-2000:]}")
            for dep in json.loads(report.read_text())["dependencies"]:
                for vuln in dep.get("vulns", []):
                    fixed = ", ".join(vuln.get("fix_versions", [])) or "no release"
                    found.append(f"{dep['name']}=={dep['version']}: {vuln['id']} (fixed in {fixed})")
    return sorted(set(found)), None


def main() -> int:
    versions = locked()
    db = os.environ.get("DISPATCH_VULN_DB")
    if db:
        found = scan_offline(Path(db), versions)
        source = f"the OSV database {db}"
    else:
        found, skipped = scan_index()
        if skipped is not None:
            print(
                f"audit: SKIPPED: {skipped}; no lock was scanned. To scan offline, set "
                "DISPATCH_VULN_DB to an OSV database of PyPI (a directory or zip of OSV JSON files).",
                file=sys.stderr,
            )
            return 0
        source = "the package index's vulnerability data (pip-audit)"
    for line in found:
        print(f"audit: {line}", file=sys.stderr)
    if found:
        print(f"audit: {len(found)} known vulnerabilities in the locks ({source})", file=sys.stderr)
        return 1
    print(f"audit: {len(versions)} locked packages, no known vulnerability ({source})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
