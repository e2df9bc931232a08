"""The README's library example is real code: it runs and ends the way the README says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_library_example_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    [example, *_] = re.findall(r"```python\n(.*?)```", readme, re.S)
    proc = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == [
        "rule 0 is enforced by the supervisor",
        "uncovered: [node-lost out-of-memory time-limit non-zero-exit launch-failed no-capacity"
        " requeued unknown]",
    ]
    assert "running none" in lines
    assert lines[-1] == "succeeded none"


def test_the_readme_starts_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = re.findall(r"```sh\n(.*?)```", readme, re.S)[0]
    assert [line.split("#")[0].strip() for line in first_block.splitlines()] == ["make demo", "make test"]
