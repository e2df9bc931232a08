"""Prometheus metrics of the operator, in a registry of their own (``prometheus-client``).

=====================================================  =======================================================
``dispatch_jobs{state}``                               jobs by recorded state (pending, recovering, succeeded,
                                                       failed, cancelled; ``running`` is never recorded)
``dispatch_recoveries_total{cause,enforcer}``          rule firings: a new submission authorized by the
                                                       supervisor, or in-place restarts by the scheduler
``dispatch_reaction_seconds``                          histogram: failure of a canonical object first seen ->
                                                       the next submission authorized
``dispatch_recovery_seconds{cause,backend,namespace}`` histogram: a failure's recorded end -> the next
                                                       submission running (once per recovery)
``dispatch_failed_node_seconds_total{cause,...}``      nodes x the time each failed submission ran
``dispatch_failed_gpu_seconds_total{cause,...}``       the same times the GPUs per node
``dispatch_record_conflicts_total``                    record writes that lost their compare-and-swap
``dispatch_supervisor_errors_total{step}``             steps that raised (a backend call or a write failed)
``dispatch_api_requests_total{verb,resource,code}``    Kubernetes API requests by answer (``code`` is the HTTP
                                                       status, ``none`` when there was no answer)
``dispatch_api_errors_total{verb,resource}``           requests with no answer, 401, 403, 429 or 5xx
``dispatch_events_dropped_total{reason}``              Events not posted (too many pending, or the API refused
                                                       or never answered); the record and conditions still
                                                       hold the transition's reason
``dispatch_startup_jobs``                              jobs the first DispatchJob list after start held
``dispatch_startup_decided_seconds``                   start -> every one of them decided once (planned,
                                                       refused, waiting or settled); unset until then
``dispatch_write_limit_qps``                           the client-side limit on writes per second
                                                       (``--write-qps``, ``auto`` resolved at start); 0: none
``dispatch_build_info{version}``                       always 1
=====================================================  =======================================================

Every label has a bounded set of values: states, causes, enforcers and step names are enums; verbs
and resources outside the known sets are counted as ``other``; codes are HTTP statuses; backends
are the configured ones and namespaces the cluster's.

What recovery cost (:mod:`dispatch._cost`) is counted by :meth:`Metrics.costs`, which the
supervision loop calls with each decision's record and objects: each failure's node- and
GPU-seconds once its end is recorded, its time to recover once the next submission runs, each
once per process. A job's first sight in a process counts nothing of what it shows already: the
process before it counted that (its counters restart from zero with the process, as Prometheus
expects), so a restart or a new leader never counts a recovery twice; what completed while no
process supervised is not counted at all (the job's ``status.cost`` has it).

:class:`Metrics` is a supervisor :class:`~dispatch._supervisor.Listener`. The reaction time needs to
know when the failure was *seen*: wrap the backend with :meth:`Metrics.observe_backend` (it notes the
first time a listing shows an object ended by a failure), or call :meth:`Metrics.failure_seen`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from socketserver import ThreadingMixIn
from typing import Any, Final
from urllib.parse import urlsplit
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from .. import _registry
from .._cost import failures
from .._decide import Authorize, RecordRestarts, Step
from .._kubeclient import is_watch
from .._model import (
    FAILURE_CAUSES,
    Capabilities,
    CauseKind,
    Enforcer,
    JobSpec,
    ObjectView,
    Phase,
    Plan,
    Record,
    State,
)
from .._protocols import Backend, SelfWaking, Unsubscribe, Wake
from .._version import __version__
from .events import EVENT_REASONS

RECORDED_STATES: Final = tuple(s for s in State if s not in (State.RUNNING, State.CANCELLING))  # status-only
VERBS: Final = frozenset({"get", "list", "watch", "create", "update", "patch", "delete"})
OPERATOR_RESOURCES: Final = frozenset(
    {
        "dispatchjobs",
        "dispatchjobs/status",
        "events",
        "leases",
        "customresourcedefinitions",
        "validatingwebhookconfigurations",
        "mutatingwebhookconfigurations",
    }
)
"""What the operator itself requests; each backend adds the resources its registry entry names."""
RESOURCES: Final = OPERATOR_RESOURCES | {
    r for b in _registry.registered().values() for r in b.metric_resources
}
"""The resource label's values: a bounded set, so an unexpected path cannot grow the series."""
REACTION_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
RECOVERY_BUCKETS: Final = (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0)
"""A recovery takes a backoff, a place in the queue, an image pull: seconds to hours."""
COST_LABELS: Final = ("cause", "backend", "namespace")
_NOTHING_COUNTED: Final = (0, 0)
STEPS: Final = frozenset(
    {"Authorize", "Create", "RecordCanonical", "Release", "End", "RecordRestarts", "RecordOutcome"}
    | {"RecordSettled"}
    | {"RecordEnd", "RecordStop"}
)


