"""``dispatch-operator`` (and ``python -m dispatch._controller``): one loop supervising every DispatchJob.

    dispatch-operator --kubeconfig ~/.kube/config --all-namespaces
    dispatch-operator --namespace team-a --namespace team-b --slurm-config slurm.yaml
    dispatch-operator --backend kubeflow --backend job
    dispatch-operator --leader-elect --lease-namespace dispatch-system --metrics-port 8080

Without ``--kubeconfig`` the operator uses $KUBECONFIG or ~/.kube/config, else the pod's service
account. The Kubernetes backends ``--backend`` names (each a registry entry, ``dispatch._registry``;
default ``kubeflow``) are opened with the operator's API client; the Slurm adapter when
``--slurm-config`` names its YAML configuration, once for every namespace: with ``tenants`` in it,
the adapter holds one client per Slurm identity and the webhook asks it what each namespace may run
(docs/slurm.md).

kopf runs for the admission webhooks and start-up only; it watches no resource (loop.py keeps the
finalizer). With ``--leader-elect`` every replica runs kopf (so every replica serves the admission
webhooks and answers its health endpoint) while the elector campaigns for the Lease in the background; the
supervision loop (loop.py) starts only once this process holds it (``Runtime.leading``, see
runtime.py). Losing the Lease stops the process (exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import ipaddress
import logging
import math
import os
import re
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import kopf
import yaml

from .. import _registry
from .._constants import LEASE_NAME, WEBHOOK_VALIDATE_ID
from .._errors import BackendError, ConfigError
from .._kubeclient import (
    DEFAULT_WRITE_BURST,
    DEFAULT_WRITE_QPS,
    Client,
    Connection,
    KubeClient,
    WriteLimiter,
    client_for,
    kubeconfig_problem,
    limit_writes,
    load_configuration,
    server_sheds_load,
)
from .._protocols import Backend
from .._supervisor import Listener
from .._version import __version__
from . import webhook
from .listeners import Fanout
from .loop import DEFAULT_WORKERS
from .runtime import Runtime
from .settings import operator_settings
from .store import KubeRecordStore
from .tls import read_tls_in_smaller_pieces

if TYPE_CHECKING:  # imported when enabled: each loads its client (Events, prometheus_client)
    from wsgiref.simple_server import WSGIServer

    from .events import EventRecorder
    from .metrics import Metrics

log = logging.getLogger("dispatch.operator")


ANY_ADDRESS: Final = "0.0.0.0"
LOOPBACK: Final = "127.0.0.1"
"""The metrics server's default address: its answers are unauthenticated, so nothing beyond the
pod reads them unless ``--metrics-addr`` opens them (the chart does, behind its NetworkPolicy)."""

WRITE_QPS_AUTO: Final = "auto"
METRICS_AUTH_NONE: Final = "none"
METRICS_AUTH_KUBERNETES: Final = "kubernetes"


def _write_qps(text: str) -> float | str:
    """``--write-qps``: a number of writes per second, or ``auto``."""
    if text.strip().lower() == WRITE_QPS_AUTO:
        return WRITE_QPS_AUTO
    try:
        qps = float(text)
    except ValueError:
        qps = math.nan
    if not math.isfinite(qps):
        raise argparse.ArgumentTypeError(
            f"{text!r}: writes per second (a number, 0: no limit) or {WRITE_QPS_AUTO}"
        )
    return qps


async def choose_write_limit(api: Client, write_qps: float | str) -> float:
    """The client-side write limit in writes per second (0: none) for ``--write-qps``.

    A number is what the user chose. ``auto`` asks the API server: one with API Priority and
    Fairness queues and sheds load itself, so no limit, as controller-runtime's clients do since
    v0.21 on SIG API Machinery's advice; a limit on top of it makes a mass preemption of 1,000
    wait for tokens while the server idles. Without it (or when it cannot say), Kueue's client
    default. The loop still bounds what is in flight: its workers and the request pool.
    """
    if write_qps != WRITE_QPS_AUTO:
        return float(write_qps)
    try:
        sheds = await server_sheds_load(api)
    except BackendError as error:
        log.warning(
            "writes: limited to %g/s (Kueue's default): could not ask the API server whether it "
            "has Priority and Fairness (%s)",
            DEFAULT_WRITE_QPS,
            error,
        )
        return DEFAULT_WRITE_QPS
    if sheds:
        log.info(
            "writes: no client-side limit: the API server has Priority and Fairness and sheds "
            "load itself (--write-qps N sets one)"
        )
        return 0.0
    log.info(
        "writes: limited to %g/s (Kueue's default): the API server has no Priority and Fairness",
        DEFAULT_WRITE_QPS,
    )
    return DEFAULT_WRITE_QPS


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dispatch-operator",
        description="Supervise DispatchJobs: run them on their backends and recover them by their rules.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace", "-n", action="append", default=[], help="watch this namespace (repeatable)"
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (default)")
    p.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="NAME",
        help="open this Kubernetes backend (repeatable; one of the registered: "
        f"{', '.join(b.name for b in _registry.kubernetes_backends())}; default: {DEFAULT_BACKEND}; "
        f"{NO_BACKEND}: no Kubernetes backend)",
    )
    p.add_argument("--slurm-config", type=Path, help="YAML configuration of the Slurm adapter")
    p.add_argument("--leader-elect", action="store_true", help="supervise only while holding a Lease")
    p.add_argument("--lease-namespace", default="default", help="namespace of the Lease (default: default)")
    p.add_argument("--lease-name", default=LEASE_NAME, help=f"name of the Lease (default: {LEASE_NAME})")
    p.add_argument(
        "--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port (0: off)"
    )
    p.add_argument(
        "--metrics-addr",
        help=f"the metrics server's listen address (default {LOOPBACK}: it has no authentication)",
    )
    p.add_argument(
        "--metrics-auth",
        choices=(METRICS_AUTH_NONE, METRICS_AUTH_KUBERNETES),
        default=METRICS_AUTH_NONE,
        help="who may scrape: anyone who reaches the address (none), or a bearer token the API "
        "server authenticates and authorizes for get on /metrics, over HTTPS (kubernetes)",
    )
    p.add_argument(
        "--metrics-cert-dir",
        type=Path,
        help="tls.crt and tls.key of the metrics server with --metrics-auth=kubernetes "
        "(default: a certificate generated at start)",
    )
    p.add_argument(
        "--webhook-port", type=int, default=0, help="serve the admission webhooks on this port (0: off)"
    )
    p.add_argument(
        "--health-port",
        type=int,
        default=0,
        help="serve /healthz (liveness) and /readyz (readiness) on this port, leader or standby (0: off)",
    )
    p.add_argument("--health-addr", help=f"the health endpoint's listen address (default {ANY_ADDRESS})")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    p.add_argument("--log-level", default="INFO")
    p.add_argument(
        "--poll-interval",
        type=float,
        default=5.0,
        help="seconds of quiet before the loop looks again at the jobs of backends that cannot wake "
        "them on every change, such as Slurm's (default: 5)",
    )
    p.add_argument(
        "--settled-ttl-seconds",
        type=int,
        default=None,
        help="seconds a settled DispatchJob without spec.ttlSecondsAfterSettled is kept before it is "
        "deleted, counted from its settle as a Job's ttlSecondsAfterFinished (default: kept)",
    )
    p.add_argument("--no-events", action="store_true", help="post no Kubernetes Events for transitions")
    p.add_argument(
        "--write-qps",
        type=_write_qps,
        default=WRITE_QPS_AUTO,
        help="the operator's API writes per second, after the burst; recoveries first; 0: no limit. "
        f"{WRITE_QPS_AUTO} (the default): none where the API server has Priority and Fairness, "
        f"which protects it, else {DEFAULT_WRITE_QPS:g} (Kueue's)",
    )
    p.add_argument(
        "--write-burst",
        type=int,
        default=DEFAULT_WRITE_BURST,
        help="writes the operator may send at once before the write limit applies "
        f"(default: {DEFAULT_WRITE_BURST})",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=DEFAULT_WORKERS,
        help="jobs the supervision loop works on at once, each waiting on its own API call "
        f"(default: {DEFAULT_WORKERS})",
    )
    webhook.add_arguments(p)
    return p


def _configure_logging(fmt: str, level: str) -> None:
    try:
        from . import logs
    except ImportError:  # pragma: no cover - the logs module ships with the operator
        logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return
    logs.configure(fmt, level)  # type: ignore[arg-type]
    logging.getLogger("kopf").setLevel(max(logging.getLogger().level, logging.INFO))
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)


def _connection_info(connection: Connection) -> kopf.ConnectionInfo:
    """kopf's credentials from the same connection the rest of the operator uses.

    kopf calls its login handler again when the API server answers 401, so a token file that
    rotated is read anew (``bearer_token`` re-reads it when it changed).
    """
    token = connection.bearer_token()
    return kopf.ConnectionInfo(
        server=connection.host,
        ca_path=connection.ca_file,
        insecure=connection.insecure,
        username=None if token else connection.username,
        password=None if token else connection.password,
        scheme="Bearer" if token else None,
        token=token,
        certificate_path=connection.cert_file,
        private_key_path=connection.key_file,
        default_namespace=connection.namespace,
        priority=100,
    )


class Health:
    """``/healthz`` and ``/readyz`` over plain HTTP (aiohttp), served from the start, before and
    regardless of leader election, so a standby answers its probes too.

    * ``/healthz``: 200 while the event loop runs (it answers) and the operator is not stopping.
    * ``/readyz``: 200 once kopf has started and, with ``--webhook-port``, its webhook server accepts
      connections (a standby is ready: it serves the webhooks); 503 before that and when stopping.

    Both answer a small JSON object: ``status``, ``leader`` (does this process hold the Lease).
    """

    def __init__(self, leading: asyncio.Event, webhook_port: int = 0) -> None:
        self.leading = leading
        self.webhook_port = webhook_port
        self.started = False
        self.stopping = False
        self._runner: Any = None

    async def start(self, port: int, addr: str = "0.0.0.0") -> int:
        """Listen on ``addr:port`` (0: a free port); returns the port."""
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, addr, port)
        await site.start()
        addresses = [a for a in self._runner.addresses if isinstance(a, tuple)]
        bound = int(addresses[0][1]) if addresses else port
        log.info("health endpoint on %s:%d (/healthz, /readyz)", addr, bound)
        return bound

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _answer(self, ok: bool, status: str) -> Any:
        from aiohttp import web

        body = {"status": status, "leader": self.leading.is_set()}
        return web.json_response(body, status=200 if ok else 503)

    async def _healthz(self, _request: Any) -> Any:
        return self._answer(not self.stopping, "stopping" if self.stopping else "ok")

    async def _readyz(self, _request: Any) -> Any:
        if self.stopping:
            return self._answer(False, "stopping")
        if not self.started:
            return self._answer(False, "starting")
        if self.webhook_port and not await _accepts(self.webhook_port):
            return self._answer(False, "webhook server not listening")
        return self._answer(True, "ready")


async def _accepts(port: int) -> bool:
    try:
        async with asyncio.timeout(1.0):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return True


async def open_backends(
    api: Any, args: argparse.Namespace, namespaces: Sequence[str] | None
) -> dict[str, Backend]:
    # Each from its registry entry, which imports the adapter (and its client) only now.
    backends: dict[str, Backend] = {}
    for name in enabled_backends(args):
        info = _registry.get(name)
        if info is None:
            raise ArgumentError(f"--backend {name!r}: no such backend registered")
        backends[name] = await info.open_operator(api, namespaces=namespaces)
    if args.slurm_config is not None:
        config = getattr(args, "slurm_settings", None)
        if config is None:
            config = read_slurm_config(args.slurm_config)
        backend: Any = _registry.get("slurm")(config)  # type: ignore[misc]
        if inspect.isawaitable(backend):
            backend = await backend
        backends["slurm"] = backend
    return backends


class ArgumentError(Exception):
    """A flag's value the operator would fail on later (or the API server would refuse)."""


