#!/usr/bin/env python3
"""Benchmark: what the record store keeps of a settled DispatchJob, and what its turn at a start costs.

    .venv/bin/python bench/settled_views.py [--jobs 20000]

A job is run to success on the memory backend, its status written as the operator writes it
(``record_write``), and ``--jobs`` DispatchJobs with that status are read by the store's
projection both ways, side by side: the whole view (``view_of(..., slim=False)``, what every job
kept before a settled job was kept slim) with its record parsed (what a settled job's turn did at a
start), and the slim view (nothing parsed). Bytes per view are tracemalloc's (the views and the dict
that holds them); times are the median of ``--repeat`` passes without tracemalloc.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "operator"))

from dispatch import Actor, ActorKind, JobSpec, MemoryBackend, Phase, Record, Shape, compose  # noqa: E402
from dispatch._controller.store import JobView, view_of  # noqa: E402
from dispatch._dispatchjob import record_from, record_write  # noqa: E402
from dispatch._kubeclient import Packer  # noqa: E402


async def settled_record() -> Record:
    backend = MemoryBackend(Shape.SLURM, auto_run=True)
    cluster = compose(backend)
    plan = await cluster.operator.submit(
        JobSpec(name="done", command=("train",)), Actor(kind=ActorKind.HUMAN, id="ada"), supervised=True
    )
    changed = asyncio.Event()
    backend.subscribe(plan.job, changed.set)
    run = asyncio.create_task(cluster.supervisor().run(plan.job))
    while True:
        changed.clear()
        views = await backend.list(plan.job)
        if views and views[0].phase is Phase.RUNNING:
            break
        await changed.wait()
    backend.env.complete(views[0].id)
    return await run


def bodies(record: Record, n: int) -> list[bytes]:
    now = datetime.now(UTC)
    status = record_write(record, previous=[], generation=1, now=now, observed={})
    out = []
    for i in range(n):
        body = {
            "apiVersion": "dispatch.dev/v1alpha1",
            "kind": "DispatchJob",
            "metadata": {
                "name": f"settled-{i:05d}",
                "namespace": "bench",
                "uid": f"5f0c{i:08d}-2b4e-4c55-9a43-1d2e3f4a5b6c",
                "resourceVersion": str(100000 + i),
                "generation": 1,
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "finalizers": ["dispatch.dev/finalizer"],
                "annotations": {"dispatch.dev/submitted-by": "human:ada"},
            },
            "spec": {"backend": "slurm", "command": ["train"], "slurm": {"partition": "batch"}},
            "status": status,
        }
        out.append(json.dumps(body).encode())
    return out


def kept_bytes(raw: list[bytes], project: Callable[[dict[str, Any]], JobView]) -> float:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    views = {i: project(json.loads(r)) for i, r in enumerate(raw)}
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del views
    return (after - before) / len(raw)


def turn_seconds(raw: list[bytes], project: Callable[[dict[str, Any]], JobView], parse: bool) -> float:
    decoded = [json.loads(r) for r in raw]
    t0 = time.perf_counter()
    for body in decoded:
        view = project(body)
        if parse and view.text is not None:
            record_from(view.text.body())
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    raw = bodies(asyncio.run(settled_record()), args.jobs)
    pack = Packer()
    whole: Callable[[dict[str, Any]], JobView] = lambda b: view_of(b, pack=pack, slim=False)  # noqa: E731
    slim: Callable[[dict[str, Any]], JobView] = lambda b: view_of(b, pack=pack)  # noqa: E731
    result: dict[str, Any] = {"jobs": args.jobs, "body_bytes": len(raw[0]), "load": os.getloadavg()[0]}
    for name, project, parse in (("whole_and_parsed", whole, True), ("slim", slim, False)):
        seconds = [turn_seconds(raw, project, parse) for _ in range(args.repeat)]
        result[name] = {
            "bytes_per_view": round(kept_bytes(raw, project)),
            "us_per_job": round(statistics.median(seconds) / args.jobs * 1e6, 1),
        }
    result["load_after"] = os.getloadavg()[0]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
