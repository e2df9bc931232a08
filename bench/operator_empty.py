#!/usr/bin/env python3
"""Benchmark: the empty operator's RSS once its first sync is done (the floor under every per-job figure).

    .venv/bin/python bench/operator_empty.py [--operator-tree DIR] [--runs 1]

bench/operator_scale.py's lab and operator (started as a user starts it: ``python -m dispatch._controller``
under its own identity, metrics on), with no DispatchJob and no node: VmRSS is read once the
operator has logged that every job (none) is known and decided, its requests have gone quiet and a
few seconds more have passed. ``--operator-tree`` runs another tree (a ``git archive`` of an older
commit, say) against the same lab set-up, so two commits compare under the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.operator_scale import Bench, load, parser  # noqa: E402

SYNC_WAIT = 300.0


async def once(argv: list[str]) -> float:
    args = parser().parse_args(["--jobs", "0", "--no-peer", "--no-mass", *argv])
    bench = Bench(args)

    def no_nodes(prefix: str, count: int, *, taint: str = "") -> list[str]:
        return []  # no job, no node (the bench's kubectl create of an empty list fails)

    bench.add_nodes = no_nodes  # type: ignore[method-assign]
    try:
        bench.setup()
        op = bench.operator
        assert op is not None
        op.start()
        t0 = time.monotonic()
        while "known and decided" not in op.log.read_text():
            op.alive()
            if time.monotonic() - t0 > SYNC_WAIT:
                raise RuntimeError(f"the operator never synced; log {op.log}")
            await asyncio.sleep(0.5)
        await asyncio.sleep(3)
        await bench.quiet(2)
        rss = op.rss_mib()
        print(
            f"tree {bench.result['operator_tree']} commit {bench.result['operator_commit']}: "
            f"empty operator RSS {rss} MiB [load {load()}]",
            flush=True,
        )
        return rss
    finally:
        if bench.operator is not None:
            bench.operator.stop()
        bench.lab.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--operator-tree", help="run the operator from this source tree (default: this one)")
    p.add_argument("--runs", type=int, default=1)
    args = p.parse_args()
    extra = [f"--operator-tree={args.operator_tree}"] if args.operator_tree else []
    for _ in range(args.runs):
        asyncio.run(once(extra))


if __name__ == "__main__":
    main()
