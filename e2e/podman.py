"""The operator image run by podman exactly as the chart's Deployment says (e2e/test_image.py).

:func:`container_from_deployment` turns the pod template of the Deployment the chart installed
(read back from the API server, defaults included) into a ``podman run`` command line: image,
args, env (the downward API's fieldRefs resolved as the kubelet would), ports, probes, the pod and
container security contexts, resources' limits, the volumes (emptyDir, and Secrets/ConfigMaps
materialized from the API server as the kubelet would) and the termination grace period. A field it
does not know how to honour raises :class:`UnsupportedPodSpec`: a chart change that the
translation would silently drop fails the tests instead, so the chart and the image cannot drift.

Two things stand in for a kubelet on a node: the host network (the test cluster's API server
listens on loopback; a pod would have its own network namespace) and the identity: either the
ServiceAccount token mounted where the kubelet mounts it (``automountServiceAccountToken``) with
``KUBERNETES_SERVICE_HOST/PORT``, or a kubeconfig of that ServiceAccount mounted read-only.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from dispatch import __version__

PODMAN = ("podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs")
"""podman as it runs on this kind of machine (crun refuses its hybrid cgroups)."""
LIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
"""The default ulimits cannot be set here; explicit ones can."""
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
KUBECONFIG_DIR = "/var/run/secrets/dispatch.dev/kubeconfig"


class UnsupportedPodSpec(AssertionError):
    """The pod spec has a field the podman translation does not honour."""


def image_ref() -> str:
    """The image `make image` builds (``IMAGE`` from mk/image.mk, else its default name)."""
    return os.environ.get("IMAGE") or f"localhost/dispatch-operator:{__version__}"


def podman(*args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}:\n{proc.stderr.strip()}")
    return proc


def require_image(ref: str) -> dict[str, Any]:
    """The image's configuration; fails (not skips) when it was not built: `make e2e` builds it."""
    if podman("image", "exists", ref, check=False).returncode != 0:
        pytest.fail(f"image {ref} not found: run `make image` (make e2e does)", pytrace=False)
    config: dict[str, Any] = json.loads(podman("image", "inspect", ref).stdout)[0]
    return config


@dataclass(frozen=True)
class Probe:
    path: str
    port: int


@dataclass(frozen=True)
class Identity:
    """How the container authenticates: files to mount read-only at ``directory`` and env."""

    directory: str
    files: Mapping[str, bytes]
    env: Mapping[str, str]

    @staticmethod
    def service_account_token(token: str, ca_pem: bytes, namespace: str, server: str) -> Identity:
        """What the kubelet mounts for ``automountServiceAccountToken: true``, and its env."""
        url = urlsplit(server)
        host = url.hostname or "127.0.0.1"
        port = str(url.port or 443)
        return Identity(
            directory=SA_DIR,
            files={"token": token.encode(), "ca.crt": ca_pem, "namespace": namespace.encode()},
            env={
                "KUBERNETES_SERVICE_HOST": host,
                "KUBERNETES_SERVICE_PORT": port,
                "KUBERNETES_SERVICE_PORT_HTTPS": port,
            },
        )

    @staticmethod
    def kubeconfig(path: Path) -> Identity:
        """A kubeconfig (of the chart's ServiceAccount) mounted read-only, named by $KUBECONFIG."""
        return Identity(
            directory=KUBECONFIG_DIR,
            files={"config": path.read_bytes()},
            env={"KUBECONFIG": f"{KUBECONFIG_DIR}/config"},
        )


@dataclass
class Container:
    """One ``podman run`` of the operator image, derived from a pod spec."""

    name: str
    image: str
    args: list[str]
    env: dict[str, str]
    ports: dict[str, int]
    liveness: Probe | None
    readiness: Probe | None
    grace_seconds: int
    run_options: list[str] = field(default_factory=list)
    started_at: float | None = None

    def argv(self) -> list[str]:
        return [*PODMAN, "run", "--detach", f"--name={self.name}", *self.run_options, self.image, *self.args]

    def start(self) -> Container:
        self.started_at = time.monotonic()
        podman(*self.argv()[len(PODMAN) :])
        return self

    def logs(self) -> str:
        proc = podman("logs", self.name, check=False)
        return proc.stdout + proc.stderr

    def running(self) -> bool:
        out = podman("inspect", "--format", "{{.State.Running}}", self.name, check=False).stdout.strip()
        return out == "true"

    def stop(self) -> tuple[int, float]:
        """SIGTERM, then SIGKILL after the grace period (the kubelet's order): exit code, seconds."""
        began = time.monotonic()
        podman("stop", f"--time={self.grace_seconds}", self.name, timeout=self.grace_seconds + 60)
        took = time.monotonic() - began
        code = podman("inspect", "--format", "{{.State.ExitCode}}", self.name).stdout.strip()
        return int(code), took

    def remove(self) -> None:
        podman("rm", "--force", "--time=0", self.name, check=False)


