"""The reference training job (examples/training/train.py) under dispatch on the lab's real node:
PyTorch 2.9 from PyPI (hack/build-torch-image.sh's image, imported into the node once per
session), torchrun with gloo on CPU, two nodes (pods) of one process each, checkpoints on a
hostPath PersistentVolume the test creates as the cluster's administrator, bound to the claim the
DispatchJob mounts.

- a PyTorchJob trains to completion, and so do a TrainJob, a JobSet and a batch/v1 Job, each to
  the same final model (the data is a function of the seed, the step and the rank);
- a real kube-scheduler preemption in the middle of a PyTorchJob: the preempted pod's process gets
  SIGTERM and writes a checkpoint, dispatch records ``preempted`` and releases submission 2, which
  resumes from that checkpoint (its log says the step, after step 0) and ends with the model of
  the uninterrupted run;
- a real OOM kill of a PyTorchJob's process (the small test image) answered by a rule.

Run: ``.venv/bin/pytest -p no:cacheprovider tests/integration/test_real_training.py`` (root,
``make node-deps torch-image``). On an existing cluster (``DISPATCH_E2E_KUBECONFIG``) the pods run
on its own nodes in the image ``DISPATCH_E2E_TRAINING_IMAGE`` names (the tests skip without it),
the checkpoints go to a claim of its default StorageClass and are read back by a pod, and the
TrainJob and JobSet runs need the lab (they skip).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import REPO, OperatorProcess, apply, get_job, history, wait_for
from tests.support.builders import host_path_claim, lab_manifest
from tests.support.kube import KubeCluster, let_go
from tests.support.lab_setup import HIGH_PRIORITY
from tests.support.node import NodeError, RealNode, resolve_torch_image

# Longer than the tier's 300 s: the first test imports the 6.6 GiB image and runs the reference job.
pytestmark = [pytest.mark.integration, pytest.mark.node, pytest.mark.timeout(1200)]

TRAIN_SCRIPT = REPO / "examples" / "training" / "train.py"
STEPS = 200
CHECKPOINT_EVERY = 50
STEP_SECONDS = 0.1
"""Each step lasts at least this long: the run spans about 20 s, long enough to preempt it midway."""
RUN_WAIT = 600.0
"""How long a training run may take to settle (image already imported; slow under a full test load)."""
NODE_RESOURCES = {"cpu": "1", "memory": "3Gi"}
"""One pod: torchrun's agent and one training process, each with torch imported."""
RDZV_PORT = 29500
SCRIPT_ARGS = [
    "/opt/train/train.py",
    "--checkpoint-dir=/checkpoints",
    f"--steps={STEPS}",
    f"--checkpoint-every={CHECKPOINT_EVERY}",
    f"--step-seconds={STEP_SECONDS}",
]
CONTAINER = {"kubeflow": "pytorch", "trainjob": "node", "jobset": "main", "job": "main"}
PREEMPTED_ONCE = [{"on": ["preempted"], "action": "resubmit", "budget": 1}]
TRAINING_IMAGE_ENV = "DISPATCH_E2E_TRAINING_IMAGE"
"""On an existing cluster: the training image (PyTorch 2.9 with python3; pullable there)."""
PREEMPTOR_PRIORITY = "dispatch-e2e-high"
"""The preemptor's PriorityClass on an existing cluster (the lab has its own, ``lab-high``)."""


