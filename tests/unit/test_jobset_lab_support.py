"""The lab's extras: which extras a lab starts, and who holds Trainer's machine-global cert dir.

Trainer v2 reads its serving cert from a hard-coded path, so the lab takes that directory for one
Trainer at a time (tests/support/lab.py): a holder is alive while a PID its owner file names runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.lab import LabError, cert_dir_holder, expand_extras


@pytest.mark.parametrize(
    ("asked", "started"),
    [
        ((), ()),
        (("jobset",), ("jobset",)),
        (("trainer",), ("jobset", "trainer")),
        (("trainer", "jobset", "trainer"), ("jobset", "trainer")),
        (("kueue", "trainer"), ("jobset", "trainer", "kueue")),
    ],
)
def test_trainer_brings_jobset_and_the_order_is_fixed(
    asked: tuple[str, ...], started: tuple[str, ...]
) -> None:
    assert expand_extras(asked) == started


def test_an_unknown_extra_is_named() -> None:
    with pytest.raises(LabError, match=r"\['volcano'\]"):
        expand_extras(("jobset", "volcano"))


def _owner(tmp_path: Path, pids: list[dict[str, object]]) -> Path:
    owner = tmp_path / "k8s-webhook-server" / "owner.json"
    owner.parent.mkdir()
    owner.write_text(json.dumps({"lab": "/some/lab", "pids": pids}))
    return owner


def test_a_live_holder_holds_it(tmp_path: Path) -> None:
    assert cert_dir_holder(_owner(tmp_path, [{"pid": os.getpid(), "binary": ""}])) == "/some/lab"


def test_a_holder_whose_processes_are_gone_is_stale(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = int(done.stdout)
    assert cert_dir_holder(_owner(tmp_path, [{"pid": dead, "binary": ""}])) is None


def test_a_pid_running_another_binary_is_not_the_trainer(tmp_path: Path) -> None:
    """PID reuse: the recorded Trainer PID now runs something else (this test's interpreter)."""
    owner = _owner(tmp_path, [{"pid": os.getpid(), "binary": "/no/such/trainer-controller-manager"}])
    assert cert_dir_holder(owner) is None


def test_a_dir_without_owner_yet_is_held_only_briefly(tmp_path: Path) -> None:
    root = tmp_path / "k8s-webhook-server"
    root.mkdir()
    assert cert_dir_holder(root / "owner.json") == "(a lab starting)"
    os.utime(root, (0, 0))
    assert cert_dir_holder(root / "owner.json") is None
