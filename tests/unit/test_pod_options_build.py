"""The pod options (``PodOptions``) in the object each Kubernetes kind builds, their refusals at
apply (the codec, which the webhook runs, naming the field), and the submission's identity in every
pod and in Slurm's submit request."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch import _dispatchjob
from dispatch._backends.job._adapter import build as build_job
from dispatch._backends.jobset._adapter import build as build_jobset
from dispatch._backends.kubeflow._adapter import build as build_kubeflow
from dispatch._backends.slurm._adapter import open_adapter
from dispatch._backends.trainjob._adapter import build as build_trainjob
from dispatch._controller import crd
from dispatch._dispatchjob import SpecError
from dispatch._model import JobSpec, Plan
from dispatch._workload import Target
from tests.support.builders import dispatch_job, identity

EXAMPLE = Path(__file__).parents[2] / "examples" / "training-dispatchjob.yaml"
TARGET = Target("team-a", "train", 4)
AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
        }
    }
}
OPTIONS: dict[str, Any] = {
    "image": "img:1",
    "env": {"A": "1"},
    "envFrom": [{"secretRef": {"name": "hf-token"}}, {"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
    "volumes": [
        {"name": "data", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}},
        {"name": "ckpt", "persistentVolumeClaim": {"claimName": "checkpoints"}},
        {"name": "creds", "secret": {"secretName": "creds"}},
        {"name": "conf", "configMap": {"name": "conf"}},
        {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
    ],
    "volumeMounts": [
        {"name": "data", "mountPath": "/data", "readOnly": True},
        {"name": "ckpt", "mountPath": "/ckpt", "subPath": "run-1"},
    ],
    "shmSize": "16Gi",
    "nodeSelector": {"gpu": "h100"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": AFFINITY,
    "serviceAccountName": "trainer",
    "imagePullSecrets": [{"name": "registry"}],
    "podLabels": {"team": "research"},
    "podAnnotations": {"note": "x"},
}
POD_ONLY: dict[str, Any] = {
    "priorityClassName": "training",
    "workingDir": "/w",
}
"""The options a TrainJob cannot carry (the other kinds do)."""
VOLUMES = [
    {"name": "data", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}},
    {"name": "ckpt", "persistentVolumeClaim": {"claimName": "checkpoints", "readOnly": False}},
    {"name": "creds", "secret": {"secretName": "creds"}},
    {"name": "conf", "configMap": {"name": "conf"}},
    {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
    {"name": "dispatch-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
]
MOUNTS = [
    {"name": "data", "mountPath": "/data", "readOnly": True},
    {"name": "ckpt", "mountPath": "/ckpt", "readOnly": False, "subPath": "run-1"},
    {"name": "dispatch-shm", "mountPath": "/dev/shm"},
]
DISPATCH_LABELS = {
    "dispatch.dev/job": "train",
    "dispatch.dev/submission": "4",
    "app.kubernetes.io/managed-by": "dispatch",
}


def spec_of(backend: str, options: dict[str, Any], **fields: Any) -> JobSpec:
    body = dispatch_job("train", backend=backend, namespace="team-a", backend_options=options, **fields)
    return _dispatchjob.job_spec(body)


def refusal(backend: str, options: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as refused:
        spec_of(backend, options)
    return str(refused.value)


def job_pods(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [body["spec"]["template"]]


def jobset_pods(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]]


def kubeflow_pods(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [replica["template"] for replica in body["spec"]["pytorchReplicaSpecs"].values()]


KINDS: dict[str, tuple[Callable[..., dict[str, Any]], Callable[[dict[str, Any]], list[dict[str, Any]]]]] = {
    "job": (build_job, job_pods),
    "jobset": (build_jobset, jobset_pods),
    "kubeflow": (build_kubeflow, kubeflow_pods),
}


@pytest.mark.parametrize("backend", sorted(KINDS))
def test_every_option_reaches_every_pod_template(backend: str) -> None:
    build, pods_of = KINDS[backend]
    body = build(TARGET, spec_of(backend, {**OPTIONS, **POD_ONLY}, nodes=2), Plan(job="team-a/train"))
    pods = pods_of(body)
    assert len(pods) == (2 if backend == "kubeflow" else 1)  # Master and Worker
    for pod in pods:
        assert pod["metadata"]["labels"] == {"team": "research", **DISPATCH_LABELS}
        assert pod["metadata"]["annotations"] == {"note": "x"}
        spec = pod["spec"]
        assert spec["volumes"] == VOLUMES
        assert spec["nodeSelector"] == {"gpu": "h100"}
        assert spec["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
        assert spec["affinity"] == AFFINITY
        assert spec["serviceAccountName"] == "trainer"
        assert spec["imagePullSecrets"] == [{"name": "registry"}]
        assert spec["priorityClassName"] == "training"
        (main,) = spec["containers"]
        assert main["volumeMounts"] == MOUNTS
        assert main["envFrom"] == [
            {"secretRef": {"name": "hf-token", "optional": False}},
            {"prefix": "CFG_", "configMapRef": {"name": "cfg", "optional": False}},
        ]
        assert main["workingDir"] == "/w"
        assert main["env"] == [{"name": "A", "value": "1"}, *identity("team-a", "train", 4)]


@pytest.mark.parametrize("backend", sorted(KINDS))
def test_without_options_a_pod_carries_only_dispatchs_labels_and_identity(backend: str) -> None:
    build, pods_of = KINDS[backend]
    (pod, *_) = pods_of(build(TARGET, spec_of(backend, {"image": "img:1"}), Plan(job="team-a/train")))
    assert pod["metadata"] == {"labels": DISPATCH_LABELS}
    assert set(pod["spec"]) <= {"containers", "restartPolicy"}
    (main,) = pod["spec"]["containers"]
    assert set(main) == {"name", "image", "command", "env"}
    assert main["env"] == identity("team-a", "train", 4)


def test_a_trainjob_carries_what_its_runtime_patch_takes() -> None:
    options = {**OPTIONS, "runtime": "torch-distributed"}
    del options["envFrom"]  # refused (below)
    body = build_trainjob(TARGET, spec_of("trainjob", options), Plan(job="team-a/train"))
    spec = body["spec"]
    assert spec["trainer"]["env"] == [{"name": "A", "value": "1"}, *identity("team-a", "train", 4)]
    (patch,) = spec["runtimePatches"]
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["name"] == "node"
    pod = rjob["template"]["spec"]["template"]
    assert pod["metadata"] == {
        "labels": {"team": "research", **DISPATCH_LABELS},
        "annotations": {"note": "x"},
    }
    assert pod["spec"] == {
        "volumes": VOLUMES,
        "nodeSelector": {"gpu": "h100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": AFFINITY,
        "serviceAccountName": "trainer",
        "imagePullSecrets": [{"name": "registry"}],
        "containers": [{"name": "node", "volumeMounts": MOUNTS}],
    }


@pytest.mark.parametrize(("field", "value"), [*POD_ONLY.items(), ("envFrom", OPTIONS["envFrom"])])
def test_a_trainjob_refuses_what_its_runtime_patch_cannot_carry(field: str, value: object) -> None:
    message = refusal("trainjob", {"runtime": "torch-distributed", field: value})
    assert message.startswith("spec.trainjob: ")
    assert f"{field}: a TrainJob cannot carry it" in message


@pytest.mark.parametrize(
    ("options", "where"),
    [
        (
            {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]},
            "spec.job.volumes[0].hostPath: Extra inputs",
        ),
        ({"volumes": [{"name": "v", "nfs": {"server": "x", "path": "/"}}]}, "spec.job.volumes[0].nfs: Extra"),
        ({"volumes": [{"name": "v"}]}, "spec.job.volumes[0]: a volume has exactly one"),
        (
            {"volumes": [{"name": "v", "emptyDir": {}, "secret": {"secretName": "s"}}]},
            "spec.job.volumes[0]: a volume has exactly one",
        ),
        ({"volumes": [{"name": "v", "emptyDir": {}}] * 2}, "volumes[1].name: 'v' names two volumes"),
        (
            {"volumeMounts": [{"name": "v", "mountPath": "/v"}]},
            "volumeMounts[0].name: 'v' is none of volumes",
        ),
        (
            {
                "shmSize": "1Gi",
                "volumes": [{"name": "v", "emptyDir": {}}],
                "volumeMounts": [{"name": "v", "mountPath": "/dev/shm"}],
            },
            "volumeMounts[0].mountPath: '/dev/shm' is mounted twice",
        ),
        ({"volumeMounts": [{"name": "v", "mountPath": "rel"}]}, "spec.job.volumeMounts[0].mountPath"),
        (
            {"env": {"DISPATCH_SUBMISSION": "9"}},
            "spec.job.env: ['DISPATCH_SUBMISSION']: names with",
        ),
        (
            {"envFrom": [{"prefix": "DISPATCH_", "secretRef": {"name": "s"}}]},
            "spec.job.envFrom[0]: prefix: the prefix DISPATCH_",
        ),
        ({"envFrom": [{"secretRef": {"name": "s"}, "configMapRef": {"name": "c"}}]}, "spec.job.envFrom[0]"),
        (
            {"podLabels": {"dispatch.dev/job": "other"}},
            "spec.job.podLabels: ['dispatch.dev/job']",
        ),
        (
            {"podLabels": {"app.kubernetes.io/managed-by": "me"}},
            "spec.job.podLabels: ['app.kubernetes.io/managed-by']",
        ),
        ({"podAnnotations": {"dispatch.dev/ended": "x"}}, "spec.job.podAnnotations: ['dispatch.dev/ended']"),
        (
            {
                "affinity": {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": "zone", "namespaces": ["other"]}
                        ]
                    }
                }
            },
            "spec.job.affinity: podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
            ".namespaces: a DispatchJob's pods may not refer to pods of other namespaces",
        ),
        (
            {
                "affinity": {
                    "podAntiAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 1, "podAffinityTerm": {"topologyKey": "zone", "namespaceSelector": {}}}
                        ]
                    }
                }
            },
            "podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.namespaceSelector",
        ),
        ({"securityContext": {"privileged": True}}, "spec.job.securityContext: Extra inputs"),
        ({"hostNetwork": True}, "spec.job.hostNetwork: Extra inputs"),
        ({"tolerations": [{"operator": "Sometimes"}]}, "spec.job.tolerations[0].operator"),
    ],
)
def test_refused_at_apply_naming_the_field(options: dict[str, Any], where: str) -> None:
    assert where in refusal("job", {"image": "img:1", **options})


def test_the_slurm_environment_refuses_dispatchs_names() -> None:
    message = refusal("slurm", {"environment": {"DISPATCH_JOB": "x"}})
    assert message.startswith("spec.slurm.environment: ['DISPATCH_JOB']")


@pytest.mark.parametrize(
    ("job", "namespace", "name"), [("team-a/finetune", "team-a", "finetune"), ("finetune", "", "finetune")]
)
def test_the_identity_is_in_slurms_submit_request(job: str, namespace: str, name: str) -> None:
    backend = open_adapter({"url": "http://slurm.test"})
    spec = spec_of("slurm", {"environment": {"A": "1"}})
    env = backend.submit_request(job, 7, spec).environment
    assert {k: v for k, v in env.items() if k.startswith("DISPATCH_")} == {
        "DISPATCH_JOB": name,
        "DISPATCH_NAMESPACE": namespace,
        "DISPATCH_SUBMISSION": "7",
    }
    assert env["A"] == "1"


def test_the_crd_refuses_dispatchs_names_and_sourceless_volumes() -> None:
    """The same refusals as CEL rules, for a client that bypasses the webhook."""
    job = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "job"
    ]
    props = job["properties"]
    rules = {r["rule"] for r in props["env"]["x-kubernetes-validations"]}
    assert "self.all(k, !k.startsWith('DISPATCH_'))" in rules
    volume_rules = [r["rule"] for r in props["volumes"]["items"]["x-kubernetes-validations"]]
    assert any("filter(x, x).size() == 1" in r for r in volume_rules)
    assert "hostPath" not in props["volumes"]["items"]["properties"]
    assert props["affinity"]["properties"]["podAffinity"]["x-kubernetes-preserve-unknown-fields"] is True
    label_rules = [r["rule"] for r in props["podLabels"]["x-kubernetes-validations"]]
    assert any("dispatch.dev/" in r for r in label_rules)


def test_the_training_example_builds_with_its_pod_options() -> None:
    body = yaml.safe_load(EXAMPLE.read_text())
    spec = _dispatchjob.job_spec(body)
    built = build_kubeflow(Target("team-a", "llama-pretrain", 1), spec, Plan(job="team-a/llama-pretrain"))
    master = built["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert {"name": "dispatch-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in master[
        "volumes"
    ]
    assert master["tolerations"][0]["key"] == "nvidia.com/gpu"
    claims = [
        v["persistentVolumeClaim"]["claimName"] for v in master["volumes"] if "persistentVolumeClaim" in v
    ]
    assert claims == ["datasets", "checkpoints"]
