"""The ``memory`` backend's declaration: a scheduler in a dict, for the library and the tests."""

from __future__ import annotations

from typing import Any, Final

from ..._model import Capabilities
from ..._registry import BackendInfo, Where

BACKEND: Final[BackendInfo[Any]] = BackendInfo(
    name="memory",
    summary="a scheduler in the process (the embedded default and the core's tests), shaped like another",
    where=Where.LOCAL,
    capabilities=Capabilities(),  # its default shape, slurm; each shape's are that backend's
    open="dispatch._backends.memory._adapter:open_adapter",
)

# The adapter is light (no client), and the root package exports it: the embedded default.
from ._adapter import Env, MemoryBackend, Shape  # noqa: E402

__all__ = ["BACKEND", "Env", "MemoryBackend", "Shape"]
