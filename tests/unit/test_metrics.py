"""Metrics: after the seed's preemption scenario the endpoint reports one recovery caused by
``preempted``, and every series is named and labelled as documented."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import dispatch
from dispatch._controller.metrics import Metrics, classify
from dispatch._decide import Authorize, Step
from dispatch._model import Record
from tests.support.observe import wait_for

JOB = "team-a/finetune"


def seed_spec() -> dispatch.JobSpec:
    return dispatch.JobSpec(
        name="finetune",
        command=("torchrun", "train.py"),
        nodes=2,
        recovery=dispatch.RecoveryPolicy(
            rules=(
                dispatch.Rule(on=(dispatch.CauseKind.PREEMPTED,), action=dispatch.Action.RESUBMIT, budget=2),
            )
        ),
    )


async def seed_scenario(metrics: Metrics) -> None:
    """The seed's tutorial under a supervisor whose listener is ``metrics``."""
    memory = dispatch.MemoryBackend(dispatch.Shape.SLURM, auto_run=True)
    store = dispatch.MemoryStore()
    cluster = dispatch.compose(memory, store=store)
    spec = seed_spec()
    plan = dispatch.make_plan(JOB, spec, memory.capabilities, supervised=True)
    ada = dispatch.Actor(kind=dispatch.ActorKind.HUMAN, id="ada")
    record = Record(
        job=JOB,
        spec=spec,
        plan=plan,
        submitted_by=ada,
        submitted_at=dispatch._supervisor.utcnow(),
        supervised=True,
    )
    await store.create(record)
    metrics.observe(record)
    supervisor = dispatch.Supervisor(metrics.observe_backend(memory), store, listener=metrics)
    done = asyncio.create_task(supervisor.run(JOB))
    status = await wait_for(cluster.observer, JOB, lambda s: s.state is dispatch.State.RUNNING)
    assert status.submissions[0].canonical is not None
    memory.env.preempt(status.submissions[0].canonical)
    status = await wait_for(
        cluster.observer, JOB, lambda s: s.state is dispatch.State.RUNNING and len(s.submissions) == 2
    )
    assert status.submissions[1].canonical is not None
    memory.env.complete(status.submissions[1].canonical)
    await done


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


async def test_seed_scenario_reports_one_recovery_caused_by_preempted() -> None:
    metrics = Metrics(version="1.2.3")
    await seed_scenario(metrics)
    server = metrics.serve(0, "127.0.0.1")
    try:
        samples = await asyncio.to_thread(scrape, f"http://127.0.0.1:{server.server_port}/metrics")
    finally:
        server.shutdown()
        server.server_close()
    recoveries = {k: v for k, v in samples.items() if k[0] == "dispatch_recoveries_total"}
    assert recoveries == {
        ("dispatch_recoveries_total", (("cause", "preempted"), ("enforcer", "supervisor"))): 1.0
    }
    assert samples[("dispatch_reaction_seconds_count", ())] == 1.0
    assert samples[("dispatch_jobs", (("state", "succeeded"),))] == 1.0
    for state in ("pending", "recovering", "failed", "cancelled"):
        assert samples[("dispatch_jobs", (("state", state),))] == 0.0
    assert ("dispatch_jobs", (("state", "running"),)) not in samples  # never recorded
    assert samples[("dispatch_build_info", (("version", "1.2.3"),))] == 1.0
    assert samples[("dispatch_record_conflicts_total", ())] == 0.0
    assert all(name.startswith("dispatch_") for name, _ in samples)


def test_reaction_is_from_failure_seen_to_authorization() -> None:
    now = [100.0]
    metrics = Metrics(clock=lambda: now[0])
    memory = dispatch.MemoryBackend(dispatch.Shape.SLURM)
    spec = seed_spec()
    plan = dispatch.make_plan(JOB, spec, memory.capabilities, supervised=True)
    ada = dispatch.Actor(kind=dispatch.ActorKind.HUMAN, id="ada")
    before = Record(
        job=JOB,
        spec=spec,
        plan=plan,
        submitted_by=ada,
        submitted_at=dispatch._supervisor.utcnow(),
        supervised=True,
    )
    metrics.failure_seen(JOB, 1)
    now[0] = 100.75
    metrics.failure_seen(JOB, 1)  # the first sighting counts
    cause = dispatch.Cause(kind=dispatch.CauseKind.PREEMPTED)
    step: Step = Authorize(2, 0, cause)
    metrics.stepped(JOB, step, before, before.model_copy(update={"state": dispatch.State.RECOVERING}))
    assert metrics.registry.get_sample_value("dispatch_reaction_seconds_sum") == pytest.approx(0.75)
    assert metrics.registry.get_sample_value("dispatch_reaction_seconds_bucket", {"le": "1.0"}) == 1.0
    assert metrics.registry.get_sample_value("dispatch_jobs", {"state": "recovering"}) == 1.0
    metrics.forget(JOB)
    assert metrics.registry.get_sample_value("dispatch_jobs", {"state": "recovering"}) == 0.0


