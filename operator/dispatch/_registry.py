"""The backend registry: the one source of which backends exist and what each needs.

Each backend is a :class:`BackendInfo` declaration named by an entry point of the
``dispatch.adapters`` group (pyproject.toml), so a third-party package registers one the same way.
A declaration is pure data in a light module: the CRD's ``spec.backend`` enum, options fields and
CEL rules, the admission webhook, the kubectl plugin's ``plan``, the metrics' resource labels, the
operator's backend opening and the chart's RBAC all iterate over :func:`registered`, and importing
it loads no Kubernetes, HTTP or kopf client. The adapter itself is imported only when it is opened
(:meth:`BackendInfo.__call__`, :meth:`BackendInfo.open_operator`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from importlib.metadata import entry_points
from typing import Any, Final, Generic, TypeVar

from ._model import Capabilities, JobSpec, OptionsChange, OptionsModel

GROUP: Final = "dispatch.adapters"
"""The entry point group: each name is a backend, each value its declaration (or, for an adapter
registered before the registry existed, a bare ``open_adapter`` callable: usable by
``dispatch.open`` but in no generated list)."""

OptionsT = TypeVar("OptionsT", bound=OptionsModel)


class Where(StrEnum):
    """Where a backend's jobs run, which decides how the operator opens it and what the chart grants."""

    KUBERNETES = "kubernetes"
    """As objects in the operator's own cluster: opened with the operator's API client; the chart
    grants its ``rbac``."""
    EXTERNAL = "external"
    """On a scheduler outside the cluster (Slurm): opened from a configuration file; no RBAC."""
    LOCAL = "local"
    """In the process (the memory backend): a library and test backend, never a ``spec.backend``."""


@dataclass(frozen=True, slots=True)
class PolicyRule:
    """One RBAC rule the operator needs for a backend; ``why`` is written above it in the chart."""

    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str
    cluster_scoped: bool = False
    """A cluster-scoped resource (nodes): granted by a ClusterRole even when the chart grants the
    namespaced rules per watched namespace, where a Role could not grant it."""

    def as_dict(self) -> dict[str, list[str]]:
        return {
            "apiGroups": list(self.api_groups),
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }


@dataclass(frozen=True, slots=True)
class ApiResource:
    """Where a Kubernetes kind's objects live on the API server, declared once in a kit backend's
    declaration: the chart's RBAC rule and the metrics' resource labels are derived from it, and its
    ``_kind`` module builds the workload kit's ``Resource`` from it (the declaration loads no kit)."""

    group: str
    """API group; ``""`` for the core group."""
    version: str
    plural: str
    kind: str


