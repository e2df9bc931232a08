"""What every backend on the Kubernetes workload kit declares alike: the options of its pods
(:class:`PodOptions`), the RBAC rules of its pods, their events and nodes (declared once, so the
chart grants each once), and :func:`workload_backend`, the declaration of a backend that runs one
held workload object per submission."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Annotated, ClassVar, Final, Literal, Self, TypeVar

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.fields import FieldInfo

from .._constants import GROUP, LABEL_MANAGED_BY
from .._model import (
    DEFAULT_GRACE_SECONDS,
    NAME_PATTERN,
    Capabilities,
    EnvMap,
    JobSpec,
    OptionsModel,
    Resources,
    bytes_quantity,
    quantity_bytes,
)
from .._registry import ApiResource, BackendInfo, PolicyRule, Where

Image = Annotated[str, Field(min_length=1, max_length=512)]
"""A container image reference, as a pod takes it."""
ObjectName = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]
"""The name of an object of the job's namespace (a PVC, Secret, ConfigMap, ServiceAccount,
PriorityClass): a DNS subdomain, as Kubernetes names them."""
VolumeName = Annotated[str, Field(min_length=1, max_length=63, pattern=NAME_PATTERN)]
"""A volume's name in the pod: a DNS label, as Kubernetes requires."""
Quantity = Annotated[str, Field(max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?([EPTGMK]i?|[mkMGTPE])?$")]
"""A Kubernetes quantity of bytes (``64Gi``, ``512M``)."""
Path = Annotated[str, Field(min_length=1, max_length=4096, pattern=r"^/")]
"""An absolute path in the container."""

RESERVED_ENV_PREFIX: Final = "DISPATCH_"
"""dispatch's own env names (the submission's identity) start so: a user's env may not."""
RESERVED_KEY_PREFIX: Final = f"{GROUP}/"
"""dispatch's own labels and annotations start so: a user's pod labels and annotations may not."""
RESERVED_KEYS: Final = frozenset({LABEL_MANAGED_BY})
"""dispatch's labels outside its prefix, by which it finds its pods."""
SHM_VOLUME: Final = "dispatch-shm"
"""The volume :attr:`PodOptions.shm_size` adds (mounted at ``/dev/shm``)."""
SHM_PATH: Final = "/dev/shm"
CROSS_NAMESPACE_KEYS: Final = ("namespaces", "namespaceSelector")
"""Keys of a pod (anti-)affinity term that reach pods of other namespaces."""


ONE_SOURCE: Final = "a volume has exactly one of persistentVolumeClaim, secret, configMap, emptyDir"
RESERVED_ENV: Final = f"names with the prefix {RESERVED_ENV_PREFIX} are reserved for dispatch's own env"
RESERVED_KEY: Final = f"keys under {RESERVED_KEY_PREFIX} (and {LABEL_MANAGED_BY}) are dispatch's own"


UserEnv = Annotated[
    EnvMap,
    Field(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": f"self.all(k, !k.startsWith('{RESERVED_ENV_PREFIX}'))", "message": RESERVED_ENV}
            ]
        }
    ),
]
"""A user's env: :data:`~dispatch._model.EnvMap` without dispatch's own names (refused by the
CRD's rule, and by the options' validators for the library and the webhook)."""


class PersistentVolumeClaimSource(OptionsModel):
    """A PersistentVolumeClaim of the job's namespace (a dataset, a checkpoint directory)."""

    claim_name: ObjectName
    read_only: bool = False


class SecretSource(OptionsModel):
    """A Secret of the job's namespace, its keys as files."""

    secret_name: ObjectName


class ConfigMapSource(OptionsModel):
    """A ConfigMap of the job's namespace, its keys as files."""

    name: ObjectName


class EmptyDirSource(OptionsModel):
    """A directory that lives as long as the pod: on the node's disk, or in memory (``Memory``,
    counted against the container's memory limit)."""

    medium: Literal["", "Memory"] = ""
    size_limit: Quantity | None = None