def test_conflicts_and_errors() -> None:
    metrics = Metrics()
    metrics.conflicted(JOB)
    metrics.conflicted(JOB)
    metrics.errored(JOB, Authorize(1), RuntimeError("x"))
    assert metrics.registry.get_sample_value("dispatch_record_conflicts_total") == 2.0
    assert metrics.registry.get_sample_value("dispatch_supervisor_errors_total", {"step": "Authorize"}) == 1.0


def test_api_requests_have_bounded_labels() -> None:
    metrics = Metrics()
    metrics.api_request("PUT", "dispatchjobs/status", 409)
    metrics.api_request("update", "dispatchjobs/status", 200)
    metrics.api_request("get", "secrets-of-someone/with-a-uid-1234", 200)
    metrics.api_request("frobnicate", "pytorchjobs", None)
    metrics.api_request("list", "pods", 503)
    metrics.api_request("get", "pods", 403)
    value = metrics.registry.get_sample_value
    assert (
        value(
            "dispatch_api_requests_total", {"verb": "other", "resource": "dispatchjobs/status", "code": "409"}
        )
        == 1
    )
    assert (
        value(
            "dispatch_api_requests_total",
            {"verb": "update", "resource": "dispatchjobs/status", "code": "200"},
        )
        == 1
    )
    assert value("dispatch_api_requests_total", {"verb": "get", "resource": "other", "code": "200"}) == 1
    assert (
        value("dispatch_api_requests_total", {"verb": "other", "resource": "pytorchjobs", "code": "none"})
        == 1
    )
    assert value("dispatch_api_errors_total", {"verb": "other", "resource": "pytorchjobs"}) == 1
    assert value("dispatch_api_errors_total", {"verb": "list", "resource": "pods"}) == 1
    assert value("dispatch_api_errors_total", {"verb": "get", "resource": "pods"}) == 1
    assert value("dispatch_api_errors_total", {"verb": "other", "resource": "dispatchjobs/status"}) is None


async def test_api_call_context_manager() -> None:
    metrics = Metrics()

    class ApiError(Exception):
        status = 409

    async with metrics.api_call("patch", "dispatchjobs"):
        pass
    with pytest.raises(ApiError):
        async with metrics.api_call("patch", "dispatchjobs"):
            raise ApiError
    with pytest.raises(OSError, match="reset"):
        async with metrics.api_call("patch", "dispatchjobs"):
            raise OSError("reset")
    value = metrics.registry.get_sample_value
    assert (
        value("dispatch_api_requests_total", {"verb": "patch", "resource": "dispatchjobs", "code": "200"})
        == 1
    )
    assert (
        value("dispatch_api_requests_total", {"verb": "patch", "resource": "dispatchjobs", "code": "409"})
        == 1
    )
    assert (
        value("dispatch_api_requests_total", {"verb": "patch", "resource": "dispatchjobs", "code": "none"})
        == 1
    )


def test_each_metrics_has_its_own_registry() -> None:
    a, b = Metrics(), Metrics()
    a.conflicted("x")
    assert b.registry.get_sample_value("dispatch_record_conflicts_total") == 0.0


