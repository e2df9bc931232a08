"""The admission webhooks on the real control plane: kopf's webhook server (TLS, generated CA)
serving dispatch's handlers, installing its own webhook configurations (``managed``).

* an unenforceable DispatchJob is refused at apply time, with the rule named, and so is a
  ``kubectl apply --dry-run=server`` of it;
* what the CRD cannot check (options for another backend) is refused;
* the recorded actor is the identity that applied the manifest, for two different minted users,
  whatever the manifest claimed; a cancel names who cancelled; the annotations cannot be edited.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch._constants import (
    ANNOTATION_CANCELLED_BY,
    ANNOTATION_SUBMITTED_BY,
    FINALIZER,
    WEBHOOK_VALIDATE_ID,
)
from dispatch._controller.webhook import MAX_OBJECT_BYTES
from tests.integration.conftest import USERS_GROUP, WebhookOperator
from tests.support.builders import SEED_EXAMPLE
from tests.support.kube import KubeCluster, KubectlError

pytestmark = pytest.mark.integration

SEED = yaml.safe_load(SEED_EXAMPLE.read_text())


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


@pytest.mark.parametrize(
    ("change", "field", "why"),
    [
        ({"memory": {"factor": 2, "max": "4Gi"}}, "change.memory", "no memory of each node is set to change"),
        ({"queue": "big"}, "change.queue", "a change of Kueue's fields needs spec.queue"),
    ],
)
def test_a_change_the_backend_cannot_make_is_refused_naming_the_field(
    kube_cluster: KubeCluster,
    namespace: str,
    admission: WebhookOperator,
    change: dict[str, Any],
    field: str,
    why: str,
) -> None:
    rules = [{"on": ["preempted"], "budget": 1, "change": change}]
    with pytest.raises(KubectlError) as info:
        apply_as(kube_cluster, job("changes", recovery={"rules": rules}), namespace)
    assert f"spec.recovery.rules[0].{field} is refused: {why}" in info.value.stderr
    accepted = job("partition", recovery={"rules": [{**rules[0], "change": {"slurm": {"partition": "big"}}}]})
    apply_as(kube_cluster, accepted, namespace, None, "--dry-run=server")


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


def test_a_large_job_can_be_cancelled_and_let_go_and_a_too_large_one_is_refused_readably(
    kube_cluster: KubeCluster, namespace: str, admission: WebhookOperator
) -> None:
    # 600 KiB of arguments: a CREATE's review holds it once, an UPDATE's twice (over kopf's 1 MiB).
    large = job("large", command=["python", "train.py", *(["x" * 4000] * 150)])
    text = yaml.safe_dump(large)
    kube_cluster.kubectl("create", "-n", namespace, "-f", "-", input=text)
    kube_cluster.kubectl(
        "patch", "-n", namespace, "dispatchjob/large", "--type=merge", "-p", '{"spec":{"cancel":true}}'
    )
    assert kube_cluster.get("dispatchjob", "large", namespace)["spec"]["cancel"] is True
    kube_cluster.kubectl("delete", "-n", namespace, "dispatchjob/large", "--wait=false")
    # What the loop does to let a deleted job go: the finalizer's removal is admitted too.
    kube_cluster.kubectl(
        "patch",
        "-n",
        namespace,
        "dispatchjob/large",
        "--type=json",
        "-p",
        json.dumps([{"op": "remove", "path": "/metadata/finalizers"}]),
    )
    kube_cluster.kubectl("wait", "-n", namespace, "--for=delete", "dispatchjob/large", "--timeout=60s")

    # Client-side apply keeps a copy in an annotation: 1.2 MB, refused readably, not a bare 413.
    with pytest.raises(KubectlError) as info:
        apply_as(kube_cluster, job("copied", command=large["spec"]["command"]), namespace)
    assert "metadata.annotations: Too long" in info.value.stderr
    assert "413" not in info.value.stderr
    # Over half the object limit: its record would have no room; refused with both sizes.
    larger = job("larger", command=["python", "train.py", *(["x" * 4000] * 200)])
    with pytest.raises(KubectlError) as info:
        kube_cluster.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(larger))
    assert "denied the request: the DispatchJob is " in info.value.stderr
    assert f"half the API server's object size limit ({MAX_OBJECT_BYTES})" in info.value.stderr