class Volume(OptionsModel):
    """A volume of the pod, of exactly one source. Only these sources exist here: a ``hostPath``
    (or any other) volume is refused, as an unknown field, so a DispatchJob mounts nothing a pod of
    its namespace could not mount without the node's filesystem."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.persistentVolumeClaim), has(self.secret), has(self.configMap),"
                    " has(self.emptyDir)].filter(x, x).size() == 1",
                    "message": ONE_SOURCE,
                }
            ]
        }
    )

    name: VolumeName
    persistent_volume_claim: PersistentVolumeClaimSource | None = None
    secret: SecretSource | None = None
    config_map: ConfigMapSource | None = None
    empty_dir: EmptyDirSource | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        sources = [self.persistent_volume_claim, self.secret, self.config_map, self.empty_dir]
        if sum(s is not None for s in sources) != 1:
            raise ValueError(ONE_SOURCE)
        return self


class VolumeMount(OptionsModel):
    """Where the training container sees one of :attr:`PodOptions.volumes`."""

    name: VolumeName
    mount_path: Path
    read_only: bool = False
    sub_path: Annotated[str, Field(min_length=1, max_length=4096, pattern=r"^[^/]")] | None = None
    """A path inside the volume (relative: Kubernetes refuses ``..`` in it)."""


class LocalObjectReference(OptionsModel):
    """An object of the job's namespace, by name."""

    name: ObjectName


class EnvFromReference(OptionsModel):
    """A Secret or ConfigMap of the job's namespace, by name."""

    name: ObjectName
    optional: bool = False
    """The pod starts without it when it does not exist."""


class EnvFromSource(OptionsModel):
    """Every key of a Secret or a ConfigMap (exactly one) as an environment variable."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.secretRef) != has(self.configMapRef)",
                    "message": "envFrom has exactly one of secretRef, configMapRef",
                },
                {
                    "rule": "!has(self.prefix) || !self.prefix.startsWith('DISPATCH_')",
                    "message": "the prefix DISPATCH_ is reserved for dispatch's own env",
                },
            ]
        }
    )

    prefix: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """Put before each key's name."""
    secret_ref: EnvFromReference | None = None
    config_map_ref: EnvFromReference | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.secret_ref is None) == (self.config_map_ref is None):
            raise ValueError("envFrom has exactly one of secretRef, configMapRef")
        if self.prefix is not None and self.prefix.startswith(RESERVED_ENV_PREFIX):
            raise ValueError(f"prefix: the prefix {RESERVED_ENV_PREFIX} is reserved for dispatch's own env")
        return self


class Toleration(OptionsModel):
    """A taint the pods tolerate (GPU nodes are usually tainted), as in a pod spec."""

    key: Annotated[str, Field(min_length=1, max_length=317)] | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: Annotated[str, Field(max_length=63)] | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None
    """How long a pod stays on a node tainted ``NoExecute`` (only with that effect)."""


LooseObject = Annotated[
    dict[str, object], Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
]
"""A Kubernetes object whose inside the API server validates when it builds the pods."""


class Affinity(OptionsModel):
    """The pods' affinity, as in a pod spec: each part is passed as written (the API server checks
    it in the pod template), except that a pod (anti-)affinity term may not name other namespaces
    (``namespaces``, ``namespaceSelector``): the pods are placed by the pods of their own namespace."""

    node_affinity: LooseObject | None = None
    pod_affinity: LooseObject | None = None
    pod_anti_affinity: LooseObject | None = None

    @model_validator(mode="after")
    def _own_namespace(self) -> Self:
        for field, part in (("podAffinity", self.pod_affinity), ("podAntiAffinity", self.pod_anti_affinity)):
            where = _cross_namespace(part, field)
            if where is not None:
                raise ValueError(f"{where}: a DispatchJob's pods may not refer to pods of other namespaces")
        return self


