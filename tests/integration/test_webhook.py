"""The admission webhooks on the real control plane: kopf's webhook server (TLS, generated CA)
serving dispatch's handlers, installing its own webhook configurations (``managed``).

* an unenforceable DispatchJob is refused at apply time, with the rule named, and so is a
  ``kubectl apply --dry-run=server`` of it;
* what the CRD cannot check (options for another backend) is refused;
* the recorded actor is the identity that applied the manifest, for two different minted users,
  whatever the manifest claimed; a cancel names who cancelled; the annotations cannot be edited.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from dispatch._constants import (
    ANNOTATION_CANCELLED_BY,
    ANNOTATION_SUBMITTED_BY,
    FINALIZER,
    WEBHOOK_VALIDATE_ID,
)
from dispatch._controller import webhook
from dispatch._controller.main import _connection_info
from dispatch._controller.settings import operator_settings
from dispatch._kubeclient import load_configuration
from tests.integration.conftest import USERS_GROUP, free_port, users_may_submit
from tests.support.builders import SEED_EXAMPLE
from tests.support.kube import KubeCluster, KubectlError

pytestmark = pytest.mark.integration

SEED = yaml.safe_load(SEED_EXAMPLE.read_text())


class WebhookOperator:
    """A kopf operator with only dispatch's admission handlers, in a thread with its own loop."""

    def __init__(self, kubeconfig: Path, managed: str) -> None:
        self.kubeconfig = kubeconfig
        self.managed = managed
        self.port = free_port()
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="webhook-operator", daemon=True)

    def start(self) -> None:
        self._thread.start()
        assert self._started.wait(60), "the operator thread never started"

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as error:
            self.error = error
            self._started.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        configuration = await load_configuration(str(self.kubeconfig))
        registry = kopf.OperatorRegistry()
        settings = operator_settings()

        @kopf.on.login(registry=registry)
        def login(**_: Any) -> kopf.ConnectionInfo:
            return _connection_info(configuration)

        webhook.setup(
            registry=registry,
            settings=settings,
            port=self.port,
            addr="127.0.0.1",
            host="127.0.0.1",
            managed=self.managed,
        )
        self._started.set()
        await kopf.operator(
            registry=registry, settings=settings, standalone=True, clusterwide=True, stop_flag=self._stop
        )


def job(name: str, **spec: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(SEED))
    body["metadata"] = {"name": name}
    body["spec"].update(spec)
    return dict(body)


def unenforceable(name: str) -> dict[str, Any]:
    # Slurm enforces no rule natively (its requeue limit does not bound preemption requeues), so even a
    # restart on what Slurm requeues, at its compiled-in limit, is refused.
    return job(
        name, recovery={"rules": [{"on": ["preempted", "node-lost"], "action": "restart", "budget": 5}]}
    )


def apply_as(
    cluster: KubeCluster, body: dict[str, Any], namespace: str, kubeconfig: Path | None = None, *extra: str
) -> str:
    return cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", *extra, input=yaml.safe_dump(body), kubeconfig=kubeconfig
    )


@pytest.fixture(scope="module")
def admission(crds: KubeCluster) -> Iterator[WebhookOperator]:
    kube_cluster = crds
    users_may_submit(kube_cluster)
    managed = f"t{secrets.token_hex(3)}.dispatch.dev"
    operator = WebhookOperator(kube_cluster.kubeconfig, managed)
    operator.start()
    try:
        _wait_until_serving(kube_cluster, operator)
        yield operator
    finally:
        operator.close()
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            kube_cluster.kubectl("delete", kind, managed, "--ignore-not-found", check=False)


def _wait_until_serving(cluster: KubeCluster, operator: WebhookOperator) -> None:
    """Until the managed configurations point at the server and it answers (a refusal is its answer)."""
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "webhook-probe"}})
    deadline = time.monotonic() + 120
    last = ""
    while time.monotonic() < deadline:
        if operator.error is not None:
            raise operator.error
        try:
            apply_as(cluster, unenforceable("probe"), "webhook-probe", None, "--dry-run=server")
            last = "the probe was admitted"
        except KubectlError as error:
            last = error.stderr
            if "denied the request" in last and "rule 0 cannot be enforced" in last:
                return
        time.sleep(0.5)
    raise AssertionError(f"the webhook never started serving: {last}")


def test_unenforceable_job_is_refused_with_the_rule_named(
    kube_cluster: KubeCluster, namespace: str, admission: WebhookOperator
) -> None:
    for extra in ((), ("--dry-run=server",)):
        with pytest.raises(KubectlError) as info:
            apply_as(kube_cluster, unenforceable("restarts"), namespace, None, *extra)
        message = info.value.stderr
        assert f'admission webhook "{WEBHOOK_VALIDATE_ID}.{admission.managed}" denied the request' in message
        assert "rule 0 cannot be enforced: only a scheduler can restart in place" in message
        assert "restart on [preempted node-lost] with budget 5 (it enforces nothing)" in message
        assert "(backend slurm)" in message
    assert kube_cluster.kubectl("get", "dispatchjobs", "-n", namespace, "-o", "name") == ""


def test_what_the_crd_cannot_check_is_refused(
    kube_cluster: KubeCluster, namespace: str, admission: WebhookOperator
) -> None:
    with pytest.raises(KubectlError) as info:
        apply_as(kube_cluster, job("mixed", kubeflow={"image": "pytorch:2"}), namespace)
    assert "spec.kubeflow is set but spec.backend is slurm" in info.value.stderr