class Site:
    """Where the training pods run and how the test reads what they leave: the lab's real node
    (its placement, the imported image, a hostPath volume read on the host, the kubelet's log
    files) or an existing cluster's own nodes (no placement, an image it can pull, a claim of its
    default StorageClass read back by a pod, ``kubectl logs``)."""

    def __init__(self, cluster: KubeCluster, image: str, node: RealNode | None) -> None:
        self.cluster, self.image, self.node = cluster, image, node

    @property
    def small_image(self) -> str:
        return self.node.image if self.node is not None else self.image

    def placement(self) -> dict[str, Any]:
        return self.node.placement() if self.node is not None else {}

    def priority_class(self) -> str:
        if self.node is not None:
            return HIGH_PRIORITY
        self.cluster.apply(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": PREEMPTOR_PRIORITY},
                "value": 1000000,
                "description": "dispatch's training tests: the preemptor",
            }
        )
        return PREEMPTOR_PRIORITY

    def claim(self, namespace: str, claim: str, out: Path) -> list[dict[str, Any]]:
        if self.node is not None:
            return host_path_claim(namespace, claim, out)
        return [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": namespace},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            }
        ]

    def log(self, namespace: str, pod: str, container: str) -> str:
        if self.node is not None:
            return self.node.container_log(namespace, pod, container)
        return self.cluster.kubectl("logs", pod, "-c", container, "-n", namespace, check=False)

    def files(self, namespace: str, claim: str, out: Path, pattern: str) -> dict[str, str]:
        """The text of the files matching ``pattern`` on the claim, by name."""
        if self.node is not None:
            return {p.name: p.read_text() for p in sorted(out.glob(pattern))}
        reader = f"read-{secrets.token_hex(3)}"
        code = (
            "import json, pathlib, sys\n"
            "print(json.dumps({p.name: p.read_text() for p in pathlib.Path('/c').glob(sys.argv[1])}))\n"
        )
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": reader, "namespace": namespace},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": self.image,
                        "command": ["python3", "-c", code, pattern],
                        "volumeMounts": [{"name": "c", "mountPath": "/c"}],
                    }
                ],
                "volumes": [{"name": "c", "persistentVolumeClaim": {"claimName": claim}}],
            },
        }
        self.cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
        wait_for(
            f"{reader} done",
            lambda: self.cluster.get("pod", reader, namespace)["status"].get("phase") == "Succeeded",
            timeout=RUN_WAIT,
        )
        found: dict[str, str] = json.loads(self.cluster.kubectl("logs", reader, "-n", namespace))
        self.cluster.kubectl("delete", "pod", reader, "-n", namespace, "--wait=false")
        return found


def rendezvous(kind: str, name: str) -> list[str]:
    """torchrun's node rank and master for ``kind``, from what its controller gives each pod
    (expanded by the kubelet: ``$(VAR)`` of the container's env)."""
    if kind == "kubeflow":  # the training operator's env; MASTER_ADDR is the master's Service
        return ["--node-rank=$(RANK)", "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)"]
    if kind == "trainjob":  # the Trainer's torch plugin: PET_*, the JobSet's Service
        return [
            "--node-rank=$(PET_NODE_RANK)",
            "--master-addr=$(PET_MASTER_ADDR)",
            "--master-port=$(PET_MASTER_PORT)",
        ]
    if kind == "jobset":  # JobSet's headless Service: <jobset>-<replicatedJob>-<job>-<pod>.<jobset>
        jobset = "$(DISPATCH_JOB)-$(DISPATCH_SUBMISSION)"
        return [
            "--node-rank=$(JOB_COMPLETION_INDEX)",
            f"--master-addr={jobset}-node-0-0.{jobset}",
            f"--master-port={RDZV_PORT}",
        ]
    # batch/v1 Job: no Service of its own; the test's rdzv_service() selects completion index 0.
    return ["--node-rank=$(JOB_COMPLETION_INDEX)", f"--master-addr={name}-rdzv", f"--master-port={RDZV_PORT}"]


def command(kind: str, name: str) -> list[str]:
    return [
        "python3",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=1",
        *rendezvous(kind, name),
        *SCRIPT_ARGS,
    ]


