"""Who is told that a job's objects may have changed, now or at a time no event announces.

Each watch event wakes the subscribers of the job it belongs to (or, for a job nobody subscribed
to, whoever oversees the others), so the path from a change to the supervisor's next decision never
polls. The timers stand in for the events that never come (a verdict's due time, a node to look up
again); the background tasks are the kit's own work started from a watch callback.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

from .._protocols import Others, Unsubscribe, Wake


class Wakes:
    """The subscribers of each job, the timers that wake them later, and the background tasks."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.subscribers: dict[str, list[Wake]] = {}
        self.others = Others()  # subscribe_others: the jobs without a subscriber
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self.background: set[asyncio.Task[None]] = set()

    def subscribe(self, job: str, wake: Wake) -> Unsubscribe:
        self.subscribers.setdefault(job, []).append(wake)

        def unsubscribe() -> None:
            wakes = self.subscribers.get(job)
            if wakes is not None:
                with contextlib.suppress(ValueError):
                    wakes.remove(wake)
                if not wakes:
                    del self.subscribers[job]

        return unsubscribe

    def supervised(self, job: str) -> bool:
        """Someone in this process supervises ``job`` (a standby operator supervises nothing)."""
        return bool(self.subscribers.get(job))

    def wake(self, job: str | None) -> None:
        if job is None:
            return
        wakes = self.subscribers.get(job)
        for wake in list(wakes) if wakes else ():
            wake()
        if not wakes:
            for other in self.others:
                other(job)

    def wake_at(self, key: str, job: str, at: float) -> None:
        """Wake ``job`` at wall-clock time ``at`` (a threshold no event will announce)."""
        if key in self.timers:
            return
        self.later(key, max(at - self.clock(), 0.0) + 0.05, lambda: self.wake(job))

    def later(self, key: str, delay: float, fire: Callable[[], None]) -> None:
        """Call ``fire`` in ``delay`` seconds, once per ``key`` while one is pending."""
        if key in self.timers:
            return

        def timer() -> None:
            self.timers.pop(key, None)
            fire()

        self.timers[key] = asyncio.get_running_loop().call_later(delay, timer)

    def cancel(self, key: str) -> None:
        timer = self.timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro, name=name)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task

    def close(self) -> None:
        """Cancel the timers and forget the subscribers (the tasks are the backend's to await)."""
        for handle in self.timers.values():
            handle.cancel()
        self.timers.clear()
        self.subscribers.clear()
        self.others.clear()
