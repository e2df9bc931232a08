"""Backend declarations (:class:`dispatch._registry.BackendInfo`), one light module per backend.

Each module is named by an entry point of ``dispatch.adapters``; importing one loads pydantic and
the core only, never the adapter's clients (a unit test checks it).
"""

from ._kit import (
    Affinity,
    ConfigMapSource,
    EmptyDirSource,
    EnvFromReference,
    EnvFromSource,
    EnvValueSource,
    KeyReference,
    LocalObjectReference,
    PersistentVolumeClaimSource,
    SecretSource,
    Toleration,
    Volume,
    VolumeMount,
)

__all__ = [
    "Affinity",
    "ConfigMapSource",
    "EmptyDirSource",
    "EnvFromReference",
    "EnvFromSource",
    "EnvValueSource",
    "KeyReference",
    "LocalObjectReference",
    "PersistentVolumeClaimSource",
    "SecretSource",
    "Toleration",
    "Volume",
    "VolumeMount",
]
"""The models of the pod options (the kit's), public in ``dispatch``."""
