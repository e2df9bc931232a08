"""Admission webhooks for DispatchJobs, served by the operator through kopf's webhook server.

Validating (``/validate-dispatchjob``, CREATE and UPDATE)
    Refuses a DispatchJob whose plan leaves a rule without an enforcer: the plan is made exactly as
    the operator makes it (``make_plan`` with the capabilities of the adapter for ``spec.backend``
    and ``supervised=True``), and the message is the PlanError's, which names the rule and why.
    It also refuses what the CRD's schema and CEL rules cannot say: options for a backend other than
    ``spec.backend``, and anything the core's JobSpec refuses; a backend the operator serving the
    webhook did not open (the webhook covers exactly the namespaces that operator supervises, so
    nothing would ever run it); and a job whose object could never be stored: the object its
    backend would create (:class:`~dispatch._protocols.Previewing`) over the API server's object
    size limit (``--max-object-bytes``, etcd's default request limit), or the DispatchJob itself over
    half of it (its record, written into its status, needs room to grow). Each refusal says the
    size and the limit. With ``--max-jobs``, a CREATE is refused while the operator holds that many
    DispatchJobs in its cache (settled ones included: each costs memory until deleted), so that its
    memory stays under its limit (docs/operator.md, "Memory, fairness and quotas"). A job outside
    what its namespace may run on its backend
    (:class:`~dispatch._protocols.Admitting`: Slurm's identities) is refused naming the field.
    An UPDATE that leaves the spec as it was (apart from a person's asks:
    ``cancel``, ``suspend``, ``retry``) is allowed, so the operator can always remove its finalizer;
    a spec change is refused (the CRD's CEL refuses it too), and so is an ask the job cannot take:
    a cancel undone, a retry of a job that has not failed (its recorded state), a retry count
    lowered, a fresh budget for a rule the job does not have.

Mutating (``/mutate-dispatchjob``, CREATE and UPDATE)
    Records who asked, from the admission request's ``userInfo``, as ``human:<username>``:
    ``dispatch.dev/submitted-by`` on CREATE, ``dispatch.dev/cancelled-by`` when an UPDATE turns
    ``spec.cancel`` true, ``dispatch.dev/suspended-by`` when one changes ``spec.suspend`` and
    ``dispatch.dev/retried-by`` when one raises ``spec.retry.count``. Whatever a user wrote into
    those annotations is overwritten (on CREATE) or put back to what it was (on any other UPDATE), so
    none can be forged through the API.
    On CREATE it also adds the deletion finalizer (``dispatch.dev/finalizer``) that the supervision
    loop would otherwise add with a patch on its first look: one API write fewer per job.

Without the webhooks the operator still refuses unenforceable jobs (in status, reason
``UnenforceableRule``) and records ``human:unknown`` as the actor: they are optional.

Server and certificates
    :func:`setup` configures ``settings.admission.server`` as a :class:`kopf.WebhookServer` on
    ``port`` over TLS. With ``cert_dir`` (a mounted Secret: ``tls.crt``, ``tls.key``, optionally
    ``ca.crt``, the layout of cert-manager and of ``kubernetes.io/tls`` Secrets) the server uses
    those files and reloads them when they change; without it a CA and a serving certificate for
    ``host`` (plus ``extra_sans``) are generated at start. The server reads admission reviews of
    up to :data:`MAX_REVIEW_BYTES` (kopf's own limit, 1 MiB, would refuse with a bare 413 the review
    of an UPDATE of a DispatchJob over 512 KiB, which holds the object twice, and with
    ``failurePolicy: Fail`` make that job impossible to cancel or to let go of its finalizer).
    With ``managed`` set (tests, development)
    the operator installs its own ``ValidatingWebhookConfiguration`` and
    ``MutatingWebhookConfiguration`` named ``managed``, pointing at ``https://<host>:<port>/<id>``
    with the CA as ``caBundle``; in production the Helm chart installs them (``managed`` unset).

Options come from :func:`setup`'s arguments, else from the flags :func:`add_arguments` adds, else
from the environment: ``DISPATCH_WEBHOOK_ADDR``, ``DISPATCH_WEBHOOK_HOST``,
``DISPATCH_WEBHOOK_CERT_DIR``, ``DISPATCH_WEBHOOK_MANAGED``, ``DISPATCH_WEBHOOK_EXTRA_SANS``
(comma-separated).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp.web
import kopf

from .. import _registry
from .._constants import (
    ANNOTATION_CANCELLED_BY,
    ANNOTATION_RETRIED_BY,
    ANNOTATION_SUBMITTED_BY,
    ANNOTATION_SUSPENDED_BY,
    FINALIZER,
    GROUP,
    PLURAL,
    VERSION,
    WEBHOOK_MUTATE_ID,
    WEBHOOK_VALIDATE_ID,
)
from .._dispatchjob import SPEC_MUTABLE, SpecError, backend_of, fresh_budget, job_spec, retry_count
from .._errors import OutsideLimits, PlanError
from .._model import ActorKind, Capabilities, JobSpec, Plan, State
from .._plan import make_plan
from .._protocols import Admitting, Previewing
from .._workload import Refused as NotBuildable
from .ports import Configured

log = logging.getLogger("dispatch.webhook")

MAX_ACTOR_ID: Final = 253
CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"
CA_FILE: Final = "ca.crt"
CERT_DAYS: Final = 365
ENV_PREFIX: Final = "DISPATCH_WEBHOOK_"

MAX_OBJECT_BYTES: Final = 1_572_864
"""etcd's default ``--max-request-bytes`` (1.5 MiB): the largest object a default cluster stores."""
MAX_REVIEW_BYTES: Final = 8 * 1024 * 1024
"""The largest admission review the server reads: an UPDATE's review holds the object twice, and
the API server accepts a request body of up to 3 MiB."""

