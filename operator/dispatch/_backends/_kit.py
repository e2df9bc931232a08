"""What every backend on the Kubernetes workload kit declares alike: the options of its pods
(:class:`PodOptions`), the RBAC rules of its pods, their events and nodes (declared once, so the
chart grants each once), and :func:`workload_backend`, the declaration of a backend that runs one
held workload object per submission."""

from __future__ import annotations

from typing import Annotated, Final, TypeVar

from pydantic import Field

from .._model import Capabilities, EnvMap, OptionsModel, Resources
from .._registry import ApiResource, BackendInfo, PolicyRule, Where

Image = Annotated[str, Field(min_length=1, max_length=512)]
"""A container image reference, as a pod takes it."""


class PodOptions(OptionsModel):
    """What every kit kind that runs the job's command in pods takes: each node's image, resources
    and environment, and how long a pod may wait for a node. A kind's options subclass it (an image
    required where the kind has no default) and add the fields of that kind alone."""

    image: Image | None = None
    """The training container's image."""
    resources: Resources = Resources()
    env: EnvMap = Field(default_factory=dict)
    no_capacity_after_seconds: Annotated[int, Field(ge=1, le=86400)] = 300
    """A pod unschedulable for longer than this ends the submission with cause no-capacity."""


OptionsT = TypeVar("OptionsT", bound=PodOptions)

POD_RULE: Final = PolicyRule(
    ("",),
    ("pods",),
    ("get", "list", "watch", "delete", "deletecollection"),
    why="Pods of the backend's objects: read to classify how a submission ended (preemption, eviction, "
    "OOM, unschedulable = no capacity). delete/deletecollection only because a cluster without a garbage "
    "collector leaves a deleted object's pods behind: the operator deletes them in one request with the "
    "label selector dispatch.dev/job=<job>,dispatch.dev/submission=<n>, i.e. only pods of a submission it "
    "ended. No other write.",
)
NODE_RULE: Final = PolicyRule(
    ("",),
    ("nodes",),
    ("get",),
    why="The node a failed pod ran on: gone (404) or not Ready means the cause is node-lost. Read only.",
    cluster_scoped=True,
)
POD_EVENT_RULE: Final = PolicyRule(
    ("",),
    ("events",),
    ("list", "watch"),
    why="The scheduler's Preempted, the taint manager's TaintManagerEviction and the kubelet's Evicted "
    "events of the backend's pods, and its controller's failure to create them: watched (one watch per "
    "reason) to say why pods ended that are gone (after a restart of the operator, or when the pod "
    "watch lags). Read only.",
)

WORKLOAD_VERBS: Final = ("create", "get", "list", "watch", "patch", "delete")

KUEUE_WORKLOAD_RULE: Final = PolicyRule(
    ("kueue.x-k8s.io",),
    ("workloads",),
    ("get", "list", "watch"),
    why="Kueue's Workloads of the objects of jobs with spec.queue (found by ownerReference): read to tell "
    "a submission waiting for admission from one Kueue evicted (preempted, PodsReady timeout, deactivated "
    "by an administrator). Read only: dispatch ends an evicted object by deleting it, which deletes its "
    "Workload.",
)


def workload_backend(
    *,
    name: str,
    summary: str,
    resource: ApiResource,
    capabilities: Capabilities,
    options: type[OptionsT],
    adapter: str,
    opener: str,
    options_required: bool = True,
    options_hint: str = "the image, at least",
    kueue: bool = True,
) -> BackendInfo[OptionsT]:
    """A kit backend: one object of ``resource`` per submission, created held, released and stopped
    by patches, let go of by a JSON patch of dispatch's finalizer, deleted to end it; its pods read
    (and deleted where no garbage collector runs), their events and nodes read. The RBAC rule of
    its objects and the metrics' resource labels are derived from ``resource``. ``adapter`` is the
    module with ``open_adapter`` (the library's opener) and ``opener`` (the operator's,
    ``(api, *, namespaces)``).
    ``kueue``: the kind is one of Kueue's integrations, so ``spec.queue`` is allowed (the
    capabilities say ``queues``) and the chart grants the read of Kueue's Workloads."""
    return BackendInfo(
        name=name,
        summary=summary,
        where=Where.KUBERNETES,
        capabilities=capabilities.model_copy(update={"queues": kueue}),
        open=f"{adapter}:open_adapter",
        open_in_operator=f"{adapter}:{opener}",
        options=options,
        options_required=options_required,
        options_hint=options_hint if options_required else "",
        rbac=(
            PolicyRule(
                (resource.group,),
                (resource.plural,),
                WORKLOAD_VERBS,
                why=f"One {resource.kind} per submission: created held, patched to release or stop it and to "
                "let go of dispatch's finalizer; deleted to end it (cancel, supervisor-side restarts).",
            ),
            POD_RULE,
            POD_EVENT_RULE,
            NODE_RULE,
            *((KUEUE_WORKLOAD_RULE,) if kueue else ()),
        ),
        metric_resources=(resource.plural, f"{resource.plural}/status", "pods", "events"),
    )