DEFAULT_BACKEND: Final = "kubeflow"
"""Opened when no ``--backend`` is given: what the operator always opened before backends were
chosen, so an existing deployment keeps its behaviour (and the chart's RBAC its default)."""


NO_BACKEND: Final = "none"
"""``--backend none``: no Kubernetes backend (a Slurm-only operator, the chart's ``backends: []``)."""


def enabled_backends(args: argparse.Namespace) -> list[str]:
    """The Kubernetes backends ``--backend`` names (default :data:`DEFAULT_BACKEND`), checked."""
    names: list[str] = list(dict.fromkeys(getattr(args, "backend", None) or [DEFAULT_BACKEND]))
    if NO_BACKEND in names:
        if len(names) > 1:
            raise ArgumentError(f"--backend {NO_BACKEND} opens no Kubernetes backend: it goes alone")
        return []
    known = [b.name for b in _registry.kubernetes_backends()]
    for name in names:
        if name not in known:
            other = _registry.get(name)
            why = (
                f"{name} is configured with --{name}-config, not --backend"
                if other is not None and other.in_spec
                else f"known: {', '.join(known)}"
            )
            raise ArgumentError(f"--backend {name!r}: not a registered Kubernetes backend ({why})")
    return names


DNS_LABEL: Final = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
WEBHOOK_NAME: Final = re.compile(rf"^{DNS_LABEL}(\.{DNS_LABEL})+$")
"""A webhook configuration's name: kopf names each webhook ``<handler id>.<NAME>``, and the API
server wants a webhook's name fully qualified (at least three dot-separated segments)."""