CapabilitiesOf = Callable[[str], Capabilities | None]
PreviewOf = Callable[[str], Previewing | None]
AdmitOf = Callable[[str], Admitting | None]


def _no_preview(backend: str) -> Previewing | None:
    return None


def _none_held() -> int:
    return 0


def _no_limits(backend: str) -> Admitting | None:
    return None


def default_capabilities(backend: str) -> Capabilities | None:
    """Each registered backend's capabilities with its default configuration (its declaration)."""
    info = _registry.get(backend)
    return info.capabilities if info is not None and info.in_spec else None


def runtime_capabilities(runtime: Configured) -> CapabilitiesOf:
    """The capabilities of the operator's configured adapters, else the defaults."""

    def of(backend: str) -> Capabilities | None:
        configured = runtime.backends.get(backend)
        if configured is not None:
            return configured.capabilities
        return default_capabilities(backend)

    return of


@dataclass(frozen=True)
class Admission:
    """What the validating webhook checks a DispatchJob against."""

    capabilities: CapabilitiesOf = default_capabilities
    served: frozenset[str] | None = None
    """The backends the operator serving the webhook opened; None (a webhook without an operator,
    as in tests): every registered backend."""
    preview: PreviewOf = _no_preview
    """The backend that shows the object a spec would create, for the size check."""
    max_object_bytes: int = MAX_OBJECT_BYTES
    max_jobs: int | None = None
    """The most DispatchJobs the operator holds before a new one is refused (None: no bound)."""
    held: Callable[[], int] = _none_held
    """How many DispatchJobs the operator holds now (its watch's cache)."""
    limits: AdmitOf = _no_limits
    """The backend that says what a namespace may run (Slurm's identities), for the limits check."""

    @classmethod
    def of(
        cls,
        runtime: Configured,
        max_object_bytes: int = MAX_OBJECT_BYTES,
        max_jobs: int | None = None,
        held: Callable[[], int] = _none_held,
    ) -> Admission:
        """The checks of the operator's runtime: its backends, their capabilities and previews."""

        def preview(backend: str) -> Previewing | None:
            configured = runtime.backends.get(backend)
            return configured if isinstance(configured, Previewing) else None

        def limits(backend: str) -> Admitting | None:
            configured = runtime.backends.get(backend)
            return configured if isinstance(configured, Admitting) else None

        return cls(
            capabilities=runtime_capabilities(runtime),
            served=frozenset(runtime.backends),
            preview=preview,
            max_object_bytes=max_object_bytes,
            max_jobs=max_jobs,
            held=held,
            limits=limits,
        )


# ---- the checks (pure, tested without a server) ------------------------------------------------------


class Refused(Exception):
    """The admission request is refused; the message is what the user sees."""