def test_a_replaced_field_is_refused_naming_the_field_that_replaced_it(
    kube_cluster: KubeCluster, namespace: str, admission: WebhookOperator
) -> None:
    """By the CRD itself (CEL): the API server would otherwise drop or refuse it as unknown."""
    with pytest.raises(KubectlError) as info:
        apply_as(kube_cluster, job("old-limit", slurm={"timeLimitMinutes": 5}), namespace)
    assert "spec.slurm.timeLimitMinutes is replaced by spec.timeLimitSeconds" in info.value.stderr


def test_a_grace_slurm_cannot_give_is_refused_naming_the_field(
    kube_cluster: KubeCluster, namespace: str, admission: WebhookOperator
) -> None:
    with pytest.raises(KubectlError) as info:
        apply_as(kube_cluster, job("grace", stop={"gracePeriodSeconds": 90}), namespace)
    assert "spec.stop.gracePeriodSeconds" in info.value.stderr
    assert "KillWait" in info.value.stderr
    # A time limit and a deadline are accepted, and no rule may cover the deadline.
    apply_as(kube_cluster, job("limits", timeLimitSeconds=600, deadlineSeconds=3600), namespace)
    with pytest.raises(KubectlError) as info:
        apply_as(
            kube_cluster,
            job("cover", recovery={"rules": [{"on": ["deadline-exceeded"], "budget": 1}]}),
            namespace,
        )
    assert "deadline-exceeded" in info.value.stderr


def test_the_recorded_actor_is_who_applied_it(
    kube_cluster: KubeCluster, namespace: str, admission: WebhookOperator
) -> None:
    alice = kube_cluster.mint_user("alice", [USERS_GROUP])
    bob = kube_cluster.mint_user("bob", [USERS_GROUP])

    # Each applies a job claiming to be someone else: the webhook records who really did it.
    for who, kubeconfig in (("alice", alice), ("bob", bob)):
        body = job(f"by-{who}")
        body["metadata"]["annotations"] = {ANNOTATION_SUBMITTED_BY: "human:mallory"}
        apply_as(kube_cluster, body, namespace, kubeconfig)
        meta = kube_cluster.get("dispatchjob", f"by-{who}", namespace)["metadata"]
        annotations = meta["annotations"]
        assert annotations[ANNOTATION_SUBMITTED_BY] == f"human:{who}"
        assert ANNOTATION_CANCELLED_BY not in annotations
        # The loop's finalizer arrives with the object (no patch of the loop's needed), once.
        assert meta["finalizers"].count(FINALIZER) == 1

    # A server-side dry run shows the same.
    shown = yaml.safe_load(
        apply_as(kube_cluster, job("dry"), namespace, alice, "--dry-run=server", "-o", "yaml")
    )
    assert shown["metadata"]["annotations"][ANNOTATION_SUBMITTED_BY] == "human:alice"

    # Editing the annotation is undone.
    kube_cluster.kubectl(
        "annotate",
        "-n",
        namespace,
        "dispatchjob/by-alice",
        f"{ANNOTATION_SUBMITTED_BY}=human:mallory",
        "--overwrite",
        kubeconfig=bob,
    )
    annotations = kube_cluster.get("dispatchjob", "by-alice", namespace)["metadata"]["annotations"]
    assert annotations[ANNOTATION_SUBMITTED_BY] == "human:alice"

    # Bob cancels Alice's job: the cancel is his, the submission still hers.
    kube_cluster.kubectl(
        "patch",
        "-n",
        namespace,
        "dispatchjob/by-alice",
        "--type=merge",
        "-p",
        json.dumps(
            {"spec": {"cancel": True}, "metadata": {"annotations": {ANNOTATION_CANCELLED_BY: "human:alice"}}}
        ),
        kubeconfig=bob,
    )
    annotations = kube_cluster.get("dispatchjob", "by-alice", namespace)["metadata"]["annotations"]
    assert annotations[ANNOTATION_SUBMITTED_BY] == "human:alice"
    assert annotations[ANNOTATION_CANCELLED_BY] == "human:bob"

    # Later edits keep both.
    kube_cluster.kubectl(
        "annotate",
        "-n",
        namespace,
        "dispatchjob/by-alice",
        f"{ANNOTATION_CANCELLED_BY}=human:alice",
        "--overwrite",
        kubeconfig=alice,
    )
    annotations = kube_cluster.get("dispatchjob", "by-alice", namespace)["metadata"]["annotations"]
    assert annotations[ANNOTATION_CANCELLED_BY] == "human:bob"


def test_the_spec_is_fixed_and_a_cancel_cannot_be_undone(
    kube_cluster: KubeCluster, namespace: str, admission: WebhookOperator
) -> None:
    apply_as(kube_cluster, job("fixed", cancel=True), namespace)
    for patch, message in (
        ({"spec": {"nodes": 3}}, "nodes is immutable"),
        ({"spec": {"cancel": False}}, "cannot be undone"),
    ):
        with pytest.raises(KubectlError) as info:
            kube_cluster.kubectl(
                "patch", "-n", namespace, "dispatchjob/fixed", "--type=merge", "-p", json.dumps(patch)
            )
        assert message in info.value.stderr