def read_slurm_config(path: Path) -> dict[str, Any]:
    """The Slurm adapter's YAML configuration, checked the way the adapter will check it."""
    from pydantic import ValidationError

    from .._backends.slurm import SlurmConfig

    try:
        text = path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise ArgumentError(f"--slurm-config {path} is a directory, not a file") from None
    except OSError as error:
        raise ArgumentError(f"--slurm-config {path}: {error.strerror or error}") from None
    try:
        config = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise ArgumentError(f"--slurm-config {path} is not YAML: {error}") from None
    if not isinstance(config, dict):
        raise ArgumentError(
            f"--slurm-config {path}: expected a mapping of settings, got {type(config).__name__}"
        )
    try:
        SlurmConfig.model_validate(config)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in error.errors()
        )
        raise ArgumentError(f"--slurm-config {path}: {problems}") from None
    return config


def serve_metrics(metrics: Metrics, api: Client, args: argparse.Namespace) -> WSGIServer:
    """The metrics server, behind the API server's TokenReview and SubjectAccessReview over TLS
    with ``--metrics-auth=kubernetes`` (the reviews go through ``api``)."""
    addr = getattr(args, "metrics_addr", None) or LOOPBACK
    if getattr(args, "metrics_auth", METRICS_AUTH_NONE) == METRICS_AUTH_NONE:
        return metrics.serve(args.metrics_port, addr)
    from .metrics_auth import KubernetesAuthorizer, server_tls

    names = sorted({"localhost", "127.0.0.1", socket.gethostname()} | ({addr} - {ANY_ADDRESS, "::"}))
    tls = server_tls(getattr(args, "metrics_cert_dir", None), names)
    return metrics.serve(
        args.metrics_port, addr, authorize=KubernetesAuthorizer(api, asyncio.get_running_loop()), tls=tls
    )


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse, before anything starts, a value that would crash the operator later or leave
    something half-made behind (a webhook configuration the API server refuses)."""
    for flag in ("metrics_port", "webhook_port", "health_port"):
        port = getattr(args, flag, 0)
        if not 0 <= port <= 65535:
            raise ArgumentError(f"--{flag.replace('_', '-')} {port}: a port is 0..65535")
    for flag in ("metrics_addr", "health_addr", "webhook_addr"):
        addr = getattr(args, flag, None)
        if addr is not None and not _is_address(addr):
            raise ArgumentError(f"--{flag.replace('_', '-')} {addr!r}: not an IP address or host name")
    managed = getattr(args, "webhook_managed", None) or os.environ.get(f"{webhook.ENV_PREFIX}MANAGED")
    if managed:
        longest = 253 - len(f"{WEBHOOK_VALIDATE_ID}.")
        if not WEBHOOK_NAME.match(managed) or len(managed) > longest:
            raise ArgumentError(
                f"--webhook-managed {managed!r}: the name of the webhook configurations must be a "
                "lowercase DNS name with at least one dot (e.g. dispatch.example.com), at most "
                f"{longest} characters: the API server requires each webhook's name "
                f"({WEBHOOK_VALIDATE_ID}.<NAME>) to have three segments"
            )
        if not getattr(args, "webhook_port", 0):
            raise ArgumentError("--webhook-managed needs --webhook-port: no webhook server would serve it")
    if args.settled_ttl_seconds is not None and args.settled_ttl_seconds < 0:
        raise ArgumentError(f"--settled-ttl-seconds {args.settled_ttl_seconds}: 0 seconds or more")
    if args.poll_interval <= 0:
        raise ArgumentError(f"--poll-interval {args.poll_interval:g}: must be more than 0 seconds")
    if args.write_qps != WRITE_QPS_AUTO and args.write_qps < 0:
        raise ArgumentError(
            f"--write-qps {args.write_qps:g}: writes per second, 0 (no limit) or more, or {WRITE_QPS_AUTO}"
        )
    if args.write_burst < 1:
        raise ArgumentError(f"--write-burst {args.write_burst}: at least 1 write")
    if args.workers < 1:
        raise ArgumentError(f"--workers {args.workers}: at least 1")
    enabled_backends(args)
    if args.slurm_config is not None:
        args.slurm_settings = read_slurm_config(args.slurm_config)


def _is_address(addr: str) -> bool:
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        return bool(re.fullmatch(rf"{DNS_LABEL}(\.{DNS_LABEL})*", addr.lower()))
    return True


@dataclass
class Opened:
    """What the process opens before it serves, closed by :meth:`close` in the reverse order."""

    connection: Connection
    api: KubeClient
    store: KubeRecordStore
    runtime: Runtime
    events: EventRecorder | None
    health: Health | None
    metrics_server: WSGIServer | None

    async def close(self) -> None:
        """Close what :func:`open_process` opened (the loop has stopped): no step is lost, since the
        record is the truth and a successor reads it."""
        if self.events is not None:
            with contextlib.suppress(Exception):
                await self.events.aclose()
        for backend in self.runtime.backends.values():
            with contextlib.suppress(Exception):
                await backend.aclose()
        await self.store.aclose()
        await self.api.close()
        if self.metrics_server is not None:
            with contextlib.suppress(Exception):
                self.metrics_server.shutdown()
        if self.health is not None:
            with contextlib.suppress(Exception):
                await self.health.aclose()


async def open_process(
    args: argparse.Namespace,
    leading: asyncio.Event,
    *,
    backends: dict[str, Backend] | None,
    listeners: Sequence[Listener],
) -> Opened:
    """Health and metrics first (a probe answers while the rest opens), then the API client with its
    write limit, the record store, the backends, and the listeners every step is told of: the
    given ones first, then the Events and the metrics."""
    health: Health | None = None
    if getattr(args, "health_port", 0):
        health = Health(leading, webhook_port=args.webhook_port)
        await health.start(args.health_port, getattr(args, "health_addr", None) or ANY_ADDRESS)
    metrics: Metrics | None = None
    server: WSGIServer | None = None
    if args.metrics_port:
        from . import metrics as metrics_module

        metrics = metrics_module.Metrics()
    connection = await load_configuration(args.kubeconfig, context=args.context)
    api = client_for(connection)
    if metrics is not None:
        server = serve_metrics(metrics, api, args)
    if metrics is not None:
        metrics.instrument(api)  # every request of the store, the adapters, events and the elector
    qps = await choose_write_limit(api, args.write_qps)
    if qps > 0:  # kopf writes nothing: the finalizer is the loop's too
        limit_writes(api, WriteLimiter(qps, args.write_burst))
    if metrics is not None:
        metrics.write_limit.set(qps)
    namespaces: list[str] | None = list(args.namespace) or None
    store = KubeRecordStore(api, namespaces=namespaces)
    if backends is None:
        backends = await open_backends(api, args, namespaces)
    listener = Fanout(listeners)
    events: EventRecorder | None = None
    if not args.no_events:
        try:
            from .events import EventRecorder as Recorder
        except ImportError:
            log.info("events are not available in this build")
        else:
            events = Recorder.for_client(
                api, on_dropped=metrics.event_dropped if metrics is not None else None
            )
            listener.add(events)
    opened = backends
    if metrics is not None:
        listener.add(metrics)
        backends = {name: metrics.observe_backend(b) for name, b in opened.items()}
    runtime = Runtime(
        store=store,
        backends=backends,
        listener=listener if listener.listeners else None,
        poll_interval=args.poll_interval,
        events=events,
        metrics=metrics,
        unobserved=opened if metrics is not None else {},
        leading=leading,
        workers=args.workers,
        settled_ttl=args.settled_ttl_seconds,
    )
    return Opened(connection, api, store, runtime, events, health, server)


class Election:
    """``--leader-elect``: wait for the Lease, set ``leading`` while it is held, and call ``stop``
    with why once it is lost or the election fails (the process then exits 1 and a successor, or
    this one restarted, takes over from the record)."""

    def __init__(
        self, api: Client, args: argparse.Namespace, leading: asyncio.Event, stop: Callable[[str], None]
    ) -> None:
        from . import leader

        self._lease = f"{args.lease_namespace}/{args.lease_name}"
        self._elector = leader.LeaderElector(
            api, args.lease_namespace, args.lease_name, leader.default_identity()
        )
        self._leading = leading
        self._stop = stop
        self._task = asyncio.create_task(self._elect(), name="dispatch-leader-election")

    async def _elect(self) -> None:
        log.info(
            "waiting for the Lease %s as %s (serving webhooks and health meanwhile)",
            self._lease,
            self._elector.identity,
        )
        try:
            await self._elector.acquire()
            log.info("holding the Lease %s: supervising", self._lease)
            self._leading.set()
            await self._elector.hold(lambda: self._stop(f"lost the Lease {self._lease}"))
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self._stop(f"leader election failed: {type(error).__name__}: {error}")

    async def aclose(self) -> None:
        """Stop electing and let go of the Lease, so that a successor need not wait for it to expire."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        with contextlib.suppress(Exception):
            await self._elector.release()


