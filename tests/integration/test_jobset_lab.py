"""The lab's opt-in extras on the real controllers: JobSet v0.11.1 with its webhooks and Kubeflow
Trainer v2.2.0 (the ``lab_extras`` fixture). Proves what the ``jobset`` and ``trainjob`` backends
rely on: a held object runs nothing, a released one runs to completion through its child Jobs and
pods (kwok completes Job-owned pods), and each webhook is really called (its defaults appear, its
refusals come back)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.kube import KubeCluster, KubectlError
from tests.support.lab import TRAINER_RUNTIME, Lab

pytestmark = pytest.mark.integration


def _get(cluster: KubeCluster, kind: str, name: str, namespace: str) -> dict[str, Any]:
    return cluster.get(kind, name, namespace)


def _condition(obj: dict[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or ()
    )


def _release(cluster: KubeCluster, kind: str, name: str, namespace: str) -> None:
    cluster.kubectl("patch", kind, name, "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}')


def _jobs(cluster: KubeCluster, namespace: str) -> list[dict[str, Any]]:
    out = json.loads(cluster.kubectl("get", "jobs.batch", "-n", namespace, "-o", "json"))
    return list(out.get("items") or [])


def jobset(name: str, *, suspend: bool) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {
            "suspend": suspend,
            "replicatedJobs": [
                {
                    "name": "node",
                    "replicas": 2,
                    "template": {
                        "spec": {
                            "backoffLimit": 0,
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [
                                        {
                                            "name": "train",
                                            "image": "example.invalid/train:1",
                                            "resources": {"requests": {"cpu": "1"}},
                                        }
                                    ],
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


def test_jobset_held_then_released_completes(
    lab_extras: Lab, kube_cluster: KubeCluster, namespace: str
) -> None:
    kube_cluster.apply(jobset("js", suspend=True), namespace=namespace)
    body = _get(kube_cluster, "jobset", "js", namespace)
    # The mutating webhook's default; without it the reconciler panics on every JobSet.
    assert body["spec"]["network"]["enableDNSHostnames"] is True
    lab_extras.wait("the held JobSet's suspended Jobs", lambda: len(_jobs(kube_cluster, namespace)) == 2)
    assert all(j["spec"].get("suspend") is True for j in _jobs(kube_cluster, namespace))
    assert not lab_extras.pods(namespace)

    _release(kube_cluster, "jobset", "js", namespace)
    lab_extras.wait(
        "JobSet Completed", lambda: _condition(_get(kube_cluster, "jobset", "js", namespace), "Completed")
    )
    assert len(lab_extras.pods(namespace, "jobset.sigs.k8s.io/jobset-name=js")) == 2


def test_jobset_validating_webhook_refuses(
    lab_extras: Lab, kube_cluster: KubeCluster, namespace: str
) -> None:
    bad = jobset("js-bad", suspend=True)
    bad["spec"]["failurePolicy"] = {
        "rules": [{"name": "r", "action": "FailJobSet", "onJobFailureReasons": ["Nope"]}]
    }
    with pytest.raises(KubectlError, match=r"vjobset\.kb\.io.*not a recognized job failure reason"):
        kube_cluster.apply(bad, namespace=namespace)


def trainjob(name: str, *, runtime: str = TRAINER_RUNTIME) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "suspend": True,
            "runtimeRef": {"name": runtime},
            "trainer": {
                "numNodes": 2,
                "image": "example.invalid/train:1",
                "command": ["python", "train.py"],
                "resourcesPerNode": {"requests": {"cpu": "1", "memory": "1Gi"}},
            },
        },
    }


def test_trainjob_runs_on_jobset(lab_extras: Lab, kube_cluster: KubeCluster, namespace: str) -> None:
    kube_cluster.apply(trainjob("tj"), namespace=namespace)
    # The mutating webhook defaulted the runtime's kind; the Trainer built a held JobSet.
    assert (
        _get(kube_cluster, "trainjob", "tj", namespace)["spec"]["runtimeRef"]["kind"]
        == "ClusterTrainingRuntime"
    )
    js = lab_extras.wait("the TrainJob's JobSet", lambda: _try_get(kube_cluster, "jobset", "tj", namespace))
    assert js["spec"]["suspend"] is True
    assert not lab_extras.pods(namespace)

    _release(kube_cluster, "trainjob", "tj", namespace)
    lab_extras.wait(
        "TrainJob Complete", lambda: _condition(_get(kube_cluster, "trainjob", "tj", namespace), "Complete")
    )
    pods = lab_extras.pods(namespace, "jobset.sigs.k8s.io/jobset-name=tj")
    assert len(pods) == 2
    container = pods[0]["spec"]["containers"][0]
    assert container["image"] == "example.invalid/train:1"
    assert container["command"] == ["python", "train.py"]


def test_trainjob_webhook_refuses_missing_runtime(
    lab_extras: Lab, kube_cluster: KubeCluster, namespace: str
) -> None:
    with pytest.raises(KubectlError, match=r"trainjob\.trainer\.kubeflow\.org"):
        kube_cluster.apply(trainjob("tj-bad", runtime="no-such-runtime"), namespace=namespace)


def _try_get(cluster: KubeCluster, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    try:
        return cluster.get(kind, name, namespace)
    except KubectlError:
        return None
