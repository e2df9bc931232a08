#!/usr/bin/env python3
"""Benchmark: where the live operator's bytes go, per DispatchJob.

    .venv/bin/python bench/operator_memory.py [--jobs 1000] [--frames 16] [--operator-tree DIR]
        [--json out.json] [any other option of bench/operator_scale.py]

The same run as bench/operator_scale.py (its Bench: the lab, kwok nodes that the job pods fill,
the operator started as a user starts it, N DispatchJobs applied with kubectl) up to its restart,
without the later phases: the empty operator, N running jobs, and after a restart. The operator is
started from a tree whose ``operator/`` holds ``dispatch`` (a link to the real package) and
bench/memory_child.py as ``sitecustomize``: tracemalloc starts before the operator imports anything,
and at each RSS reading a snapshot is written from a forked copy of the process (so taking it does
not change the operator's memory). Printed, per job over the empty operator:

- RSS with the jobs running (that process is traced only until the empty operator's snapshot,
  so its RSS is an untraced operator's; the empty RSS is taken less tracemalloc's bookkeeping), and
  after a restart (traced: less tracemalloc's bookkeeping is about what an untraced one has);
- tracemalloc's growth from the empty operator to the restarted one (every job known and decided)
  by file (the innermost frame), by the innermost frame in dispatch's own code
  (which of dispatch's lines made the bytes, whatever library allocated them) and by package;
- the large per-job structures of dispatch's live objects (dicts, sets and lists with many entries,
  followed through their data: the record store's caches, the loop's maps, the kit's caches), by
  their deep size.

- where the heap is, by allocator (``allocator``, in MiB, and the same for the empty operator):
  pymalloc's arenas (objects up to 512 bytes) and the bytes in use in them, and glibc malloc's
  heap (``malloc_arena``), in use (``uordblks``), free (``fordblks``) and mmapped (``hblkhd``):
  what the RSS holds beyond the bytes in use is what the allocators keep free.

``--frames 0`` runs the operator untraced (RSS, structures and allocators only).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.operator_scale import Bench, Operator, load, parser, run  # noqa: E402

DUMP_WAIT = 900.0
"""Seconds to wait for one snapshot (a traced operator with 10,000 jobs holds millions of blocks)."""
TOP = 15


class TracedOperator(Operator):
    """The bench's operator process; each RSS reading also writes a snapshot (memory_child.py)."""

    def __init__(self, base: Operator, frames: int) -> None:
        super().__init__(base.identity, base.work, base.tree, base.no_events)
        self.frames = frames
        self.dumps: list[Path] = []
        self.out = base.work

    def start(self) -> None:
        self.out = self.work / f"memory-{self.starts}"
        self.out.mkdir(exist_ok=True)
        os.environ["DISPATCH_MEMORY_DIR"] = str(self.out)
        os.environ["DISPATCH_MEMORY_FRAMES"] = str(self.frames)
        # The first process is traced only up to its first snapshot (the empty operator): traced,
        # creating the jobs would take several times as long. The restarted one is traced throughout.
        if self.starts == 0:
            os.environ["DISPATCH_MEMORY_TRACE_UNTIL"] = "1"
        else:
            os.environ.pop("DISPATCH_MEMORY_TRACE_UNTIL", None)
        super().start()

    def rss_mib(self) -> float:
        if self.synced() is None:  # once this process has decided every job (traced, that is slow)
            deadline = time.monotonic() + DUMP_WAIT
            while self.synced() is None and time.monotonic() < deadline:
                self.alive()
                time.sleep(0.5)
        rss = super().rss_mib()
        self.dumps.append(self.dump())
        return rss

    def dump(self) -> Path:
        """SIGUSR1, then wait for the snapshot's facts file; returns its path without suffix."""
        assert self.proc is not None
        n = sum(1 for p in self.out.glob("*.json"))
        facts = self.out / f"{n}.json"
        os.kill(self.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + DUMP_WAIT
        while not facts.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no snapshot {facts}")
            time.sleep(0.5)
        return facts.with_suffix("")


def short(filename: str) -> str:
    """``dispatch/_controller/store.py``, ``pydantic/main.py``: the path from the package."""
    parts = Path(filename).parts
    for anchor in ("site-packages", "operator"):
        if anchor in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(anchor) :])
    if "lib" in parts:
        rest = parts[len(parts) - parts[::-1].index("lib") :]
        return "/".join(rest[1:]) if rest and rest[0].startswith("python") else "/".join(rest)
    return filename


def package(filename: str) -> str:
    """The package a file belongs to; dispatch by subpackage (``dispatch/_workload``, ...)."""
    path = short(filename).split("/")
    if path[0] == "dispatch" and len(path) > 2:
        return "/".join(path[:2])
    return path[0].removesuffix(".py") if len(path) == 1 else path[0]


def dispatch_site(trace: tracemalloc.Trace) -> str:
    """The innermost frame in dispatch's own code (``file:line``), else the innermost file's name."""
    frames = list(reversed(trace.traceback))  # a Traceback runs from the oldest frame to the newest
    for frame in frames:
        name = short(frame.filename)
        if name.startswith("dispatch/"):
            return f"{name}:{frame.lineno}"
    return f"(no dispatch frame) {short(frames[0].filename)}" if frames else "?"


def grouped(snapshot: tracemalloc.Snapshot, key: Callable[[tracemalloc.Trace], str]) -> Counter[str]:
    sizes = Counter[str]()
    for trace in snapshot.traces:
        sizes[key(trace)] += trace.size
    return sizes


