#!/usr/bin/env python3
"""A CycloneDX SBOM of a built operator image: what is in its file system, read from it.

    python hack/image_sbom.py IMAGE [--base BUILD_BASE] [-o FILE] [--check-lock]

- the Python distributions in ``/opt/dispatch`` (each ``*.dist-info``: name, version, licence);
- with ``--base``, the Debian packages the image holds files of: the build base's dpkg database
  (``/var/lib/dpkg``) is read, and a package counts when a file it installed is in the image (the
  runtime base made by hack/image-base.sh is a cut of the build base without dpkg's database).

``--check-lock`` fails when the Python distributions differ from requirements/operator.txt (the
build backend and the operator itself aside): the image must hold exactly what the lock says.
The output has no timestamp or serial number; the image's ID names it. Needs root (podman image
mount). `make image-sbom` runs it on $(IMAGE) with the bases `make image` used.
"""

from __future__ import annotations

import argparse
import contextlib
import email.parser
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack"))
from lock import pins  # noqa: E402  (hack/ holds scripts, not a package)

PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
SITE = "opt/dispatch/lib/python3.11/site-packages"
NOT_LOCKED = {"dispatch-jobs", "dispatch", "pip", "setuptools", "wheel"}
"""The operator itself, and the installers the Dockerfile removes after building its wheel."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@contextlib.contextmanager
def mounted(image: str) -> Iterator[Path]:
    path = subprocess.run([*PODMAN, "image", "mount", image], capture_output=True, text=True, check=True)
    try:
        yield Path(path.stdout.strip())
    finally:
        subprocess.run([*PODMAN, "image", "umount", image], capture_output=True, check=False)


def python_components(root: Path) -> list[dict[str, Any]]:
    out = []
    for info in sorted((root / SITE).glob("*.dist-info")):
        meta = email.parser.Parser().parsestr(
            (info / "METADATA").read_text(errors="replace"), headersonly=True
        )
        name, version = meta["Name"], meta["Version"]
        component: dict[str, Any] = {
            "type": "library",
            "bom-ref": f"pkg:pypi/{canonical(name)}@{version}",
            "name": name,
            "version": version,
            "purl": f"pkg:pypi/{canonical(name)}@{version}",
        }
        licence = meta.get("License-Expression") or ""
        if licence:
            component["licenses"] = [{"expression": licence}]
        out.append(component)
    return out


def debian_components(root: Path, base: Path) -> list[dict[str, Any]]:
    status = (base / "var/lib/dpkg/status").read_text()
    out = []
    for block in status.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", block, re.M))
        if "Package" not in fields or "installed" not in fields.get("Status", ""):
            continue
        pkg, arch = fields["Package"], fields.get("Architecture", "all")
        lists = [base / f"var/lib/dpkg/info/{pkg}.list", base / f"var/lib/dpkg/info/{pkg}:{arch}.list"]
        files = [line for f in lists if f.exists() for line in f.read_text().splitlines()]
        if not any((root / p.lstrip("/")).is_file() for p in files if not (base / p.lstrip("/")).is_dir()):
            continue
        version = fields["Version"]
        purl = f"pkg:deb/debian/{pkg}@{version}?arch={arch}"
        out.append({"type": "library", "bom-ref": purl, "name": pkg, "version": version, "purl": purl})
    return out


def image_id(image: str) -> str:
    return subprocess.run(
        [*PODMAN, "image", "inspect", "--format", "{{.Id}}", image],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def lock_differences(components: list[dict[str, Any]]) -> list[str]:
    locked = pins((REPO / "requirements" / "operator.txt").read_text())
    found = {canonical(c["name"]): c["version"] for c in components if c["purl"].startswith("pkg:pypi/")}
    problems = []
    for name in sorted((set(locked) | set(found)) - NOT_LOCKED):
        if locked.get(name) != found.get(name):
            problems.append(f"{name}: lock {locked.get(name, 'absent')}, image {found.get(name, 'absent')}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("image")
    ap.add_argument("--base", help="the build base image, whose dpkg database names the Debian packages")
    ap.add_argument("-o", "--output", type=Path, help="write here (default: stdout)")
    ap.add_argument("--check-lock", action="store_true", help="fail when the image differs from the lock")
    args = ap.parse_args()
    with mounted(args.image) as root:
        components = python_components(root)
        if args.base:
            with mounted(args.base) as base:
                components += debian_components(root, base)
    digest = image_id(args.image)
    name, _, tag = (
        args.image.rpartition(":") if ":" in args.image.rsplit("/", 1)[-1] else (args.image, "", "")
    )
    bom = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "version": 1,
        "metadata": {
            "component": {
                "type": "container",
                "bom-ref": f"sha256:{digest}",
                "name": name,
                "version": tag or digest,
                "hashes": [{"alg": "SHA-256", "content": digest}],
            },
            "tools": {"components": [{"type": "application", "name": "hack/image_sbom.py"}]},
        },
        "components": sorted(components, key=lambda c: (c["purl"].split("/")[0], c["name"].lower())),
    }
    text = json.dumps(bom, indent=2, sort_keys=True) + "\n"
    if args.output:
        args.output.write_text(text)
        print(f"image-sbom: {len(components)} components of {args.image} -> {args.output}")
    else:
        sys.stdout.write(text)
    if args.check_lock:
        problems = lock_differences(components)
        for problem in problems:
            print(f"image-sbom: {problem}", file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
