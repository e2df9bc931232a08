"""The per-kind protocol: what the workload kit needs to know about one Kubernetes workload kind.

The kit (:class:`~dispatch._workload.WorkloadBackend`) owns everything every kind shares: the
watches and their cache, our own writes until the watch shows them, tombstones, the fence, stopping
by suspend, pod evidence, events and cause classification. A kind says only what differs: where its
objects live, how one is built from a job's spec, how it is held and released, and how its own
status reports success, failure and in-place restarts. See docs/backends.md, "The kit's API".
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, TypeAlias, cast, runtime_checkable

import msgspec

from .._constants import (
    ANNOTATION_NO_CAPACITY_AFTER,
    ANNOTATION_RESTART_BUDGET,
    GPU_RESOURCE,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_SUBMISSION,
    MANAGED_BY,
    OBJECT_FINALIZER,
)
from .._errors import BackendError
from .._model import Action, Capabilities, Cause, Enforcer, JobSpec, Plan, Resources

Body = dict[str, Any]

MAX_OBJECT_BYTES: Final = 1_500_000
"""Below etcd's default request limit (1.5 MiB) with room for the status a controller adds: a bigger
object is refused by the API server, and its pods (each a copy of a template) too."""
ENV_NAME: Final = re.compile(r"[\x20-\x3c\x3e-\x7e]+")
"""Kubernetes' rule for a container env name since 1.32 (IsRelaxedEnvVarName): printable ASCII,
no '='."""


@dataclass(frozen=True, slots=True)
class Clip:
    """A string kept up to ``limit`` characters: one only ever shown cut to that length."""

    limit: int


@dataclass(frozen=True, slots=True)
class Prefixed:
    """A string map (labels, annotations) of which only the keys with these prefixes are kept, keys
    and values shared (``sys.intern``): an object and its pods carry the same ones."""

    prefixes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Shared:
    """A string kept as one shared copy (``sys.intern``) for every cached body: a value many
    objects carry (a condition's type, status and reason, a phase, a node, a namespace); a string
    unique to one object (a name, a uid) is better kept as ``True``, with no entry in the table."""


SHARED: Final = Shared()


@dataclass(frozen=True, slots=True)
class Select:
    """The elements of a list whose ``key`` is one of ``values``, each by ``shape`` (the conditions
    of the types a reader looks up; it looks them up by type, so the others say nothing to it)."""

    key: str
    values: frozenset[str]
    shape: Mask


Mask: TypeAlias = Literal[True] | Clip | Prefixed | Shared | Select | Mapping[str, "Mask"] | tuple["Mask"]
"""Which part of a JSON value the kit caches (:func:`project`): ``True`` the value whole; a mapping
the listed keys of an object, each by its own shape; ``(shape,)`` every element of a list by
``shape``; :class:`Clip`, :class:`Prefixed`, :class:`Shared`, :class:`Select` as they say."""

CONDITION: Final[Mapping[str, Mask]] = {"type": SHARED, "status": SHARED, "reason": SHARED, "message": True}


def conditions(*types: str, shape: Mask = CONDITION) -> Select:
    """``status.conditions`` of these types only, as :func:`true_condition`-style readers see them."""
    return Select("type", frozenset(types), shape)


Projector: TypeAlias = Callable[[Any], Any]

_MISSING: Final = object()
_PROJECTORS: dict[int, tuple[Mask, Projector | None]] = {}
"""Each shape's compiled projector, by the shape's id (the shape kept beside it, so the id is never
reused): the shapes are few and live as long as the process (module constants, and one per kind:
``_classify.object_shape`` is cached)."""


def project(value: Any, shape: Mask) -> Any:
    """The part of ``value`` that ``shape`` names (nothing else of ``value`` stays referenced).

    A container of which nothing is left out is ``value`` itself, so projecting a projection again
    returns it unchanged (the informer's store and the kit's cache hold the same objects). A value
    of another type than its shape expects is kept whole: its readers see what they would have
    seen in the whole body. The shape is compiled once into nested closures (:func:`_compile`):
    interpreted, the walk of a shape per value was most of a restart's listing (a pod's projection
    took about as long as decoding the whole pod)."""
    entry = _PROJECTORS.get(id(shape))
    if entry is None or entry[0] is not shape:
        entry = _PROJECTORS[id(shape)] = (shape, _compile(shape))
    compiled = entry[1]
    return value if compiled is None else compiled(value)


def _named(name: Any, values: frozenset[str]) -> bool:
    return type(name) is str and name in values


def _identity(value: Any) -> Any:
    return value


def _compile(shape: Mask) -> Projector | None:
    """``shape`` as a function of the value; None for ``True`` (the value itself: no call)."""
    if shape is True:
        return None
    if isinstance(shape, Clip):
        limit = shape.limit

        def clip(value: Any) -> Any:
            return value[:limit] if type(value) is str else value

        return clip
    if isinstance(shape, Shared):

        def shared(value: Any) -> Any:
            return sys.intern(value) if type(value) is str else value

        return shared
    if isinstance(shape, Prefixed):
        prefixes = shape.prefixes

        def prefixed(value: Any) -> Any:
            if not isinstance(value, dict):
                return value
            kept = {
                sys.intern(k): sys.intern(v) if type(v) is str else v
                for k, v in value.items()
                if k.startswith(prefixes)
            }
            same = len(kept) == len(value) and all(
                k is sys.intern(k) and kept[k] is v for k, v in value.items()
            )
            return value if same else kept

        return prefixed
    if isinstance(shape, Select):
        key, values = shape.key, shape.values
        item = _compile(shape.shape) or _identity

        def where(value: Any) -> Any:
            if not isinstance(value, list):
                return value
            # Only a string names a wanted element: any other value (even an unhashable one) does not.
            items = [item(i) for i in value if not isinstance(i, dict) or _named(i.get(key), values)]
            same = len(items) == len(value) and all(a is b for a, b in zip(items, value, strict=True))
            return value if same else items

        return where
    if isinstance(shape, tuple):
        compiled = _compile(shape[0])
        if compiled is None:
            return None
        element: Projector = compiled

        def each(value: Any) -> Any:
            if not isinstance(value, list):
                return value
            items = [element(i) for i in value]
            same = all(a is b for a, b in zip(items, value, strict=True))
            return value if same else items

        return each
    # The shape's own key strings, not the body's: one copy of each key for every cached object.
    fields = tuple((key, _compile(sub)) for key, sub in shape.items())

    def mapping(value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out = {}
        same = True
        for key, sub in fields:
            kept = value.get(key, _MISSING)
            if kept is _MISSING:
                continue
            if sub is not None:
                projected = sub(kept)
                same = same and projected is kept
                kept = projected
            out[key] = kept
        return value if same and len(out) == len(value) else out

    return mapping


Reader: TypeAlias = Callable[[bytes], Body]
"""Decodes one list page's JSON (``{"metadata": ..., "items": [...]}``) or one watch event's
(``{"type": ..., "object": ...}``)."""

_READERS: dict[int, tuple[Mask, Reader]] = {}
"""Each item shape's reader, by the shape's id (kept beside it, as :data:`_PROJECTORS`)."""
_EVENT_METADATA: Final[Mask] = {"metadata": {"resourceVersion": True, "annotations": True}}
"""What a watch reads of every event's object besides its shape: a bookmark's resourceVersion and
the annotation that ends a streamed list's initial events."""


