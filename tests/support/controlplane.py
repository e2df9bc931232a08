"""A real Kubernetes control plane (etcd + kube-apiserver) for tests, without Docker.

The binaries come from ``hack/build-bins.sh`` (``make bins``); they are looked up in
the environment variables ``DISPATCH_ETCD``, ``DISPATCH_KUBE_APISERVER`` and
``DISPATCH_KUBECTL`` first, then at the version-keyed paths the build script prints
with ``--print-env``.

The apiserver is started the way controller-runtime's envtest starts it: RBAC
authorization, client-certificate authentication, a ServiceAccount signing key pair,
no ServiceAccount admission plugin. Everything (certificates, etcd data, logs,
kubeconfigs) lives in one directory.

Python use::

    with ControlPlane(tmp_dir) as cp:
        cp.kubeconfig                      # admin (CN=dispatch-admin, O=system:masters)
        cp.mint_user("alice", ["team-a"])  # kubeconfig path for a client-cert identity
        cp.serviceaccount_kubeconfig("ns", "dispatch-operator")

CLI use (the daemons keep running after the command returns)::

    python -m tests.support.controlplane up --dir DIR     # writes DIR/kubeconfig, DIR/state.json
    python -m tests.support.controlplane down --dir DIR   # stops them by PID

Processes are started in their own process group and are always stopped by PID
(SIGTERM, then SIGKILL after a grace period) by :meth:`ControlPlane.stop`, the context
manager, an ``atexit`` hook and a SIGTERM/SIGHUP handler. On Linux the children also get
``PR_SET_PDEATHSIG`` so that they die with the test process even if it is SIGKILLed
(not for the detached CLI mode).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime as dt
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Protocol, cast

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-bins.sh"

ADMIN_USER = "dispatch-admin"
ADMIN_GROUPS = ("system:masters",)
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
STOP_GRACE_SECONDS = 10.0


class ControlPlaneError(RuntimeError):
    """The control plane could not be started or stopped."""


class _ExitedEarly(ControlPlaneError):
    """A daemon exited during start-up (e.g. its port was taken meanwhile): worth a retry."""


# --------------------------------------------------------------------------------------
# Binaries
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Binaries:
    etcd: str
    kube_apiserver: str
    kubectl: str


def _build_script_env() -> dict[str, str]:
    if not BUILD_SCRIPT.exists():
        return {}
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-env"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    env: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            env[key.strip()] = value.strip()
    return env


def resolve_binaries() -> Binaries:
    """Find etcd, kube-apiserver and kubectl (env vars first, then the build cache)."""
    keys = ("DISPATCH_ETCD", "DISPATCH_KUBE_APISERVER", "DISPATCH_KUBECTL")
    found = {k: os.environ.get(k, "") for k in keys}
    if not all(found.values()):
        script_env = _build_script_env()
        for k in keys:
            found[k] = found[k] or script_env.get(k, "")
    missing = [f"{k}={v or '?'}" for k, v in found.items() if not (v and os.access(v, os.X_OK))]
    if missing:
        raise ControlPlaneError(
            "control-plane binaries not found: "
            + ", ".join(missing)
            + " (run `make bins` or hack/build-bins.sh, or set the variables)"
        )
    return Binaries(
        etcd=found["DISPATCH_ETCD"],
        kube_apiserver=found["DISPATCH_KUBE_APISERVER"],
        kubectl=found["DISPATCH_KUBECTL"],
    )


# --------------------------------------------------------------------------------------
# Certificates
# --------------------------------------------------------------------------------------


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write(path: Path, data: bytes, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    tmp.replace(path)


def _certificate(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, *, ca: bool
) -> x509.CertificateBuilder:
    """A week's certificate of ``key`` (back-dated five minutes against clock skew), a CA's or a
    leaf's: only a CA may sign certificates and revocation lists."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + dt.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )


