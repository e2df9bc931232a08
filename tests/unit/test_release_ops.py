"""The release's JSON patch (dispatch._workload._release): its tests are the release's preconditions.

What the API server makes of it (a write after the read passes, a stop or a deletion since fails
with 422) is checked on the real one: tests/integration/test_kubeflow_adapter.py::
test_the_release_tests_what_it_must_not_undo_not_the_resource_version."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch._backends.job._kind import JOB
from dispatch._backends.kubeflow._kind import PYTORCHJOB
from dispatch._workload._kind import Kind
from dispatch._workload._release import pointer, release_ops

NOW = "2026-12-01T00:00:00+00:00"


def test_pointer_escapes_the_slash_and_the_tilde() -> None:
    assert (
        pointer("metadata", "annotations", "dispatch.dev/ended")
        == "/metadata/annotations/dispatch.dev~1ended"
    )
    assert pointer("a~b") == "/a~0b"


@pytest.mark.parametrize(
    ("kind", "suspend"),
    [(PYTORCHJOB, "/spec/runPolicy/suspend"), (JOB, "/spec/suspend")],
    ids=["pytorchjob", "batch-job"],
)
def test_the_release_tests_held_not_ended_not_deleting_then_unsuspends(kind: Kind, suspend: str) -> None:
    body: dict[str, Any] = {"metadata": {"annotations": {"dispatch.dev/spec": "x"}, "resourceVersion": "7"}}
    ops = release_ops(kind, body, NOW)
    assert ops == [
        {"op": "test", "path": "/metadata/deletionTimestamp", "value": None},
        {"op": "test", "path": "/metadata/annotations/dispatch.dev~1ended", "value": None},
        {"op": "add", "path": "/metadata/annotations/dispatch.dev~1released", "value": NOW},
        {"op": "test", "path": suspend, "value": True},
        {"op": "replace", "path": suspend, "value": False},
    ]
    assert "resourceVersion" not in str(ops)  # a status write since the read does not fail it


def test_without_annotations_the_map_is_added_only_if_still_absent() -> None:
    ops = release_ops(PYTORCHJOB, {"metadata": {}}, NOW)
    assert ops[1:3] == [
        {"op": "test", "path": "/metadata/annotations", "value": None},
        {"op": "add", "path": "/metadata/annotations", "value": {"dispatch.dev/released": NOW}},
    ]