def reader(shape: Mask) -> Reader:
    """A decoder of one list page or watch event that builds, of each object, only what ``shape``
    reaches (and a bookmark's :data:`_EVENT_METADATA`).

    Decoding whole bodies and projecting them was most of a restart's CPU (issue 13): about 40 us
    per pod, most of it the dicts and strings of everything the projection drops, made and freed.
    The JSON is decoded instead into msgspec Structs made from the shape (:func:`_typed`), which
    skip every other field as they read, and turned back into plain dicts: each object is the
    shape's part of it, of which :func:`project` keeps exactly what it keeps of the whole object
    (clipping, interning, filtering by prefix or key). JSON in which a value has another type than
    its shape expects (a string where an object was expected; an ERROR event's Status) is decoded
    whole instead: :func:`project` keeps such a value whole, so the objects are the same either way.
    """
    entry = _READERS.get(id(shape))
    if entry is None or entry[0] is not shape:
        entry = _READERS[id(shape)] = (shape, _reader(shape))
    return entry[1]


def _reader(shape: Mask) -> Reader:
    names = itertools.count()
    item = _typed(merge(shape, _EVENT_METADATA), names)
    fields = [("metadata", Any), ("items", _list_of(item)), ("type", Any), ("object", item)]
    top = msgspec.defstruct("PageOrEvent", [(name, kind, msgspec.UNSET) for name, kind in fields])
    decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(top)

    def read(raw: bytes) -> Body:
        try:
            decoded = decoder.decode(raw)
        except msgspec.ValidationError:
            whole: Body = json.loads(raw)
            return whole
        kept: Body = msgspec.to_builtins(decoded)
        return kept

    return read


