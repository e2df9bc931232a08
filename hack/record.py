#!/usr/bin/env python3
"""Record what the real stack says about each Kubernetes kind dispatch runs, for the unit tests that
replay it (tests/unit/test_<kind>_*.py, test_projection.py, test_kit_events_watch.py, ...).

    .venv/bin/python hack/record.py KIND [SCENARIO ...]      (or: make record KIND=job)

KIND is one of :data:`KINDS` (``job``, ``kubeflow``, ``jobset``, ``trainjob``: the registered
backends' kinds; ``kueue``: PyTorchJobs in Kueue's queues); no SCENARIO records all of the kind's.

One engine serves every kind: it starts a lab of its own (``tests.support.lab.Lab``: the real
kube-apiserver, kube-scheduler, kube-controller-manager, kwok with the lab's stages, the training
operator, plus the kind's extras: JobSet, Kubeflow Trainer, Kueue), so that every recording of a
kind is made on the same stack whatever else runs on the machine. For each scenario it makes a
namespace, watches the kind's objects, the other objects its controllers make and the pods, runs
the scenario (an object built by dispatch's own builder, released, then failed through the real
mechanism: kwok's container-exit stage, a kube-scheduler preemption, the Eviction API, a NoExecute
taint, a node that stops heartbeating, Kueue's quota and priorities) and, once the stack is quiet,
writes every watch event in arrival order, the Events Kubernetes wrote in the namespace, the
server's version and the components' (what hack/build-bins.sh builds). Nothing in a recording is
written by hand. Trainer's webhook certificate directory is one per machine: a ``trainjob``
recording waits (up to the lab's start timeout) while another lab with Trainer runs.

What differs between kinds is data (:class:`Profile`); what a kind is (API group, plural, how its
object is built and held, its training container, whether it has a native rule) comes from the
backend's own code through the registry (:func:`workload_kind`). The scenarios are small functions
of a :class:`Run`, the engine's handle on one scenario's object.

Output: tests/unit/data/<KIND>/<scenario>.json, ``metadata.managedFields`` dropped (size). The
objects carry no ownerReference (the recorder passes no owner: the garbage collector would delete
an object whose DispatchJob does not exist); the kinds whose profile says so keep dispatch's
finalizer, which the engine removes once a scenario is over (no operator runs here to do it).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT))  # tests.support, beside hack/

from dispatch._backends.jobset._kind import RESTART_ATTEMPT_LABEL  # noqa: E402
from dispatch._constants import (  # noqa: E402
    ANNOTATION_RELEASED,
    LABEL_MANAGED_BY,
    MANAGED_BY,
)
from dispatch._model import (  # noqa: E402
    Action,
    CauseKind,
    Enforcer,
    JobSpec,
    Plan,
    PlannedRule,
    Resources,
)
from dispatch._registry import Where, registered  # noqa: E402
from dispatch._workload import Kind, Resource, Target  # noqa: E402
from tests.support.kube import release_finalizers  # noqa: E402
from tests.support.kueue import (  # noqa: E402
    HIGH,
    LOW,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    WORKLOADS,
    Queues,
    batch_job,
    queue_objects,
    shared_objects,
    workload_of,
)
from tests.support.lab import (  # noqa: E402
    KUEUE_PODS_READY_TIMEOUT,
    TRAINER_RUNTIME,
    UNPULLABLE_IMAGE,
    Lab,
)

Body = dict[str, Any]
DATA: Final = ROOT / "tests" / "unit" / "data"
IMAGE: Final = "example.invalid/train:1"
DISPATCH_OBJECTS: Final = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
"""What dispatch labels: its objects and their pods (the recorder's preemptors are not)."""
EVERYTHING: Final = "!lab.dispatch.io/preemptor"
"""Every object but the lab's preemptors: the controllers' own objects (a JobSet's Jobs, Kueue's
Workloads, a Trainer's JobSet) carry no dispatch label."""
PREEMPTORS: Final = "lab.dispatch.io/preemptor=true"
QUIET: Final = 2.0
"""Seconds without a watch event after which a recording stops."""
STOP_AT_MOST: Final = 15.0
"""A scenario that never settles (an image that never pulls) stops this long after it ends."""
NO_CAPACITY: Final = 5
"""Seconds unschedulable before no-capacity: short, so that a recording's pod passes it."""
BUILD_BINS: Final = ROOT / "hack" / "build-bins.sh"


@functools.cache
def pins() -> Mapping[str, str]:
    """What hack/build-bins.sh says it builds (``--print-env``: its pins, or the versions the
    environment overrides them with), which is what the lab runs."""
    out = subprocess.run(["bash", str(BUILD_BINS), "--print-env"], check=True, capture_output=True, text=True)
    return dict(line.partition("=")[::2] for line in out.stdout.splitlines() if "=" in line)


def pin(component: str) -> str:
    """A component's version in the lab, written into each recording beside the server's."""
    return pins()[f"{component.upper()}_VERSION"]


def workload_kind(backend: str) -> Kind:
    """The workload kit's kind of a registered Kubernetes backend: the instance in its package's
    ``_kind`` module (operator/dispatch/_backends/<name>/_kind.py) that names the backend."""
    info = registered()[backend]
    if info.where is not Where.KUBERNETES:
        raise SystemExit(f"backend {backend!r} runs no Kubernetes objects")
    package = info.open.partition(":")[0].rpartition(".")[0]
    module = importlib.import_module(f"{package}._kind")
    for value in vars(module).values():
        if (
            not isinstance(value, type)
            and getattr(value, "name", None) == backend
            and isinstance(getattr(value, "resource", None), Resource)
        ):
            kind: Kind = value
            return kind
    raise SystemExit(f"{package}._kind defines no kind named {backend!r}")


def trim(obj: Body) -> Body:
    """Without ``metadata.managedFields``: the bulk of every object, which nothing replayed reads."""
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


# ---- the recording ------------------------------------------------------------------------------


@dataclass
class Recording:
    """Every watch event of the resources watched, in arrival order, with its time."""

    kubectl: tuple[str, ...]
    """The kubectl binary and its ``--kubeconfig``: a watch is one ``kubectl get -w`` process."""
    namespace: str
    stream: list[Body] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)

    def watch(self, resource: str, selector: str) -> None:
        argv = ["get", resource, "-n", self.namespace, "-l", selector, "-w", "--output-watch-events"]
        proc = subprocess.Popen(
            [*self.kubectl, *argv, "-o", "json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.procs.append(proc)
        threading.Thread(target=self._pump, args=(proc, resource), daemon=True).start()

    def _pump(self, proc: subprocess.Popen[str], resource: str) -> None:
        decoder = json.JSONDecoder()
        buf = ""
        assert proc.stdout is not None
        for line in proc.stdout:
            buf += line
            while buf.strip():
                try:
                    event, end = decoder.raw_decode(buf.lstrip())
                except ValueError:
                    break  # an object spans lines: read on
                buf = buf.lstrip()[end:]
                with self.lock:
                    self.stream.append(
                        {
                            "at": round(time.monotonic() - self.t0, 3),
                            "resource": resource,
                            "type": event.get("type"),
                            "object": trim(event.get("object") or {}),
                        }
                    )

    def stop(self) -> None:
        """Once the stack is quiet: what the scenario set off is recorded to its end (a controller's
        last clean-up, a watch lagging under load), whatever the machine's speed."""
        deadline = time.monotonic() + STOP_AT_MOST
        time.sleep(1.0)  # what is already on its way
        while time.monotonic() < deadline:
            with self.lock:
                last = self.stream[-1]["at"] if self.stream else 0.0
            if time.monotonic() - self.t0 - last >= QUIET:
                break
            time.sleep(0.1)
        for proc in self.procs:
            proc.terminate()
            proc.wait(timeout=10)


# ---- one scenario's object ----------------------------------------------------------------------


class Run:
    """The engine's handle on one scenario: its namespace, its object (built by the kind's own
    builder), the object's pods, and the lab's mechanisms aimed at them."""

    def __init__(self, lab: Lab, profile: Profile, scenario: str, namespace: str) -> None:
        self.lab, self.profile, self.scenario, self.namespace = lab, profile, scenario, namespace
        self.kind = workload_kind(profile.backend)
        self.name = ""
        self.uid = ""
        self.nodes = profile.nodes
        self.first_uids: set[str] = set()
        self.objects: list[Body] = []
        """Objects beside the stream that the replay reads (a lost node, Kueue's ClusterQueues)."""
        self.after: list[Callable[[], None]] = []
        """What undoes the scenario's change to the lab (a taint, a node let go) and reads or
        deletes what it made, once the recording has stopped: what the stack does then is not the
        scenario's (a node back would have its kubelet confirm a deletion no kubelet confirmed)."""

    # -- the object

    def build(
        self, job: str, *, nodes: int | None = None, restart_left: int | None = None, **options: Any
    ) -> Body:
        """The object of submission 1 of ``job``, as dispatch builds it, with the profile's options
        and ``options`` (image, gpu, ...) over them."""
        self.nodes = nodes or self.profile.nodes
        info = registered()[self.profile.backend]
        assert info.options is not None
        fields: dict[str, Any] = {
            "image": IMAGE,
            "no_capacity_after_seconds": NO_CAPACITY,
            **self.profile.options,
        }
        fields.update(options)
        fields["resources"] = Resources(cpu="1", memory="1Gi", gpu=fields.pop("gpu", 0))
        values = info.options(**fields)
        named = {info.name: values} if info.name in JobSpec.model_fields else {"options": {info.name: values}}
        spec = JobSpec(name=job, command=("python", "train.py"), nodes=self.nodes, **named)
        body = self.kind.build(Target(self.namespace, job, 1), spec, plan(self.namespace, job, restart_left))
        if not self.profile.dispatch_only:
            body["metadata"].pop("finalizers", None)
        body["metadata"].pop("ownerReferences", None)
        self.name = body["metadata"]["name"]
        return body

    def submit(self, body: Body) -> Body:
        """``kubectl create`` of ``body``, as a person would: what it answered (the refusal of a
        validating webhook is itself a recording)."""
        done = subprocess.run(
            [self.lab.kubectl_bin, f"--kubeconfig={self.lab.kubeconfig}", "create", "-o", "json", "-f", "-"],
            input=json.dumps(body),
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if done.returncode == 0:
            self.uid = json.loads(done.stdout)["metadata"]["uid"]
        return {"built": body, "returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}

    def create(self, job: str, **build: Any) -> None:
        answer = self.submit(self.build(job, **build))
        if answer["returncode"] != 0:
            raise RuntimeError(f"create {self.name}: {answer['stderr'].strip()}")

    def path(self) -> str:
        return self.kind.resource.path(self.namespace, self.name)

    def patch(self, change: Body) -> None:
        self.lab.request("PATCH", self.path(), change, content_type="application/merge-patch+json")

    def release(self) -> None:
        """dispatch's release of a job without a queue: the kind's unsuspend patch."""
        self.patch(self.kind.suspend_patch(False))

    def get(self) -> Body:
        return self.lab.request("GET", self.path())

    def condition(self, kind: str) -> bool:
        return any(
            c.get("type") == kind and c.get("status") == "True"
            for c in (self.get().get("status") or {}).get("conditions") or ()
        )

    def succeeded(self) -> bool:
        return self.condition(self.profile.succeeded)

    def failed(self) -> bool:
        """Failed; for a kind without a native rule also: a container restarted in place or a
        failed pod replaced, which its controllers do by themselves (a TrainJob's runtime) but
        dispatch does not let happen: it stops the object there, so the recording does too."""
        if self.condition("Failed"):
            return True
        if self.kind.capabilities.native:
            return False
        pods = self.pods()
        restarted = any(
            int(c.get("restartCount") or 0) > 0
            for p in pods
            for c in p["status"].get("containerStatuses") or ()
        )
        replaced = bool(self.first_uids) and any(p["metadata"]["uid"] not in self.first_uids for p in pods)
        return restarted or replaced

    def delete(self) -> None:
        """A person deletes the object; dispatch's finalizer keeps it readable (with its
        deletionTimestamp) until dispatch lets go, which the engine does after a moment."""
        # kubectl, as a person does: propagation Background (a batch/v1 Job's own default orphans its pods)
        self.lab.kubectl("delete", str(self.kind.resource), self.name, "-n", self.namespace, "--wait=false")
        self.until("deleting", lambda: bool(self.get()["metadata"].get("deletionTimestamp")))
        time.sleep(2.0)
        self.let_go()
        self.until(
            "gone", lambda: not self.pods() and not self.lab.request("GET", self.list_path()).get("items")
        )

    def list_path(self) -> str:
        return self.kind.resource.path(self.namespace)

    def let_go(self) -> None:
        release_finalizers(self.lab.kubectl, self.namespace, (str(self.kind.resource),))

    # -- its pods

    def pods(self, phase: str | None = None) -> list[Body]:
        """The object's pods (dispatch's labels), by name: master before workers, index order."""
        pods = self.lab.pods(self.namespace, DISPATCH_OBJECTS)
        chosen = (p for p in pods if phase in (None, p["status"].get("phase")))
        return sorted(chosen, key=lambda p: str(p["metadata"]["name"]))

    def running(
        self, count: int | None = None, *, restart: int | None = None, besides: tuple[str, ...] = ()
    ) -> list[Body]:
        """Once at least ``count`` (default: the object's nodes) of its pods run, they; only those
        of the JobSet's restart attempt ``restart`` when given, none named in ``besides``."""

        def ready() -> list[Body]:
            pods = [
                p
                for p in self.pods("Running")
                if not p["metadata"].get("deletionTimestamp") and p["metadata"]["name"] not in besides
            ]
            if restart is not None:
                pods = [p for p in pods if p["metadata"]["labels"].get(RESTART_ATTEMPT_LABEL) == str(restart)]
            return pods if len(pods) >= (count or self.nodes) else []

        out: list[Body] = self.lab.wait("pods Running", ready, 90)
        self.first_uids = self.first_uids or {p["metadata"]["uid"] for p in out}
        return out

    def exit(self, pod: Body, code: int, reason: str | None = None) -> None:
        """The training container exits (kwok's lab-container-exit stage)."""
        self.lab.exit_pod(
            self.namespace, pod["metadata"]["name"], code, reason=reason, container=self.kind.container
        )

    def preempt(self, pod: Body) -> None:
        """A real kube-scheduler preemption by a lab-high pod: of the whole node, kept until the
        scenario ends, where the profile says so; else of the pod alone (see Lab.preempt_pod)."""
        whole = self.profile.dispatch_only
        self.lab.preempt_pod(self.namespace, pod["metadata"]["name"], keep=whole, whole_node=whole)

    def node_of(self, pod: Body) -> str:
        return self.lab.pod_node(self.namespace, pod["metadata"]["name"])

    def until(self, what: str, check: Callable[[], bool], seconds: float = 60) -> None:
        self.lab.wait(what, check, seconds, interval=0.2)


def plan(namespace: str, job: str, restart_left: int | None) -> Plan:
    """The plan the builder enforces: without ``restart_left`` a supervisor rule only (no native
    rule: the object's controllers retry nothing); with it, the scheduler's restart rule on a
    non-zero exit or an OOM kill with that many restarts left."""
    if restart_left is None:
        rule = PlannedRule(
            index=0, on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, budget=3, enforcer=Enforcer.SUPERVISOR
        )
    else:
        rule = PlannedRule(
            index=0,
            on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY),
            action=Action.RESTART,
            budget=restart_left,
            enforcer=Enforcer.SCHEDULER,
        )
    return Plan(job=f"{namespace}/{job}", rules=(rule,))


# ---- the engine ---------------------------------------------------------------------------------

ScenarioRun = Callable[[Run], Body | None]
"""A scenario: drives its :class:`Run`; what it returns goes into the recording as ``create``."""


@dataclass(frozen=True)
class Scenario:
    what: str
    """One line: what happens (the recording's ``what``)."""
    run: ScenarioRun


@dataclass(frozen=True)
class Profile:
    """What records one KIND: the facts the backend's code does not hold, and its scenarios."""

    backend: str
    """The registered backend whose kind builds the object."""
    scenarios: Mapping[str, Scenario]
    succeeded: str
    """The object's condition that says its controller finished it successfully."""
    extras: tuple[str, ...] = ()
    """The lab's extras (tests.support.lab.EXTRAS) the kind's controllers need, every one named
    (the recording gives each one's version)."""
    watch: tuple[str, ...] = ()
    """Besides the kind and the pods: the backends whose objects its controllers make, or a
    resource by name (Kueue's Workloads)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Options fields of every object beside the image and resources."""
    nodes: int = 2
    namespace: str = "rec-{kind}-{scenario}"
    """Each scenario's namespace (the object's namespace, which the tests' expectations name)."""
    dispatch_only: bool = False
    """The first recordings' layout (PyTorchJob, then batch/v1 Job), which their tests name: one
    namespace for every scenario, only what dispatch labels watched, the streams named by the
    plural alone, dispatch's finalizer kept (the ``deleted`` scenarios need it), a preemption that
    takes the victim's whole node, and the components' versions alone in the header."""

    @property
    def selector(self) -> str:
        return DISPATCH_OBJECTS if self.dispatch_only else EVERYTHING

    def resource_name(self, what: str) -> str:
        if what in registered():
            resource = workload_kind(what).resource
            return resource.plural if self.dispatch_only else str(resource)
        return what

    def header(self) -> Body:
        """Beside the scenario: the backend, and the version of each component of the lab its
        objects meet (its extras, and the training operator for PyTorchJobs)."""
        components = (*self.extras, *RUN_BY.get(self.backend, ()))
        return {
            **({} if self.dispatch_only else {"backend": self.backend}),
            **{c: pin(c) for c in components},
        }


RUN_BY: Final = {"kubeflow": ("training_operator",)}
"""The component that runs a backend's objects where it is not an extra (every lab runs it)."""


def record(lab: Lab, kind: str, name: str) -> None:
    profile = PROFILES[kind]
    scenario = profile.scenarios[name]
    namespace = profile.namespace.format(kind=kind, scenario=name)
    rec = Recording((lab.kubectl_bin, f"--kubeconfig={lab.kubeconfig}"), namespace)
    run = Run(lab, profile, name, namespace)
    run.let_go()
    lab.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=60s", check=False)
    lab.kubectl("create", "namespace", namespace)
    for what in (profile.backend, *profile.watch):
        rec.watch(profile.resource_name(what), profile.selector)
    rec.watch("pods", profile.selector)
    time.sleep(1.0)
    answer: Body | None = None
    try:
        answer = scenario.run(run)
    finally:
        rec.stop()
        lab.kubectl("delete", "pods", "-n", namespace, "-l", PREEMPTORS, "--wait=false", check=False)
        for then in run.after:
            then()
        run.let_go()
    events = [
        trim(e) for e in json.loads(lab.kubectl("get", "events", "-n", namespace, "-o", "json"))["items"]
    ]
    version = json.loads(lab.kubectl("version", "-o", "json")).get("serverVersion", {}).get("gitVersion")
    data: Body = {
        "scenario": name,
        "what": scenario.what,
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "kubernetes": version,
        **profile.header(),
        **({"create": answer} if answer is not None else {}),
        "stream": rec.stream,
        "events": events,
    }
    if run.objects:
        data["objects"] = [trim(o) for o in run.objects]
    out = DATA / kind
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"{kind}/{name}: {len(rec.stream)} watch events, {len(events)} events", flush=True)


# ---- the scenarios every kind shares ------------------------------------------------------------


def ends(
    act: Callable[[Run], object], *, succeeds: bool = False, settle: float = 0.0, **build: Any
) -> ScenarioRun:
    """Created, released, ``act``; until the object succeeded (or failed), then ``settle`` more
    seconds of what follows."""

    def run(r: Run) -> None:
        r.create(r.scenario, **build)
        r.release()
        act(r)
        if succeeds:
            r.until("succeeded", r.succeeded)
        else:
            r.until("failed", r.failed)
        time.sleep(settle)

    return run


def exit_all(r: Run, *, in_order: bool = False, restart: int | None = None) -> None:
    """Every container exits 0: the last pod first (workers before a master), else in order."""
    pods = r.running(restart=restart)
    for pod in pods if in_order else reversed(pods):
        r.exit(pod, 0)


def exit_pod(index: int, code: int, reason: str | None = None) -> Callable[[Run], None]:
    return lambda r: r.exit(r.running()[index], code, reason)


def preempt_pod(index: int) -> Callable[[Run], None]:
    return lambda r: r.preempt(r.running()[index])


def exit_then(first: tuple[int, str | None], then: tuple[int, str | None]) -> Callable[[Run], None]:
    """Under a restart rule: the first pod exits (code, reason) and is replaced, then the
    replacement exits (code, reason)."""

    def act(r: Run) -> None:
        pod = r.running()[0]
        r.exit(pod, *first)
        r.exit(r.running(besides=(pod["metadata"]["name"],))[0], *then)

    return act


def unschedulable(r: Run) -> None:
    """Asking for 64 GPUs (the lab's nodes have 8): kube-scheduler cannot place it."""
    r.create(r.scenario, gpu=64, nodes=1)
    r.release()
    r.until(
        "unschedulable",
        lambda: any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            for p in r.pods()
            for c in p["status"].get("conditions") or []
        ),
    )
    time.sleep(1)


def image_pull(r: Run) -> None:
    """An image under unpullable.invalid/ (kwok's lab-image-pull-error stage) never pulls."""
    r.create(r.scenario, image=UNPULLABLE_IMAGE, nodes=1)
    r.release()
    time.sleep(6)


def deleted(r: Run) -> None:
    r.create(r.scenario)
    r.release()
    r.running()
    r.delete()


# ---- batch/v1 Job -------------------------------------------------------------------------------

JOB_SCENARIOS: Final = {
    "success": Scenario(
        "1 node; the container exits 0 (kwok lab-container-exit)", ends(exit_all, succeeds=True)
    ),
    "success-indexed": Scenario(
        "2 nodes (Indexed); both containers exit 0",
        ends(lambda r: exit_all(r, in_order=True), succeeds=True, nodes=2),
    ),
    "exit-never": Scenario("no native rule (backoffLimit 0); the container exits 3", ends(exit_pod(0, 3))),
    "oom-never": Scenario(
        "no native rule; the container OOMKilled (exit 137)", ends(exit_pod(0, 137, "OOMKilled"))
    ),
    "preempt-never": Scenario(
        "no native rule; the pod preempted by kube-scheduler", ends(preempt_pod(0), settle=2)
    ),
    "restart-native": Scenario(
        "restart budget 1: exit 1, replaced by the Job controller, then exit 0",
        ends(exit_then((1, None), (0, None)), succeeds=True, restart_left=1),
    ),
    "restart-exhausted": Scenario(
        "restart budget 1: exit 1, replaced, then OOMKilled: BackoffLimitExceeded",
        ends(exit_then((1, None), (137, "OOMKilled")), restart_left=1),
    ),
    "preempt-native": Scenario(
        "restart budget 2; the pod preempted: podFailurePolicy FailJob",
        ends(preempt_pod(0), settle=2, restart_left=2),
    ),
    "unschedulable": Scenario("1 node asking for 64 GPUs: kube-scheduler cannot place it", unschedulable),
    "image-pull": Scenario("an image that never pulls (kwok stage on unpullable.invalid/)", image_pull),
    "deleted": Scenario("the running Job deleted by a person (dispatch's finalizer holds it)", deleted),
}


# ---- PyTorchJob ---------------------------------------------------------------------------------


def oom_then_exit(r: Run) -> None:
    """The master OOMKilled and restarted in place, then worker-0 exits 1."""
    r.exit(r.running()[0], 137, "OOMKilled")
    r.until(
        "restarted",
        lambda: any((p["status"].get("containerStatuses") or [{}])[0].get("restartCount") for p in r.pods()),
    )
    time.sleep(1)
    r.exit(r.running()[1], 1)


def preempt_never(r: Run) -> None:
    """worker-0 preempted; until the training operator has failed the job and the victim is gone."""
    r.create(r.scenario)
    r.release()
    victim = r.running()[1]
    r.preempt(victim)
    r.until("failed", r.failed)
    uid = victim["metadata"]["uid"]
    r.until("victim gone", lambda: not any(p["metadata"]["uid"] == uid for p in r.pods("Failed")), 30)


def preempt_recreated(r: Run) -> None:
    """Under OnFailure the training operator deletes and recreates the preempted pod by itself."""
    r.create(r.scenario, restart_left=2)
    r.release()
    victim = r.running()[1]
    name, uid = victim["metadata"]["name"], victim["metadata"]["uid"]
    r.preempt(victim)
    r.until(
        "recreated",
        lambda: any(p["metadata"]["name"] == name and p["metadata"]["uid"] != uid for p in r.pods()),
    )
    time.sleep(2)


def taint(r: Run) -> None:
    """NoExecute on the pod's node: the taint-eviction controller deletes the pod."""
    node = r.node_of(r.running()[0])
    r.after.append(lambda: r.lab.untaint_node(node))
    r.lab.taint_node(node)


def notready_deleted(r: Run) -> None:
    """The pod's node stops heartbeating (kwok no longer manages it, as if its kubelet died); as soon
    as it is NotReady the pod is deleted by someone: no DisruptionTarget, no kubelet confirms it."""
    r.create(r.scenario, nodes=1)
    r.release()
    pod = r.running()[0]
    node = r.node_of(pod)
    r.after.append(lambda: r.lab.node_ready(node))
    r.lab.node_not_ready(node)
    r.until(
        "NotReady",
        lambda: (
            not any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in (r.lab.node(node) or {}).get("status", {}).get("conditions") or []
            )
        ),
        90,
    )
    r.lab.delete_pod(r.namespace, pod["metadata"]["name"])
    r.until("failed", r.failed, 30)
    time.sleep(2)
    r.objects.append(r.lab.node(node) or {})