def _fixed(spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """The spec without a person's asks and the time to live: what may never change."""
    return {k: v for k, v in (spec or {}).items() if k not in SPEC_MUTABLE}


def check_asks(spec: Mapping[str, Any], old: Mapping[str, Any]) -> None:
    """Refuse an ask the job cannot take: a cancel undone, a retry count lowered, or raised on a job
    that has not failed (its recorded state, in the old object's status)."""
    old_spec = old.get("spec") or {}
    if old_spec.get("cancel") and not spec.get("cancel"):
        raise Refused("spec.cancel cannot be undone: a cancelled job stays cancelled")
    count, before = retry_count(spec), retry_count(old_spec)
    if count < before:
        raise Refused(f"spec.retry.count never goes down ({before} -> {count}): raise it to ask for a retry")
    if count > before:
        state = (old.get("status") or {}).get("state")
        if state != State.FAILED.value:
            raise Refused(
                f"spec.retry: only a failed job is retried; this one is {state or 'not yet recorded'}"
            )


def _check_fresh_budget(spec: Mapping[str, Any], rules: int) -> None:
    rule = fresh_budget(spec)
    if rule is not None and rule >= rules:
        raise Refused(f"spec.retry.freshBudget: the job has no rule {rule} (it has {rules})")


def check(
    body: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    operation: str | None,
    admission: Admission = Admission(),
) -> None:
    """Raise :class:`Refused` when the DispatchJob must not be admitted."""
    spec = body.get("spec") or {}
    if operation == "UPDATE" and old is not None:
        if _fixed(spec) != _fixed(old.get("spec") or {}):
            raise Refused(
                "the spec is fixed once created: only a person's asks may change (spec.cancel from false "
                "to true, spec.suspend, spec.retry), and how long it is kept once settled "
                "(spec.ttlSecondsAfterSettled)"
            )
        check_asks(spec, old)
        if retry_count(spec) > retry_count(old.get("spec") or {}):
            rules = (((old.get("spec") or {}).get("recovery") or {}).get("rules")) or ()
            _check_fresh_budget(spec, len(rules))
        return
    if operation not in (None, "CREATE", "UPDATE"):
        return
    _check_room(admission)
    meta = body.get("metadata") or {}
    job = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
    try:
        backend = backend_of(spec).name
        job_spec_ = job_spec(body)
    except SpecError as error:
        raise Refused(str(error)) from None
    except (KeyError, TypeError) as error:
        raise Refused(f"not a DispatchJob: {error}") from None
    if admission.served is not None and backend not in admission.served:
        serves = ", ".join(sorted(admission.served)) or "no backend"
        raise Refused(
            f"spec.backend: {backend!r} is not served by the operator supervising this namespace "
            f"(it serves {serves}), so nothing would run the job; the chart's value `backends` "
            f"(or `slurm.enabled`) opens it"
        )
    admitting = admission.limits(backend)
    if admitting is not None:
        try:
            admitting.admit(job, job_spec_)
        except OutsideLimits as error:
            raise Refused(str(error)) from None
    caps = admission.capabilities(backend)
    if caps is None:
        raise Refused(f"spec.backend {backend!r} has no capabilities this operator knows")
    try:
        plan = make_plan(job, job_spec_, caps, supervised=True)
    except PlanError as error:
        raise Refused(f"{error} (backend {backend})") from None
    _check_fresh_budget(spec, len(job_spec_.recovery.rules))
    _check_sizes(body, job, job_spec_, plan, admission.preview(backend), admission.max_object_bytes)


def _check_room(admission: Admission) -> None:
    """Refuse a new job while the operator holds ``max_jobs``: past it, its memory would near its
    limit, and an operator killed for memory supervises nothing."""
    if admission.max_jobs is None:
        return
    held = admission.held()
    if held >= admission.max_jobs:
        raise Refused(
            f"the operator supervising this namespace holds {held} DispatchJobs, its limit "
            f"(--max-jobs {admission.max_jobs}, the chart's value maxJobs), which keeps its memory "
            "under its container's limit: delete settled DispatchJobs, or raise maxJobs with the "
            'memory limit (docs/operator.md, "Memory, fairness and quotas")'
        )


def _size(obj: Mapping[str, Any]) -> int:
    """The object's size as the API server stores it (compact JSON; etcd's protobuf is close)."""
    return len(json.dumps(obj, separators=(",", ":"), default=str).encode())


def _check_sizes(
    body: Mapping[str, Any],
    job: str,
    spec: JobSpec,
    plan: Plan,
    previewing: Previewing | None,
    limit: int,
) -> None:
    """Refuse a job whose DispatchJob or first object could never be stored (see the module doc)."""
    own = _size(body)
    if own > limit // 2:
        raise Refused(
            f"the DispatchJob is {own} bytes: over {limit // 2}, half the API server's object size "
            f"limit ({limit}), which leaves its record room to grow in its status; move large "
            f"values (env, command) into a ConfigMap or Secret the pods read"
        )
    if previewing is None:
        return
    try:
        workload = previewing.preview(job, spec, plan)
    except NotBuildable as error:
        raise Refused(str(error)) from None
    size = _size(workload)
    if size > limit:
        kind = str(workload.get("kind") or "object")
        raise Refused(
            f"its {kind} would be {size} bytes, over the API server's object size limit ({limit}): "
            f"the spec is copied into each replica's pod template; move large values (env, "
            f"command) into a ConfigMap or Secret the pods read"
        )


SERVICE_ACCOUNT_PREFIX: Final = "system:serviceaccount:"


def actor_of(userinfo: Mapping[str, Any] | None) -> str:
    """The requester of an admission request, from its userInfo: ``serviceaccount:<namespace>/<name>``
    for a service account, else ``human:<username>`` (``human:unknown`` without one)."""
    username = str((userinfo or {}).get("username") or "unknown")
    kind = ActorKind.HUMAN
    if username.startswith(SERVICE_ACCOUNT_PREFIX) and username.count(":") == 3:
        kind = ActorKind.SERVICE_ACCOUNT
        username = "/".join(username[len(SERVICE_ACCOUNT_PREFIX) :].split(":"))
    return f"{kind.value}:{username[:MAX_ACTOR_ID]}"


def annotations_to_set(
    body: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    operation: str | None,
    userinfo: Mapping[str, Any] | None,
) -> dict[str, str | None]:
    """The actor annotations the mutating webhook writes (None removes one), only where they differ."""
    current: Mapping[str, Any] = (body.get("metadata") or {}).get("annotations") or {}
    spec = body.get("spec") or {}
    want: dict[str, str | None]
    if operation == "CREATE" or old is None:
        who = actor_of(userinfo)
        want = {
            ANNOTATION_SUBMITTED_BY: who,
            ANNOTATION_CANCELLED_BY: who if spec.get("cancel") else None,
            ANNOTATION_SUSPENDED_BY: who if spec.get("suspend") else None,
            ANNOTATION_RETRIED_BY: None,  # the count a job is created with is no retry
        }
    else:
        previous: Mapping[str, Any] = (old.get("metadata") or {}).get("annotations") or {}
        old_spec = old.get("spec") or {}
        # Who last changed each ask: stamped when it changes, else kept as it was.
        changed = {
            ANNOTATION_SUBMITTED_BY: False,
            ANNOTATION_CANCELLED_BY: bool(spec.get("cancel")) and not old_spec.get("cancel"),
            ANNOTATION_SUSPENDED_BY: bool(spec.get("suspend")) != bool(old_spec.get("suspend")),
            ANNOTATION_RETRIED_BY: retry_count(spec) > retry_count(old_spec),
        }
        want = {key: actor_of(userinfo) if now else previous.get(key) for key, now in changed.items()}
    return {key: value for key, value in want.items() if current.get(key) != value}


def finalizers_to_set(body: Mapping[str, Any], operation: str | None) -> list[str] | None:
    """The finalizers a new DispatchJob gets (with the loop's), or None: never on UPDATE, where the
    loop may just have removed it to let a deleted job go."""
    if operation != "CREATE":
        return None
    meta = body.get("metadata") or {}
    current = list(meta.get("finalizers") or ())
    if FINALIZER in current or meta.get("deletionTimestamp"):
        return None
    return [*current, FINALIZER]


# ---- kopf handlers ----------------------------------------------------------------------------------


def register(registry: kopf.OperatorRegistry, admission: Admission | None = None) -> None:
    """Register the validating and mutating handlers for DispatchJobs in ``registry``."""

    @kopf.on.mutate(
        GROUP,
        VERSION,
        PLURAL,
        id=WEBHOOK_MUTATE_ID,
        operations=["CREATE", "UPDATE"],
        registry=registry,
    )
    def mutate(**kwargs: Any) -> None:
        body: kopf.Body = kwargs["body"]
        operation: str | None = kwargs.get("operation")
        patch: kopf.Patch = kwargs["patch"]
        changes = annotations_to_set(body, kwargs.get("old"), operation, kwargs.get("userinfo"))
        for key, value in changes.items():
            patch.meta.annotations[key] = value
        finalizers = finalizers_to_set(body, operation)
        if finalizers is not None:
            patch.setdefault("metadata", {})["finalizers"] = finalizers
        if changes:
            meta = body.get("metadata") or {}
            log.info(
                "%s %s/%s: %s",
                operation,
                meta.get("namespace"),
                meta.get("name"),
                ", ".join(f"{k}={v}" for k, v in changes.items()),
            )

    @kopf.on.validate(
        GROUP,
        VERSION,
        PLURAL,
        id=WEBHOOK_VALIDATE_ID,
        operations=["CREATE", "UPDATE"],
        registry=registry,
    )
    def validate(**kwargs: Any) -> None:
        body: kopf.Body = kwargs["body"]
        operation: str | None = kwargs.get("operation")
        try:
            check(body, kwargs.get("old"), operation, admission or Admission())
        except Refused as error:
            meta = body.get("metadata") or {}
            log.info("%s %s/%s refused: %s", operation, meta.get("namespace"), meta.get("name"), error)
            raise kopf.AdmissionError(str(error), code=422) from None


# ---- server and certificates ------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    port: int
    addr: str = "0.0.0.0"
    host: str | None = None
    """The host name or IP the API server uses to reach the webhook (managed configurations only)."""
    cert_dir: Path | None = None
    managed: str | None = None
    extra_sans: tuple[str, ...] = field(default_factory=tuple)
    max_object_bytes: int = MAX_OBJECT_BYTES
    max_jobs: int | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The webhook's flags (``--webhook-port`` is the operator's own)."""
    g = parser.add_argument_group("admission webhook")
    g.add_argument("--webhook-addr", help="listen address (default 0.0.0.0)")
    g.add_argument(
        "--webhook-host",
        help="host the API server reaches the webhook at, for a managed configuration (default: the pod IP "
        "from $POD_IP, else 127.0.0.1)",
    )
    g.add_argument(
        "--webhook-cert-dir",
        type=Path,
        help=f"directory with {CERT_FILE}, {KEY_FILE} and optionally {CA_FILE} (a mounted Secret); "
        "default: generate a CA and a certificate at start",
    )
    g.add_argument(
        "--webhook-managed",
        metavar="NAME",
        help="install Validating/MutatingWebhookConfigurations named NAME "
        "(default: off; the chart installs them)",
    )
    g.add_argument(
        "--webhook-extra-san", action="append", default=None, help="extra DNS name or IP for a generated cert"
    )
    g.add_argument(
        "--max-object-bytes",
        type=int,
        default=None,
        help=f"the API server's object size limit (etcd's --max-request-bytes; default {MAX_OBJECT_BYTES}): "
        "a job whose object would exceed it is refused at apply",
    )
    g.add_argument(
        "--max-jobs",
        type=int,
        default=None,
        help="refuse a new DispatchJob while the operator holds this many (its memory bound; default: "
        "no bound)",
    )


def options(port: int, args: argparse.Namespace | None = None, **given: Any) -> Options:
    """Options from explicit arguments, else flags, else the environment."""

    def pick(name: str) -> Any:
        if given.get(name) is not None:
            return given[name]
        value = getattr(args, f"webhook_{name}", None) if args is not None else None
        if value is not None:
            return value
        return os.environ.get(f"{ENV_PREFIX}{name.upper()}") or None

    cert_dir = pick("cert_dir")
    sans = pick("extra_sans") or pick("extra_san") or ()
    if isinstance(sans, str):
        sans = tuple(s.strip() for s in sans.split(",") if s.strip())
    return Options(
        port=port,
        addr=str(pick("addr") or "0.0.0.0"),
        host=pick("host") or os.environ.get("POD_IP") or None,
        cert_dir=Path(cert_dir) if cert_dir else None,
        managed=pick("managed"),
        extra_sans=tuple(sans),
        max_object_bytes=int(
            given.get("max_object_bytes") or getattr(args, "max_object_bytes", None) or MAX_OBJECT_BYTES
        ),
        max_jobs=given.get("max_jobs") or getattr(args, "max_jobs", None),
    )


def generate_certificates(
    directory: Path, hostnames: Sequence[str], *, days: int = CERT_DAYS
) -> tuple[Path, Path, Path]:
    """A CA and a serving certificate for ``hostnames`` (DNS names or IPs) in ``directory``.

    Returns (certificate, private key, CA certificate) paths; the key file is mode 0600.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dispatch-webhook-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    names: list[x509.GeneralName] = []
    seen: set[str] = set()
    for host in hostnames:
        if not host or host in seen:
            continue
        seen.add(host)
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            names.append(x509.DNSName(host))
        else:
            if not ip.is_unspecified:
                names.append(x509.IPAddress(ip))
    common = next((h for h in hostnames if h and not _is_ip(h)), "dispatch-webhook")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path, ca_path = directory / CERT_FILE, directory / KEY_FILE, directory / CA_FILE
    key_path.touch(mode=0o600)
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path, ca_path


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class _Server(kopf.WebhookServer):
    """kopf's webhook server, reading reviews of up to :data:`MAX_REVIEW_BYTES`: its aiohttp
    application keeps aiohttp's default of 1 MiB and has no setting for it, so each request is
    served as a clone that allows more."""

    @staticmethod
    async def _serve(fn: Any, request: aiohttp.web.Request) -> aiohttp.web.Response:
        return await kopf.WebhookServer._serve(fn, request.clone(client_max_size=MAX_REVIEW_BYTES))