def _keys(node: object, path: str) -> Iterator[str]:
    """The path of every mapping key in ``node``, depth first."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield f"{path}.{key}"
            yield from _keys(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _keys(item, f"{path}[{i}]")


def _cross_namespace(node: object, path: str) -> str | None:
    """The path of the first key in ``node`` that reaches another namespace, or None."""
    return next((k for k in _keys(node, path) if k.rsplit(".", 1)[-1] in CROSS_NAMESPACE_KEYS), None)


def _reserved(rule: str, message: str) -> FieldInfo:
    """A user's labels or annotations: at most 64, none of dispatch's keys (``rule``, in CEL)."""
    info: FieldInfo = Field(
        max_length=64, json_schema_extra={"x-kubernetes-validations": [{"rule": rule, "message": message}]}
    )
    return info


LabelKey = Annotated[str, Field(min_length=1, max_length=317)]
PodLabels = Annotated[
    dict[LabelKey, Annotated[str, Field(max_length=63)]],
    _reserved(
        f"self.all(k, !k.startsWith('{RESERVED_KEY_PREFIX}') && k != '{LABEL_MANAGED_BY}')", RESERVED_KEY
    ),
]
PodAnnotations = Annotated[
    dict[LabelKey, Annotated[str, Field(max_length=4096)]],
    _reserved(
        f"self.all(k, !k.startsWith('{RESERVED_KEY_PREFIX}'))",
        f"keys under {RESERVED_KEY_PREFIX} are dispatch's own",
    ),
]


class PodOptions(OptionsModel):
    """What every kit kind that runs the job's command in pods takes: each node's image, resources
    and environment, how long a pod may wait for a node, and the pod options a training job needs
    (volumes, ``/dev/shm``, scheduling, identity), with Kubernetes' field names so that they can be
    copied from a pod spec. A kind's options subclass it (an image required where the kind has no
    default) and add the fields of that kind alone. Nothing here lets a pod do what a pod of its
    namespace could not: see docs/security.md."""

    REPLACED: ClassVar[Mapping[str, str]] = {"terminationGracePeriodSeconds": "spec.stop.gracePeriodSeconds"}

    image: Image | None = None
    """The training container's image."""
    resources: Resources = Resources()
    env: UserEnv = Field(default_factory=dict)
    """The training container's environment (names with the prefix ``DISPATCH_`` are dispatch's:
    ``DISPATCH_JOB``, ``DISPATCH_NAMESPACE``, ``DISPATCH_SUBMISSION``)."""
    no_capacity_after_seconds: Annotated[int, Field(ge=1, le=86400)] = 300
    """A pod unschedulable for longer than this ends the submission with cause no-capacity."""
    env_from: Annotated[list[EnvFromSource], Field(max_length=16)] = Field(default_factory=list)
    """Secrets and ConfigMaps of the job's namespace whose keys become the container's environment."""
    volumes: Annotated[list[Volume], Field(max_length=32)] = Field(default_factory=list)
    """The pod's volumes: PersistentVolumeClaims, Secrets, ConfigMaps of the job's namespace, and
    emptyDirs."""
    volume_mounts: Annotated[list[VolumeMount], Field(max_length=32)] = Field(default_factory=list)
    """Where the training container mounts :attr:`volumes` (each names one of them)."""
    shm_size: Quantity | None = None
    """The size of ``/dev/shm`` (an in-memory emptyDir mounted there, counted against the memory
    limit): PyTorch's DataLoader workers share batches through it, and a container's default is 64M."""
    node_selector: Annotated[dict[LabelKey, Annotated[str, Field(max_length=63)]], Field(max_length=32)] = (
        Field(default_factory=dict)
    )
    """Labels a node must have to run the pods."""
    tolerations: Annotated[list[Toleration], Field(max_length=32)] = Field(default_factory=list)
    """Taints the pods tolerate."""
    affinity: Affinity | None = None
    service_account_name: ObjectName | None = None
    """The ServiceAccount of the job's namespace the pods run as (default: the namespace's ``default``)."""
    image_pull_secrets: Annotated[list[LocalObjectReference], Field(max_length=16)] = Field(
        default_factory=list
    )
    """Secrets of the job's namespace to pull the image with."""
    priority_class_name: ObjectName | None = None
    """The pods' PriorityClass (outside Kueue; under a queue Kueue's priority class applies)."""
    pod_labels: PodLabels = Field(default_factory=dict)
    """Labels on every pod (not under ``dispatch.dev/``: dispatch's own labels are how it finds them)."""
    pod_annotations: PodAnnotations = Field(default_factory=dict)
    """Annotations on every pod (not under ``dispatch.dev/``)."""
    working_dir: Path | None = None
    """The training container's working directory (default: the image's)."""

    def gpus_per_node(self) -> int:
        return self.resources.gpu

    memory_field: ClassVar[str | None] = "resources.memory"

    def memory_bytes(self) -> int | None:
        memory = self.resources.memory
        return quantity_bytes(memory) if memory is not None else None

    def with_memory_bytes(self, value: int) -> Self:
        """The container's memory (its request and limit) as ``value`` bytes, in the largest binary
        unit that holds it exactly."""
        memory = bytes_quantity(max(value, self.memory_bytes() or 0))
        return self.model_copy(update={"resources": self.resources.model_copy(update={"memory": memory})})

    @field_validator("env")
    @classmethod
    def _reserved_env(cls, env: dict[str, str]) -> dict[str, str]:
        refuse_reserved_env(env)
        return env

    @field_validator("pod_labels", "pod_annotations")
    @classmethod
    def _reserved_keys(cls, keys: dict[str, str]) -> dict[str, str]:
        for key in sorted(keys):
            if key.startswith(RESERVED_KEY_PREFIX) or key in RESERVED_KEYS:
                raise ValueError(f"[{key!r}]: {RESERVED_KEY}")
        return keys

    @model_validator(mode="after")
    def _mounts_name_volumes(self) -> Self:
        names = [v.name for v in self.volumes]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ValueError(f"volumes[{i}].name: {name!r} names two volumes")
            if name == SHM_VOLUME:
                raise ValueError(f"volumes[{i}].name: {SHM_VOLUME!r} is the volume of shmSize")
        paths: list[str] = [SHM_PATH] if self.shm_size is not None else []
        for i, mount in enumerate(self.volume_mounts):
            if mount.name not in names:
                raise ValueError(f"volumeMounts[{i}].name: {mount.name!r} is none of volumes")
            if mount.mount_path.rstrip("/") in paths:
                raise ValueError(f"volumeMounts[{i}].mountPath: {mount.mount_path!r} is mounted twice")
            paths.append(mount.mount_path.rstrip("/"))
        return self


