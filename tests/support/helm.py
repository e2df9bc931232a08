"""Where the tests find helm: the one the Makefile built, else the build cache, else PATH; and what
a test does when a tool it needs is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@cache
def helm_binary() -> str | None:
    """helm from DISPATCH_HELM, then the build cache (hack/build-bins.sh), then PATH."""
    env = os.environ.get("DISPATCH_HELM")
    if env and os.access(env, os.X_OK):
        return env
    script = REPO / "hack" / "build-bins.sh"
    if script.exists():
        out = subprocess.run(
            ["bash", str(script), "--print-env"], capture_output=True, text=True, check=False
        ).stdout
        for line in out.splitlines():
            key, _, value = line.partition("=")
            if key == "DISPATCH_HELM" and os.access(value, os.X_OK):
                return value
    return shutil.which("helm")


def required(found: str | None, what: str, require_env: str, how: str) -> str:
    """``found``, else fail when ``require_env`` is ``1`` (a make target that needs the tool) or
    skip (a tier that runs it when it is there); ``how`` says how to get it."""
    if found is not None:
        return found
    message = f"{what} not found: {how}"
    if os.environ.get(require_env) == "1":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)