def server(opts: Options) -> kopf.WebhookServer:
    """kopf's HTTPS webhook server for ``opts``, with certificates from ``cert_dir`` or generated."""
    host = opts.host or ("127.0.0.1" if opts.addr in ("0.0.0.0", "::", "") else opts.addr)
    if opts.cert_dir is not None:
        cert, key = opts.cert_dir / CERT_FILE, opts.cert_dir / KEY_FILE
        ca = opts.cert_dir / CA_FILE
        log.info("webhook certificates from %s", opts.cert_dir)
        return _Server(
            addr=opts.addr,
            port=opts.port,
            host=host,
            certfile=str(cert),
            pkeyfile=str(key),
            cafile=str(ca) if ca.exists() else None,
        )
    directory = Path(tempfile.mkdtemp(prefix="dispatch-webhook-"))
    hostnames = [host, opts.addr, "localhost", "127.0.0.1", *opts.extra_sans]
    cert, key, ca = generate_certificates(directory, hostnames)
    log.info("webhook certificates generated for %s", ", ".join(h for h in dict.fromkeys(hostnames) if h))
    return _Server(
        addr=opts.addr, port=opts.port, host=host, certfile=str(cert), pkeyfile=str(key), cafile=str(ca)
    )


def setup(
    *,
    registry: kopf.OperatorRegistry,
    settings: kopf.OperatorSettings,
    port: int,
    runtime: Configured | None = None,
    args: argparse.Namespace | None = None,
    held: Callable[[], int] = _none_held,
    **given: Any,
) -> Options:
    """Register the webhooks and configure kopf's webhook server (and managed configurations).

    ``runtime`` (the operator's :class:`~dispatch._controller.runtime.Runtime`) supplies the
    backends the webhook admits, their capabilities and previews (:meth:`Admission.of`; without
    it every registered backend is admitted with its default capabilities); ``held`` how many
    DispatchJobs the operator holds (for ``max_jobs``); ``args`` the flags of
    :func:`add_arguments`; ``given`` overrides (``addr``, ``host``, ``cert_dir``, ``managed``,
    ``extra_sans``, ``max_object_bytes``).
    """
    opts = options(port, args, **given)
    admission = (
        Admission.of(runtime, opts.max_object_bytes, opts.max_jobs, held) if runtime is not None else None
    )
    register(registry, admission)
    settings.admission.server = server(opts)
    settings.admission.managed = opts.managed
    log.info(
        "admission webhooks on %s:%d (paths /%s, /%s)%s",
        opts.addr,
        opts.port,
        WEBHOOK_VALIDATE_ID,
        WEBHOOK_MUTATE_ID,
        f", configurations {opts.managed} managed by the operator" if opts.managed else "",
    )
    return opts