def refuse_reserved_env(env: Mapping[str, str]) -> None:
    """Refuse env names dispatch sets itself (the submission's identity): they would be overwritten."""
    for key in sorted(env):
        if key.startswith(RESERVED_ENV_PREFIX):
            raise ValueError(f"[{key!r}]: {RESERVED_ENV}")


def identity_env(namespace: str, job: str, submission: int) -> dict[str, str]:
    """The submission's identity, in every pod and Slurm job: the job's name, its namespace, and the
    submission's number, which only grows (a script's fencing token; see docs/semantics.md)."""
    return {
        f"{RESERVED_ENV_PREFIX}JOB": job,
        f"{RESERVED_ENV_PREFIX}NAMESPACE": namespace,
        f"{RESERVED_ENV_PREFIX}SUBMISSION": str(submission),
    }


def pod_volumes(options: PodOptions) -> list[dict[str, object]]:
    """The pod's ``volumes``: the options' and the ``/dev/shm`` of :attr:`PodOptions.shm_size`."""
    out: list[dict[str, object]] = [v.model_dump(by_alias=True, exclude_none=True) for v in options.volumes]
    if options.shm_size is not None:
        out.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": options.shm_size}})
    return out


def volume_mounts(options: PodOptions) -> list[dict[str, object]]:
    """The training container's ``volumeMounts``, the ``/dev/shm`` one included."""
    out: list[dict[str, object]] = [
        m.model_dump(by_alias=True, exclude_none=True) for m in options.volume_mounts
    ]
    if options.shm_size is not None:
        out.append({"name": SHM_VOLUME, "mountPath": SHM_PATH})
    return out


