"""A real node for the test lab: kubelet + containerd + runc + a CNI bridge + CoreDNS, on this machine.

kwok plays every other node of the lab (:mod:`tests.support.lab`): a container's exit code, an
OOM kill or a pod's termination are what kwok's stages write. On this node they are what a real
kubelet observes: a process that exits 3 gives ``exitCode: 3``, a memory cgroup limit gives
``OOMKilled``/137, a deleted pod's process gets SIGTERM and, after the grace period, SIGKILL, and
pod DNS is CoreDNS serving the lab's Services. It is opt-in (the ``real_node`` fixture of
``tests/integration/conftest.py``) and needs root and ``make node-deps`` (``hack/build-node.sh``).

The pieces, all started and stopped here, all state in one work directory:

- a Linux bridge ``BRIDGE`` with ``NODE_IP``: the node's address, the pods' gateway, the
  kubelet's listen address and CoreDNS's. The pod network (``POD_SUBNET``, host-local IPAM) is
  local to this machine: no default route in pods, no masquerade, no iptables rule.
- containerd 1.6 (Debian's; CRI v1, cgroupfs, runc) with its root, state and sockets in the work
  directory, the two images of ``hack/build-node.sh`` imported at start (no registry is
  reachable: every pod says ``imagePullPolicy: Never``).
- CoreDNS as a host process on ``NODE_IP:53``: ``cluster.local`` from the lab's API server,
  NXDOMAIN for every other name (nothing leaves the machine). It is the kubelet's ``clusterDNS``.
- kubelet v1.34 with a client certificate from the lab's CA (``system:node:NAME`` in
  ``system:nodes``, bound to the ``system:node`` ClusterRole: the lab's API server authorizes
  with RBAC only). The Node carries the label and the NoSchedule taint ``REAL_NODE_KEY``: only a
  pod that selects and tolerates it (:meth:`RealNode.placement`) lands here.

What this machine kind needs (the reasons are in docs/real-node.md): root lacks CAP_SYS_RESOURCE,
so containerd clamps containers' ``oom_score_adj`` (``restrict_oom_score_adj``) and the kubelet
keeps its own at 0; there is no systemd (cgroupfs driver, no graceful node shutdown); cgroups
are v1. The kubelet changes a few kernel tunables when it starts (``setupKernelTunables``) and the
bridge plugin turns on IP forwarding: :data:`HOST_SYSCTLS` are saved before anything starts and
written back once the Node is Ready and again at stop.

One real node per machine (the bridge, the node address and some kubelet and containerd paths
are machine-wide): a lock file serializes them.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

import yaml

from tests.support.controlplane import REPO_ROOT, SERVICE_CLUSTER_IP_RANGE
from tests.support.lab import Lab

BUILD_SCRIPT: Final = REPO_ROOT / "hack" / "build-node.sh"
TORCH_BUILD_SCRIPT: Final = REPO_ROOT / "hack" / "build-torch-image.sh"
NODE_NAME: Final = "dispatch-real-node"
REAL_NODE_KEY: Final = "lab.dispatch.io/real-node"
"""The real node's label and the key of its NoSchedule taint (value ``"true"``)."""
BRIDGE: Final = "dispatch0"
NODE_IP: Final = "10.123.0.1"
POD_SUBNET: Final = "10.123.0.0/24"
POD_RANGE: Final = ("10.123.0.10", "10.123.0.250")
CLUSTER_DOMAIN: Final = "cluster.local"
CNI_NETWORK: Final = "dispatch-lab"
LOCK_FILE: Final = Path("/tmp/dispatch-real-node.lock")
HOST_SYSCTLS: Final = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
)
API_SERVICE_IP: Final = str(ipaddress.ip_network(SERVICE_CLUSTER_IP_RANGE)[1])
"""The ``kubernetes`` Service's ClusterIP (the range's first address), which the kubelet gives
pods as ``KUBERNETES_SERVICE_HOST`` (with port 443); the API server's certificate names it."""
API_SERVICE_PORT: Final = 443
COREDNS_USER: Final = "dispatch-lab:coredns"
STOP_GRACE_SECONDS: Final = 15.0
SOCKET_PATH_MAX: Final = 100
"""A unix socket path must fit sockaddr_un (108 bytes); containerd's live in the work directory."""