def rdzv_service(namespace: str, name: str) -> dict[str, Any]:
    """The rendezvous Service of a 2-node batch/v1 Job: headless, selecting the pod of completion
    index 0 of whichever submission runs, and publishing it before it is Ready (the workers resolve
    it as they start; a headless Service publishes only Ready pods otherwise)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{name}-rdzv", "namespace": namespace},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"dispatch.dev/job": name, "batch.kubernetes.io/job-completion-index": "0"},
            "ports": [{"name": "rdzv", "port": RDZV_PORT}],
        },
    }


class Training:
    """One training DispatchJob's namespace-side setup and what it leaves on the host."""

    def __init__(self, site: Site, namespace: str, name: str) -> None:
        self.site, self.cluster = site, site.cluster
        self.namespace, self.name = namespace, name
        self.claim = f"{name}-checkpoints"
        self.out = (
            site.node.host_dir if site.node is not None else Path("/nonexistent")
        ) / f"{namespace}-{name}"

    def prepare(self, kind: str) -> None:
        """The script as a ConfigMap, the checkpoint claim on a host directory, and for a Job its
        rendezvous Service."""
        self.cluster.kubectl(
            "create",
            "configmap",
            f"{self.name}-script",
            f"--from-file=train.py={TRAIN_SCRIPT}",
            "-n",
            self.namespace,
        )
        self.cluster.apply(self.site.claim(self.namespace, self.claim, self.out))
        if kind == "job":
            self.cluster.apply(rdzv_service(self.namespace, self.name))

    def cleanup(self) -> None:
        if self.site.node is not None:  # the hostPath volume the test made (Retain: it stays otherwise)
            self.cluster.kubectl(
                "delete",
                "pv",
                f"{self.namespace}-{self.claim}",
                "--ignore-not-found",
                "--wait=false",
                check=False,
            )

    def manifest(self, kind: str, rules: list[dict[str, Any]]) -> str:
        options: dict[str, Any] = {
            "image": self.site.image,
            "resources": dict(NODE_RESOURCES),
            "volumes": [
                {"name": "script", "configMap": {"name": f"{self.name}-script"}},
                {"name": "checkpoints", "persistentVolumeClaim": {"claimName": self.claim}},
            ],
            "volumeMounts": [
                {"name": "script", "mountPath": "/opt/train", "readOnly": True},
                {"name": "checkpoints", "mountPath": "/checkpoints"},
            ],
            **self.site.placement(),
        }
        return lab_manifest(
            kind, self.name, rules, options=options, command=command(kind, self.name), nodes=2
        )

    def submit(self, kind: str, rules: list[dict[str, Any]]) -> None:
        self.prepare(kind)
        apply(self.cluster, self.namespace, self.manifest(kind, rules))

    def settled(self) -> dict[str, Any]:
        body: dict[str, Any] = wait_for(
            f"{self.name} settled",
            lambda: (
                (b := get_job(self.cluster, self.namespace, self.name)).get("status", {}).get("settled") and b
            ),
            timeout=RUN_WAIT,
            interval=1.0,
        )
        return body

    def records(self, pattern: str = "step-*.json") -> list[dict[str, Any]]:
        """The checkpoints' commit records the script wrote (or ``final.json``), by name."""
        found = self.site.files(self.namespace, self.claim, self.out, pattern)
        return [json.loads(found[name]) for name in sorted(found)]

    def final(self) -> dict[str, Any]:
        (final,) = self.records("final.json")
        return final

    def pods(self, submission: int | None = None) -> list[dict[str, Any]]:
        selector = f"dispatch.dev/job={self.name}"
        if submission is not None:
            selector += f",dispatch.dev/submission={submission}"
        out = json.loads(
            self.cluster.kubectl("get", "pods", "-n", self.namespace, "-l", selector, "-o", "json")
        )
        return sorted(out["items"], key=lambda p: p["metadata"]["name"])

    def log(self, pod: dict[str, Any] | str, kind: str) -> str:
        name = pod if isinstance(pod, str) else pod["metadata"]["name"]
        return self.site.log(self.namespace, name, CONTAINER[kind])


