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
``make node-deps torch-image``).
"""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.integration.conftest import REPO, OperatorProcess, apply, get_job, history, wait_for
from tests.support.builders import host_path_claim, lab_manifest
from tests.support.kube import KubeCluster, let_go
from tests.support.lab import Lab
from tests.support.lab_setup import HIGH_PRIORITY
from tests.support.node import NodeError, RealNode, resolve_torch_image

pytestmark = [pytest.mark.integration, pytest.mark.node]

TRAIN_SCRIPT = REPO / "examples" / "training" / "train.py"
STEPS = 200
CHECKPOINT_EVERY = 50
STEP_SECONDS = 0.1
"""Each step lasts at least this long: the run spans about 20 s, long enough to preempt it midway."""
RUN_WAIT = 600.0
"""How long a training run may take to settle (image already imported; slow under a full test load)."""
NODE_RESOURCES = {"cpu": "500m", "memory": "2Gi"}
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

    def __init__(self, cluster: KubeCluster, node: RealNode, image: str, namespace: str, name: str) -> None:
        self.cluster, self.node, self.image = cluster, node, image
        self.namespace, self.name = namespace, name
        self.claim = f"{name}-checkpoints"
        self.out = node.host_dir / f"{namespace}-{name}"

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
        self.cluster.apply(host_path_claim(self.namespace, self.claim, self.out))
        if kind == "job":
            self.cluster.apply(rdzv_service(self.namespace, self.name))

    def cleanup(self) -> None:
        self.cluster.kubectl(
            "delete",
            "pv",
            f"{self.namespace}-{self.claim}",
            "--ignore-not-found",
            "--wait=false",
            check=False,
        )

    def manifest(self, kind: str, rules: list[dict[str, Any]]) -> str:
        placement = self.node.placement()
        options: dict[str, Any] = {
            "image": self.image,
            "resources": dict(NODE_RESOURCES),
            "volumes": [
                {"name": "script", "configMap": {"name": f"{self.name}-script"}},
                {"name": "checkpoints", "persistentVolumeClaim": {"claimName": self.claim}},
            ],
            "volumeMounts": [
                {"name": "script", "mountPath": "/opt/train", "readOnly": True},
                {"name": "checkpoints", "mountPath": "/checkpoints"},
            ],
            "nodeSelector": placement["nodeSelector"],
            "tolerations": placement["tolerations"],
        }
        if kind != "trainjob":  # a TrainJob cannot carry it (Trainer's runtimePatches); 30 s is its default
            options["terminationGracePeriodSeconds"] = 30
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
        """The checkpoints' commit records the script wrote (or ``final.json``)."""
        return [json.loads(p.read_text()) for p in sorted(self.out.glob(pattern))]

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

    def log(self, pod: dict[str, Any], kind: str) -> str:
        return self.node.container_log(self.namespace, pod["metadata"]["name"], CONTAINER[kind])


@pytest.fixture(scope="module")
def training_image(real_node: RealNode) -> str:
    """The training image's tag, imported into the real node (once per session)."""
    try:
        image = resolve_torch_image()
        seconds = real_node.import_image(image)
    except NodeError as e:
        pytest.fail(str(e), pytrace=False)
    print(f"\ntraining image {image.tag} imported in {seconds:.1f}s", file=sys.stderr)
    return image.tag


def make_namespace(cluster: KubeCluster, test: str) -> str:
    name = f"t-{test}-{secrets.token_hex(3)}"
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def drop_namespace(cluster: KubeCluster, namespace: str) -> None:
    let_go(cluster, namespace)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def training(
    crds: KubeCluster,
    real_node: RealNode,
    training_image: str,
    namespace: str,
    operator: Callable[..., OperatorProcess],
) -> Iterator[Callable[[str], Training]]:
    """A factory: the operator for ``kind`` and the Training of the test's job ``train``."""
    made: list[Training] = []

    def make(kind: str) -> Training:
        operator("--backend", kind)
        made.append(Training(crds, real_node, training_image, namespace, "train"))
        return made[-1]

    yield make
    for t in made:
        t.cleanup()


@pytest.fixture(scope="module")
def uninterrupted(
    crds: KubeCluster, real_node: RealNode, training_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Training, dict[str, Any]]]:
    """The reference run: the training job as a 2-node PyTorchJob, never interrupted; its
    Training and its settled DispatchJob."""
    namespace = make_namespace(crds, "uninterrupted")
    op = OperatorProcess(
        kubeconfig=crds.kubeconfig,
        namespace=namespace,
        log_path=tmp_path_factory.mktemp("uninterrupted") / "operator.log",
        args=("--backend", "kubeflow"),
    ).start()
    run = Training(crds, real_node, training_image, namespace, "reference")
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
        drop_namespace(crds, namespace)


def ran_on_the_node(pods: list[dict[str, Any]], node: RealNode, image: str, count: int = 2) -> None:
    assert len(pods) == count, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        assert pod["spec"]["nodeName"] == node.name, "the pod must run on the real node, not on kwok's"
        assert {c["image"] for c in pod["spec"]["containers"]} == {image}


def test_a_pytorchjob_trains_to_completion(
    uninterrupted: tuple[Training, dict[str, Any]], real_node: RealNode, training_image: str
) -> None:
    run, body = uninterrupted
    status = body["status"]
    assert status["state"] == "succeeded", status
    assert history(body) == [("pending", "succeeded", 1, "none")]
    pods = run.pods(1)
    ran_on_the_node(pods, real_node, training_image)
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