class NodeError(RuntimeError):
    """The real node could not start (or a part of it stopped working)."""


@dataclass(frozen=True)
class NodeBinaries:
    """What ``hack/build-node.sh`` installs and builds (``--print-env``)."""

    kubelet: str
    coredns: str
    containerd: str
    ctr: str
    runc: str
    cni_bin_dir: str
    pause_image: Path
    pause_tag: str
    test_image: Path
    test_tag: str


def resolve_node_binaries() -> NodeBinaries:
    """The node's binaries and images: environment variables first, then the paths
    ``hack/build-node.sh --print-env`` prints; fails naming what is missing."""
    keys = {
        "kubelet": "DISPATCH_KUBELET",
        "coredns": "DISPATCH_COREDNS",
        "containerd": "DISPATCH_CONTAINERD",
        "ctr": "DISPATCH_CTR",
        "runc": "DISPATCH_RUNC",
        "cni_bin_dir": "DISPATCH_CNI_BIN_DIR",
        "pause_image": "DISPATCH_NODE_PAUSE_IMAGE",
        "pause_tag": "DISPATCH_NODE_PAUSE_TAG",
        "test_image": "DISPATCH_NODE_TEST_IMAGE",
        "test_tag": "DISPATCH_NODE_TEST_TAG",
    }
    found = {field: os.environ.get(env, "") for field, env in keys.items()}
    if not all(found.values()):
        out = subprocess.run(
            ["bash", str(BUILD_SCRIPT), "--print-env"], check=True, capture_output=True, text=True
        ).stdout
        script = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        found = {field: value or script.get(keys[field], "") for field, value in found.items()}
    missing = [
        f"{keys[field]}={value or '?'}"
        for field, value in found.items()
        if not field.endswith("_tag")
        and not (
            Path(value).is_dir()
            if field == "cni_bin_dir"
            else Path(value).is_file()
            if field.endswith("_image")
            else os.access(value, os.X_OK)
        )
    ]
    if missing:
        raise NodeError("real node parts not found: " + ", ".join(missing) + " (run `make node-deps`)")
    return NodeBinaries(
        kubelet=found["kubelet"],
        coredns=found["coredns"],
        containerd=found["containerd"],
        ctr=found["ctr"],
        runc=found["runc"],
        cni_bin_dir=found["cni_bin_dir"],
        pause_image=Path(found["pause_image"]),
        pause_tag=found["pause_tag"],
        test_image=Path(found["test_image"]),
        test_tag=found["test_tag"],
    )


@dataclass(frozen=True)
class NodeImage:
    """An image tarball for the node and the tag it carries."""

    tar: Path
    tag: str