def _typed(shape: Mask, names: Iterator[int]) -> Any:
    """The msgspec type that decodes a JSON value keeping what ``shape`` reaches of it: ``Any`` for a
    value kept whole (clipped, interned or filtered afterwards by :func:`project`), a Struct of the
    named keys (each unset where the object has none) for a mapping, a list for a tuple or a
    :class:`Select` (its elements' key kept too: it chooses them)."""
    if shape is True or isinstance(shape, Clip | Shared | Prefixed):
        return Any
    if isinstance(shape, Select):
        inner = shape.shape
        if not isinstance(inner, Mapping):
            return Any
        return _list_of(_typed({shape.key: True, **inner}, names))
    if isinstance(shape, tuple):
        element = _typed(shape[0], names)
        return Any if element is Any else _list_of(element)
    keys = list(shape)
    struct = msgspec.defstruct(
        f"Kept{next(names)}",
        [(f"f{i}", _typed(shape[key], names), msgspec.UNSET) for i, key in enumerate(keys)],
        rename={f"f{i}": key for i, key in enumerate(keys)},
    )
    return struct | None


def _list_of(element: Any) -> Any:
    """``list[element] | None``, made at run time."""
    return cast(Any, list)[element] | None


def merge(a: Mask, b: Mask) -> Mask:
    """Both shapes' fields (a mapping's keys from either; ``True`` wins over any part)."""
    if a is True or b is True:
        return True
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out: dict[str, Mask] = dict(a)
        for key, sub in b.items():
            out[key] = merge(out[key], sub) if key in out else sub
        return out
    if isinstance(a, tuple) and isinstance(b, tuple):
        return (merge(a[0], b[0]),)
    if isinstance(a, Select) and isinstance(b, Select) and a.key == b.key:
        return Select(a.key, a.values | b.values, merge(a.shape, b.shape))
    if a == b:
        return a
    raise ValueError(f"shapes {a!r} and {b!r} cannot be merged")


class Refused(BackendError):
    """This submission can never become a running object; ``field`` names what to change."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True, slots=True)
class Resource:
    """Where a kind's objects live on the API server."""

    group: str
    """API group; ``""`` for the core group."""
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        path = f"{base}/namespaces/{namespace}/{self.plural}" if namespace else f"{base}/{self.plural}"
        return f"{path}/{name}" if name else path

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