def classify(method: str, url: str, query: Any = None) -> tuple[str, str]:
    """(verb, resource) of a Kubernetes API request, as in the audit log: ``get``/``list``/``watch``...

    ``resource`` is the plural, with ``/subresource`` when there is one (``dispatchjobs/status``).
    """
    path = urlsplit(url).path.strip("/").split("/")
    rest: list[str] = []
    if len(path) >= 2 and path[0] == "api":
        rest = path[2:]
    elif len(path) >= 3 and path[0] == "apis":
        rest = path[3:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]  # a namespaced resource
    resource = rest[0] if rest else "other"
    named = len(rest) >= 2
    if len(rest) >= 3:
        resource = f"{rest[0]}/{rest[2]}"
    pairs = query.items() if isinstance(query, dict) else (query or ())
    watching = is_watch(pairs) or "watch=true" in url
    method = method.upper()
    if method == "GET":
        verb = "watch" if watching else "get" if named else "list"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, "other")
    return verb, resource


def _api_error(code: int | None) -> bool:
    return code is None or code in (401, 403, 429) or code >= 500


class Metrics:
    """The operator's metrics and a Listener that keeps them. Thread-safe enough for one event loop."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        version: str = __version__,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._clock = clock
        self._lock = threading.Lock()
        self._states: dict[str, State] = {}
        self._seen: dict[tuple[str, int], float] = {}
        """(job, submission) -> when its canonical object was first seen ended by a failure."""
        r = self.registry
        self.jobs = Gauge("dispatch_jobs", "Jobs by recorded state.", ["state"], registry=r)
        self.recoveries = Counter(
            "dispatch_recoveries",
            "Recovery rule firings by the cause that ended the execution and who enforced the rule.",
            ["cause", "enforcer"],
            registry=r,
        )
        self.reaction = Histogram(
            "dispatch_reaction_seconds",
            "From the failure of a canonical object first seen to the next submission authorized.",
            buckets=REACTION_BUCKETS,
            registry=r,
        )
        self.recovery_time = Histogram(
            "dispatch_recovery_seconds",
            "From a failure's recorded end to the next submission running.",
            COST_LABELS,
            buckets=RECOVERY_BUCKETS,
            registry=r,
        )
        self.failed_node_seconds = Counter(
            "dispatch_failed_node_seconds",
            "Nodes times the time each submission that ended with a failure ran.",
            COST_LABELS,
            registry=r,
        )
        self.failed_gpu_seconds = Counter(
            "dispatch_failed_gpu_seconds",
            "GPUs times the time each submission that ended with a failure ran.",
            COST_LABELS,
            registry=r,
        )
        self._costed: dict[str, tuple[int, int]] = {}
        """job -> (the last submission whose failure's seconds were counted, the last whose
        recovery was), from the job's first sight in this process."""
        self.conflicts = Counter(
            "dispatch_record_conflicts", "Record writes that lost their compare-and-swap.", registry=r
        )
        self.step_errors = Counter(
            "dispatch_supervisor_errors", "Supervisor steps that raised, by step.", ["step"], registry=r
        )
        self.api_requests = Counter(
            "dispatch_api_requests",
            "Kubernetes API requests by verb, resource and HTTP status ('none': no answer).",
            ["verb", "resource", "code"],
            registry=r,
        )
        self.api_errors = Counter(
            "dispatch_api_errors",
            "Kubernetes API requests that got no answer, 401, 403, 429 or a 5xx.",
            ["verb", "resource"],
            registry=r,
        )
        self.events_dropped = Counter(
            "dispatch_events_dropped",
            "Events not posted (too many pending, or the API refused them), by reason.",
            ["reason"],
            registry=r,
        )
        self.startup_jobs = Gauge(
            "dispatch_startup_jobs", "Jobs the first DispatchJob list after start held.", registry=r
        )
        self.startup_decided = Gauge(
            "dispatch_startup_decided_seconds",
            "Seconds from the supervision loop's start until every job of its first list was decided once.",
            registry=r,
        )
        self.write_limit = Gauge(
            "dispatch_write_limit_qps",
            "The client-side limit on the operator's API writes per second; 0: none.",
            registry=r,
        )
        self.build_info = Gauge("dispatch_build_info", "Build information.", ["version"], registry=r)
        self.build_info.labels(version=version).set(1)
        for state in RECORDED_STATES:
            self.jobs.labels(state=state.value).set(0)

    # ------------------------------------------------------------------ jobs by state

    def observe(self, record: Record) -> None:
        """Count ``record``'s job in its recorded state (call on startup and whenever a record is read)."""
        self.observe_state(record.job, record.state)

    def observe_state(self, job: str, state: State) -> None:
        """Count ``job`` in its recorded ``state``, read without its record (a settled job's view)."""
        with self._lock:
            self._set_state(job, state)

    def forget(self, job: str) -> None:
        """The job's DispatchJob is gone: stop counting it."""
        with self._lock:
            state = self._states.pop(job, None)
            if state is not None:
                self.jobs.labels(state=state.value).dec()
            for key in [k for k in self._seen if k[0] == job]:
                del self._seen[key]
            self._costed.pop(job, None)

    def _set_state(self, job: str, state: State) -> None:
        old = self._states.get(job)
        if old is state:
            return
        if old is not None:
            self.jobs.labels(state=old.value).dec()
        self._states[job] = state
        self.jobs.labels(state=state.value).inc()

    # ------------------------------------------------------------------ Listener

    def stepped(self, job: str, step: Step, before: Record, after: Record | None) -> None:
        now = self._clock()
        with self._lock:
            self._set_state(job, (after or before).state)
            if isinstance(step, Authorize) and step.rule is not None:
                cause = step.cause.kind if step.cause is not None else CauseKind.UNKNOWN
                enforcer = before.plan.rules[step.rule].enforcer
                self.recoveries.labels(cause=cause.value, enforcer=enforcer.value).inc()
                seen = self._seen.pop((job, step.submission - 1), None)
                if seen is not None:
                    self.reaction.observe(max(now - seen, 0.0))
            elif isinstance(step, RecordRestarts):
                i = step.submission - 1
                more = step.restarts - before.submissions[i].restarts
                if more > 0:
                    # The scheduler does not say which cause it restarted on.
                    self.recoveries.labels(
                        cause=CauseKind.UNKNOWN.value, enforcer=Enforcer.SCHEDULER.value
                    ).inc(more)
            if after is not None and after.settled:
                for key in [k for k in self._seen if k[0] == job]:
                    del self._seen[key]

    def conflicted(self, job: str) -> None:
        self.conflicts.inc()

    def errored(self, job: str, step: Step, error: Exception) -> None:
        name = type(step).__name__
        self.step_errors.labels(step=name if name in STEPS else "other").inc()

    def decided(self, jobs: int, seconds: float) -> None:
        """Every job known at start has been decided once (the supervision loop tells it once)."""
        self.startup_jobs.set(jobs)
        self.startup_decided.set(seconds)

    def event_dropped(self, reason: str) -> None:
        """An Event of ``reason`` was not posted (EventRecorder's ``on_dropped``)."""
        self.events_dropped.labels(reason=reason if reason in EVENT_REASONS else "other").inc()

    # ------------------------------------------------------------------ what recovery cost

    def costs(self, backend: str, record: Record, objects: Sequence[ObjectView]) -> None:
        """Count what recovery cost ``record``'s job that was not counted yet (see the module):
        call with every decision's record and the objects it was decided on."""
        found = failures(record, objects)
        with self._lock:
            counted = self._costed.get(record.job)
            ended = max((f.submission for f in found), default=0)
            recovered = max((f.submission for f in found if f.recovery_seconds is not None), default=0)
            if counted is None:  # first sight: what it shows now was the process before's to count
                self._costed[record.job] = (ended, recovered) if found else _NOTHING_COUNTED
                return
            if (ended, recovered) == counted:
                return
            namespace = record.job.rpartition("/")[0]
            for f in found:
                labels = {"cause": f.cause.value, "backend": backend, "namespace": namespace}
                if f.submission > counted[0]:
                    self.failed_node_seconds.labels(**labels).inc(f.node_seconds)
                    self.failed_gpu_seconds.labels(**labels).inc(f.gpu_seconds)
                if f.recovery_seconds is not None and f.submission > counted[1]:
                    self.recovery_time.labels(**labels).observe(f.recovery_seconds)
            self._costed[record.job] = (max(ended, counted[0]), max(recovered, counted[1]))

    # ------------------------------------------------------------------ reaction time

    def failure_seen(self, job: str, submission: int) -> None:
        """The canonical object of ``submission`` was seen ended by a failure (the first call counts)."""
        with self._lock:
            self._seen.setdefault((job, submission), self._clock())

    def observe_backend(self, backend: Backend) -> Backend:
        """``backend``, with every listing checked for objects ended by a failure (for the reaction time)."""
        return _ObservedBackend(backend, self)

    def _listed(self, objects: Sequence[ObjectView]) -> None:
        if not objects:
            return
        latest = max(o.submission for o in objects)  # older submissions were dealt with already
        for o in objects:
            if (
                o.submission == latest
                and o.phase is Phase.ENDED
                and not o.cancelled
                and o.cause is not None
                and o.cause.kind in FAILURE_CAUSES
            ):
                self.failure_seen(o.job, o.submission)

    # ------------------------------------------------------------------ API requests

    def api_request(self, verb: str, resource: str, code: int | None) -> None:
        """Count one Kubernetes API request; ``code`` is the HTTP status, None when there was no answer."""
        verb = verb.lower() if verb.lower() in VERBS else "other"
        resource = resource if resource in RESOURCES else "other"
        label = str(code) if code is not None and 100 <= code <= 599 else "none"
        self.api_requests.labels(verb=verb, resource=resource, code=label).inc()
        if _api_error(code if label != "none" else None):
            self.api_errors.labels(verb=verb, resource=resource).inc()

    @contextlib.asynccontextmanager
    async def api_call(self, verb: str, resource: str, *, ok: int = 200) -> AsyncIterator[None]:
        """Count the request made inside the block: ``ok`` on success, the exception's ``status``
        (``ApiException``, ``KubeError``) when it has one, no answer otherwise."""
        try:
            yield
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            status = getattr(error, "status", None)
            code = status if isinstance(status, int) and status > 0 else None
            self.api_request(verb, resource, code)
            raise
        self.api_request(verb, resource, ok)

    def instrument(self, api: Any) -> Any:
        """Count every request ``api`` (a :class:`dispatch._kubeclient.Client`) sends; returns ``api``.

        Wraps ``api.rest_client.request``, the one method all of the client's calls go through
        (``call_api``, lists, watches), so nothing else has to report its requests.
        """
        rest = api.rest_client
        if getattr(rest, "_dispatch_metrics", None) is self:
            return api
        inner = rest.request

        async def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            verb, resource = classify(method, url, kwargs.get("query_params"))
            try:
                response = await inner(method, url, *args, **kwargs)
            except asyncio.CancelledError:
                raise  # the caller gave up: not an answer from the API server, not an error
            except BaseException as error:
                status = getattr(error, "status", None)
                self.api_request(verb, resource, status if isinstance(status, int) and status > 0 else None)
                raise
            status = getattr(response, "status", None)
            self.api_request(verb, resource, status if isinstance(status, int) else None)
            return response

        rest.request = request
        rest._dispatch_metrics = self
        return api

    # ------------------------------------------------------------------ endpoint

    def serve(
        self,
        port: int,
        addr: str = "127.0.0.1",
        *,
        authorize: Callable[[str | None], int] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> WSGIServer:
        """Serve the registry over HTTP (any path, conventionally ``/metrics``) in daemon threads.

        Without ``authorize`` the answers are unauthenticated: the default address is the loopback
        one, and another is for a network only the scrapers reach (the chart's NetworkPolicy).
        ``authorize`` gets each request's ``Authorization`` header and returns the HTTP status to
        answer (200 serves the metrics; :mod:`.metrics_auth`); ``tls`` makes it HTTPS.
        ``port`` 0 picks a free port (``server.server_port``). Stop with ``server.shutdown()``.
        """
        app = make_wsgi_app(self.registry)
        if authorize is not None:
            app = _guarded(app, authorize)

        class Server(ThreadingWSGIServer):
            address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET

        server = make_server(addr, port, app, Server, handler_class=_QuietHandler)
        if tls is not None:
            # The handshake runs in the request's thread: a slow client holds no other scrape up.
            server.socket = tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
        return server


class ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    """One thread per scrape (prometheus-client's own server does the same)."""

    daemon_threads = True


_REASONS: Final = {401: "Unauthorized", 403: "Forbidden", 503: "Service Unavailable"}


def _guarded(app: Any, authorize: Callable[[str | None], int]) -> Any:
    """The metrics app behind ``authorize``: any status but 200 is answered without the metrics."""

    def guarded(environ: dict[str, Any], start_response: Any) -> Any:
        status = authorize(environ.get("HTTP_AUTHORIZATION"))
        if status == 200:
            return app(environ, start_response)
        reason = _REASONS.get(status, "Error")
        headers = [("Content-Type", "text/plain; charset=utf-8")]
        if status == 401:
            headers.append(("WWW-Authenticate", 'Bearer realm="dispatch-operator metrics"'))
        start_response(f"{status} {reason}", headers)
        return [f"{reason}\n".encode()]

    return guarded


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(metrics: Metrics, port: int, addr: str = "127.0.0.1", **kwargs: Any) -> WSGIServer:
    """Module-level shorthand for :meth:`Metrics.serve`."""
    return metrics.serve(port, addr, **kwargs)


class _ObservedBackend:
    """A Backend that tells :class:`Metrics` what each listing shows, and otherwise delegates."""

    def __init__(self, inner: Backend, metrics: Metrics) -> None:
        self._inner = inner
        self._metrics = metrics

    @property
    def inner(self) -> Backend:
        return self._inner

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def capabilities(self) -> Capabilities:
        return self._inner.capabilities

    async def create(self, job: str, submission: int, spec: JobSpec, plan: Plan) -> str:
        return await self._inner.create(job, submission, spec, plan)

    async def release(self, object_id: str) -> None:
        await self._inner.release(object_id)

    async def end(self, object_id: str, *, grace_seconds: int | None = None) -> None:
        await self._inner.end(object_id, grace_seconds=grace_seconds)

    async def list(self, job: str) -> Sequence[ObjectView]:
        objects = await self._inner.list(job)
        self._metrics._listed(objects)
        return objects

    def subscribe(self, job: str, wake: Wake) -> Unsubscribe:
        return self._inner.subscribe(job, wake)

    @property
    def wakes_itself(self) -> bool:
        return isinstance(self._inner, SelfWaking) and self._inner.wakes_itself

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