def container_fields(options: PodOptions) -> dict[str, object]:
    """What the options add to the training container beside its image, command, env and
    resources: its mounts, ``envFrom`` and working directory."""
    out: dict[str, object] = {}
    mounts = volume_mounts(options)
    if mounts:
        out["volumeMounts"] = mounts
    if options.env_from:
        out["envFrom"] = [e.model_dump(by_alias=True, exclude_none=True) for e in options.env_from]
    if options.working_dir is not None:
        out["workingDir"] = options.working_dir
    return out


def pod_spec_fields(options: PodOptions) -> dict[str, object]:
    """What the options add to the pod's spec beside its containers."""
    out: dict[str, object] = {}
    volumes = pod_volumes(options)
    if volumes:
        out["volumes"] = volumes
    if options.node_selector:
        out["nodeSelector"] = dict(options.node_selector)
    if options.tolerations:
        out["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in options.tolerations]
    if options.affinity is not None:
        out["affinity"] = options.affinity.model_dump(by_alias=True, exclude_none=True)
    if options.service_account_name is not None:
        out["serviceAccountName"] = options.service_account_name
    if options.image_pull_secrets:
        out["imagePullSecrets"] = [s.model_dump(by_alias=True) for s in options.image_pull_secrets]
    if options.priority_class_name is not None:
        out["priorityClassName"] = options.priority_class_name
    return out


def pod_grace(spec: JobSpec) -> int:
    """The pods' ``terminationGracePeriodSeconds``: the job's grace, or its warning when longer, so
    that a time limit's stop begun ``warningSeconds`` early may last until the limit; dispatch's
    other stops give the grace by their deletion (which may shorten a pod's own)."""
    return max(spec.stop.grace_period_seconds, spec.stop.warning_seconds or 0)


def pod_metadata(options: PodOptions, labels: Mapping[str, str]) -> dict[str, object]:
    """The pod template's metadata: the options' labels and annotations, and dispatch's ``labels``
    (which win; the options cannot name them)."""
    meta: dict[str, object] = {"labels": {**options.pod_labels, **labels}}
    if options.pod_annotations:
        meta["annotations"] = dict(options.pod_annotations)
    return meta


def pod_template(
    options: PodOptions,
    main: Mapping[str, object],
    labels: Mapping[str, str],
    *,
    restart_policy: str | None = None,
    grace_seconds: int = DEFAULT_GRACE_SECONDS,
) -> dict[str, object]:
    """A kind's pod template: the training container ``main`` (the kit's ``container()``) with the
    options' container fields, the options' pod fields, dispatch's ``labels`` and the options'.
    ``grace_seconds`` is the job's ``spec.stop.gracePeriodSeconds``: the kubelet's SIGTERM-to-SIGKILL
    time on every stop of a pod (dispatch's, a preemption's, an eviction's)."""
    spec: dict[str, object] = {}
    if restart_policy is not None:
        spec["restartPolicy"] = restart_policy
    spec["containers"] = [{**main, **container_fields(options)}]
    spec.update(pod_spec_fields(options))
    if grace_seconds != DEFAULT_GRACE_SECONDS:  # (the kubelet's own default otherwise)
        spec["terminationGracePeriodSeconds"] = grace_seconds
    return {"metadata": pod_metadata(options, labels), "spec": spec}


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