@dataclass(frozen=True, slots=True)
class Target:
    """The object to build: submission ``submission`` of job ``namespace/job_name``."""

    namespace: str
    job_name: str
    submission: int
    owner: Mapping[str, Any] | None = None
    """The ownerReference to put on it (the DispatchJob), or None when used as a library."""

    @property
    def name(self) -> str:
        return object_name(self.job_name, self.submission)

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a kind's own status says about its end: finished for good, with this cause."""

    cause: Cause
    """``none`` for success; for a failure, the cause the object's status alone gives (the pods'
    evidence, when there is some, is more precise and wins)."""
    failed: bool


@runtime_checkable
class Kind(Protocol):
    """One workload kind on the kit. Every method is pure (no I/O) and cheap: called per event."""

    @property
    def name(self) -> str:
        """The backend's name (``spec.backend``), also used in logs and task names."""
        ...

    @property
    def resource(self) -> Resource: ...

    @property
    def capabilities(self) -> Capabilities:
        """What its controller enforces natively and exactly (the plan gives it those rules)."""
        ...

    @property
    def container(self) -> str:
        """The name of the container whose state is the evidence (else a pod's first container)."""
        ...

    @property
    def create_failure_reason(self) -> str:
        """The reason of the Event its controller writes on the object when the API server refuses
        the pods it creates (``FailedCreatePod``, ``FailedCreate``)."""
        ...

    @property
    def projection(self) -> Mask:
        """Every field of ``spec`` and ``status`` the methods below read from an object (its suspend
        field, its terminal conditions, its restart settings): the kit caches an object as this
        plus the metadata it reads itself, never the whole body, so a field read but not declared
        here is absent (tests/unit/test_projection.py compares both on every recorded event)."""
        ...

    def build(self, target: Target, spec: JobSpec, plan: Plan) -> Body:
        """The manifest, created held (it cannot start), metadata from :func:`metadata`. Raise
        :class:`Refused` for a spec that can never run; :class:`~dispatch.BackendError` for a job
        that lacks this backend's options."""
        ...

    def suspended(self, body: Body) -> bool:
        """Held: the spec says suspend, so its controller runs nothing."""
        ...

    def suspend_patch(self, suspend: bool) -> Body:
        """The merge patch (spec part) that holds (True) or releases (False) the object."""
        ...

    def outcome(self, body: Body, last_restart: Cause | None) -> Outcome | None:
        """Finished by its controller for good (its terminal conditions), or None. ``last_restart``:
        the cause of the latest in-place restart seen, for a failure that says only "backoff limit"."""
        ...

    def running(self, body: Body) -> bool:
        """Its status says it runs (the kit also counts a running pod as running)."""
        ...

    def in_place(self, body: Body) -> bool:
        """Built to let its controller restart failed pods itself under a native rule: their
        failures are restarts (counted in ``restarts``), not the end of the object."""
        ...

    def restarts(self, pod: Body) -> int:
        """How many in-place restarts this pod stands for (read only when :meth:`in_place`)."""
        ...

    def object_restarts(self, body: Body) -> int | None:
        """The object's own count of the in-place restarts it made (JobSet's ``status.restarts``),
        when it keeps one; None: the kit sums :meth:`restarts` over the pods it has seen."""
        ...

    def recovers(self, body: Body, cause: Cause) -> bool:
        """Its controller answers a pod that ended with ``cause`` by itself as the native rule says
        (a restart, not the end): only when :meth:`in_place`."""
        ...

    def pod_prefixes(self, body: Body) -> tuple[str, ...]:
        """Name prefixes of its pods, to match Events that outlive them."""
        ...


def object_name(job_name: str, submission: int) -> str:
    return f"{job_name}-{submission}"


def labels(job_name: str, submission: int) -> dict[str, str]:
    return {LABEL_JOB: job_name, LABEL_SUBMISSION: str(submission), LABEL_MANAGED_BY: MANAGED_BY}


def restart_budget(plan: Plan) -> int | None:
    """What is left of the plan's scheduler-enforced restart rule (budget minus firings so far), or
    None when it has none."""
    budgets = [
        rule.left
        for rule in plan.rules
        if rule.enforcer is Enforcer.SCHEDULER and rule.action is Action.RESTART
    ]
    if len(budgets) > 1:  # the capabilities declare one native rule; a plan cannot hold two
        raise BackendError("the plan gives the scheduler more than one restart rule; a kind enforces one")
    return budgets[0] if budgets else None