def _make_ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _certificate(name, name, key, ca=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _issue(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    *,
    common_name: str,
    organizations: Sequence[str] = (),
    server: bool = False,
    dns_names: Sequence[str] = (),
    ips: Sequence[str] = (),
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _new_key()
    # X.509 caps CN/O at 64 characters, but ServiceAccount user names
    # (system:serviceaccount:NS:NAME) can be longer; Go's parser and the apiserver accept
    # them, so build the name without the check (and without its warning).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o, _validate=False) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name, _validate=False))
    builder = (
        _certificate(x509.Name(attrs), ca_cert.subject, key, ca=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    if server:
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def loopback_tls(directory: Path, ca_name: str) -> tuple[ssl.SSLContext, Path]:
    """For a test's own TLS server on 127.0.0.1: its context (a certificate from a new CA, files
    in ``directory``) and the CA's file, which a client trusts."""
    ca_key, ca_cert = _make_ca(ca_name)
    key, cert = _issue(ca_key, ca_cert, common_name="localhost", server=True, ips=["127.0.0.1"])
    (directory / "tls.crt").write_bytes(_cert_pem(cert))
    (directory / "tls.key").write_bytes(_key_pem(key))
    (directory / "ca.crt").write_bytes(_cert_pem(ca_cert))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "tls.crt", directory / "tls.key")
    return context, directory / "ca.crt"


def _load_ca(pki: Path, stem: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = serialization.load_pem_private_key((pki / f"{stem}.key").read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ControlPlaneError(f"unexpected key type in {pki / stem}.key")
    cert = x509.load_pem_x509_certificate((pki / f"{stem}.crt").read_bytes())
    return key, cert


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:100] or "user"


# --------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def set_pdeathsig() -> None:  # runs in the child between fork and exec
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not reaped by its parent) counts as gone
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _pid_runs(pid: int, binary: str) -> bool:
    """True when PID is alive and is still the process we started (guards against PID reuse)."""
    if not _pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return sys.platform != "linux"
    return bool(cmdline) and cmdline[0].decode(errors="replace") == binary


def _terminate(pid: int, binary: str, popen: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM the process group of PID, SIGKILL it after the grace period, reap it."""
    if popen is not None and popen.poll() is not None:
        return
    if popen is None and not _pid_runs(pid, binary):
        return
    for sig, grace in ((signal.SIGTERM, STOP_GRACE_SECONDS), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)  # started with start_new_session, so pgid == pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if popen is not None:
                if popen.poll() is not None:
                    return
            elif not _pid_alive(pid):
                return
            time.sleep(0.05)
    raise ControlPlaneError(f"process {pid} ({binary}) did not exit after SIGKILL")


@dataclass
class _Proc:
    name: str
    binary: str
    pid: int
    log: Path
    popen: subprocess.Popen[bytes] | None = None


# --------------------------------------------------------------------------------------
# The control plane
# --------------------------------------------------------------------------------------


class ControlPlane:
    """etcd + kube-apiserver on 127.0.0.1, free ports, fresh data, certificates made at start."""

    def __init__(
        self,
        workdir: Path | str,
        *,
        binaries: Binaries | None = None,
        start_timeout: float = 60.0,
        extra_apiserver_args: Sequence[str] = (),
        service_accounts: bool = False,
    ) -> None:
        self.dir = Path(workdir).resolve()
        self.binaries = binaries
        self.start_timeout = start_timeout
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.service_accounts = service_accounts
        """The ServiceAccount admission plugin on: pods get their ServiceAccount's token mounted
        (what an in-cluster client needs), and a pod whose ServiceAccount does not exist yet is
        refused. Off by default: no kubelet mounts anything on kwok's nodes, and controllers'
        pods in a namespace made a moment ago would be refused until its ``default`` exists."""
        self.pki = self.dir / "pki"
        self.kubeconfig = self.dir / "kubeconfig"
        self.state_file = self.dir / "state.json"
        self.server = ""
        self.etcd_url = ""
        self.start_seconds = 0.0
        self._procs: list[_Proc] = []
        self._lock = threading.RLock()  # stop() may re-enter from a signal handler
        self._hooks_installed = False
        self._previous_handlers: dict[int, Any] = {}

    # ---- lifecycle -----------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def control_plane(self) -> ControlPlane:
        """Itself (the lab, built on a control plane, answers its own)."""
        return self

    def start(self, *, detach: bool = False, attempts: int = 3) -> None:
        """Start etcd and kube-apiserver and wait for /readyz.

        With ``detach=True`` (the CLI ``up``) the daemons outlive this process: no atexit
        or signal hooks and no parent-death signal; stop them with :func:`down`.
        """
        if self._procs:
            raise ControlPlaneError("control plane already started")
        if self.binaries is None:
            self.binaries = resolve_binaries()
        self.dir.mkdir(parents=True, exist_ok=True)
        if not detach:
            self._install_hooks()
        t0 = time.monotonic()
        self._make_pki()
        for attempt in range(1, attempts + 1):
            try:
                self._start_once(detach=detach)
                break
            except _ExitedEarly:  # a free port can be taken between probe and bind
                self.stop()
                if attempt == attempts:
                    raise
            except BaseException:
                self.stop()
                raise
        self.start_seconds = time.monotonic() - t0
        self._write_state()

    def stop(self) -> None:
        """Stop every process this object started (apiserver first), then drop the etcd data."""
        with self._lock:
            errors: list[str] = []
            for proc in reversed(self._procs):
                try:
                    _terminate(proc.pid, proc.binary, proc.popen)
                except ControlPlaneError as e:
                    errors.append(str(e))
            self._procs.clear()
            shutil.rmtree(self.dir / "etcd-data", ignore_errors=True)
            if self.state_file.exists():
                self.state_file.unlink()
            if errors:
                raise ControlPlaneError("; ".join(errors))

    @property
    def pids(self) -> dict[str, int]:
        return {p.name: p.pid for p in self._procs}

    def replace_apiserver(self, binary: str) -> None:
        """Stop kube-apiserver and start ``binary`` in its place with the same flags, port and etcd:
        one lab, two builds of the API server (bench/operator_scale.py's ``--hold``). Every client's
        watches break and list again, as in a real API server's rolling restart."""
        with self._lock:
            i, old = next((i, p) for i, p in enumerate(self._procs) if p.name == "kube-apiserver")
            if old.popen is None:
                raise ControlPlaneError("kube-apiserver was not started by this process")
            args = [str(a) for a in cast(Sequence[str], old.popen.args)][1:]
            _terminate(old.pid, old.binary, old.popen)
            del self._procs[i]
            new = self._spawn("kube-apiserver", binary, args, detach=False)
            self._procs.remove(new)
            self._procs.insert(i, new)
            self._write_state()
        self._wait_http(
            new, f"{self.server}/readyz", self._admin_ssl_context(), time.monotonic() + self.start_timeout
        )

    # ---- identities ----------------------------------------------------------------

    def mint_user(self, name: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig authenticating as user NAME in GROUPS (client certificate).

        The apiserver maps the certificate CN to the user name and each O to a group;
        ``system:authenticated`` is added by the apiserver itself.
        """
        if not self.server:
            raise ControlPlaneError("control plane not started")
        ca_key, ca_cert = _load_ca(self.pki, "client-ca")
        key, cert = _issue(ca_key, ca_cert, common_name=name, organizations=list(groups))
        path = self.dir / "users" / f"{_safe_name(name)}.kubeconfig"
        _write(path, self._kubeconfig_yaml(name, _cert_pem(cert), _key_pem(key)))
        return path

    def serviceaccount_kubeconfig(self, namespace: str, name: str) -> Path:
        """A kubeconfig acting as ``system:serviceaccount:NAMESPACE:NAME``.

        Uses a client certificate with that CN and the groups the ServiceAccount token
        authenticator would give (``system:serviceaccounts``,
        ``system:serviceaccounts:NAMESPACE``; ``system:authenticated`` is implicit), so
        RBAC bindings to the ServiceAccount subject apply. The ServiceAccount object need
        not exist.
        """
        return self.mint_user(
            f"system:serviceaccount:{namespace}:{name}",
            ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
        )

    # ---- internals -----------------------------------------------------------------

    def _make_pki(self) -> None:
        pki = self.pki
        if pki.exists():
            shutil.rmtree(pki)
        ca_key, ca_cert = _make_ca("dispatch-test-server-ca")
        _write(pki / "server-ca.crt", _cert_pem(ca_cert), 0o644)
        _write(pki / "server-ca.key", _key_pem(ca_key))
        key, cert = _issue(
            ca_key,
            ca_cert,
            common_name="kube-apiserver",
            server=True,
            dns_names=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
            ips=["127.0.0.1", "10.0.0.1"],
        )
        _write(pki / "apiserver.crt", _cert_pem(cert), 0o644)
        _write(pki / "apiserver.key", _key_pem(key))

        cca_key, cca_cert = _make_ca("dispatch-test-client-ca")
        _write(pki / "client-ca.crt", _cert_pem(cca_cert), 0o644)
        _write(pki / "client-ca.key", _key_pem(cca_key))

        sa_key = _new_key()
        _write(pki / "sa.key", _key_pem(sa_key))
        _write(
            pki / "sa.pub",
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
            0o644,
        )

        akey, acert = _issue(cca_key, cca_cert, common_name=ADMIN_USER, organizations=list(ADMIN_GROUPS))
        self._admin_cert = pki / "admin.crt"
        self._admin_key = pki / "admin.key"
        _write(self._admin_cert, _cert_pem(acert), 0o644)
        _write(self._admin_key, _key_pem(akey))

    def _kubeconfig_yaml(self, user: str, cert_pem: bytes, key_pem: bytes) -> bytes:
        import base64

        def b64(b: bytes) -> str:
            return base64.b64encode(b).decode("ascii")

        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "dispatch-test",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": b64((self.pki / "server-ca.crt").read_bytes()),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": b64(cert_pem),
                        "client-key-data": b64(key_pem),
                    },
                }
            ],
            "contexts": [
                {
                    "name": "dispatch-test",
                    "context": {"cluster": "dispatch-test", "user": user, "namespace": "default"},
                }
            ],
            "current-context": "dispatch-test",
        }
        return yaml.safe_dump(cfg, sort_keys=False).encode()

    def spawn(
        self,
        name: str,
        binary: str,
        args: Sequence[str],
        *,
        detach: bool = False,
        env: dict[str, str] | None = None,
    ) -> _Proc:
        """Start another daemon that belongs to this control plane (stopped with it, before it)."""
        proc = self._spawn(name, binary, list(args), detach=detach, env=env)
        self._write_state()
        return proc

    def wait_http(
        self, proc: _Proc, url: str, *, admin_tls: bool = False, timeout: float | None = None
    ) -> None:
        """Wait until URL answers 200 (with the admin client certificate when ``admin_tls``)."""
        ctx: ssl.SSLContext | None = None
        if admin_tls:
            ctx = self._admin_ssl_context()
        elif url.startswith("https://"):  # a component's self-signed serving cert: only liveness matters
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        self._wait_http(proc, url, ctx, time.monotonic() + (timeout or self.start_timeout))

    def admin_ssl_context(self) -> ssl.SSLContext:
        return self._admin_ssl_context()

    def _spawn(
        self, name: str, binary: str, args: list[str], *, detach: bool, env: dict[str, str] | None = None
    ) -> _Proc:
        log = self.dir / f"{name}.log"
        preexec = None
        if not detach and sys.platform == "linux" and threading.current_thread() is threading.main_thread():
            # PDEATHSIG fires when the *thread* that forked exits, so only from the main thread.
            preexec = set_pdeathsig
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                [binary, *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                start_new_session=True,
                preexec_fn=preexec,
                env=None if env is None else {**os.environ, **env},
            )
        proc = _Proc(name=name, binary=binary, pid=popen.pid, log=log, popen=popen)
        self._procs.append(proc)
        return proc

    def _start_once(self, *, detach: bool) -> None:
        assert self.binaries is not None
        deadline = time.monotonic() + self.start_timeout
        etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
        self.etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        data = self.dir / "etcd-data"
        shutil.rmtree(data, ignore_errors=True)
        etcd = self._spawn(
            "etcd",
            self.binaries.etcd,
            [
                "--name=dispatch-test",
                f"--data-dir={data}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=dispatch-test={peer_url}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
            detach=detach,
        )
        self._wait_http(etcd, f"{self.etcd_url}/health", None, deadline)

        self.server = f"https://127.0.0.1:{api_port}"
        pki = self.pki
        api = self._spawn(
            "kube-apiserver",
            self.binaries.kube_apiserver,
            [
                f"--etcd-servers={self.etcd_url}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'client-ca.crt'}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--allow-privileged=true",
                *([] if self.service_accounts else ["--disable-admission-plugins=ServiceAccount"]),
                "--authorization-mode=RBAC",
                f"--service-account-issuer={self.server}/",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                *self.extra_apiserver_args,
            ],
            detach=detach,
        )
        _write(self.kubeconfig, self._admin_kubeconfig())
        self._wait_http(api, f"{self.server}/readyz", self._admin_ssl_context(), deadline)

    def _admin_kubeconfig(self) -> bytes:
        return self._kubeconfig_yaml(ADMIN_USER, self._admin_cert.read_bytes(), self._admin_key.read_bytes())

    def _admin_ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "server-ca.crt"))
        ctx.load_cert_chain(str(self._admin_cert), str(self._admin_key))
        return ctx

    def _wait_http(self, proc: _Proc, url: str, ctx: ssl.SSLContext | None, deadline: float) -> None:
        last = ""
        while time.monotonic() < deadline:
            if proc.popen is not None and proc.popen.poll() is not None:
                raise _ExitedEarly(
                    f"{proc.name} exited with {proc.popen.returncode}; log {proc.log}:\n" + _tail(proc.log)
                )
            try:
                with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}"
                e.close()
            except (OSError, ssl.SSLError) as e:
                last = repr(e)
            time.sleep(0.1)
        raise ControlPlaneError(
            f"{proc.name} not ready at {url} ({last}); log {proc.log}:\n" + _tail(proc.log)
        )

    def _write_state(self) -> None:
        state = {
            "dir": str(self.dir),
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "etcd_url": self.etcd_url,
            "kubectl": self.binaries.kubectl if self.binaries else "",
            "start_seconds": round(self.start_seconds, 2),
            "processes": [
                {"name": p.name, "pid": p.pid, "binary": p.binary, "log": str(p.log)} for p in self._procs
            ],
        }
        _write(self.state_file, json.dumps(state, indent=2).encode(), 0o644)

    # ---- cleanup hooks -------------------------------------------------------------

    def _install_hooks(self) -> None:
        if self._hooks_installed:
            return
        self._hooks_installed = True
        atexit.register(self._stop_quietly)
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGHUP):
            previous = signal.getsignal(signum)
            self._previous_handlers[signum] = previous
            signal.signal(signum, self._on_signal)

    def _stop_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop_quietly()
        previous = self._previous_handlers.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
            return
        if previous == signal.SIG_IGN:
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def control_plane(workdir: Path | str, **kwargs: Any) -> Iterator[ControlPlane]:
    """``with control_plane(dir) as cp: ...`` — starts and always stops."""
    cp = ControlPlane(workdir, **kwargs)
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def down(workdir: Path | str) -> list[int]:
    """Stop the processes recorded in WORKDIR/state.json (by PID); returns the PIDs handled."""
    d = Path(workdir).resolve()
    state_file = d / "state.json"
    if not state_file.exists():
        return []
    state = json.loads(state_file.read_text())
    pids: list[int] = []
    errors: list[str] = []
    for p in reversed(state.get("processes", [])):
        pid, binary = int(p["pid"]), str(p["binary"])
        pids.append(pid)
        try:
            _terminate(pid, binary, None)
        except ControlPlaneError as e:
            errors.append(str(e))
    if errors:
        raise ControlPlaneError("; ".join(errors))
    shutil.rmtree(d / "etcd-data", ignore_errors=True)
    state_file.unlink()
    return pids


def already_running(workdir: Path | str) -> str:
    """Why ``up`` must not start in WORKDIR (a recorded process still runs), or ''."""
    state_file = Path(workdir).resolve() / "state.json"
    if state_file.exists():
        state = json.loads(state_file.read_text())
        if any(_pid_runs(int(p["pid"]), str(p["binary"])) for p in state.get("processes", [])):
            return f"already running (see {state_file}); run `down --dir {workdir}` first"
    return ""


def abandon(cp: ControlPlane) -> None:
    """Leave the detached daemons running when this process exits (``up``; ``down`` stops them)."""
    for proc in cp._procs:
        if proc.popen is not None:
            proc.popen.returncode = 0  # keeps Popen.__del__ from warning "still running"
            proc.popen = None


class _Detachable(Protocol):
    """What ``detached_cli`` starts: a control plane, or something built on one (the lab)."""

    start_seconds: float

    @property
    def server(self) -> str: ...
    @property
    def kubeconfig(self) -> Path: ...
    @property
    def control_plane(self) -> ControlPlane: ...
    def start(self, *, detach: bool = False) -> None: ...
    def stop(self) -> None: ...


def detached_cli(
    argv: Sequence[str] | None,
    *,
    prog: str,
    what: str,
    timeout: float,
    make: Callable[[argparse.Namespace], _Detachable],
    add_arguments: Callable[[argparse.ArgumentParser], None] = lambda _: None,
) -> int:
    """``up --dir D`` starts ``make(args)`` detached and prints its KUBECONFIG; ``down --dir D``
    stops by PID what ``up`` started there. One command line for the control plane and the lab."""
    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="cmd", required=True)
    up_p = sub.add_parser("up", help=f"start {what} in the background")
    up_p.add_argument("--dir", required=True, type=Path)
    up_p.add_argument("--timeout", type=float, default=timeout)
    add_arguments(up_p)
    down_p = sub.add_parser("down", help="stop what `up` started (by PID)")
    down_p.add_argument("--dir", required=True, type=Path)
    args = parser.parse_args(argv)

    if args.cmd == "up":
        busy = already_running(args.dir)
        if busy:
            print(busy, file=sys.stderr)
            return 1
        running = make(args)
        try:
            running.start(detach=True)
        except BaseException:
            running.stop()
            raise
        abandon(running.control_plane)
        print(f"{what} ready in {running.start_seconds:.1f}s: {running.server}")
        print(f"pids: {running.control_plane.pids}")
        print(f"export KUBECONFIG={running.kubeconfig}")
        return 0

    try:
        pids = down(args.dir)
    except ControlPlaneError as e:
        print(str(e), file=sys.stderr)
        return 1
    print(f"stopped {pids}" if pids else f"nothing running in {args.dir}")
    return 0


def _cli(argv: Sequence[str] | None = None) -> int:
    return detached_cli(
        argv,
        prog="python -m tests.support.controlplane",
        what="control plane",
        timeout=60.0,
        make=lambda args: ControlPlane(args.dir, start_timeout=args.timeout),
    )


if __name__ == "__main__":
    sys.exit(_cli())