def growth(after: Counter[str], before: Counter[str], jobs: int) -> list[dict[str, Any]]:
    """The top groups by growth, in KiB per job."""
    diff = {k: after[k] - before.get(k, 0) for k in set(after) | set(before)}
    top = sorted(diff.items(), key=lambda kv: -kv[1])[:TOP]
    return [{"where": k, "kib_per_job": round(v / 1024 / jobs, 2)} for k, v in top]


def by_file(trace: tracemalloc.Trace) -> str:
    return short(trace.traceback[-1].filename)


def by_package(trace: tracemalloc.Trace) -> str:
    return package(trace.traceback[-1].filename)


KEYS: dict[str, Callable[[tracemalloc.Trace], str]] = {
    "by_file": by_file,
    "by_dispatch_site": dispatch_site,
    "by_package": by_package,
}


def analyse(base: Path, at: Path, jobs: int) -> dict[str, Any]:
    """What grew from the empty operator (``base``) to ``at``, per job."""
    facts = json.loads(at.with_suffix(".json").read_text())
    empty = json.loads(base.with_suffix(".json").read_text())
    out: dict[str, Any] = {}
    if at.with_suffix(".snap").exists() and base.with_suffix(".snap").exists():
        before = tracemalloc.Snapshot.load(str(base.with_suffix(".snap")))
        after = tracemalloc.Snapshot.load(str(at.with_suffix(".snap")))
        traced = sum(t.size for t in after.traces) - sum(t.size for t in before.traces)
        out["traced_kib_per_job"] = round(traced / 1024 / jobs, 2)
        for name, key in KEYS.items():
            out[name] = growth(grouped(after, key), grouped(before, key), jobs)
        out["tracemalloc_overhead_mib"] = round(facts["tracemalloc_overhead_bytes"] / 2**20, 1)
        out["tracemalloc_overhead_empty_mib"] = round(empty["tracemalloc_overhead_bytes"] / 2**20, 1)
    if "allocator" in facts:  # bytes in MiB (the arena count as it is), then and for the empty operator
        allocators = (("allocator", facts["allocator"]), ("allocator_empty", empty.get("allocator") or {}))
        for name, stats in allocators:
            out[name] = {k: v if k == "pymalloc_arenas" else round(v / 2**20, 1) for k, v in stats.items()}
    out["structures"] = [
        {**s, "kib_per_job": round(s["bytes"] / 1024 / jobs, 2)}
        for s in facts["structures"]
        if s["bytes"] >= 1024 * jobs / 100  # 0.01 KiB per job or more
    ]
    return out


def tree_for(source: Path, work: Path) -> Path:
    """A tree the operator starts from: ``source``'s package and CRDs, with memory_child.py as
    sitecustomize (imported before the operator's first import)."""
    tree = work / "traced-tree"
    (tree / "operator").mkdir(parents=True)
    (tree / "operator" / "dispatch").symlink_to(source / "operator" / "dispatch")
    (tree / "operator" / "sitecustomize.py").symlink_to(REPO / "bench" / "memory_child.py")
    (tree / "crds").symlink_to(source / "crds")
    stamp = source / "COMMIT"
    if stamp.exists():
        commit = stamp.read_text().strip()
    else:
        git = ["git", "-C", str(source)]
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
        dirty = subprocess.run([*git, "status", "--porcelain", "operator"], capture_output=True, text=True)
        commit = commit.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")
    (tree / "COMMIT").write_text(commit + "\n")
    return tree


class MemoryBench(Bench):
    """Bench's set-up, creation, steady state and restart (``--scale-only``; with ``--mass`` the
    reactions and the mass preemption too), then the analysis."""

    def setup(self) -> None:
        source = Path(self.args.operator_tree).resolve() if self.args.operator_tree else REPO
        self.args.operator_tree = str(tree_for(source, self.work))
        super().setup()
        assert self.operator is not None
        self.operator = TracedOperator(self.operator, self.args.frames)

    async def run(self) -> None:
        await super().run()
        assert isinstance(self.operator, TracedOperator)
        dumps = self.operator.dumps
        self.say("analysing the snapshots")
        memory: dict[str, Any] = {"frames": self.args.frames, "load": load()}
        phases = zip(("running", "after_restart", "after_mass", "after_quiet"), dumps[1:], strict=False)
        for phase, at in phases:
            memory[phase] = analyse(dumps[0], at, self.n)
        if len(dumps) > 3:  # --mass: what the mass preemption added, per preempted job
            memory["mass_over_restart"] = analyse(dumps[2], dumps[3], min(self.args.preempt, self.n))
        empty = json.loads(dumps[0].with_suffix(".json").read_text())
        if "rss" in self.result and "tracemalloc_overhead_bytes" in empty:
            # The empty operator's RSS was read while it was traced; the running one's was not.
            untraced = self.result["rss_empty_mib"] - empty["tracemalloc_overhead_bytes"] / 2**20
            memory["rss_empty_untraced_mib"] = round(untraced, 1)
            running = self.result["rss"]["after_creation_mib"]
            memory["rss_running_per_job_kib"] = round((running - untraced) * 1024 / self.n, 1)
        self.result["memory"] = memory


def main(argv: Sequence[str] | None = None) -> int:
    options = parser()  # operator_scale's options and defaults; the phases after the restart do not run
    options.description = __doc__
    options.add_argument("--frames", type=int, default=16, help="frames per trace (0: no tracing)")
    options.add_argument(
        "--mass",
        action="store_true",
        help="go on through the reactions and the mass preemption: snapshots after it and once quiet too"
        " (after_mass, after_quiet, and mass_over_restart per preempted job)",
    )
    args = options.parse_args(argv)
    if args.jobs % args.slots:
        options.error("--jobs must be a multiple of --slots (every node full)")
    args.no_peer = True
    args.scale_only = not args.mass
    return run(MemoryBench(args))


if __name__ == "__main__":
    raise SystemExit(main())
