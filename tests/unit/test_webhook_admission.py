"""The validating webhook refuses at apply what is known to fail later: a backend the operator
serving the namespace does not run, a DispatchJob or an object too large to store."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from dispatch import JobSpec, Plan
from dispatch._backends.kubeflow._adapter import KubeflowBackend
from dispatch._controller.webhook import MAX_OBJECT_BYTES, MAX_REVIEW_BYTES, Admission, Refused, check
from dispatch._protocols import Previewing
from tests.support.builders import dispatch_job


def body(env: Mapping[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    options = {"image": "trainer:1", "env": dict(env or {})}
    return dispatch_job("big", namespace="team-a", backend_options=options, **spec)


def size(obj: Mapping[str, Any]) -> int:
    return len(json.dumps(obj, separators=(",", ":")).encode())


def test_a_backend_the_operator_does_not_serve_is_refused_naming_the_field() -> None:
    admission = Admission(served=frozenset({"job", "jobset"}))
    with pytest.raises(
        Refused, match=r"^spec\.backend: 'kubeflow' is not served .* \(it serves job, jobset\)"
    ):
        check(body(), None, "CREATE", admission)
    check(body(), None, "CREATE", Admission(served=frozenset({"kubeflow"})))
    check(body(), None, "CREATE", Admission())  # a webhook without an operator admits every backend


def test_a_new_job_over_the_operators_bound_is_refused_naming_it() -> None:
    held = [2]
    admission = Admission(max_jobs=3, held=lambda: held[0])
    check(body(), None, "CREATE", admission)
    held[0] = 3
    with pytest.raises(Refused, match=r"holds 3 DispatchJobs.*--max-jobs 3.*maxJobs"):
        check(body(), None, "CREATE", admission)
    # A person's ask on a job already held is an UPDATE: never refused for the bound.
    asked = dict(body(), spec={**body()["spec"], "cancel": True})
    check(asked, body(), "UPDATE", admission)
    check(body(), None, "CREATE", Admission(held=lambda: 10**6))  # no bound by default


def test_a_dispatchjob_over_half_the_object_limit_is_refused_with_its_size() -> None:
    big = body({"BLOB": "x" * 30_000})
    limit = 2 * size(big) - 2
    with pytest.raises(Refused, match=rf"^the DispatchJob is {size(big)} bytes: over {limit // 2}"):
        check(big, None, "CREATE", Admission(max_object_bytes=limit))
    check(big, None, "CREATE", Admission(max_object_bytes=limit + 4))


def test_an_object_over_the_api_servers_limit_is_refused_with_its_size() -> None:
    # The PyTorchJob copies the pod template into each replica: twice the DispatchJob's env.
    big = body({"BLOB": "x" * 30_000}, nodes=2)
    backend = KubeflowBackend(None)  # type: ignore[arg-type]  # builds only: no request
    assert isinstance(backend, Previewing)
    admission = Admission(served=frozenset({"kubeflow"}), preview=lambda name: backend)
    check(big, None, "CREATE", admission)
    spec_plan: list[tuple[JobSpec, Plan]] = []

    class Spy:
        def preview(self, job: str, spec: JobSpec, plan: Plan) -> Mapping[str, object]:
            spec_plan.append((spec, plan))
            return backend.preview(job, spec, plan)

    check(big, None, "CREATE", Admission(preview=lambda name: Spy()))
    ((spec, plan),) = spec_plan
    workload = backend.preview("team-a/big", spec, plan)
    assert workload["kind"] == "PyTorchJob"
    limit = size(workload) - 1
    assert size(big) <= limit // 2  # only the object is too large
    with pytest.raises(
        Refused, match=rf"^its PyTorchJob would be {size(workload)} bytes, over .* \({limit}\)"
    ):
        check(big, None, "CREATE", Admission(preview=lambda name: backend, max_object_bytes=limit))


def test_the_server_reads_the_review_of_an_update_of_the_largest_object() -> None:
    # An UPDATE's review holds the object twice; the API server takes request bodies up to 3 MiB.
    assert MAX_REVIEW_BYTES >= 2 * MAX_OBJECT_BYTES + 1024 * 1024


def test_kopf_still_serves_each_review_through_the_method_the_server_overrides() -> None:
    # The larger limit rides on kopf's WebhookServer._serve: a kopf that renames it would bring
    # back aiohttp's 1 MiB, so this fails first.
    import kopf

    from dispatch._controller.webhook import options, server

    assert isinstance(vars(kopf.WebhookServer)["_serve"], staticmethod)
    assert type(server(options(8443, addr="127.0.0.1")))._serve is not kopf.WebhookServer._serve