@pytest.fixture(scope="module")
def site(crds: KubeCluster, request: pytest.FixtureRequest) -> Site:
    """The lab's real node with the training image imported (once per session); on an existing
    cluster, its nodes and the image ``DISPATCH_E2E_TRAINING_IMAGE`` names."""
    if crds.lab is None:
        image = os.environ.get(TRAINING_IMAGE_ENV, "")
        if not image:
            pytest.skip(
                f"an existing cluster needs {TRAINING_IMAGE_ENV}: an image with torch 2.9 it can pull"
            )
        return Site(crds, image, None)
    node: RealNode = request.getfixturevalue("real_node")
    try:
        built = resolve_torch_image()
        seconds = node.import_image(built)
    except NodeError as e:
        pytest.fail(str(e), pytrace=False)
    print(f"\ntraining image {built.tag} imported in {seconds:.1f}s", file=sys.stderr)
    return Site(crds, built.tag, node)


def make_namespace(cluster: KubeCluster, test: str) -> str:
    name = f"t-{test}-{secrets.token_hex(3)}"
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def drop_namespace(cluster: KubeCluster, namespace: str) -> None:
    let_go(cluster, namespace)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def training(
    site: Site, namespace: str, operator: Callable[..., OperatorProcess]
) -> Iterator[Callable[[str], Training]]:
    """A factory: the operator for ``kind`` and the Training of the test's job ``train``."""
    made: list[Training] = []

    def make(kind: str) -> Training:
        operator("--backend", kind)
        made.append(Training(site, namespace, "train"))
        return made[-1]

    yield make
    for t in made:
        t.cleanup()


@pytest.fixture(scope="module")
def uninterrupted(
    site: Site, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Training, dict[str, Any]]]:
    """The reference run: the training job as a 2-node PyTorchJob, never interrupted; its
    Training and its settled DispatchJob."""
    namespace = make_namespace(site.cluster, "uninterrupted")
    op = OperatorProcess(
        kubeconfig=site.cluster.kubeconfig,
        namespace=namespace,
        log_path=tmp_path_factory.mktemp("uninterrupted") / "operator.log",
        args=("--backend", "kubeflow"),
    ).start()
    run = Training(site, namespace, "reference")
    try:
        run.submit("kubeflow", PREEMPTED_ONCE)
        body = run.settled()
        yield run, body
    except Exception:
        sys.stderr.write(op.log()[-20000:])
        raise
    finally:
        op.stop()
        run.cleanup()
        drop_namespace(site.cluster, namespace)


def ran_on_the_site(pods: list[dict[str, Any]], site: Site, image: str | None = None) -> None:
    """The pods in the training image, on the real node when there is one (not on kwok's). Not
    how many: a PyTorchJob's cleanPodPolicy deletes a worker still exiting when the master's end
    has made the job Succeeded; the checkpoints say how many ranks trained (:func:`two_ranks`)."""
    assert pods, "no pod left to look at"
    for pod in pods:
        if site.node is not None:
            assert pod["spec"]["nodeName"] == site.node.name, (
                "the pod must run on the real node, not on kwok's"
            )
        assert {c["image"] for c in pod["spec"]["containers"]} == {image or site.image}


def two_ranks(run: Training) -> None:
    """Every checkpoint was written by a world of two ranks: two nodes of one process each."""
    assert {r["world_size"] for r in run.records()} == {2}, run.records()


def start_latency(pod: dict[str, Any]) -> float:
    """Seconds from the pod's creation to its container's start (the API's second resolution)."""
    (status,) = pod["status"]["containerStatuses"]
    state = status["state"].get("terminated") or status["state"].get("running") or {}
    created = datetime.fromisoformat(pod["metadata"]["creationTimestamp"])
    return (datetime.fromisoformat(state["startedAt"]) - created).total_seconds()


def test_a_pytorchjob_trains_to_completion(
    uninterrupted: tuple[Training, dict[str, Any]], site: Site
) -> None:
    run, body = uninterrupted
    status = body["status"]
    assert status["state"] == "succeeded", status
    assert history(body) == [("pending", "succeeded", 1, "none")]
    pods = run.pods(1)
    ran_on_the_site(pods, site)
    two_ranks(run)
    # For BENCHMARKS.md (measured, never asserted): the image is imported, so no pull.
    latency = ", ".join(f"{p['metadata']['name']} {start_latency(p):.0f}s" for p in pods)
    print(f"\npod start (created -> container started): {latency}", file=sys.stderr)
    master = next(p for p in pods if "-master-" in p["metadata"]["name"])
    log = run.log(master, "kubeflow")
    assert "starting at step 0" in log, log
    final = run.final()
    assert (final["step"], final["submission"]) == (STEPS, 1), final
    assert f"finished at step {STEPS}: model digest {final['digest']}" in log, log
    assert [(r["step"], r["reason"]) for r in run.records()] == [
        (s, "periodic") for s in range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY)
    ]