@dataclass(frozen=True, slots=True)
class BackendInfo(Generic[OptionsT]):
    """A backend's declaration: every fact the generated lists need, and where its adapter is."""

    name: str
    """``spec.backend``'s value, the entry point's name and the options field ``spec.<name>``."""
    summary: str
    """One line: what the backend runs its jobs as (the CRD's description, the docs' table)."""
    where: Where
    capabilities: Capabilities
    """What its scheduler enforces natively and exactly, with its default configuration."""
    open: str
    """``module:callable`` of the library's opener: ``callable(config) -> Backend`` (or awaitable)."""
    options: type[OptionsT] | None = None
    """The pydantic model of ``spec.<name>`` (a subclass of ``dispatch._model.OptionsModel``)."""
    change: type[OptionsChange] | None = None
    """The pydantic model of a rule's ``change.<name>``: the fields of its options a firing may
    replace (a subclass of ``dispatch._model.OptionsChange``, each field one of ``options``)."""
    options_required: bool = False
    """A DispatchJob with this backend must carry ``spec.<name>`` (the CRD, webhook and plugin say so)."""
    options_hint: str = ""
    """What the options hold at least, for the refusal when they are missing (``the image, at least``)."""
    open_in_operator: str | None = None
    """``module:callable`` the operator opens a KUBERNETES backend with: ``callable(api, *,
    namespaces)`` (``namespaces`` None for all) -> Backend or awaitable."""
    rbac: tuple[PolicyRule, ...] = ()
    """Exactly what the operator needs for this backend, beyond the DispatchJobs themselves."""
    metric_resources: tuple[str, ...] = ()
    """API resources (plural, ``/subresource``) its adapter requests, counted by name in
    ``dispatch_api_requests_total`` (others are counted as ``other``)."""

    def __post_init__(self) -> None:
        if self.name in JobSpec.model_fields:
            raise ValueError(
                f"backend {self.name!r}: its options field spec.{self.name} is a field of JobSpec"
            )
        if self.change is not None:
            extra = sorted(
                set(self.change.model_fields) - set(self.options.model_fields if self.options else ())
            )
            if extra:
                raise ValueError(f"backend {self.name!r}: its change model's {extra} are none of its options")
        if self.options_required and self.options is None:
            raise ValueError(f"backend {self.name!r}: options_required without an options model")
        if self.where is Where.KUBERNETES and self.open_in_operator is None:
            raise ValueError(f"backend {self.name!r}: a Kubernetes backend needs open_in_operator")

    @property
    def in_spec(self) -> bool:
        """Whether a DispatchJob may name it (``spec.backend``): every backend the operator can run."""
        return self.where is not Where.LOCAL

    def __call__(self, config: Mapping[str, object] | None = None) -> Any:
        """Open the adapter for the library (``dispatch.open``): the entry point's callable contract."""
        opener: Callable[[Mapping[str, object] | None], Any] = _resolve(self.open)
        return opener(config)

    async def open_operator(self, api: Any, *, namespaces: Sequence[str] | None) -> Any:
        """Open the adapter inside the operator, with its API client (KUBERNETES backends)."""
        if self.open_in_operator is None:
            raise ValueError(f"backend {self.name!r} is not opened with the operator's API client")
        backend = _resolve(self.open_in_operator)(api, namespaces=namespaces)
        if inspect.isawaitable(backend):
            backend = await backend
        prepare = getattr(backend, "prepare", None)
        if prepare is not None:  # what it checks once on the cluster (the kit: whether Kueue is there)
            await prepare()
        return backend

    def options_of(self, spec: JobSpec) -> OptionsT | None:
        """This backend's options in ``spec`` (``spec.options[name]``), checked to be its model's."""
        value: Any = spec.options.get(self.name)
        if value is None:
            return None
        if self.options is not None and not isinstance(value, self.options):
            raise TypeError(
                f"spec options of {self.name!r} are a {type(value).__name__}, not {self.options.__name__}"
            )
        result: OptionsT = value
        return result


def _resolve(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


@functools.cache
def registered() -> Mapping[str, BackendInfo[Any]]:
    """Every declared backend, by name, sorted by name (loaded once per process)."""
    found: dict[str, BackendInfo[Any]] = {}
    for ep in entry_points(group=GROUP):
        try:
            value = ep.load()
        except Exception as error:  # a broken third-party package must say which entry point it is
            raise ImportError(f"entry point {GROUP}:{ep.name} = {ep.value} does not load: {error}") from error
        if not isinstance(value, BackendInfo):
            continue  # a bare opener: dispatch.open finds it, but it declares nothing
        if value.name != ep.name:
            raise ValueError(f"entry point {GROUP}:{ep.name} declares a backend named {value.name!r}")
        found[ep.name] = value
    return dict(sorted(found.items()))


def get(name: str) -> BackendInfo[Any] | None:
    return registered().get(name)


def spec_backends() -> tuple[BackendInfo[Any], ...]:
    """The backends a DispatchJob may name, sorted by name (the CRD's enum)."""
    return tuple(b for b in registered().values() if b.in_spec)


def kubernetes_backends() -> tuple[BackendInfo[Any], ...]:
    """The backends whose jobs are objects in the operator's cluster (what the chart may grant)."""
    return tuple(b for b in registered().values() if b.where is Where.KUBERNETES)


def option_fields() -> dict[str, BackendInfo[Any]]:
    """``spec.<field>`` -> the backend whose options it holds, for every backend with options."""
    return {b.name: b for b in registered().values() if b.options is not None}


def change_fields() -> dict[str, BackendInfo[Any]]:
    """``change.<field>`` of a rule -> the backend whose changes it holds, for every backend with some."""
    return {b.name: b for b in registered().values() if b.change is not None}


Opener = Callable[..., Any | Awaitable[Any]]


def opener(name: str) -> Callable[[Mapping[str, object] | None], Any] | None:
    """What ``dispatch.open(name)`` calls: the declaration, else a bare callable registered as ``name``."""
    info = registered().get(name)
    if info is not None:
        return info
    for ep in entry_points(group=GROUP):
        if ep.name == name:
            found: Callable[[Mapping[str, object] | None], Any] = ep.load()
            return found
    return None


def names() -> list[str]:
    """Every name in the entry point group, declared or not (for an error listing what exists)."""
    return sorted({ep.name for ep in entry_points(group=GROUP)})