def metadata(target: Target, *, no_capacity_after: int, budget: int | None) -> Body:
    """The metadata every kit object carries: its name, dispatch's labels (the pods' templates
    carry them too), the thresholds the classification reads back, the finalizer, the owner."""
    annotations = {ANNOTATION_NO_CAPACITY_AFTER: str(no_capacity_after)}
    if budget is not None:
        annotations[ANNOTATION_RESTART_BUDGET] = str(budget)
    meta: Body = {
        "name": target.name,
        "namespace": target.namespace,
        "labels": labels(target.job_name, target.submission),
        "annotations": annotations,
        "finalizers": [OBJECT_FINALIZER],
    }
    if target.owner is not None:
        meta["ownerReferences"] = [dict(target.owner)]
    return meta


def check_env(env: Mapping[str, str], field: str) -> None:
    for key in sorted(env):
        if not ENV_NAME.fullmatch(key):
            raise Refused(
                f"{field}[{key!r}]",
                "Kubernetes refuses this env name for a container (printable ASCII without '=')",
            )


def container(name: str, image: str, spec: JobSpec, env: Mapping[str, str], res: Resources) -> Body:
    """The one container of a training pod: the image, the job's command, env and resources."""
    out: Body = {"name": name, "image": image, "command": list(spec.command)}
    if env:
        out["env"] = [{"name": k, "value": v} for k, v in sorted(env.items())]
    requests: dict[str, str] = {}
    if res.cpu is not None:
        requests["cpu"] = res.cpu
    if res.memory is not None:
        requests["memory"] = res.memory
    limits = dict(requests)
    if res.gpu:
        limits[GPU_RESOURCE] = str(res.gpu)
    resources: Body = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    if resources:
        out["resources"] = resources
    return out


def check_size(body: Body, noun: str) -> Body:
    size = len(json.dumps(body, separators=(",", ":")))
    if size > MAX_OBJECT_BYTES:
        raise Refused(
            "spec",
            f"the {noun} would be {size} bytes, over the API server's limit of about "
            f"{MAX_OBJECT_BYTES} bytes (command and env are copied into each pod template)",
        )
    return body


SPEC_SUSPEND: Final[Mask] = {"spec": {"suspend": True}}
"""What :class:`HeldBySpecSuspend` reads: merge it into the kind's projection."""


class HeldBySpecSuspend:
    """Defaults for a kind held by ``spec.suspend`` (batch Job, JobSet, TrainJob) whose pods are
    named ``<object name>-...``: mix in and define the rest of :class:`Kind` (its projection
    merged with :data:`SPEC_SUSPEND`)."""

    def suspended(self, body: Body) -> bool:
        return bool(body.get("spec", {}).get("suspend"))

    def suspend_patch(self, suspend: bool) -> Body:
        return {"spec": {"suspend": suspend}}

    def pod_prefixes(self, body: Body) -> tuple[str, ...]:
        return (f"{body.get('metadata', {}).get('name', '')}-",)


def failed_exit(pod: Mapping[str, Any], container: str) -> int | None:
    """The exit code of ``container`` when the pod failed by itself with it != 0: not disrupted
    (``DisruptionTarget``), not being deleted. What a Job controller counts as a failure of the
    training process, under ``restartPolicy: Never``; None otherwise."""
    status = pod.get("status", {})
    if status.get("phase") != "Failed" or pod.get("metadata", {}).get("deletionTimestamp"):
        return None
    for condition in status.get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return None
    for state in status.get("containerStatuses") or []:
        if state.get("name") == container:
            code = ((state.get("state") or {}).get("terminated") or {}).get("exitCode")
            return code if isinstance(code, int) and code != 0 else None
    return None