def env_refused(r: Run) -> None:
    """An env name the PyTorchJob CRD accepts and the pod API refuses (set after the builder,
    which refuses it itself): its controller's pod creation is refused, forever."""
    body = r.build(r.scenario, nodes=1)
    body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "A=B", "value": "1"}
    ]
    answer = r.submit(body)
    if answer["returncode"] != 0:
        raise RuntimeError(answer["stderr"])
    r.release()
    reason = r.kind.create_failure_reason
    r.until(reason, lambda: reason in r.lab.kubectl("get", "events", "-n", r.namespace), 30)
    time.sleep(1)


def webhook_refused(r: Run) -> Body:
    """A name that is not a DNS-1035 label: the training operator's validating webhook refuses it."""
    return r.submit(r.build("1-starts-with-a-digit", nodes=1))


KUBEFLOW_SCENARIOS: Final = {
    "success": Scenario(
        "Never, 2 nodes; every container exits 0 (kwok lab-container-exit)", ends(exit_all, succeeds=True)
    ),
    "oom-never": Scenario("Never; the master OOMKilled (exit 137)", ends(exit_pod(0, 137, "OOMKilled"))),
    "exit-never": Scenario("Never; worker-0 exits 1", ends(exit_pod(1, 1))),
    "oom-onfailure": Scenario(
        "OnFailure, restart budget 1 (backoffLimit 2); master OOM in place, then worker exit 1",
        ends(oom_then_exit, restart_left=1),
    ),
    "deleted": Scenario(
        "Never; the running PyTorchJob deleted by a person (dispatch's finalizer holds it)", deleted
    ),
    "preempt-never": Scenario(
        "Never; worker-0 preempted by kube-scheduler (a lab-high pod needing the node)", preempt_never
    ),
    "preempt-onfailure": Scenario(
        "OnFailure; worker-0 preempted by kube-scheduler; the training operator recreates it",
        preempt_recreated,
    ),
    "taint-never": Scenario(
        "Never, 1 node; NoExecute taint on its node (taint-eviction controller)",
        ends(taint, settle=2, nodes=1),
    ),
    "unschedulable": Scenario(
        "Never, 1 node asking for 64 GPUs: kube-scheduler cannot place it", unschedulable
    ),
    "node-shutdown": Scenario(
        "Never, 1 node; graceful node shutdown: DisruptionTarget TerminationByKubelet",
        ends(
            lambda r: r.lab.shutdown_pod(r.namespace, r.running()[0]["metadata"]["name"]), settle=1, nodes=1
        ),
    ),
    "deadline": Scenario(
        "Never, 1 node; the kubelet's activeDeadlineSeconds kill: pod reason DeadlineExceeded",
        ends(
            lambda r: r.lab.deadline_pod(r.namespace, r.running()[0]["metadata"]["name"]), settle=1, nodes=1
        ),
    ),
    "notready-deleted": Scenario(
        "Never, 1 node; its node NotReady, then the pod deleted (no DisruptionTarget)", notready_deleted
    ),
    "image-pull": Scenario(
        "Never, 1 node, an image that never pulls (kwok stage on unpullable.invalid/)", image_pull
    ),
    "env-refused": Scenario(
        "an env name with '=': the PyTorchJob is accepted, every pod creation refused", env_refused
    ),
    "webhook-refused": Scenario(
        "a PyTorchJob name that is not a DNS-1035 label: the validating webhook refuses it", webhook_refused
    ),
}


