"""The operator side of bench/operator_memory.py: imported as ``sitecustomize`` by the operator process.

bench/operator_memory.py links this file as ``sitecustomize.py`` into the tree the operator is
started from, so it runs before the operator starts: it imports the operator's modules (untraced:
they are the same in every snapshot), then starts tracing, so every byte the running operator
allocates is attributed; SIGUSR1 writes a snapshot. The snapshot is taken in a forked
child, so the operator's own memory (its RSS, measured beside it) is not disturbed by it.

Environment: ``DISPATCH_MEMORY_FRAMES`` (frames per trace, 0 = no tracing), ``DISPATCH_MEMORY_DIR``
(where snapshot ``<n>.snap`` and its structures ``<n>.json`` go, n = 0, 1, ... per SIGUSR1),
``DISPATCH_MEMORY_TRACE_UNTIL`` (stop tracing after that many snapshots: tracing slows the operator
several times over, too much for creating a thousand jobs on a loaded machine).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import enum
import gc
import importlib
import json
import os
import re
import signal
import sys
import tempfile
import tracemalloc
from pathlib import Path
from types import FrameType
from typing import Any

FRAMES = int(os.environ.get("DISPATCH_MEMORY_FRAMES", "0"))
OUT = Path(os.environ.get("DISPATCH_MEMORY_DIR", "."))
UNTIL = (
    int(os.environ["DISPATCH_MEMORY_TRACE_UNTIL"]) if "DISPATCH_MEMORY_TRACE_UNTIL" in os.environ else None
)
LEAVES = (str, bytes, int, float, bool, type(None))
CONTAINERS = (dict, list, tuple, set, frozenset)
LARGE = 50
"""A dict, set or list attribute of a dispatch object with at least this many entries is per-job state."""


def _model(obj: object) -> bool:
    """Data worth following: pydantic models and dataclass instances (not enums: shared singletons)."""
    if isinstance(obj, enum.Enum):
        return False
    return hasattr(type(obj), "model_fields") or (dataclasses.is_dataclass(obj) and not isinstance(obj, type))


def deep_size(root: object, seen: set[int]) -> int:
    """Bytes of ``root`` and of the data it holds (containers, strings, numbers, models), each object
    once across ``seen``; functions, tasks, clients and other objects are not followed."""
    total, stack = 0, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, LEAVES):
            continue
        if isinstance(obj, CONTAINERS):
            stack.extend(gc.get_referents(obj))
        elif _model(obj):
            stack.extend(r for r in gc.get_referents(obj) if not isinstance(r, type))
    return total


def structures() -> list[dict[str, Any]]:
    """Every large dict/set/list attribute of every live object of a dispatch class, with its bytes."""
    out: list[dict[str, Any]] = []
    seen: set[int] = set()
    for obj in gc.get_objects():
        cls = type(obj)
        module = getattr(cls, "__module__", None)
        if not isinstance(module, str) or not module.startswith("dispatch.") or isinstance(obj, type):
            continue
        names = list(getattr(obj, "__dict__", {}) or ()) + list(getattr(cls, "__slots__", ()) or ())
        for name in names:
            try:
                value = getattr(obj, name, None)
            except Exception:  # a property that cannot answer here
                continue
            if isinstance(value, dict | set | list) and len(value) >= LARGE:
                where = f"{module}.{cls.__qualname__}.{name}"
                out.append({"where": where, "entries": len(value), "bytes": deep_size(value, seen)})
    return sorted(out, key=lambda s: -int(s["bytes"]))


PYMALLOC = {
    "arenas": r"# arenas allocated current\s*=\s*([\d,]+)",
    "allocated_blocks_bytes": r"# bytes in allocated blocks\s*=\s*([\d,]+)",
    "available_blocks_bytes": r"# bytes in available blocks\s*=\s*([\d,]+)",
    "unused_pools_bytes": r"unused pools \* \d+ bytes\s*=\s*([\d,]+)",
    "arenas_bytes": r"arenas \* \d+ bytes/arena\s*=\s*([\d,]+)",
}
"""What is read of ``sys._debugmallocstats()`` (the first match of each)."""
MALLINFO2 = (
    "arena",
    "ordblks",
    "smblks",
    "hblks",
    "hblkhd",
    "usmblks",
    "fsmblks",
    "uordblks",
    "fordblks",
    "keepcost",
)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in MALLINFO2]


def allocator() -> dict[str, int]:
    """Where the process's heap is, by allocator: pymalloc's arenas (objects of up to 512 bytes;
    ``sys._debugmallocstats``, which writes to the C stderr) and glibc's malloc (everything larger:
    ``mallinfo2``: ``arena`` bytes from the heap, ``uordblks`` of them in use, ``fordblks`` free,
    ``hblkhd`` in mmapped blocks). The RSS beyond what is in use in both is what they keep free."""
    out: dict[str, int] = {}
    with tempfile.TemporaryFile() as stats:
        saved = os.dup(2)
        sys.stderr.flush()
        os.dup2(stats.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        stats.seek(0)
        text = stats.read().decode(errors="replace")
    for key, pattern in PYMALLOC.items():
        found = re.search(pattern, text)
        if found is not None:
            out[f"pymalloc_{key}"] = int(found.group(1).replace(",", ""))
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        info = libc.mallinfo2()
        for name in ("arena", "uordblks", "fordblks", "hblkhd"):
            out[f"malloc_{name}"] = int(getattr(info, name))
    return out


def _dump(count: list[int]) -> None:
    n = count[0]
    count[0] += 1
    with contextlib.suppress(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # the previous snapshot's child
    if os.fork() != 0:
        if UNTIL is not None and count[0] >= UNTIL:
            tracemalloc.stop()  # from here on the operator runs at full speed (and without the traces)
        return
    try:  # the child: the operator's memory as it was at the fork
        facts: dict[str, Any] = {}
        try:  # first: before this child allocates anything
            facts["allocator"] = allocator()
        except Exception as error:
            facts["allocator_error"] = repr(error)
        gc.collect()
        try:
            facts["structures"] = structures()
        except Exception as error:  # say so in the facts rather than leave the bench waiting
            facts["structures"], facts["error"] = [], repr(error)
        if tracemalloc.is_tracing():
            facts["tracemalloc_overhead_bytes"] = tracemalloc.get_tracemalloc_memory()
            tracemalloc.take_snapshot().dump(str(OUT / f"{n}.snap"))
        (OUT / f"{n}.json.part").write_text(json.dumps(facts))
        (OUT / f"{n}.json.part").rename(OUT / f"{n}.json")
    finally:
        os._exit(0)


PRELOAD = (
    "dispatch._controller.main",
    "dispatch._controller.events",
    "dispatch._workload",
    "dispatch._backends.kubeflow._adapter",
    "kopf",
)
"""Imported before tracing starts: the modules are the same in every snapshot, and importing them
traced (kubernetes_asyncio's generated client above all) takes minutes on a loaded machine."""


def install() -> None:
    if FRAMES > 0:
        for name in PRELOAD:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
        tracemalloc.start(FRAMES)
    count = [0]

    def on_signal(signum: int, frame: FrameType | None) -> None:
        _dump(count)

    signal.signal(signal.SIGUSR1, on_signal)


if "DISPATCH_MEMORY_DIR" in os.environ:
    install()
