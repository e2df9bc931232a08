"""Opening a kit backend from the library's config mapping (``dispatch.open(name, config)``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .._config import flag
from ._backend import WorkloadBackend

B = TypeVar("B", bound=WorkloadBackend)

KEYS = frozenset({"kubeconfig", "context", "namespaces", "stop_ended", "owner"})


async def open_workload(name: str, make: Callable[..., B], config: Mapping[str, object] | None) -> B:
    """Config: ``kubeconfig`` (path; default $KUBECONFIG, ~/.kube/config, else in-cluster),
    ``context``, ``namespaces`` (list; default all), ``stop_ended`` (default true), ``owner``
    (``dispatchjob``, the default: each object is owned by its DispatchJob; ``none``: no owner, for
    a cluster without the DispatchJob CRD)."""
    from .._kubeclient import new_client

    config = dict(config or {})
    unknown = set(config) - KEYS
    if unknown:
        raise ValueError(f"{name} adapter: unknown config keys {sorted(unknown)}")
    namespaces = config.get("namespaces")
    if namespaces is not None and not (
        isinstance(namespaces, list | tuple) and all(isinstance(n, str) for n in namespaces)
    ):
        raise ValueError(f"{name} adapter: namespaces must be a list of namespace names")
    owner = config.get("owner", "dispatchjob")
    if owner not in ("dispatchjob", "none"):
        raise ValueError(f"{name} adapter: owner must be 'dispatchjob' or 'none', not {owner!r}")
    kubeconfig, context = config.get("kubeconfig"), config.get("context")
    api = await new_client(
        str(kubeconfig) if kubeconfig is not None else None,
        context=str(context) if context is not None else None,
    )
    extra: dict[str, Any] = {"owner": None} if owner == "none" else {}
    backend = make(
        api,
        namespaces=list(namespaces) if namespaces is not None else None,
        stop_ended=flag(name, config, "stop_ended", True),  # "false" from YAML is false
        owns_api=True,
        **extra,
    )
    await backend.prepare()  # is Kueue there (spec.queue)?
    return backend