def resolve_torch_image() -> NodeImage:
    """The training image of ``hack/build-torch-image.sh`` (PyTorch on the test image): the
    environment's ``DISPATCH_NODE_TORCH_IMAGE``/``_TAG`` first, then what the script prints;
    fails naming the command that builds it."""
    found = {k: os.environ.get(k, "") for k in ("DISPATCH_NODE_TORCH_IMAGE", "DISPATCH_NODE_TORCH_TAG")}
    if not all(found.values()):
        out = subprocess.run(
            ["bash", str(TORCH_BUILD_SCRIPT), "--print-env"], check=True, capture_output=True, text=True
        ).stdout
        script = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        found = {k: v or script.get(k, "") for k, v in found.items()}
    tar = Path(found["DISPATCH_NODE_TORCH_IMAGE"])
    if not tar.is_file():
        raise NodeError(f"the training image {tar} is missing (run `make torch-image`)")
    return NodeImage(tar, found["DISPATCH_NODE_TORCH_TAG"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(*argv: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise NodeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or under ``root``, deepest first (the order to unmount them in)."""
    prefix = str(root).rstrip("/") + "/"
    points: list[str] = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")  # octal escapes: \040 etc.
            if point == str(root) or point.startswith(prefix):
                points.append(point)
    return sorted(set(points), key=lambda p: (p.count("/"), p), reverse=True)


class _Forwarder:
    """TCP from ``listen`` to ``target``, one thread per connection: what kube-proxy makes of the
    ``kubernetes`` Service for pods (its ClusterIP and port, to the API server on loopback)."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self._target = target
        self._server = socket.create_server(listen)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="node-api-forwarder", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self._target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            threading.Thread(target=self._relay, args=(client, upstream), daemon=True).start()

    def _relay(self, a: socket.socket, b: socket.socket) -> None:
        with selectors.DefaultSelector() as sel, a, b:
            sel.register(a, selectors.EVENT_READ, b)
            sel.register(b, selectors.EVENT_READ, a)
            live = 2
            while live:
                for key, _ in sel.select():
                    src, dst = key.fileobj, key.data
                    assert isinstance(src, socket.socket)
                    try:
                        data = src.recv(65536)
                        if data:
                            dst.sendall(data)
                            continue
                    except OSError:
                        return
                    sel.unregister(src)  # this direction is done: pass the end on
                    live -= 1
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
        with self._lock:
            self._open.difference_update((a, b))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self._server.close()
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)


@dataclass
class _Daemon:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


class RealNode:
    """One real node joined to a running :class:`~tests.support.lab.Lab`; see the module docstring.

    ``start()``, then always ``stop()`` (it undoes a partial start too). ``host_dir`` is a host
    directory for pods' hostPath volumes (tests read what a pod wrote there); ``image`` is the
    test image's tag."""

    def __init__(
        self,
        lab: Lab,
        workdir: Path | str,
        *,
        name: str = NODE_NAME,
        binaries: NodeBinaries | None = None,
        start_timeout: float = 120.0,
        api_for_pods: bool = False,
    ) -> None:
        self.lab = lab
        self.api_for_pods = api_for_pods
        """Pods reach the lab's API server at the ``kubernetes`` Service (``API_SERVICE_IP``:443),
        as in-cluster clients do: the address on the bridge, a route to it in every pod, and a
        forwarder to the API server (no kube-proxy runs here)."""
        self._forwarder: _Forwarder | None = None
        self.dir = Path(workdir).resolve()
        self.name = name
        self.binaries = binaries
        self.start_timeout = start_timeout
        self.etc = self.dir / "etc"
        self.host_dir = self.dir / "hostpath"
        self.pod_logs = self.dir / "pod-logs"
        self.kubelet_root = self.dir / "kubelet"
        self.containerd_root = self.dir / "containerd"
        self.socket = self.containerd_root / "containerd.sock"
        self.ready_seconds = 0.0
        """From the kubelet's start to the Node's Ready condition."""
        self.start_seconds = 0.0
        """From :meth:`start` to Ready, everything included (image import, CoreDNS)."""
        self._daemons: list[_Daemon] = []
        self._sysctls: dict[str, str] = {}
        self._netns_before: set[str] = set()
        self._lock: IO[bytes] | None = None
        self._stop_lock = threading.Lock()
        self._started = False
        self._imported: dict[str, float] = {}
        """The images imported besides the two of every start: tag -> seconds the import took."""

    @property
    def image(self) -> str:
        assert self.binaries is not None
        return self.binaries.test_tag

    def placement(self) -> dict[str, Any]:
        """The pod spec fields that put a pod on this node (through the scheduler) and only here."""
        return {
            "nodeSelector": {REAL_NODE_KEY: "true"},
            "tolerations": [
                {"key": REAL_NODE_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
            ],
        }

    def pod(
        self,
        name: str,
        command: Sequence[str],
        *,
        namespace: str,
        labels: Mapping[str, str] | None = None,
        **spec: Any,
    ) -> dict[str, Any]:
        """A Pod manifest for this node: one container ``main`` of the test image running
        ``command``, never restarted, never pulled; ``spec`` adds or replaces pod spec fields
        (``container`` is merged into the container)."""
        container: dict[str, Any] = {
            "name": "main",
            "image": self.image,
            "imagePullPolicy": "Never",
            "command": list(command),
            **spec.pop("container", {}),
        }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 5,
                "containers": [container],
                **self.placement(),
                **spec,
            },
        }

    def container_log(self, namespace: str, pod: str, container: str = "main") -> str:
        """What the container wrote to stdout and stderr, read from the kubelet's log files (the
        lab's API server cannot proxy ``kubectl logs`` to this node: it prefers the node's
        Hostname, which nothing resolves)."""
        lines: list[str] = []
        for path in sorted(self.pod_logs.glob(f"{namespace}_{pod}_*/{container}/*.log")):
            for line in path.read_text(errors="replace").splitlines():
                parts = line.split(" ", 3)  # CRI format: time stream P|F message
                lines.append(parts[3] if len(parts) == 4 else line)
        return "\n".join(lines)

    def import_image(self, image: NodeImage | Path) -> float:
        """Import ``image`` (a docker-archive tarball, ``podman save``'s, under the tag it carries)
        into the node's containerd, once per node; the seconds it took. For the images only some
        tests use (the training image is 6.6 GiB: ``ctr`` writes its blobs and unpacks its
        snapshot, minutes under load; the operator's image), so a session pays for it only when
        one of them runs."""
        if isinstance(image, Path):
            image = NodeImage(image, str(image))
        if image.tag not in self._imported:
            t0 = time.monotonic()
            self._ctr("images", "import", str(image.tar), timeout=1800)
            self._imported[image.tag] = time.monotonic() - t0
        return self._imported[image.tag]

    # ---- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        """Start containerd, CoreDNS and the kubelet; return once the Node is Ready."""
        t0 = time.monotonic()
        if os.geteuid() != 0:
            raise NodeError("a real node needs root (bridge, mounts, cgroups)")
        self.binaries = self.binaries or resolve_node_binaries()
        if len(str(self.containerd_root / "containerd-ttrpc.sock")) > SOCKET_PATH_MAX:
            raise NodeError(f"work directory {self.dir} is too long for containerd's socket paths")
        self._take_lock()
        self._started = True
        atexit.register(self._stop_quietly)
        for d in (self.etc, self.host_dir, self.pod_logs, self.kubelet_root, self.containerd_root):
            d.mkdir(parents=True, exist_ok=True)
        self._sysctls = {key: Path("/proc/sys", key).read_text().strip() for key in HOST_SYSCTLS}
        (self.dir / "sysctl.orig").write_text(json.dumps(self._sysctls, indent=2))
        self._netns_before = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
        self._write_configs()
        self._bridge_up()
        if self.api_for_pods:
            server = urllib.parse.urlsplit(self.lab.control_plane.server)
            assert server.hostname is not None
            assert server.port is not None
            self._forwarder = _Forwarder((API_SERVICE_IP, API_SERVICE_PORT), (server.hostname, server.port))
        self._start_containerd()
        # The import (a few seconds) runs while the API objects and CoreDNS are set up.
        with ThreadPoolExecutor(1, thread_name_prefix="node-image-import") as pool:
            imported = pool.submit(self._import_images)
            try:
                self._grant_access()
                self._start_coredns()
            finally:
                imported.result()
        self._start_kubelet()
        # The kubelet set its kernel tunables at start-up; the host's own values go back now.
        self._restore_sysctls()
        self.start_seconds = time.monotonic() - t0

    def stop(self) -> None:
        """Stop everything and leave the host as it was: the pods' sandboxes (their network
        namespaces and addresses), the kubelet, containerd and its shims, CoreDNS, the mounts
        under the work directory, the kubelet's cgroups, the bridge, the sysctls, the Node."""
        with self._stop_lock:
            if not self._started:
                return
            errors: list[str] = []
            for step in (
                self._drain,
                lambda: self._stop_daemon("kubelet"),
                self._kill_containers,
                lambda: self._stop_daemon("containerd"),
                self._kill_shims,
                lambda: self._stop_daemon("coredns"),
                self._remove_netns,
                self._unmount,
                self._remove_imported,
                self._remove_cgroups,
                self._stop_forwarder,
                self._bridge_down,
                self._remove_fixed_paths,
                self._restore_sysctls,
                self._delete_node,
            ):
                try:
                    step()
                except Exception as e:  # every step runs: a failed one must not leave the rest
                    errors.append(f"{getattr(step, '__name__', 'step')}: {e}")
            self._started = False
            self._release_lock()
            if errors:
                raise NodeError("real node stop: " + "; ".join(errors))

    def _stop_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()

    # ---- start ----------------------------------------------------------------------

    def _take_lock(self) -> None:
        self._lock = LOCK_FILE.open("ab")
        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self._release_lock()
                    raise NodeError(f"another real node holds {LOCK_FILE}") from None
                time.sleep(0.5)

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing drops the flock
            self._lock = None

    def _write_configs(self) -> None:
        assert self.binaries is not None
        sock, ttrpc = self.socket, self.containerd_root / "containerd-ttrpc.sock"
        cri = '[plugins."io.containerd.grpc.v1.cri"'
        (self.etc / "containerd.toml").write_text(
            f"""# containerd 1.6 of the lab's real node (tests/support/node.py): everything in its work dir.
version = 2
root = "{self.containerd_root / "root"}"
state = "{self.containerd_root / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{sock}"

[ttrpc]
  address = "{ttrpc}"

{cri}]
  sandbox_image = "{self.binaries.pause_tag}"
  # root lacks CAP_SYS_RESOURCE here: the kernel refuses a negative oom_score_adj (the pause
  # container's -998), so every container's score is clamped to containerd's own (0).
  restrict_oom_score_adj = true
  {cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    {cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      {cri}.containerd.runtimes.runc.options]
        BinaryName = "{self.binaries.runc}"
        SystemdCgroup = false
  {cri}.cni]
    bin_dir = "{self.binaries.cni_bin_dir}"
    conf_dir = "{self.etc / "cni"}"
    max_conf_num = 1
"""
        )
        (self.etc / "cni").mkdir(exist_ok=True)
        conflist = {
            "cniVersion": "1.0.0",
            "name": CNI_NETWORK,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "isDefaultGateway": False,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.dir / "cni-ipam"),
                        "ranges": [
                            [
                                {
                                    "subnet": POD_SUBNET,
                                    "gateway": NODE_IP,
                                    "rangeStart": POD_RANGE[0],
                                    "rangeEnd": POD_RANGE[1],
                                }
                            ]
                        ],
                        # The API server's Service address only, through the node (api_for_pods).
                        "routes": [{"dst": f"{API_SERVICE_IP}/32", "gw": NODE_IP}]
                        if self.api_for_pods
                        else [],
                    },
                }
            ],
        }
        (self.etc / "cni" / "10-dispatch-lab.conflist").write_text(json.dumps(conflist, indent=2))
        # Pods resolve through CoreDNS only: the host's resolver is not reachable from them.
        (self.etc / "pod-resolv.conf").write_text(f"nameserver {NODE_IP}\n")

    def _bridge_up(self) -> None:
        if _run("ip", "link", "show", BRIDGE, check=False).returncode == 0:
            _run("ip", "link", "del", BRIDGE)  # a crashed run's (the lock says none is live)
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
        if self.api_for_pods:
            _run("ip", "addr", "add", f"{API_SERVICE_IP}/32", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")

    def _spawn(self, name: str, argv: Sequence[str]) -> _Daemon:
        """A daemon of the lab's control plane (its log in the lab's directory, stopped with the
        lab if nothing here stops it first), which this node stops itself, in its own order."""
        proc = self.lab.control_plane.spawn(name, argv[0], argv[1:])
        assert proc.popen is not None
        daemon = _Daemon(name, proc.popen, proc.log)
        self._daemons.append(daemon)
        return daemon

    def _wait(self, what: str, daemon: _Daemon, probe: Any, deadline: float) -> None:
        while not probe():
            if daemon.popen.poll() is not None:
                raise NodeError(
                    f"{daemon.name} exited {daemon.popen.returncode}; log {daemon.log}:\n{_tail(daemon.log)}"
                )
            if time.monotonic() > deadline:
                raise NodeError(
                    f"{what} not ready in {self.start_timeout:.0f}s; log {daemon.log}:\n{_tail(daemon.log)}"
                )
            time.sleep(0.1)

    def _ctr(
        self, *args: str, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        assert self.binaries is not None
        return _run(
            self.binaries.ctr,
            f"--address={self.socket}",
            "--namespace=k8s.io",
            *args,
            check=check,
            timeout=timeout,
        )

    def _start_containerd(self) -> None:
        assert self.binaries is not None
        daemon = self._spawn(
            "containerd", [self.binaries.containerd, f"--config={self.etc / 'containerd.toml'}"]
        )
        deadline = time.monotonic() + self.start_timeout
        self._wait(
            "containerd",
            daemon,
            lambda: self.socket.exists() and self._ctr("version", check=False, timeout=10).returncode == 0,
            deadline,
        )

    def _import_images(self) -> None:
        assert self.binaries is not None
        for tar in (self.binaries.pause_image, self.binaries.test_image):
            self._ctr("images", "import", str(tar), timeout=self.start_timeout)

    def _grant_access(self) -> None:
        """RBAC for the kubelet (the lab authorizes with RBAC only: no Node authorizer) and for
        CoreDNS (what its kubernetes plugin lists and watches)."""
        objects = [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "dispatch-lab:nodes"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "system:node",
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": COREDNS_USER},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["endpoints", "services", "pods", "namespaces"],
                        "verbs": ["list", "watch"],
                    },
                    {
                        "apiGroups": ["discovery.k8s.io"],
                        "resources": ["endpointslices"],
                        "verbs": ["list", "watch"],
                    },
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": COREDNS_USER},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": COREDNS_USER,
                },
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": COREDNS_USER}],
            },
        ]
        self.lab.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))

    def _start_coredns(self) -> None:
        assert self.binaries is not None
        port = _free_port()
        kubeconfig = self.lab.mint_user(COREDNS_USER)
        corefile = self.etc / "Corefile"
        corefile.write_text(
            f"""# CoreDNS of the lab's real node: {CLUSTER_DOMAIN} from the lab's API server, on the bridge's
# address only; every other name is NXDOMAIN (no forwarding: nothing outside the machine is asked).
{CLUSTER_DOMAIN}:53 in-addr.arpa:53 {{
    bind {NODE_IP}
    ready 127.0.0.1:{port}
    errors
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        ttl 5
    }}
}}
.:53 {{
    bind {NODE_IP}
    errors
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""
        )
        daemon = self._spawn("coredns", [self.binaries.coredns, f"-conf={corefile}"])

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as resp:
                    return bool(resp.status == 200)
            except urllib.error.HTTPError as e:
                e.close()
                return False
            except OSError:
                return False

        self._wait("CoreDNS", daemon, ready, time.monotonic() + self.start_timeout)

    def _kubelet_config(self, healthz_port: int) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,  # the bridge: reachable from this machine and its pods only
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz_port,
            # Lab only: the API server's log/exec proxy connects without a client certificate.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "imageServiceEndpoint": f"unix://{self.socket}",
            # No systemd; containerd 1.6 cannot tell the kubelet its driver (no RuntimeConfig RPC).
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,  # this machine kind has cgroup v1 (the default turns true in 1.35)
            "failSwapOn": False,
            "makeIPTablesUtilChains": False,  # the host's iptables stay as they are
            "podLogsDir": str(self.pod_logs),
            "volumePluginDir": str(self.kubelet_root / "volume-plugins"),
            "clusterDomain": CLUSTER_DOMAIN,
            "clusterDNS": [NODE_IP],
            "resolvConf": str(self.etc / "pod-resolv.conf"),
            "serializeImagePulls": False,
            # Images cannot be pulled back: image GC must not remove them on a busy shared disk,
            # nor disk pressure evict the tests' pods.
            "imageGCHighThresholdPercent": 95,
            "imageGCLowThresholdPercent": 90,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "5%",
                "imagefs.available": "5%",
            },
            # Volume usage (an emptyDir's sizeLimit, which the eviction manager enforces) is measured
            # every 10 s instead of every minute.
            "volumeStatsAggPeriod": "10s",
            "syncFrequency": "10s",
            "nodeStatusUpdateFrequency": "5s",
            # Renewed every 2.5 s: well inside the lab's node-monitor grace period (12 s).
            "nodeLeaseDurationSeconds": 10,
            "shutdownGracePeriod": "0s",  # graceful node shutdown needs systemd-logind
            "oomScoreAdj": 0,  # root lacks CAP_SYS_RESOURCE: the default -999 is refused
            "registerWithTaints": [{"key": REAL_NODE_KEY, "value": "true", "effect": "NoSchedule"}],
        }

    def _start_kubelet(self) -> None:
        assert self.binaries is not None
        healthz = _free_port()
        config = self.etc / "kubelet-config.yaml"
        config.write_text(yaml.safe_dump(self._kubelet_config(healthz), sort_keys=False))
        kubeconfig = self.lab.mint_user(f"system:node:{self.name}", ["system:nodes"])
        t0 = time.monotonic()
        daemon = self._spawn(
            "kubelet",
            [
                self.binaries.kubelet,
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.kubelet_root}",
                f"--cert-dir={self.kubelet_root / 'pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={NODE_IP}",
                f"--node-labels={REAL_NODE_KEY}=true",
                "--v=2",
            ],
        )
        self._wait("the Node", daemon, self._node_ready, time.monotonic() + self.start_timeout)
        self.ready_seconds = time.monotonic() - t0

    def _node_ready(self) -> bool:
        node = self.lab.node(self.name) or {}
        return any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (node.get("status") or {}).get("conditions") or ()
        )

    # ---- stop -----------------------------------------------------------------------

    def _daemon(self, name: str) -> _Daemon | None:
        return next((d for d in self._daemons if d.name == name), None)

    def _drain(self) -> None:
        """Delete the pods bound here and wait until the kubelet has stopped them: stopping a
        pod's sandbox is what tears its network down (CNI DEL: the veth, the address, the
        network namespace)."""
        kubelet = self._daemon("kubelet")
        if kubelet is None or kubelet.popen.poll() is not None:
            return
        selector = f"spec.nodeName={self.name}"
        self.lab.kubectl(
            "delete",
            "pods",
            "--all-namespaces",
            f"--field-selector={selector}",
            "--grace-period=1",
            "--wait=false",
            check=False,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and kubelet.popen.poll() is None:
            out = self.lab.kubectl(
                "get", "pods", "--all-namespaces", f"--field-selector={selector}", "-o=name", check=False
            )
            if not out.strip():
                return
            time.sleep(0.5)

    def _stop_daemon(self, name: str) -> None:
        daemon = self._daemon(name)
        if daemon is None:
            return
        for sig, grace in ((signal.SIGTERM, STOP_GRACE_SECONDS), (signal.SIGKILL, 5.0)):
            if daemon.popen.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(daemon.popen.pid, sig)  # its own session: the group is its pid
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.popen.wait(timeout=grace)
        self._daemons.remove(daemon)
        if daemon.popen.poll() is None:
            raise NodeError(f"{name} ({daemon.popen.pid}) did not exit after SIGKILL")

    def _kill_containers(self) -> None:
        """Whatever the kubelet left running (a pod it had no time to stop): killed through
        containerd, so its shim reaps it and unmounts its root filesystem."""
        containerd = self._daemon("containerd")
        if containerd is None or containerd.popen.poll() is not None:
            return
        tasks = self._ctr("tasks", "list", "--quiet", check=False).stdout.split()
        for task in tasks:
            self._ctr("tasks", "kill", "--signal=SIGKILL", task, check=False)
        for task in tasks:
            self._ctr("tasks", "delete", "--force", task, check=False)

    def _kill_shims(self) -> None:
        """containerd-shim-runc-v2 processes of this containerd (its socket in their command line)."""
        address = str(self.socket)
        for pid_dir in Path("/proc").iterdir():
            if not pid_dir.name.isdigit():
                continue
            try:
                argv = (pid_dir / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            words = [a.decode(errors="replace") for a in argv]
            if words and words[0].endswith("containerd-shim-runc-v2") and address in words:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid_dir.name), signal.SIGKILL)

    def _remove_netns(self) -> None:
        """Network namespaces created while this node ran (CNI's ``cni-*``), if a sandbox was not
        stopped: unmounted and removed, which also removes their veth."""
        if not os.path.isdir("/run/netns"):
            return
        for name in set(os.listdir("/run/netns")) - self._netns_before:
            if name.startswith("cni-"):
                path = f"/run/netns/{name}"
                _run("umount", "-l", path, check=False)
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def _unmount(self) -> None:
        for point in _mounts_under(self.dir):
            _run("umount", "-l", point, check=False)
        left = _mounts_under(self.dir)
        if left:
            raise NodeError(f"still mounted: {left}")

    def _remove_imported(self) -> None:
        """containerd's content and snapshots, once it is stopped and nothing is mounted, when a
        big image was imported: pytest keeps the last runs' temporary directories, and each would
        keep two copies of it (the tarball stays in the build cache)."""
        if self._imported and not _mounts_under(self.dir):
            shutil.rmtree(self.containerd_root / "root", ignore_errors=True)
            self._imported.clear()

    def _remove_cgroups(self) -> None:
        """The kubelet's cgroup trees (cgroupfs driver: ``kubepods`` in every hierarchy), children
        first; a cgroup with a process left in it stays (and is reported)."""
        stuck: list[str] = []
        for top in Path("/sys/fs/cgroup").glob("*/kubepods"):
            for d in sorted(
                (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
            ):
                with contextlib.suppress(OSError):
                    d.rmdir()
            try:
                top.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                stuck.append(str(top))
        if stuck:
            raise NodeError(f"cgroups left: {stuck}")

    def _stop_forwarder(self) -> None:
        if self._forwarder is not None:
            self._forwarder.close()
            self._forwarder = None

    def _bridge_down(self) -> None:
        if _run("ip", "link", "show", BRIDGE, check=False).returncode == 0:
            _run("ip", "link", "del", BRIDGE)

    def _remove_fixed_paths(self) -> None:
        """Paths the kubelet, containerd and libcni use whatever their configuration says: this
        node's log symlinks, device-plugin socket and CNI results, then the directories if
        nothing else is in them."""
        containers = Path("/var/log/containers")
        if containers.is_dir():
            for link in containers.iterdir():
                with contextlib.suppress(OSError):
                    if link.is_symlink() and os.readlink(link).startswith(str(self.dir)):
                        link.unlink()
        Path("/var/lib/kubelet/device-plugins/kubelet.sock").unlink(missing_ok=True)
        # libcni's result cache (a sandbox whose CNI DEL never ran leaves its entry).
        for cached in Path("/var/lib/cni/results").glob(f"{CNI_NETWORK}-*"):
            cached.unlink(missing_ok=True)
        for d in (
            "/var/log/containers",
            "/var/lib/kubelet/device-plugins",
            "/var/lib/kubelet",
            "/run/containerd/runc/k8s.io",
            "/run/containerd/runc",
            "/run/containerd/s",
            "/run/containerd/fifo",
            "/run/containerd",
            "/run/netns",
            "/var/lib/cni/results",
            "/var/lib/cni",
        ):
            with contextlib.suppress(OSError):
                os.rmdir(d)

    def _restore_sysctls(self) -> None:
        for key, value in self._sysctls.items():
            path = Path("/proc/sys", key)
            if path.read_text().strip() != value:
                path.write_text(value + "\n")

    def _delete_node(self) -> None:
        self.lab.kubectl("delete", "node", self.name, "--ignore-not-found", "--wait=false", check=False)