async def run(
    args: argparse.Namespace,
    *,
    backends: dict[str, Backend] | None = None,
    stop_flag: asyncio.Event | None = None,
    listeners: Sequence[Listener] = (),
) -> int:
    """Run the operator until it is stopped (a signal, ``stop_flag``, or a lost Lease).

    ``backends`` replaces the adapters the arguments would open (for embedding and tests);
    ``listeners`` are told of every step first, before the Events and the metrics.
    """
    started_by = asyncio.current_task()
    leading = asyncio.Event()
    if not args.leader_elect:
        leading.set()
    opened = await open_process(args, leading, backends=backends, listeners=listeners)
    runtime, health = opened.runtime, opened.health
    registry = kopf.OperatorRegistry()
    settings = operator_settings()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return _connection_info(opened.connection)

    @kopf.on.startup(registry=registry)
    def started(**_: Any) -> None:
        if health is not None:
            health.started = True

    if args.webhook_port:
        webhook.setup(
            registry=registry,
            settings=settings,
            port=args.webhook_port,
            runtime=runtime,
            args=args,
            held=opened.store.held,
        )

    async def supervise() -> None:
        await leading.wait()  # nothing is read before this process holds the Lease
        runtime.start_loop()

    supervising = asyncio.create_task(supervise(), name="dispatch-supervise")
    stop_flag = stop_flag if stop_flag is not None else asyncio.Event()
    exit_code = 0

    def stop(why: str) -> None:
        nonlocal exit_code
        log.error("%s; stopping", why)
        exit_code = 1
        leading.clear()
        runtime.abandon()
        stop_flag.set()

    election = Election(opened.api, args, leading, stop) if args.leader_elect else None
    wound_down = False

    async def wind_down() -> None:
        """Stop everything of ours and let go of the Lease, once. Called by kopf's cleanup activity:
        kopf waits up to 5 s for every task started after it (our loop's workers, watches and
        Lease renewals run until cancelled) before it cancels them, which would keep the Lease
        from a successor for that long; and again on the way out, for a start that never reached
        the activities."""
        nonlocal wound_down
        if wound_down:
            return
        wound_down = True
        # Stopped by a signal, kopf still has a task waiting for this flag (its "stop-flag
        # waiter"), and would wait the 5 s for it too.
        stop_flag.set()
        if health is not None:
            health.stopping = True
        leading.clear()
        runtime.abandon()
        if election is not None:
            await election.aclose()
        supervising.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await supervising
        if runtime.loop is not None:
            await runtime.loop.stop()
        await opened.close()

    @kopf.on.cleanup(registry=registry)
    async def stopping(**_: Any) -> None:
        await wind_down()
        left = tasks_left(besides={started_by, asyncio.current_task()})
        if left:  # kopf waits up to 5 s for each task it did not start, then cancels it
            log.warning("still running after the stop: %s", ", ".join(left))

    namespaces = list(args.namespace)
    try:
        await kopf.operator(
            registry=registry,
            settings=settings,
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            stop_flag=stop_flag,
        )
    finally:
        await wind_down()
    return exit_code


EXIT_USAGE: Final = 2


def tasks_left(besides: set[asyncio.Task[Any] | None]) -> list[str]:
    """The names of the tasks still running (``besides`` aside): what kopf would wait for."""
    return sorted(t.get_name() for t in asyncio.all_tasks() if t not in besides and not t.done())


def main(argv: Sequence[str] | None = None, *, listeners: Sequence[Listener] = ()) -> int:
    """The console script. Exit status: 0 stopped, 1 failed while running (a lost Lease), 2 a
    mistake in the command line or the files it names (one line on stderr, no traceback).

    ``listeners`` are told of every step (see :func:`run`), for embedding and tests."""
    p = parser()
    args = p.parse_args(argv)
    try:
        check_arguments(args)
    except ArgumentError as error:
        p.error(str(error))  # exits 2 with the usage line
    problem = kubeconfig_problem(args.kubeconfig)
    if problem is not None:
        print(f"{p.prog}: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    _configure_logging(args.log_format, args.log_level)
    read_tls_in_smaller_pieces()
    try:
        return asyncio.run(run(args, listeners=listeners))
    except KeyboardInterrupt:
        return 130
    except ConfigError as error:  # a kubeconfig or adapter config we cannot use
        print(f"{p.prog}: error: {error}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
