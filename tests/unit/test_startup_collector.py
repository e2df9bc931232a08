"""The supervision loop's start pauses the cyclic garbage collector until every listed job is
decided (dispatch._controller.loop.StartupCollector): a restart's decoded lists are not traversed again
and again while they grow. The figures are in BENCHMARKS.md; here only the states: paused, then
one collection and what survives it frozen, at most ``longest`` after the pause, and a collector
disabled by someone else left alone."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from dispatch._controller.loop import StartupCollector


class Node:
    other: object = None


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    yield
    gc.enable()
    gc.unfreeze()


async def test_paused_until_resumed_then_survivors_are_frozen() -> None:
    collector = StartupCollector()
    collector.pause()
    assert not gc.isenabled()
    assert collector.paused
    cycle = Node()
    cycle.other = cycle
    gone = weakref.ref(cycle)
    del cycle
    for _ in range(10_000):  # allocations that would have set a running collector off
        Node()
    assert gone() is not None  # garbage the paused collector leaves in place
    frozen = gc.get_freeze_count()
    collector.resume()
    assert gc.isenabled()
    assert not collector.paused
    assert gone() is None  # the one collection took it
    assert gc.get_freeze_count() > frozen
    collector.resume()  # once only
    assert gc.isenabled()


async def test_resumed_at_the_latest_after_longest() -> None:
    collector = StartupCollector(longest=0.01)
    collector.pause()
    assert not gc.isenabled()
    for _ in range(200):
        await asyncio.sleep(0.01)
        if gc.isenabled():
            break
    assert gc.isenabled()
    assert not collector.paused


async def test_a_collector_disabled_by_someone_else_stays_disabled() -> None:
    gc.disable()
    collector = StartupCollector()
    collector.pause()
    assert not collector.paused
    collector.resume()
    assert not gc.isenabled()