def millicpu(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def preempt(site: Site, namespace: str, victim: dict[str, Any]) -> str:
    """A real preemption by kube-scheduler: a high-priority pod for the victim's node that refuses
    to share it with the victim (required anti-affinity on a label put on the victim) and asks for
    all the cpu the other pods there leave. The scheduler's only way to place it is to evict the
    victim, and once it runs nothing else of the job fits there until it is deleted."""
    cluster, name, node = site.cluster, victim["metadata"]["name"], victim["spec"]["nodeName"]
    token = secrets.token_hex(3)
    cluster.kubectl("label", "pod", name, "-n", namespace, f"lab.dispatch.io/victim={token}")
    allocatable = millicpu(cluster.get("node", node)["status"]["allocatable"]["cpu"])
    bound = json.loads(
        cluster.kubectl("get", "pods", "-A", f"--field-selector=spec.nodeName={node}", "-o", "json")
    )
    used = sum(
        millicpu(c.get("resources", {}).get("requests", {}).get("cpu", "0"))
        for p in bound["items"]
        if p["metadata"]["name"] != name and p["status"].get("phase") in ("Pending", "Running")
        for c in p["spec"]["containers"]
    )
    placement = site.placement()
    preemptor = f"preemptor-{token}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": preemptor, "namespace": namespace},
        "spec": {
            "priorityClassName": site.priority_class(),
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {**placement.get("nodeSelector", {}), "kubernetes.io/hostname": node},
            "tolerations": placement.get("tolerations", []),
            "affinity": {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": {"lab.dispatch.io/victim": token}},
                            "topologyKey": "kubernetes.io/hostname",
                        }
                    ]
                }
            },
            "containers": [
                {
                    "name": "main",
                    "image": site.small_image,
                    "command": ["python3", "-c", "import time; time.sleep(3600)"],
                    "resources": {"requests": {"cpu": f"{allocatable - used}m"}},
                }
            ],
        },
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    return preemptor


def test_a_preempted_pytorchjob_resumes_from_its_sigterm_checkpoint(
    training: Callable[[str], Training], uninterrupted: tuple[Training, dict[str, Any]], site: Site
) -> None:
    reference = uninterrupted[0].final()
    run = training("kubeflow")
    run.submit("kubeflow", PREEMPTED_ONCE)
    master = f"{run.name}-1-master-0"
    # Midway: past the first periodic checkpoint, well before the end.
    wait_for(
        "submission 1 at step 60",
        lambda: "step 60 loss" in run.log(master, "kubeflow"),
        timeout=RUN_WAIT,
        interval=0.5,
    )
    victim = next(p for p in run.pods(1) if p["metadata"]["name"] == master)
    preemptor = preempt(site, run.namespace, victim)

    def preempted_and_saved() -> dict[str, Any] | None:
        status = get_job(run.cluster, run.namespace, run.name).get("status", {})
        causes = [s.get("cause", {}).get("kind") for s in status.get("submissions") or ()]
        saved = [r for r in run.records() if r["reason"] == "sigterm"]
        return saved[0] if causes[:1] == ["preempted"] and saved else None

    saved = wait_for("preempted recorded and a SIGTERM checkpoint", preempted_and_saved, timeout=RUN_WAIT)
    # Its capacity back, submission 2 can run.
    run.cluster.kubectl("delete", "pod", preemptor, "-n", run.namespace, "--grace-period=0", "--wait=false")
    body = run.settled()

    status = body["status"]
    assert status["state"] == "succeeded", status
    assert history(body) == [
        ("pending", "recovering", 2, "preempted"),
        ("recovering", "succeeded", 2, "none"),
    ]
    step = saved["step"]
    # The preempted pod's process (the master's: rank 0, its hostname the pod's name) wrote it on
    # SIGTERM, midway, as submission 1.
    assert (saved["submission"], saved["rank"], saved["host"]) == (1, 0, master), saved
    assert CHECKPOINT_EVERY < step < STEPS, saved
    pods = run.pods(2)
    ran_on_the_site(pods, site)
    two_ranks(run)
    log = run.log(next(p for p in pods if "-master-" in p["metadata"]["name"]), "kubeflow")
    assert f"resumed at step {step} from step-{step:08d}.pt (submission 1, sigterm)" in log, log
    final = run.final()
    assert (final["step"], final["submission"]) == (STEPS, 2), final
    assert final["digest"] == reference["digest"], (
        "the resumed run's model differs from the uninterrupted one's"
    )