@pytest.mark.parametrize(
    ("method", "url", "query", "expected"),
    [
        (
            "GET",
            "https://h/apis/dispatch.dev/v1alpha1/namespaces/a/dispatchjobs/j",
            None,
            ("get", "dispatchjobs"),
        ),
        (
            "GET",
            "https://h/apis/dispatch.dev/v1alpha1/namespaces/a/dispatchjobs",
            [],
            ("list", "dispatchjobs"),
        ),
        (
            "GET",
            "https://h/apis/dispatch.dev/v1alpha1/dispatchjobs",
            [("watch", True), ("resourceVersion", "5")],
            ("watch", "dispatchjobs"),
        ),
        (
            "PUT",
            "https://h/apis/dispatch.dev/v1alpha1/namespaces/a/dispatchjobs/j/status",
            None,
            ("update", "dispatchjobs/status"),
        ),
        ("POST", "https://h/apis/events.k8s.io/v1/namespaces/a/events", None, ("create", "events")),
        ("PATCH", "https://h/api/v1/namespaces/a/pods/p", None, ("patch", "pods")),
        (
            "DELETE",
            "https://h/apis/kubeflow.org/v1/namespaces/a/pytorchjobs/x",
            None,
            ("delete", "pytorchjobs"),
        ),
        ("GET", "https://h/api/v1/namespaces/a", None, ("get", "namespaces")),
        ("GET", "https://h/version", None, ("list", "other")),
    ],
)
def test_classify(method: str, url: str, query: object, expected: tuple[str, str]) -> None:
    assert classify(method, url, query) == expected


async def test_instrument_counts_every_request_of_a_client() -> None:
    class Response:
        status = 201

    class Rest:
        async def request(self, method: str, url: str, **kwargs: object) -> Response:
            if url.endswith("/boom"):
                raise ConnectionResetError("reset")
            if url.endswith("/gone"):
                error = RuntimeError("not found")
                error.status = 404  # type: ignore[attr-defined]
                raise error
            return Response()

    class Api:
        rest_client = Rest()

    metrics = Metrics()
    api = metrics.instrument(Api())
    assert metrics.instrument(api) is api  # idempotent: no double counting
    await api.rest_client.request("POST", "https://h/apis/events.k8s.io/v1/namespaces/a/events", body={})
    with pytest.raises(ConnectionResetError):
        await api.rest_client.request("GET", "https://h/api/v1/namespaces/a/pods/boom")
    with pytest.raises(RuntimeError):
        await api.rest_client.request("GET", "https://h/api/v1/namespaces/a/pods/gone")
    value = metrics.registry.get_sample_value
    assert value("dispatch_api_requests_total", {"verb": "create", "resource": "events", "code": "201"}) == 1
    assert value("dispatch_api_requests_total", {"verb": "get", "resource": "pods", "code": "none"}) == 1
    assert value("dispatch_api_requests_total", {"verb": "get", "resource": "pods", "code": "404"}) == 1
    assert value("dispatch_api_errors_total", {"verb": "get", "resource": "pods"}) == 1


def test_the_endpoint_listens_on_loopback_unless_told_otherwise() -> None:
    """The answers carry no authentication: by default nothing beyond the host (the Pod) reads them."""
    server = Metrics().serve(0)
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        server.server_close()


def test_an_authorizer_decides_every_scrape_and_sees_its_header() -> None:
    """What the authorizer answers is what the scraper gets; only 200 carries the metrics."""
    seen: list[str | None] = []

    def authorize(header: str | None) -> int:
        seen.append(header)
        return {"Bearer good": 200, "Bearer other": 403}.get(header or "", 401)

    server = Metrics().serve(0, authorize=authorize)
    url = f"http://127.0.0.1:{server.server_port}/metrics"

    def get(header: str | None) -> tuple[int, str, str | None]:
        req = urllib.request.Request(url, headers={"Authorization": header} if header else {})
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                return response.status, response.read().decode(), None
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(), error.headers.get("WWW-Authenticate")

    try:
        assert get(None)[0::2] == (401, 'Bearer realm="dispatch-operator metrics"')
        code, body, _ = get("Bearer other")
        assert (code, "dispatch_" in body) == (403, False)
        code, body, _ = get("Bearer good")
        assert (code, "dispatch_build_info" in body) == (200, True)
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [None, "Bearer other", "Bearer good"]


def test_a_kubernetes_authorizer_refuses_a_request_without_a_bearer_token_unasked() -> None:
    from dispatch._controller.metrics_auth import UNAUTHENTICATED, KubernetesAuthorizer

    loop = asyncio.new_event_loop()
    try:
        authorizer = KubernetesAuthorizer(api=None, loop=loop)  # type: ignore[arg-type]  # never called
        assert authorizer(None) == UNAUTHENTICATED
        assert authorizer("Basic dXNlcjpwdw==") == UNAUTHENTICATED
        assert authorizer("Bearer ") == UNAUTHENTICATED
    finally:
        loop.close()
