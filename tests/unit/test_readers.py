"""The readers that decode list pages and watch events into what the caches keep: the kit's
(``_kind.reader``: each object only as far as its shape reaches) and the record store's
(``read_dispatchjobs``: a DispatchJob without its managedFields). Whatever the JSON, what is kept of
each object must be exactly what the whole decode and the projection keep: every recorded object
and pod of every kind (from the lab, tests/unit/data/), and the same with values of other types
than the shapes expect.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch._backends.job._adapter import JOB
from dispatch._backends.jobset._adapter import JOBSET
from dispatch._backends.kubeflow._adapter import PYTORCHJOB
from dispatch._backends.trainjob._adapter import TRAINJOB
from dispatch._controller.store import read_dispatchjobs, view_of
from dispatch._workload import project_object, project_pod
from dispatch._workload._kept import POD, object_shape
from dispatch._workload._kind import Kind
from dispatch._workload._mask import reader
from tests.support.recorded import states

DATA = Path(__file__).parent / "data"
KINDS: dict[str, tuple[str, Kind]] = {
    "pytorchjobs": ("kubeflow", PYTORCHJOB),
    "jobsets.jobset.x-k8s.io": ("jobset", JOBSET),
    "trainjobs.trainer.kubeflow.org": ("trainjob", TRAINJOB),
    "jobs": ("job", JOB),
}


def page(items: list[dict[str, Any]]) -> bytes:
    return json.dumps(
        {"kind": "List", "metadata": {"resourceVersion": "7", "continue": "x"}, "items": items}
    ).encode()


def event(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode()


@pytest.mark.parametrize("resource", sorted(KINDS))
def test_every_recorded_object_is_kept_as_the_whole_decode_keeps_it(resource: str) -> None:
    directory, kind = KINDS[resource]
    shape = object_shape(kind)
    objects = states(DATA / directory, resource)
    assert objects, f"no recorded {resource}"
    read = reader(shape)
    listed = read(page(objects))
    assert listed["metadata"] == {"resourceVersion": "7", "continue": "x"}
    assert [project_object(shape, o) for o in listed["items"]] == [project_object(shape, o) for o in objects]
    for obj in objects:
        seen = read(event("MODIFIED", obj))
        assert seen["type"] == "MODIFIED"
        assert project_object(shape, seen["object"]) == project_object(shape, obj)


@pytest.mark.parametrize("directory", ["kubeflow", "jobset", "trainjob", "job"])
def test_every_recorded_pod_is_kept_as_the_whole_decode_keeps_it(directory: str) -> None:
    pods = states(DATA / directory, "pods")
    assert pods
    listed = reader(POD)(page(pods))
    assert [project_pod(p) for p in listed["items"]] == [project_pod(p) for p in pods]
    # and less is built: nothing of a pod's spec but its node
    assert all(set(p.get("spec", {})) <= {"nodeName"} for p in listed["items"])


def test_a_bookmark_keeps_what_ends_a_streamed_list_and_an_error_its_status() -> None:
    read = reader(POD)
    end = {"resourceVersion": "12", "annotations": {"k8s.io/initial-events-end": "true"}}
    assert read(event("BOOKMARK", {"kind": "Pod", "metadata": end})) == {
        "type": "BOOKMARK",
        "object": {"metadata": end},
    }
    status = {"kind": "Status", "status": "Failure", "reason": "Expired", "code": 410, "message": "too old"}
    assert read(event("ERROR", status)) == {"type": "ERROR", "object": status}  # read whole


ODD = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=2)
)
"""Values of other types than a shape expects where it names an object or a list."""


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_value_of_another_type_is_kept_as_the_whole_decode_keeps_it(data: st.DataObject) -> None:
    pods = states(DATA / "kubeflow", "pods")
    pod = json.loads(json.dumps(data.draw(st.sampled_from(pods))))
    path = data.draw(
        st.sampled_from(
            [
                ("status",),
                ("status", "conditions"),
                ("status", "containerStatuses"),
                ("metadata",),
                ("metadata", "labels"),
                ("spec",),
            ]
        )
    )
    where = pod
    for key in path[:-1]:
        where = where.setdefault(key, {})
    if isinstance(where, dict):
        where[path[-1]] = data.draw(ODD)
    listed = reader(POD)(page([pod, pods[0]]))
    assert [project_pod(p) for p in listed["items"]] == [project_pod(pod), project_pod(pods[0])]
    assert project_pod(reader(POD)(event("ADDED", pod))["object"]) == project_pod(pod)


def dispatchjob(cancel: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(
        (Path(__file__).parents[2] / "bench" / "data" / "dispatchjob.json").read_text()
    )
    managed = [
        {
            "manager": "kubectl",
            "operation": "Update",
            "time": "2026-12-01T10:00:00Z",
            "fieldsV1": {"f:spec": {}},
        },
        {"manager": "dispatch-operator", "operation": "Update", "subresource": "status", "fieldsV1": {}},
    ]
    body["metadata"]["managedFields"] = managed
    body["metadata"]["ownerReferences"] = [{"kind": "Team", "name": "a", "uid": "u", "apiVersion": "x/v1"}]
    if cancel:
        body["spec"]["cancel"] = True
        managed.append(
            {
                "manager": "kubectl",
                "operation": "Update",
                "time": "2026-12-01T11:00:00Z",
                "fieldsV1": {"f:spec": {"f:cancel": {}}},
            }
        )
    return body


@pytest.mark.parametrize("cancel", [False, True])
def test_a_dispatchjob_is_read_without_its_managed_fields_unless_cancelled(cancel: bool) -> None:
    body = dispatchjob(cancel)
    seen = read_dispatchjobs(event("ADDED", body))["object"]
    expected = json.loads(json.dumps(body))
    if not cancel:
        del expected["metadata"]["managedFields"]
    assert seen == expected
    a, b = view_of(seen), view_of(body)
    assert a.text is not None
    assert b.text is not None
    assert a.text.body() == b.text.body()
    assert replace(a, text=None) == replace(b, text=None)
    listed = read_dispatchjobs(page([body, body]))
    assert listed["items"] == [expected, expected]
    assert listed["metadata"]["resourceVersion"] == "7"


def test_a_dispatchjob_reader_keeps_an_error_and_a_bookmark() -> None:
    status = {"kind": "Status", "status": "Failure", "reason": "Expired", "code": 410, "message": "too old"}
    assert read_dispatchjobs(event("ERROR", status)) == {"type": "ERROR", "object": status}
    end = {"resourceVersion": "12", "annotations": {"k8s.io/initial-events-end": "true"}}
    assert read_dispatchjobs(event("BOOKMARK", {"kind": "DispatchJob", "metadata": end})) == {
        "type": "BOOKMARK",
        "object": {"kind": "DispatchJob", "metadata": end},
    }
    odd = {"metadata": "not an object", "spec": {}}
    assert read_dispatchjobs(event("ADDED", odd)) == {"type": "ADDED", "object": odd}  # read whole
