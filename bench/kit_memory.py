#!/usr/bin/env python3
"""Benchmark: the bytes the workload kit's cache holds per object, pod and job, whole vs projected.

    .venv/bin/python bench/kit_memory.py [--copies 2000] [--kubeconfig PATH] [--json out.json]

Bodies: every recorded state of every object and pod in tests/unit/data/<backend>/ (recorded from
the lab; the recorders drop ``metadata.managedFields``), or, with ``--kubeconfig``, every object of
the kit's kinds and every pod labelled ``app.kubernetes.io/managed-by=dispatch`` on that cluster as
its API server lists them (managedFields included). Read-only: a few LISTs.

Per body: tracemalloc's bytes held by ``copies`` separately parsed copies (each watch event is parsed
anew), whole and as the kit projects it, divided by ``copies``; the same per top-level part
(``metadata.managedFields``, the rest of ``metadata``, ``spec``, ``status``) says where they go.

Per job (recordings): each kind's ``success`` recording replayed through a read-only backend's own
watch handlers up to the moment its pods run, as ``copies`` renamed jobs; the kit's whole state
(tracked objects, their pods, indexes, timers) per job, with the projection and without it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "operator"))

from dispatch._errors import BackendError  # noqa: E402
from dispatch._kubeclient import new_client, request  # noqa: E402
from dispatch._workload import object_shape, project_object, project_pod  # noqa: E402
from dispatch._workload._requests import SELECTOR  # noqa: E402
from tests.support.kit import BACKENDS  # noqa: E402

DATA = REPO / "tests" / "unit" / "data"
Body = dict[str, Any]
KINDS = BACKENDS
"""backend directory -> (kind, backend class, the resource of its objects in the recordings)."""
PARTS = ("managedFields", "metadata", "spec", "status")


def held(make: Callable[[], object], copies: int) -> float:
    """Bytes per result of ``make()`` while ``copies`` of them are kept (the list's slots excluded)."""
    gc.collect()
    start = tracemalloc.get_traced_memory()[0]
    kept = [make() for _ in range(copies)]
    gc.collect()
    end = tracemalloc.get_traced_memory()[0]
    del kept
    return (end - start) / copies


def part(body: Body, name: str) -> object:
    meta = body.get("metadata", {})
    if name == "managedFields":
        return meta.get("managedFields")
    if name == "metadata":
        return {k: v for k, v in meta.items() if k != "managedFields"}
    return body.get(name)


def sizes(texts: list[str], project: Callable[[Body], Body], copies: int) -> dict[str, float]:
    """Mean bytes per body (and per part of it), whole and projected, over ``texts``: every text
    parsed ``copies // len(texts)`` times (at least once)."""
    rounds = max(copies // len(texts), 1)
    out: dict[str, float] = {"json": sum(len(t) for t in texts) / len(texts)}
    for label, keep in (("whole", lambda b: b), ("slim", project)):

        def every(pick: Callable[[Body], object], keep: Callable[[Body], Body] = keep) -> list[object]:
            return [pick(keep(json.loads(t))) for t in texts]

        every(lambda b: b)  # interns its shared strings first: the table's growth is not a body's
        # Less the list slot (8 bytes) that holds each kept body here.
        out[label] = held(lambda: every(lambda b: b), rounds) / len(texts) - 8
        for name in PARTS:
            kept = held(lambda n=name: every(lambda b: part(b, n)), rounds)  # type: ignore[misc]
            out[f"{label}.{name}"] = kept / len(texts) - 8
    return out


def recorded(backend: str) -> tuple[list[str], list[str]]:
    """The JSON texts of every recorded object state and every recorded pod state."""
    resource = KINDS[backend][2]
    objects, pods = [], []
    for path in sorted((DATA / backend).glob("*.json")):
        for event in json.loads(path.read_text())["stream"]:
            if event["type"] == "DELETED":
                continue
            text = json.dumps(event["object"])
            if event["resource"] == resource:
                objects.append(text)
            elif event["resource"] == "pods":
                pods.append(text)
    return objects, pods


def running(backend: str) -> list[tuple[str, str, str]]:
    """The ``success`` recording's (resource, type, JSON) events until just before a pod ends."""
    resource = KINDS[backend][2]
    stream = json.loads((DATA / backend / "success.json").read_text())["stream"]
    out: list[tuple[str, str, str]] = []
    for event in stream:
        if event["resource"] not in (resource, "pods"):
            continue
        if event["resource"] == "pods" and event["object"].get("status", {}).get("phase") in (
            "Succeeded",
            "Failed",
        ):
            break
        out.append((event["resource"], event["type"], json.dumps(event["object"])))
    return out


def renamed(events: list[tuple[str, str, str]], copies: int) -> Iterator[list[tuple[str, str, str]]]:
    job = next(json.loads(t)["metadata"]["labels"]["dispatch.dev/job"] for r, _, t in events if r != "pods")
    for i in range(copies):
        yield [(r, kind, t.replace(f'"{job}', f'"{job}-{i}')) for r, kind, t in events]


async def per_job(backend: str, copies: int, *, slim: bool) -> tuple[float, int]:
    """The kit's bytes per job (and the pods it holds per job) for ``copies`` running jobs."""
    _, make, resource = KINDS[backend]
    events = running(backend)
    gc.collect()
    start = tracemalloc.get_traced_memory()[0]
    kit = make(None, stop_ended=False)
    if not slim:  # the kit as it was: every body cached whole
        kit.cache.project = lambda body: body  # type: ignore[method-assign]
        kit.cache.project_pod = lambda pod: pod  # type: ignore[method-assign]
    kit.watches.tasks = [asyncio.get_running_loop().create_task(asyncio.sleep(3600))]  # no informer
    for job in renamed(events, copies):
        for res, kind, text in job:
            # As the informers hand them on: projected (or not, with the patch above) and packed.
            obj = json.loads(text)
            if res == resource:
                handler, kept = kit.watches.object_changed, kit.cache.packed(obj)
            else:
                handler, kept = kit.watches.pod_changed, kit.cache.packed_pod(obj)
            if kind == "DELETED":
                handler(kept, None)
            else:
                handler(None, kept)
    for jid in sorted({t.job for t in kit.cache.tracked.values() if t.job}):
        await kit.list(jid)  # as the supervisor does: the verdict and the last view are kept
    gc.collect()
    end = tracemalloc.get_traced_memory()[0]
    pods = sum(len(t.pods) for t in kit.cache.tracked.values()) // copies
    await kit.aclose()
    return (end - start) / copies, pods


async def live(kubeconfig: str) -> dict[str, tuple[list[str], list[str]]]:
    """The bodies of that cluster: each kit kind's objects; every dispatch pod under ``pods``."""
    api = await new_client(kubeconfig)
    try:
        found: dict[str, tuple[list[str], list[str]]] = {}
        for backend, (kind, _, _) in KINDS.items():
            try:
                listing = await request(
                    api, "GET", kind.resource.path(None), query={"labelSelector": SELECTOR}
                )
            except BackendError:  # a kind whose CRD this cluster does not serve
                continue
            found[backend] = ([json.dumps(o) for o in listing.get("items") or []], [])
        pods = await request(api, "GET", "/api/v1/pods", query={"labelSelector": SELECTOR})
        found["pods"] = ([], [json.dumps(p) for p in pods.get("items") or []])
        return found
    finally:
        await api.close()


def row(what: str, s: dict[str, float]) -> str:
    parts = " ".join(f"{n}={s[f'whole.{n}']:.0f}" for n in PARTS)
    slim = " ".join(f"{n}={s[f'slim.{n}']:.0f}" for n in PARTS if s[f"slim.{n}"] > 0)
    return (
        f"| {what} | {s['json']:.0f} | {s['whole']:.0f} ({parts}) | {s['slim']:.0f} ({slim}) "
        f"| {s['whole'] / s['slim']:.1f}x |"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=2000)
    parser.add_argument("--kubeconfig", help="measure the bodies of this cluster instead of the recordings")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    tracemalloc.start()
    results: dict[str, Any] = {"load": os.getloadavg()[0], "copies": args.copies}
    sources = await live(args.kubeconfig) if args.kubeconfig else {b: recorded(b) for b in KINDS}
    print("| body | JSON bytes | cached whole, bytes (by part) | cached projected, bytes | ratio |")
    print("|---|---|---|---|---|")
    for backend, (objects, pods) in sources.items():
        kind = KINDS[backend if backend in KINDS else "kubeflow"][0]
        shape = object_shape(kind)
        for what, texts, project in (
            (kind.resource.kind, objects, lambda b, s=shape: project_object(s, b)),
            (f"Pod ({backend})", pods, project_pod),
        ):
            if not texts:
                continue
            s = sizes(texts, project, args.copies)
            results[what] = s
            print(row(f"{what} ({len(texts)} states)", s))
    if not args.kubeconfig:
        print()
        print("| running job, kit state | pods/job | whole, bytes/job | projected, bytes/job | ratio |")
        print("|---|---|---|---|---|")
        for backend in KINDS:
            whole, per = await per_job(backend, args.copies, slim=False)
            slim, _ = await per_job(backend, args.copies, slim=True)
            results[f"job.{backend}"] = {"whole": whole, "slim": slim, "pods": per}
            print(f"| {backend} | {per} | {whole:.0f} | {slim:.0f} | {whole / slim:.1f}x |")
    print(f"\nload average (1 min) at start: {results['load']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