# ---- JobSet and TrainJob ------------------------------------------------------------------------


def restarts(first: tuple[int, str | None], then: Callable[[Run], None]) -> Callable[[Run], None]:
    """Under the native rule: pod 0 of attempt 0 exits (code, reason), JobSet restarts the whole
    JobSet, then ``then`` on attempt 1."""

    def act(r: Run) -> None:
        r.exit(r.running(restart=0)[0], *first)
        then(r)

    return act


def attempt_1_pod_1_exits_1(r: Run) -> None:
    r.exit(r.running(restart=1)[1], 1)


SHARED_SCENARIOS: Final = {
    "success": Scenario(
        "2 nodes; every container exits 0 (kwok lab-container-exit)", ends(exit_all, succeeds=True)
    ),
    "exit": Scenario("2 nodes; pod index 0 exits 1", ends(exit_pod(0, 1), settle=2)),
    "oom": Scenario(
        "2 nodes; pod index 0 OOMKilled (exit 137)", ends(exit_pod(0, 137, "OOMKilled"), settle=2)
    ),
    "preempt": Scenario(
        "2 nodes; pod index 1 preempted by kube-scheduler (a lab-high pod needing its cpu)",
        ends(preempt_pod(1), settle=2),
    ),
    "evict": Scenario(
        "2 nodes; pod index 0 evicted through the Eviction API",
        ends(lambda r: r.lab.evict_pod(r.namespace, r.running()[0]["metadata"]["name"]), settle=2),
    ),
}
"""What JobSet and TrainJob are both recorded doing."""