@pytest.mark.parametrize("kind", ["trainjob", "jobset", "job"])
def test_the_training_job_runs_to_completion_as(
    kind: str,
    request: pytest.FixtureRequest,
    training: Callable[[str], Training],
    uninterrupted: tuple[Training, dict[str, Any]],
    site: Site,
) -> None:
    if kind in ("trainjob", "jobset"):
        request.getfixturevalue("lab_extras")  # JobSet and Trainer, started once per session
    run = training(kind)
    run.submit(kind, PREEMPTED_ONCE)
    body = run.settled()

    status = body["status"]
    assert status["state"] == "succeeded", status
    assert history(body) == [("pending", "succeeded", 1, "none")]
    ran_on_the_site(run.pods(1), site)
    two_ranks(run)
    final = run.final()
    assert (final["step"], final["submission"]) == (STEPS, 1), final
    # The same seed, steps and ranks: the same model as the PyTorchJob's, whichever kind ran it.
    assert final["digest"] == uninterrupted[0].final()["digest"]


def test_an_oom_killed_pytorchjob_is_resubmitted_by_its_rule(
    site: Site, namespace: str, operator: Callable[..., OperatorProcess]
) -> None:
    # The small test image: submission 1's process writes 256 MiB of pages under a 64Mi limit (each
    # page counts against the memory cgroup as it is written) and the cgroup kills it; submission 2
    # exits 0.
    code = (
        "import os\n"
        "if os.environ['DISPATCH_SUBMISSION'] == '1':\n"
        "    blob = b'x' * (256 << 20)\n"
        "    print('survived', flush=True)\n"
        "print('submission', os.environ['DISPATCH_SUBMISSION'], 'done', flush=True)\n"
    )
    crds = site.cluster
    options = {"image": site.small_image, "resources": {"cpu": "100m", "memory": "64Mi"}, **site.placement()}
    rules = [{"on": ["out-of-memory"], "action": "resubmit", "budget": 1}]
    operator("--backend", "kubeflow")
    apply(
        crds,
        namespace,
        lab_manifest("kubeflow", "oom", rules, options=options, command=["python3", "-c", code]),
    )
    body: dict[str, Any] = wait_for(
        "oom settled",
        lambda: (b := get_job(crds, namespace, "oom")).get("status", {}).get("settled") and b,
        timeout=RUN_WAIT,
        interval=1.0,
    )

    status = body["status"]
    assert status["state"] == "succeeded", status
    assert history(body) == [
        ("pending", "recovering", 2, "out-of-memory"),
        ("recovering", "succeeded", 2, "none"),
    ]
    oom = status["submissions"][0]["cause"]
    assert (oom["kind"], oom["exitCode"], oom.get("signal")) == ("out-of-memory", 137, 9), oom
    (pod,) = json.loads(
        crds.kubectl("get", "pods", "-n", namespace, "-l", "dispatch.dev/submission=2", "-o", "json")
    )["items"]
    ran_on_the_site([pod], site, site.small_image)
    assert "submission 2 done" in site.log(namespace, pod["metadata"]["name"], "pytorch")
