#!/usr/bin/env python3
"""Benchmark: the operator's CPU per listed body after a restart, for source trees side by side.

    .venv/bin/python bench/list_cost.py [--rounds 7] [--json out.json] TREE [TREE ...]

A restart lists every DispatchJob, PyTorchJob and pod (bench/operator_scale.py measures the whole;
this splits its CPU). For each tree (a ``git archive`` of a commit, or ``.``), in its own
interpreter, one after another and again for ``--rounds`` rounds (so the trees share the machine's
load), the process time per body of:

- ``decode``: one list page as the informer reads it (``json.loads``; trees with
  ``_kind.reader``: into the projections, each object only as far as its shape reaches);
- ``compacted``: the informer's projection of the page as it keeps it (``_informer.compacted``;
  trees with ``_informer.Packed``: each projection packed, by one ``Packer`` per kind where the
  tree has it);
- ``handler``: the kit's handler's projection of what the informer kept (0 for trees whose
  informer hands its projection on);
- ``record``: one DispatchJob's view made and its record parsed as the store does: for older trees
  ``compact(record_from(body))``, every record kept (the shared parts live as long as a record
  holds them); for trees with ``view_of``, ``view_of(body)`` (its record's text kept) and the
  record parsed from that text, not kept; trees with ``store.read_dispatchjobs`` decode the
  DispatchJob's watch event with it first.

Bodies: every recorded PyTorchJob and pod state in tests/unit/data/kubeflow/ (recorded from the lab),
as pages of 100, and the DispatchJob in bench/data/dispatchjob.json (read with kubectl from
bench/operator_scale.py's lab).
Medians over the rounds, the machine's load before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "unit" / "data"


def bodies() -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {"pods": [], "pytorchjobs": []}
    for path in sorted((DATA / "kubeflow").glob("*.json")):
        for event in json.loads(path.read_text())["stream"]:
            if event["resource"] in out:
                out[event["resource"]].append(event["object"])
    return out


def measure(tree: Path) -> dict[str, float]:
    """In a child interpreter: the tree's own code on the same bodies."""
    sys.path.insert(0, str(tree / "operator"))
    import gc

    from dispatch._backends.kubeflow._adapter import PYTORCHJOB
    from dispatch._controller import store
    from dispatch._dispatchjob import record_from
    from dispatch._kubeclient import _informer
    from dispatch._workload import POD, project, project_object, project_pod

    mask_reader: Any = None
    try:  # where the kit keeps its masks in their own modules
        from dispatch._workload._kept import object_shape
        from dispatch._workload._mask import reader as mask_reader
    except ImportError:
        from dispatch._workload._classify import object_shape  # type: ignore[attr-defined,no-redef]

    handler_projects = (
        "new = self._project(new)"
        in (tree / "operator" / "dispatch" / "_workload" / "_backend.py").read_text()
    )
    packed = getattr(_informer, "Packed", None)
    shape = object_shape(PYTORCHJOB)
    from dispatch._workload import _kind

    # trees with it decode a page into projections
    reader: Any = mask_reader or getattr(_kind, "reader", None)
    gc.disable()  # as during a restart (StartupCollector)
    out: dict[str, float] = {}
    recorded = bodies()
    for name, items, proj, again, kept_shape in (
        ("pod", recorded["pods"], project_pod, lambda b: project(b, POD), POD),
        (
            "ptj",
            recorded["pytorchjobs"],
            lambda b: project_object(shape, b),
            lambda b: project_object(shape, b),
            shape,
        ),
    ):
        decode = reader(kept_shape) if reader is not None else json.loads
        pages = [json.dumps({"items": items[i : i + 100]}).encode() for i in range(0, len(items), 100)]
        # As the kit packs: one Packer per kind (its first text the sample), or Packed alone before.
        packer: Any = getattr(_informer, "Packer", None)
        pack_one: Any = packer() if packer is not None else packed
        n, dec, comp, hand = len(items), 0.0, 0.0, 0.0
        for _ in range(5):
            for raw in pages:
                start = time.process_time()
                page = decode(raw)
                dec += time.process_time() - start
                page_items = page["items"]
                del page
                start = time.process_time()
                if pack_one is not None:  # each projection packed as it is made
                    kept = [pack_one(proj(item)) for item in page_items]
                else:
                    kept = _informer.compacted(proj, page_items)
                comp += time.process_time() - start
                if handler_projects:
                    start = time.process_time()
                    for body in kept:
                        again(body)
                    hand += time.process_time() - start
        out[f"{name}_decode_us"] = dec / n / 5 * 1e6
        out[f"{name}_compacted_us"] = comp / n / 5 * 1e6
        out[f"{name}_handler_us"] = hand / n / 5 * 1e6
    dispatchjob = json.loads((REPO / "bench" / "data" / "dispatchjob.json").read_text())
    read_dispatchjobs: Any = getattr(store, "read_dispatchjobs", None)  # as the watch reads it
    jobs: list[Any] = []  # what the store keeps of every job
    compact = getattr(store, "compact", None)
    packer = getattr(_informer, "Packer", None)
    trees_store: Any = store  # its names differ from tree to tree
    pack = (trees_store.utcnow, packer()) if packer is not None else ()  # as the store packs: one sample
    raw_job = json.dumps({"type": "ADDED", "object": dispatchjob}).encode()
    start = time.process_time()
    for _ in range(500):
        if read_dispatchjobs is not None:
            dispatchjob = read_dispatchjobs(raw_job)["object"]
        if compact is not None:  # the record parsed once per version, compacted and kept
            jobs.append(compact(record_from(dispatchjob)))
        else:  # the view's text kept (packed, later), the record parsed from it when a turn needs it
            view = trees_store.view_of(dispatchjob, *pack)
            jobs.append(view)
            text: Any = view.text
            record_from(text.body() if hasattr(text, "body") else json.loads(text or "{}"))
    out["record_us"] = (time.process_time() - start) / 500 * 1e6
    return out


def load() -> float:
    return round(os.getloadavg()[0], 2)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.trees[0].resolve())))
        return 0
    runs: dict[str, list[dict[str, float]]] = {str(t): [] for t in args.trees}
    before = load()
    for _ in range(args.rounds):
        for tree in args.trees:
            child = [sys.executable, __file__, "--child", str(tree)]
            runs[str(tree)].append(
                json.loads(subprocess.run(child, capture_output=True, text=True, check=True).stdout)
            )
    result: dict[str, Any] = {"load_before": before, "load_after": load(), "rounds": args.rounds, "trees": {}}
    for tree, samples in runs.items():
        medians = {k: round(statistics.median(s[k] for s in samples), 1) for k in samples[0]}
        medians["per_job_us"] = round(
            sum(medians[k] for k in medians if k.startswith(("pod_", "ptj_"))) + medians["record_us"], 1
        )
        result["trees"][tree] = medians
    first = result["trees"][str(args.trees[0])]["per_job_us"]
    for medians in result["trees"].values():
        medians["ratio_to_first"] = round(medians["per_job_us"] / first, 2)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