JOBSET_SCENARIOS: Final = {
    **SHARED_SCENARIOS,
    "restarts-exhausted": Scenario(
        "native rule, 1 restart left (maxRestarts 1): exit 1, JobSet restarted, exit 1: ReachedMaxRestarts",
        ends(restarts((1, None), attempt_1_pod_1_exits_1), settle=2, restart_left=1),
    ),
    "restart-success": Scenario(
        "native rule, 2 restarts left: OOM, JobSet restarted, then every container exits 0",
        ends(restarts((137, "OOMKilled"), lambda r: exit_all(r, restart=1)), succeeds=True, restart_left=2),
    ),
}


# ---- Kueue --------------------------------------------------------------------------------------


def apply(lab: Lab, docs: list[Body]) -> None:
    lab.kubectl("apply", "--server-side", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))


def queues(r: Run, **quota: Any) -> Queues:
    """The scenario's two ClusterQueues in a cohort and their LocalQueues (tests.support.kueue);
    their final state goes into the recording, and they are deleted once it is over."""
    made, docs = queue_objects(r.namespace, **quota)
    apply(r.lab, docs)
    names = (made.cluster_queue, made.other_cluster_queue)

    def keep_and_delete() -> None:
        r.objects.extend(
            r.lab.request("GET", f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{cq}") for cq in names
        )
        r.lab.kubectl("delete", "namespace", r.namespace, "--wait=false", check=False)
        r.lab.kubectl("delete", "clusterqueues.v1beta2.kueue.x-k8s.io", *names, "--wait=false", check=False)

    r.after.append(keep_and_delete)
    return made


def queued(r: Run, queue: str, *, job: str = "", image: str = IMAGE) -> None:
    """The PyTorchJob (of ``job``, default: the scenario's name) created held and released as
    dispatch releases a job with a queue: ONE patch adding the queue and priority-class labels and
    the released annotation; suspend stays true."""
    r.create(job or r.scenario, image=image)
    labels = {QUEUE_LABEL: queue, PRIORITY_LABEL: LOW}
    r.patch({"metadata": {"labels": labels, "annotations": {ANNOTATION_RELEASED: "1"}}})


def workload_has(r: Run, kind: str, status: str = "True", reason: str | None = None) -> bool:
    items = r.lab.request("GET", f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{r.namespace}/workloads")
    wl = workload_of(items.get("items") or (), r.uid) or {}
    return any(
        c.get("type") == kind and c.get("status") == status and reason in (None, c.get("reason"))
        for c in (wl.get("status") or {}).get("conditions") or ()
    )


def suspended_again(r: Run) -> None:
    r.until("suspended again", lambda: r.kind.suspended(r.get()), 90)
    time.sleep(3)


def batch(r: Run, name: str, queue: str, priority: str) -> None:
    """A plain batch/v1 Job in ``queue`` (tests.support.kueue.batch_job) that needs the quota."""
    r.lab.request(
        "POST",
        f"/apis/batch/v1/namespaces/{r.namespace}/jobs",
        batch_job(r.namespace, name, queue, priority=priority),
    )


def admitted(r: Run) -> None:
    """Admitted, unsuspended by Kueue, run by the training operator; every pod exits 0: Finished."""
    queued(r, queues(r).queue)
    r.until("admitted", lambda: workload_has(r, "Admitted"), 90)
    exit_all(r)
    r.until("finished", lambda: workload_has(r, "Finished"), 90)
    time.sleep(2)


def pending_quota(r: Run) -> None:
    """The ClusterQueue holds cpu 1; the job asks for 2: the Workload waits (QuotaReserved=False)."""
    queued(r, queues(r, cpu="1").queue, job="pending")
    r.until("pending", lambda: workload_has(r, "QuotaReserved", "False", "Pending"), 90)
    time.sleep(5)


def preempted(r: Run) -> None:
    """Admitted and running at priority low; a batch/v1 Job at priority high in the same LocalQueue
    needs the whole quota: Kueue evicts the PyTorchJob (Preempted, InClusterQueue), suspends it,
    and requeues its Workload, which then waits for quota."""
    q = queues(r)
    queued(r, q.queue)
    r.running()
    batch(r, "preemptor", q.queue, HIGH)
    r.until("evicted", lambda: workload_has(r, "Evicted", reason="Preempted"), 90)
    r.until("suspended", lambda: r.kind.suspended(r.get()), 90)
    r.until("requeued", lambda: workload_has(r, "QuotaReserved", "False"), 90)
    time.sleep(3)


def reclaimed(r: Run) -> None:
    """Its ClusterQueue has no quota of its own: it borrows the cohort's; a Job in the other
    ClusterQueue (the lender) reclaims it (Preempted, InCohortReclamation)."""
    q = queues(r, cpu="0", memory="0", borrowing_limit=None)
    queued(r, q.queue)
    r.running()
    batch(r, "reclaimer", q.other_queue, LOW)
    r.until("evicted", lambda: workload_has(r, "Evicted", reason="Preempted"), 90)
    suspended_again(r)


def pods_ready_timeout(r: Run) -> None:
    """Admitted, but its image never pulls (kwok's lab-image-pull-error stage): after the
    waitForPodsReady timeout Kueue evicts it (PodsReadyTimeout) and requeues it after a backoff."""
    queued(r, queues(r).queue, image=UNPULLABLE_IMAGE)
    r.until("admitted", lambda: workload_has(r, "Admitted"), 90)
    r.until("evicted", lambda: workload_has(r, "Evicted", reason="PodsReadyTimeout"), 180)
    suspended_again(r)


def deactivated(r: Run) -> None:
    """Admitted and running; an administrator sets the Workload's spec.active=false: Kueue evicts
    it (Deactivated) and suspends the PyTorchJob; it is never requeued."""
    queued(r, queues(r).queue)
    r.running()
    items = r.lab.request("GET", f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{r.namespace}/workloads")
    wl = workload_of(items.get("items") or (), r.uid)
    assert wl is not None
    patch = json.dumps({"spec": {"active": False}})
    r.lab.kubectl(
        "patch", f"{WORKLOADS}/{wl['metadata']['name']}", "-n", r.namespace, "--type=merge", "-p", patch
    )
    r.until("evicted", lambda: workload_has(r, "Evicted", reason="Deactivated"), 90)
    suspended_again(r)


KUEUE_SCENARIOS: Final = {
    "admitted": Scenario("admitted into a ClusterQueue of cpu 2, run, every container exits 0", admitted),
    "pending-quota": Scenario("a ClusterQueue of cpu 1 (no borrowing) for a job of cpu 2", pending_quota),
    "preempted": Scenario(
        "running at WorkloadPriorityClass low; a batch/v1 Job at high in the same LocalQueue preempts it",
        preempted,
    ),
    "reclaimed": Scenario(
        "borrowing the cohort's quota (own nominal cpu 0); a Job in the lending ClusterQueue reclaims it",
        reclaimed,
    ),
    "pods-ready-timeout": Scenario(
        f"admitted, its image never pulls: evicted after waitForPodsReady.timeout {KUEUE_PODS_READY_TIMEOUT}",
        pods_ready_timeout,
    ),
    "deactivated": Scenario(
        "running; the Workload's spec.active set to false by an administrator", deactivated
    ),
}


# ---- the kinds ----------------------------------------------------------------------------------

ENV: Final = {"env": {"A": "1"}}
"""An env var on every JobSet and TrainJob: their build tests check that the real stack keeps it."""
TRAINER: Final = {**ENV, "runtime": TRAINER_RUNTIME}
"""A TrainJob names its runtime: the one the lab installs."""


PROFILES: Final[Mapping[str, Profile]] = {
    "job": Profile("job", JOB_SCENARIOS, "Complete", nodes=1, namespace="job-record", dispatch_only=True),
    "kubeflow": Profile(
        "kubeflow", KUBEFLOW_SCENARIOS, "Succeeded", namespace="kubeflow-record", dispatch_only=True
    ),
    "jobset": Profile(
        "jobset", JOBSET_SCENARIOS, "Completed", extras=("jobset",), watch=("job",), options=ENV
    ),
    "trainjob": Profile(
        "trainjob",
        SHARED_SCENARIOS,
        "Complete",
        extras=("jobset", "trainer"),
        watch=("jobset", "job"),
        options=TRAINER,
    ),
    "kueue": Profile("kubeflow", KUEUE_SCENARIOS, "Succeeded", extras=("kueue",), watch=(WORKLOADS, "job")),
}
"""Each KIND the recorder knows: ``tests/unit/data/<KIND>/`` holds its recordings."""

KINDS: Final = tuple(PROFILES)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="default: every scenario of KIND")
    args = parser.parse_args()
    profile = PROFILES[args.kind]
    unknown = sorted(set(args.scenarios) - set(profile.scenarios))
    if unknown:
        parser.error(
            f"{args.kind} has no scenario {', '.join(unknown)}; it has {', '.join(profile.scenarios)}"
        )
    with (
        tempfile.TemporaryDirectory(prefix=f"record-{args.kind}-") as tmp,
        Lab(Path(tmp), extras=profile.extras) as lab,
    ):
        print(f"lab up in {lab.start_seconds:.1f}s (extras {lab.extras_seconds})", flush=True)
        if "kueue" in profile.extras:  # what Kueue admits nothing without: its flavor, the priorities
            apply(lab, shared_objects())
        for name in args.scenarios or list(profile.scenarios):
            record(lab, args.kind, name)


if __name__ == "__main__":
    main()