def preempt(lab: Lab, node: RealNode, namespace: str, victim: dict[str, Any]) -> str:
    """A real preemption by kube-scheduler: a pod of PriorityClass ``lab-high`` for the real node
    that refuses to share it with the victim (required anti-affinity on a label put on the victim)
    and asks for all the cpu the other pods there leave. The scheduler's only way to place it is to
    evict the victim, and once it runs nothing else of the job fits until it is deleted."""
    name = victim["metadata"]["name"]
    token = secrets.token_hex(3)
    lab.kubectl("label", "pod", name, "-n", namespace, f"lab.dispatch.io/victim={token}")
    allocatable = millicpu((lab.node(node.name) or {})["status"]["allocatable"]["cpu"])
    bound = json.loads(
        lab.kubectl("get", "pods", "-A", f"--field-selector=spec.nodeName={node.name}", "-o", "json")
    )["items"]
    used = sum(
        millicpu(c.get("resources", {}).get("requests", {}).get("cpu", "0"))
        for p in bound
        if p["metadata"]["name"] != name and p["status"].get("phase") in ("Pending", "Running")
        for c in p["spec"]["containers"]
    )
    preemptor = f"preemptor-{token}"
    manifest = node.pod(
        preemptor,
        ["python3", "-c", "import time; time.sleep(3600)"],
        namespace=namespace,
        priorityClassName=HIGH_PRIORITY,
        terminationGracePeriodSeconds=0,
        affinity={
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {"lab.dispatch.io/victim": token}},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        },
        container={"resources": {"requests": {"cpu": f"{allocatable - used}m"}}},
    )
    lab.kubectl("create", "-f", "-", input=json.dumps(manifest))
    return preemptor


def test_a_preempted_pytorchjob_resumes_from_its_sigterm_checkpoint(
    training: Callable[[str], Training],
    uninterrupted: tuple[Training, dict[str, Any]],
    lab: Lab,
    real_node: RealNode,
    training_image: str,
) -> None:
    reference = uninterrupted[0].final()
    run = training("kubeflow")
    run.submit("kubeflow", PREEMPTED_ONCE)
    master = f"{run.name}-1-master-0"
    # Midway: past the first periodic checkpoint, well before the end.
    wait_for(
        "submission 1 at step 60",
        lambda: "step 60 loss" in run.node.container_log(run.namespace, master, "pytorch"),
        timeout=RUN_WAIT,
        interval=0.5,
    )
    victim = next(p for p in run.pods(1) if p["metadata"]["name"] == master)
    preemptor = preempt(lab, real_node, run.namespace, victim)

    def preempted_and_saved() -> dict[str, Any] | None:
        status = get_job(run.cluster, run.namespace, run.name).get("status", {})
        causes = [s.get("cause", {}).get("kind") for s in status.get("submissions") or ()]
        saved = [r for r in run.records() if r["reason"] == "sigterm"]
        return saved[0] if causes[:1] == ["preempted"] and saved else None

    saved = wait_for("preempted recorded and a SIGTERM checkpoint", preempted_and_saved, timeout=RUN_WAIT)
    # Its capacity back, submission 2 can run.
    lab.kubectl("delete", "pod", preemptor, "-n", run.namespace, "--grace-period=0", "--wait=false")
    body = run.settled()

    status = body["status"]
    assert status["state"] == "succeeded", status
    assert history(body) == [
        ("pending", "recovering", 2, "preempted"),
        ("recovering", "succeeded", 2, "none"),
    ]
    step = saved["step"]
    # The preempted pod's rank (0: the master) wrote it on SIGTERM, midway, as submission 1.
    assert (saved["submission"], saved["rank"]) == (1, 0), saved
    assert CHECKPOINT_EVERY < step < STEPS, saved
    pods = run.pods(2)
    ran_on_the_node(pods, real_node, training_image)
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
    real_node: RealNode,
    training_image: str,
) -> None:
    if kind in ("trainjob", "jobset"):
        request.getfixturevalue("lab_extras")  # JobSet and Trainer, started once per session
    run = training(kind)
    run.submit(kind, PREEMPTED_ONCE)
    body = run.settled()

    status = body["status"]
    assert status["state"] == "succeeded", status
    assert history(body) == [("pending", "succeeded", 1, "none")]
    ran_on_the_node(run.pods(1), real_node, training_image)
    final = run.final()
    assert (final["step"], final["submission"]) == (STEPS, 1), final
    # The same seed, steps and ranks: the same model as the PyTorchJob's, whichever kind ran it.
    assert final["digest"] == uninterrupted[0].final()["digest"]


def test_an_oom_killed_pytorchjob_is_resubmitted_by_its_rule(
    crds: KubeCluster, namespace: str, real_node: RealNode, operator: Callable[..., OperatorProcess]
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
    placement = real_node.placement()
    options = {
        "image": real_node.image,
        "resources": {"cpu": "100m", "memory": "64Mi"},
        "nodeSelector": placement["nodeSelector"],
        "tolerations": placement["tolerations"],
    }
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
    assert pod["spec"]["nodeName"] == real_node.name
    assert "submission 2 done" in real_node.container_log(namespace, pod["metadata"]["name"], "pytorch")
