"""The lab's failures (:class:`LabFailures`): what a kubelet reports, played by kwok's stages (an
exit, a deadline, a shutdown, a waiting container), and the control plane's own mechanisms
(preemption by kube-scheduler, the Eviction API, taints, node loss and deletion).
"""

from __future__ import annotations

import contextlib
import secrets
from typing import Any

import yaml

from tests.support.lab_api import LabApi
from tests.support.lab_setup import (
    HIGH_PRIORITY,
    KWOK_NODE_LABEL,
    NODE_CPU,
    NODE_GPU,
    NODE_MEMORY,
    NODE_PODS,
    PREEMPT_ATTEMPTS,
    TAINT_KEY,
    ApiStatus,
    LabError,
    node_manifest,
)


class LabFailures(LabApi):
    """Every way the lab fails a pod or a node, each by the mechanism that does it for real."""

    # ---- what a kubelet reports (kwok stages) --------------------------------------

    def exit_pod(
        self,
        namespace: str,
        name: str,
        code: int,
        *,
        reason: str | None = None,
        message: str | None = None,
        container: str = "pytorch",
    ) -> None:
        """A container exits with CODE (kwok stage lab-container-exit; see kwok.yaml)."""
        ann = {"lab.dispatch.io/exit-code": str(code), "lab.dispatch.io/exit-container": container}
        if reason:
            ann["lab.dispatch.io/exit-reason"] = reason
        if message:
            ann["lab.dispatch.io/exit-message"] = message
        self._wait_running(namespace, name)
        self.annotate_pod(namespace, name, ann)

    def deadline_pod(self, namespace: str, name: str) -> None:
        """The kubelet's activeDeadlineSeconds kill: Failed, reason DeadlineExceeded."""
        self.annotate_pod(namespace, name, {"lab.dispatch.io/deadline": "true"})

    def shutdown_pod(self, namespace: str, name: str) -> None:
        """The kubelet's graceful node shutdown: Failed, DisruptionTarget TerminationByKubelet."""
        self.annotate_pod(namespace, name, {"lab.dispatch.io/node-shutdown": "true"})

    def waiting_pod(
        self, namespace: str, name: str, reason: str, message: str = "", container: str = "pytorch"
    ) -> None:
        """The container goes waiting with REASON (e.g. CreateContainerConfigError)."""
        self.annotate_pod(
            namespace,
            name,
            {
                "lab.dispatch.io/waiting-reason": reason,
                "lab.dispatch.io/waiting-message": message,
                "lab.dispatch.io/waiting-container": container,
            },
        )

    def _wait_running(self, namespace: str, name: str) -> None:
        def running() -> bool:
            pod = self.pod(namespace, name)
            return bool(pod and pod.get("status", {}).get("phase") == "Running")

        self.wait(f"pod {namespace}/{name} Running", running, 60)

    # ---- what the control plane does (real mechanisms) -----------------------------

    def preempt_pod(
        self,
        namespace: str,
        name: str,
        *,
        keep: bool = False,
        whole_node: bool = False,
        timeout: float = 60.0,
    ) -> str:
        """Real preemption by kube-scheduler: a ``lab-high`` pod for the victim's node that needs
        the victim's cpu and refuses to share the node with it (required pod anti-affinity on a
        label put on the victim). The scheduler's smallest set of victims is then exactly that
        pod, whatever else runs or arrives on the node meanwhile (so concurrent preemptions never
        take a neighbour). With ``whole_node`` the preemptor asks for the node's whole cpu (a full
        node) and every lower-priority pod there goes.
        Returns the preemptor's name; unless ``keep``, it is deleted once it is bound."""
        node_name = self.pod_node(namespace, name)
        node = self.node(node_name)
        victim = self.pod(namespace, name)
        if node is None or victim is None:
            raise LabError(f"pod {namespace}/{name} or its node {node_name} does not exist")
        uid = victim["metadata"]["uid"]
        token = secrets.token_hex(3)
        spec: dict[str, Any] = {
            "priorityClassName": HIGH_PRIORITY,
            "nodeSelector": {"kubernetes.io/hostname": node_name},
            "terminationGracePeriodSeconds": 0,
        }
        if whole_node:
            cpu = node["status"]["allocatable"]["cpu"]
        else:
            self.request(
                "PATCH",
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                {"metadata": {"labels": {"lab.dispatch.io/victim": token}}},
                content_type="application/merge-patch+json",
            )
            cpu = f"{max(_millicpu(_pod_cpu(victim)), 1)}m"
            spec["affinity"] = {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": {"lab.dispatch.io/victim": token}},
                            "topologyKey": "kubernetes.io/hostname",
                        }
                    ]
                }
            }
        spec["containers"] = [
            {"name": "hog", "image": "lab.invalid/hog:1", "resources": {"requests": {"cpu": cpu}}}
        ]

        def disrupted() -> bool:
            pod = self.pod(namespace, name)
            if pod is None or pod["metadata"]["uid"] != uid:
                return True
            return any(
                c.get("type") == "DisruptionTarget" and c.get("status") == "True"
                for c in pod.get("status", {}).get("conditions") or ()
            )

        def bound(pod_name: str) -> bool:
            return bool((self.pod(namespace, pod_name) or {}).get("spec", {}).get("nodeName"))

        def preempts(preemptor: str) -> bool:
            """Create ``preemptor``; True once the victim is disrupted, False when the preemptor
            was bound beside it (then deleted again)."""
            self.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/pods",
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": preemptor, "labels": {"lab.dispatch.io/preemptor": "true"}},
                    "spec": spec,
                },
            )
            try:
                # A preemptor is bound only once its victims are gone, so bound while the victim
                # stays undisrupted means kube-scheduler found room beside it: its cache did not
                # have the victim's new label yet (the anti-affinity could not hold).
                self.wait(
                    f"preemption of {namespace}/{name} on {node_name}",
                    lambda: disrupted() or bound(preemptor),
                    timeout,
                )
                if disrupted():
                    if not keep:
                        self.wait(f"preemptor {preemptor} bound", lambda: bound(preemptor), timeout)
                    return True
            except LabError as e:
                raise LabError(f"{e}; preemptor: {self.pod(namespace, preemptor)}") from None
            self.delete_pod(namespace, preemptor, grace_seconds=0)
            self.wait(f"preemptor {preemptor} gone", lambda: self.pod(namespace, preemptor) is None, timeout)
            return False

        for attempt in range(1, PREEMPT_ATTEMPTS + 1):
            preemptor = f"lab-preemptor-{token}-{attempt}"
            if preempts(preemptor):
                break
        else:
            raise LabError(f"{PREEMPT_ATTEMPTS} preemptors of {namespace}/{name} were bound beside it")
        if not keep:
            self.delete_pod(namespace, preemptor, grace_seconds=0)
        return preemptor

    def evict_pod(self, namespace: str, name: str) -> None:
        """The Eviction API (what ``kubectl drain`` uses): DisruptionTarget EvictionByEvictionAPI."""
        self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
            },
        )

    def delete_pod(self, namespace: str, name: str, *, grace_seconds: int | None = None) -> None:
        query = {"gracePeriodSeconds": str(grace_seconds)} if grace_seconds is not None else None
        with contextlib.suppress(ApiStatus):
            self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", query=query)

    def _patch_node(self, name: str, change: Any) -> None:
        for _ in range(20):
            node = self.node(name)
            if node is None:
                raise LabError(f"node {name} does not exist")
            patch = change(node)
            if patch is None:
                return
            patch.setdefault("metadata", {})["resourceVersion"] = node["metadata"]["resourceVersion"]
            try:
                self.request(
                    "PATCH", f"/api/v1/nodes/{name}", patch, content_type="application/merge-patch+json"
                )
                return
            except ApiStatus as e:
                if e.code != 409:
                    raise
        raise LabError(f"node {name} kept changing")

    def taint_node(self, name: str, key: str = TAINT_KEY, effect: str = "NoExecute") -> None:
        """A taint on the node; with NoExecute the taint-eviction controller deletes the pods
        that do not tolerate it (DisruptionTarget DeletionByTaintManager)."""

        def change(node: dict[str, Any]) -> dict[str, Any] | None:
            taints = list(node.get("spec", {}).get("taints") or [])
            if any(t["key"] == key and t["effect"] == effect for t in taints):
                return None
            return {"spec": {"taints": [*taints, {"key": key, "value": "true", "effect": effect}]}}

        self._patch_node(name, change)

    def untaint_node(self, name: str, key: str = TAINT_KEY) -> None:
        def change(node: dict[str, Any]) -> dict[str, Any] | None:
            taints = list(node.get("spec", {}).get("taints") or [])
            kept = [t for t in taints if t["key"] != key]
            return None if kept == taints else {"spec": {"taints": kept}}

        if self.node(name) is not None:
            self._patch_node(name, change)

    def node_not_ready(self, name: str) -> None:
        """kwok stops managing the node (as if its kubelet died): no lease renewals, its pods no
        longer played. node-lifecycle marks it Ready=Unknown after the grace period and taints it
        unreachable:NoExecute; its pods are evicted after their toleration (5 s in the lab)."""
        self._patch_node(name, lambda node: {"metadata": {"labels": {KWOK_NODE_LABEL: None}}})

    def node_ready(self, name: str) -> None:
        """kwok manages the node again: Ready, lease renewed; node-lifecycle lifts its taints."""
        if self.node(name) is None:
            return
        self._patch_node(name, lambda node: {"metadata": {"labels": {KWOK_NODE_LABEL: "fake"}}})

    def delete_node(self, name: str) -> None:
        """Delete the Node object: pod GC force-deletes its pods (after ~40-60 s, hard-coded)."""
        with contextlib.suppress(ApiStatus):
            self.request("DELETE", f"/api/v1/nodes/{name}")

    def add_node(
        self,
        name: str,
        *,
        cpu: str = NODE_CPU,
        memory: str = NODE_MEMORY,
        gpu: int = NODE_GPU,
        pods: str = NODE_PODS,
    ) -> str:
        """A new kwok node (Ready within a second or so)."""
        self.kubectl(
            "create",
            "-f",
            "-",
            input=yaml.safe_dump(node_manifest(name, cpu=cpu, memory=memory, gpu=gpu, pods=pods)),
        )
        self.wait(f"node {name} Ready", lambda: name in self.ready_nodes(), 60)
        return name

    def restore_nodes(self) -> None:
        """Bring the base nodes back to their start state (after a test changed them)."""
        for name in self.nodes:
            node = self.node(name)
            if node is None:
                self.add_node(name)
                continue
            self.untaint_node(name)
            self.node_ready(name)


def _millicpu(quantity: str) -> int:
    q = str(quantity)
    return int(q[:-1]) if q.endswith("m") else int(float(q) * 1000)


def _pod_cpu(pod: dict[str, Any]) -> str:
    """A pod's cpu request as the scheduler counts it: the sum over its containers (requests,
    or limits when only limits are set), or the largest init container's if that is more."""
    spec = pod.get("spec") or {}

    def cpu(c: dict[str, Any]) -> int:
        res = c.get("resources") or {}
        value = (res.get("requests") or {}).get("cpu") or (res.get("limits") or {}).get("cpu") or "0"
        return _millicpu(str(value))

    main = sum(cpu(c) for c in spec.get("containers") or ())
    init = max((cpu(c) for c in spec.get("initContainers") or ()), default=0)
    return f"{max(main, init)}m"


__all__ = ["LabFailures"]