_POD_KEYS = {
    "containers",
    "securityContext",
    "serviceAccountName",
    "serviceAccount",
    "automountServiceAccountToken",
    "terminationGracePeriodSeconds",
    "volumes",
    # Scheduling and defaults that mean nothing to one container on this machine.
    "restartPolicy",
    "dnsPolicy",
    "schedulerName",
    "nodeSelector",
    "tolerations",
    "affinity",
    "priorityClassName",
}
_CONTAINER_KEYS = {
    "name",
    "image",
    "imagePullPolicy",
    "args",
    "env",
    "ports",
    "livenessProbe",
    "readinessProbe",
    "securityContext",
    "resources",
    "volumeMounts",
    "terminationMessagePath",
    "terminationMessagePolicy",
}


def _unknown(where: str, body: Mapping[str, Any], known: set[str]) -> None:
    extra = sorted(set(body) - known)
    if extra:
        raise UnsupportedPodSpec(f"{where}: no podman translation for {extra}")


def container_from_deployment(
    deployment: Mapping[str, Any],
    *,
    name: str,
    pod_name: str,
    workdir: Path,
    identity: Identity,
    secret: Callable[[str], Mapping[str, str]],
    config_map: Callable[[str], Mapping[str, str]],
) -> Container:
    """The ``podman run`` of the Deployment's only container, as a kubelet would run its pod.

    ``secret(name)`` / ``config_map(name)`` return the object's ``data`` (base64 for a Secret),
    read from the API server by the caller; files are written under ``workdir``.
    """
    template = deployment["spec"]["template"]
    pod: Mapping[str, Any] = template["spec"]
    namespace = deployment["metadata"]["namespace"]
    _unknown("pod spec", pod, _POD_KEYS)
    if pod.get("imagePullSecrets"):
        raise UnsupportedPodSpec("imagePullSecrets: the image is local")
    (container,) = pod["containers"]
    _unknown(f"container {container['name']}", container, _CONTAINER_KEYS)
    options: list[str] = ["--network=host", *LIMITS]

    # Image: never pulled (there is no registry); the chart must name the image that was built.
    options.append("--pull=never")

    # Security: the pod's context, overridden field by field by the container's.
    pod_sc: Mapping[str, Any] = pod.get("securityContext") or {}
    sc: dict[str, Any] = {**pod_sc, **(container.get("securityContext") or {})}
    for key in sc:
        if key not in {
            "runAsNonRoot",
            "runAsUser",
            "runAsGroup",
            "fsGroup",
            "seccompProfile",
            "allowPrivilegeEscalation",
            "privileged",
            "readOnlyRootFilesystem",
            "capabilities",
        }:
            raise UnsupportedPodSpec(f"securityContext.{key}")
    uid = sc.get("runAsUser")
    gid = sc.get("runAsGroup")
    if uid is None:
        raise UnsupportedPodSpec("securityContext.runAsUser: the test runs a numeric user")
    if sc.get("runAsNonRoot") and int(uid) == 0:
        raise UnsupportedPodSpec("runAsNonRoot with runAsUser 0: the kubelet would refuse to start it")
    options.append(f"--user={uid}:{gid if gid is not None else uid}")
    fs_group = pod_sc.get("fsGroup")
    if fs_group is not None:
        options.append(f"--group-add={fs_group}")
    seccomp = (sc.get("seccompProfile") or {}).get("type", "RuntimeDefault")
    if seccomp != "RuntimeDefault":
        raise UnsupportedPodSpec(f"seccompProfile {seccomp}: podman runs its default profile")
    if sc.get("privileged"):
        raise UnsupportedPodSpec("privileged")
    if sc.get("allowPrivilegeEscalation") is False:
        options.append("--security-opt=no-new-privileges")
    if sc.get("readOnlyRootFilesystem"):
        # Only the pod's volumes are writable: podman's own tmpfs on /tmp, /run would hide a
        # missing emptyDir.
        options += ["--read-only", "--read-only-tmpfs=false"]
    caps: Mapping[str, Any] = sc.get("capabilities") or {}
    options += [f"--cap-drop={c}" for c in caps.get("drop") or ()]
    options += [f"--cap-add={c}" for c in caps.get("add") or ()]

    # Resources: limits are enforced by the runtime; requests only schedule.
    limits: Mapping[str, Any] = (container.get("resources") or {}).get("limits") or {}
    for key, value in limits.items():
        if key == "memory":
            options.append(f"--memory={_bytes(str(value))}")
        elif key == "cpu":
            options.append(f"--cpus={_cpus(str(value))}")
        else:
            raise UnsupportedPodSpec(f"resources.limits.{key}")

    # Env: values, and the downward API's fieldRefs this pod would get.
    fields = {"metadata.name": pod_name, "metadata.namespace": namespace}
    env: dict[str, str] = {}
    for var in container.get("env") or ():
        if "value" in var:
            env[var["name"]] = str(var["value"])
            continue
        ref = (var.get("valueFrom") or {}).get("fieldRef") or {}
        if ref.get("fieldPath") not in fields:
            raise UnsupportedPodSpec(f"env {var['name']}: {var.get('valueFrom')}")
        env[var["name"]] = fields[ref["fieldPath"]]
    env.update(identity.env)
    for key, value in env.items():
        options.append(f"--env={key}={value}")

    # Volumes: what each mount of the container is backed by.
    volumes = {v["name"]: v for v in pod.get("volumes") or ()}
    mounted: set[str] = set()
    for mount in container.get("volumeMounts") or ():
        _unknown(f"volumeMount {mount['name']}", mount, {"name", "mountPath", "readOnly"})
        volume = volumes[mount["name"]]
        mounted.add(mount["name"])
        target = mount["mountPath"]
        ro = bool(mount.get("readOnly"))
        if "emptyDir" in volume:
            size = (volume["emptyDir"] or {}).get("sizeLimit")
            medium = (volume["emptyDir"] or {}).get("medium", "")
            if medium not in ("", "Memory"):
                raise UnsupportedPodSpec(f"emptyDir medium {medium}")
            # An emptyDir is writable by the pod's fsGroup (setgid directory owned by it).
            spec = f"type=tmpfs,destination={target},tmpfs-mode=1777"
            if size:
                spec += f",tmpfs-size={_bytes(str(size))}"
            options.append(f"--mount={spec}")
        elif "secret" in volume:
            src = volume["secret"]
            data = {k: base64.b64decode(v) for k, v in secret(src["secretName"]).items()}
            directory = _materialize(workdir / mount["name"], src, data, fs_group)
            options.append(f"--volume={directory}:{target}:{'ro' if ro else 'rw'}")
        elif "configMap" in volume:
            src = volume["configMap"]
            data = {k: v.encode() for k, v in config_map(src["name"]).items()}
            directory = _materialize(workdir / mount["name"], src, data, fs_group)
            options.append(f"--volume={directory}:{target}:{'ro' if ro else 'rw'}")
        else:
            raise UnsupportedPodSpec(f"volume {mount['name']}: {sorted(volume)}")
    unused = set(volumes) - mounted
    if unused:
        raise UnsupportedPodSpec(f"volumes never mounted: {sorted(unused)}")

    # The identity (the kubelet's ServiceAccount mount, or a kubeconfig), read-only.
    if identity.directory == SA_DIR and pod.get("automountServiceAccountToken") is False:
        raise UnsupportedPodSpec("automountServiceAccountToken: false, but a token identity was asked for")
    ident_dir = _materialize(workdir / "identity", {"defaultMode": 0o440}, identity.files, fs_group)
    options.append(f"--volume={ident_dir}:{identity.directory}:ro")

    # Ports (host network: containerPort is the host's port) and probes.
    ports = {p["name"]: int(p["containerPort"]) for p in container.get("ports") or ()}
    for p in container.get("ports") or ():
        if p.get("hostPort") or p.get("protocol", "TCP") != "TCP":
            raise UnsupportedPodSpec(f"port {p}")

    def probe(body: Mapping[str, Any] | None) -> Probe | None:
        if body is None:
            return None
        get = body.get("httpGet")
        if get is None or set(body) - {
            "httpGet",
            "initialDelaySeconds",
            "periodSeconds",
            "timeoutSeconds",
            "failureThreshold",
            "successThreshold",
        }:
            raise UnsupportedPodSpec(f"probe {body}")
        if get.get("scheme", "HTTP") != "HTTP" or get.get("host") or get.get("httpHeaders"):
            raise UnsupportedPodSpec(f"probe httpGet {get}")
        port = get["port"]
        return Probe(path=get["path"], port=ports[port] if isinstance(port, str) else int(port))

    grace = int(pod.get("terminationGracePeriodSeconds", 30))
    options.append(f"--stop-timeout={grace}")
    if container.get("imagePullPolicy") not in (None, "IfNotPresent", "Never"):
        raise UnsupportedPodSpec(
            f"imagePullPolicy {container['imagePullPolicy']}: nothing can be pulled here"
        )
    return Container(
        name=name,
        image=container["image"],
        args=list(container.get("args") or ()),
        env=env,
        ports=ports,
        liveness=probe(container.get("livenessProbe")),
        readiness=probe(container.get("readinessProbe")),
        grace_seconds=grace,
        run_options=options,
    )


def _materialize(
    directory: Path, source: Mapping[str, Any], data: Mapping[str, bytes], fs_group: int | None
) -> Path:
    """Files as the kubelet projects a Secret/ConfigMap: ``items`` (key -> path) or every key,
    mode ``defaultMode`` (0644), group-owned by the pod's fsGroup."""
    _unknown("secret/configMap volume", source, {"secretName", "name", "items", "defaultMode", "optional"})
    mode = int(source.get("defaultMode", 0o644))
    items = source.get("items")
    pairs = [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in data]
    directory.mkdir(parents=True, exist_ok=True)
    for key, path in pairs:
        target = directory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data[key])
        target.chmod(mode)
        if fs_group is not None:
            os.chown(target, 0, fs_group)
    directory.chmod(0o755)
    return directory


def _bytes(quantity: str) -> int:
    units = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "k": 1000, "M": 1000**2, "G": 1000**3}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(quantity)


def _cpus(quantity: str) -> str:
    return str(int(quantity[:-1]) / 1000) if quantity.endswith("m") else quantity
