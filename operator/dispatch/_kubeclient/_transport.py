"""dispatch's own connection to the API server: a kubeconfig (or a pod's service account) read into
a :class:`Connection`, and one aiohttp session that sends raw JSON requests with it
(:class:`KubeClient`).

Why not kubernetes_asyncio's client: importing it loads about a thousand generated model modules,
tens of MiB of the operator's RSS, while dispatch sends and reads plain dicts anyway.
:class:`KubeClient` keeps the two entry points dispatch's code uses on a client (``call_api`` with
``_preload_content=False`` and ``rest_client.request``, which the metrics and the write limiter
wrap), so either client can be handed to the same code.

Supported in a kubeconfig: ``server``, ``certificate-authority(-data)``,
``insecure-skip-tls-verify``, ``tls-server-name``, ``client-certificate(-data)``,
``client-key(-data)``, ``token``, ``tokenFile``, ``username``/``password``; relative paths are
relative to the kubeconfig's directory. Proxies (``HTTPS_PROXY``, ``proxy-url``) and ~/.netrc are not
used. Not supported (a :class:`~dispatch.ConfigError` naming the
field): ``exec`` and ``auth-provider`` plugins.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import json
import os
import ssl
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import yaml

from .._config import RereadFile
from .._errors import ConfigError

IN_CLUSTER_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_KUBECONFIG: Final = "~/.kube/config"
REQUEST_CONNECTIONS: Final = 100
"""Parallel connections for every request but watches (kubernetes_asyncio's default, kept); more
requests wait for one of them. Fewer connections bound a mass preemption's sockets but delay its
releases: on a small control plane the writes in flight are what keeps up with kube-scheduler. The
memory of each is bounded instead (``dispatch._controller.main``)."""


@dataclass(frozen=True)
class Connection:
    """Where the API server is and how to authenticate to it; files, not data, for TLS material
    (``ssl`` loads certificates from files; inline data goes to private temporary files)."""

    host: str
    ca_file: str | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token: str | None = None
    token_file: str | None = None
    """Read again whenever it changes (a projected service-account token rotates)."""
    username: str | None = None
    password: str | None = None
    namespace: str | None = None
    source: str = ""
    """Where this came from, for messages: ``kubeconfig PATH, context NAME`` or ``in-cluster``."""
    _token_file: RereadFile | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.token_file:
            object.__setattr__(self, "_token_file", RereadFile(self.token_file))

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, keyfile=self.key_file)
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def bearer_token(self) -> str | None:
        """The token to send: ``token``, else the token file's content, re-read when it changed."""
        if self.token:
            return self.token
        if self._token_file is None:
            return None
        try:
            return self._token_file.read()
        except OSError as error:
            raise ConfigError(f"{self.source}: token file {self.token_file}: {error.strerror}") from None

    def authorization(self) -> str | None:
        """The ``Authorization`` header's value, or None (client certificates only)."""
        token = self.bearer_token()
        if token:
            return f"Bearer {token}"
        if self.username is not None and self.password is not None:
            return aiohttp.BasicAuth(self.username, self.password).encode()
        return None


def in_cluster_available(directory: str = IN_CLUSTER_DIR) -> bool:
    return os.path.exists(os.path.join(directory, "token")) and "KUBECONFIG" not in os.environ


def load_in_cluster(
    *, directory: str = IN_CLUSTER_DIR, environ: Mapping[str, str] | None = None
) -> Connection:
    """A pod's service account: ``KUBERNETES_SERVICE_HOST``/``_PORT``, ``token``, ``ca.crt``."""
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ConfigError("in-cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both be set")
    token_file = os.path.join(directory, "token")
    ca_file = os.path.join(directory, "ca.crt")
    for path in (token_file, ca_file):
        if not os.path.isfile(path):
            raise ConfigError(f"in-cluster: {path} does not exist")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    namespace_file = os.path.join(directory, "namespace")
    namespace = None
    if os.path.isfile(namespace_file):
        with open(namespace_file, encoding="utf-8") as f:
            namespace = f.read().strip() or None
    connection = Connection(
        host=f"https://{host}:{port}",
        ca_file=ca_file,
        token_file=token_file,
        namespace=namespace,
        source="in-cluster",
    )
    connection.bearer_token()  # unreadable: fail now, not at the first request
    return connection


def kubeconfig_paths(kubeconfig: str | None = None) -> list[str]:
    """The files to read: ``kubeconfig``, else $KUBECONFIG's (path-separated), else ~/.kube/config."""
    if kubeconfig is not None:
        return [kubeconfig]
    if os.environ.get("KUBECONFIG"):
        return [p for p in os.environ["KUBECONFIG"].split(os.pathsep) if p]
    return [os.path.expanduser(DEFAULT_KUBECONFIG)]


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            document = yaml.safe_load(f)
    except OSError as error:
        raise ConfigError(f"kubeconfig {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"kubeconfig {path}: not YAML: {error}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(f"kubeconfig {path}: not a mapping")
    return document


def load_kubeconfig(kubeconfig: str | None = None, *, context: str | None = None) -> Connection:
    """The connection of ``context`` (else ``current-context``) in the kubeconfig file(s).

    Several files ($KUBECONFIG) merge as kubectl merges them: the first file naming a cluster,
    user or context (or ``current-context``) wins.
    """
    paths = kubeconfig_paths(kubeconfig)
    named: dict[str, dict[str, tuple[str, Any]]] = {"clusters": {}, "users": {}, "contexts": {}}
    current: str | None = None
    for path in paths:
        if kubeconfig is None and not os.path.exists(path):
            continue  # kubectl skips missing files of $KUBECONFIG
        document = _read(path)
        current = current or document.get("current-context") or None
        for section, entries in named.items():
            for entry in document.get(section) or []:
                if isinstance(entry, dict) and entry.get("name") is not None:
                    entries.setdefault(str(entry["name"]), (path, entry.get(section[:-1]) or {}))
    where = "kubeconfig " + " or ".join(paths)
    name = context or current
    if not name:
        raise ConfigError(f"{where}: no current-context (pass a context)")
    if name not in named["contexts"]:
        raise ConfigError(f"{where}: no context named {name!r}")
    path, ctx = named["contexts"][name]
    source = f"kubeconfig {path}, context {name}"
    cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
    if not cluster_name:
        raise ConfigError(f"{source}: the context has no cluster")
    if cluster_name not in named["clusters"]:
        raise ConfigError(f"{source}: no cluster named {cluster_name!r}")
    cluster_path, cluster = named["clusters"][cluster_name]
    user_path, user = named["users"].get(user_name, (path, {})) if user_name else (path, {})
    if user_name and user_name not in named["users"]:
        raise ConfigError(f"{source}: no user named {user_name!r}")
    for plugin in ("exec", "auth-provider"):
        if user.get(plugin):
            raise ConfigError(
                f"{source}: user {user_name!r} uses {plugin!r}, which dispatch does not support "
                "(use a token, tokenFile or a client certificate; docs/install.md)"
            )
    server = cluster.get("server")
    if not server:
        raise ConfigError(f"{source}: cluster {cluster_name!r} has no server")
    cluster_at = f"{source}: cluster {cluster_name!r}"
    user_at = f"{source}: user {user_name!r}"
    cert = _material(user, "client-certificate", user_path, user_at)
    key = _material(user, "client-key", user_path, user_at)
    if bool(cert) != bool(key):
        raise ConfigError(f"{user_at}: client-certificate and client-key go together (one is missing)")
    token_file = _path(user.get("tokenFile"), user_path) if user.get("tokenFile") else None
    if token_file and not os.path.isfile(token_file):
        raise ConfigError(f"{user_at}: tokenFile {token_file} does not exist")
    return Connection(
        host=str(server).rstrip("/"),
        ca_file=_material(cluster, "certificate-authority", cluster_path, cluster_at),
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        tls_server_name=cluster.get("tls-server-name") or None,
        cert_file=cert,
        key_file=key,
        token=str(user["token"]) if user.get("token") else None,
        token_file=token_file,
        username=user.get("username"),
        password=user.get("password"),
        namespace=ctx.get("namespace") or None,
        source=source,
    )


def _path(value: Any, kubeconfig: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(kubeconfig)), os.path.expanduser(str(value)))


def _material(section: Mapping[str, Any], key: str, kubeconfig: str, where: str) -> str | None:
    """The file holding ``key`` (``KEY-data``, base64, goes to a private temporary file)."""
    data = section.get(f"{key}-data")
    if data:
        try:
            raw = base64.b64decode(str(data), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{where}: {key}-data is not base64") from None
        handle, path = tempfile.mkstemp(prefix="dispatch-kube-")  # mode 0600
        with os.fdopen(handle, "wb") as f:
            f.write(raw)
        atexit.register(_remove, path)  # a key must not outlive the process in /tmp
        return path
    if section.get(key):
        path = _path(section[key], kubeconfig)
        if not os.path.isfile(path):
            raise ConfigError(f"{where}: {key} {path} does not exist")
        return path
    return None


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def load_connection(kubeconfig: str | None = None, *, context: str | None = None) -> Connection:
    """An explicit ``kubeconfig`` wins; without one, a pod's service account is used when present."""
    if kubeconfig is None and context is None and in_cluster_available():
        return load_in_cluster()
    return load_kubeconfig(kubeconfig, context=context)


def _timeout(value: Any) -> aiohttp.ClientTimeout:
    """kubernetes_asyncio's semantics: a number is the total, a pair (connect, read), None none."""
    if isinstance(value, aiohttp.ClientTimeout):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return aiohttp.ClientTimeout(connect=value[0], sock_connect=value[0], sock_read=value[1])
    if value:
        return aiohttp.ClientTimeout(total=float(value))
    return aiohttp.ClientTimeout()


class _Rest:
    """The one method every request goes through (what the metrics and write limit wrap)."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    async def request(
        self,
        method: str,
        url: str,
        query_params: Sequence[tuple[str, str]] | None = None,
        headers: Mapping[str, str] | None = None,
        body: Any = None,
        post_params: Any = None,
        _preload_content: bool = True,
        _request_timeout: Any = None,
    ) -> aiohttp.ClientResponse:
        """Send; returns the open response, whatever its status (the caller checks it and releases)."""
        data: bytes | str | None = None
        if body is not None:
            data = body if isinstance(body, bytes | str) else json.dumps(body)
        session = self._client.session(watch=is_watch(query_params or ()))
        server_hostname = self._client.connection.tls_server_name
        return await session.request(
            method.upper(),
            url,
            params=list(query_params or []) or None,
            headers=dict(headers or {}),
            data=data,
            timeout=_timeout(_request_timeout),
            server_hostname=server_hostname,
        )


def is_watch(query_params: Iterable[tuple[str, object]]) -> bool:
    """Whether a request's query asks for a watch (``watch=true``)."""
    return any(k == "watch" and str(v).lower() in ("true", "1") for k, v in query_params)


class KubeClient:
    """Two aiohttp sessions to one API server: one for watches, each holding its connection as long
    as it lasts, and one of :data:`REQUEST_CONNECTIONS` connections for every other request (a
    bounded pool shared with the watches would let watches take every connection)."""

    def __init__(self, connection: Connection, *, user_agent: str = "dispatch") -> None:
        self.connection = connection
        self.user_agent = user_agent
        self.rest_client = _Rest(self)
        self._sessions: dict[bool, aiohttp.ClientSession] = {}

    def session(self, *, watch: bool = False) -> aiohttp.ClientSession:
        """Made at the first request, inside the running event loop (aiohttp requires one)."""
        session = self._sessions.get(watch)
        if session is None or session.closed:
            limit = 0 if watch else REQUEST_CONNECTIONS  # 0: no limit
            connector = aiohttp.TCPConnector(limit=limit, ssl=self.connection.ssl_context())
            # trust_env=False: with it, aiohttp looks up ~/.netrc in a thread for every request
            # (5.6% of the busy loop in py-spy); no proxy variables are read either.
            session = self._sessions[watch] = aiohttp.ClientSession(connector=connector, trust_env=False)
        return session

    async def call_api(
        self,
        resource_path: str,
        method: str,
        *,
        query_params: Sequence[tuple[str, str]] | None = None,
        header_params: Mapping[str, str] | None = None,
        body: Any = None,
        auth_settings: Any = None,
        _preload_content: bool = False,
        _request_timeout: Any = None,
    ) -> aiohttp.ClientResponse:
        """``resource_path`` (``/api/v1/...``) on the server; the response is open, not checked."""
        headers = {"User-Agent": self.user_agent, **(header_params or {})}
        authorization = self.connection.authorization()
        if authorization:
            headers["Authorization"] = authorization
        return await self.rest_client.request(
            method,
            self.connection.host + resource_path,
            query_params=query_params,
            headers=headers,
            body=body,
            _preload_content=_preload_content,
            _request_timeout=_request_timeout,
        )

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            await session.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = [
    "Connection",
    "KubeClient",
    "in_cluster_available",
    "is_watch",
    "kubeconfig_paths",
    "load_connection",
    "load_in_cluster",
    "load_kubeconfig",
]
