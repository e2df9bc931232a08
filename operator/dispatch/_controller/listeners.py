"""Supervisor listeners for the operator: a fan-out that tells several and never lets one fail a step."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from .._decide import Step
from .._model import Record
from .._supervisor import Listener

log = logging.getLogger("dispatch.listeners")


class Fanout:
    """A :class:`~dispatch._supervisor.Listener` calling each of ``listeners`` in turn.

    An error in one listener is logged and swallowed: events and metrics must never stop the
    supervisor or keep the others from being told.
    """

    def __init__(self, listeners: Iterable[Listener] = ()) -> None:
        self.listeners: list[Listener] = list(listeners)

    def add(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def stepped(self, job: str, step: Step, before: Record, after: Record | None) -> None:
        for listener in self.listeners:
            try:
                listener.stepped(job, step, before, after)
            except Exception:
                log.exception("listener %r failed on a step of job %s", listener, job)

    def held(self, job: str, note: str) -> None:
        """The job's current object is held outside dispatch (``note`` says by whom): tell those
        listeners that care (the EventRecorder); it is not part of the core's Listener protocol."""
        for listener in self.listeners:
            told = getattr(listener, "held", None)
            if told is None:
                continue
            try:
                told(job, note)
            except Exception:
                log.exception("listener %r failed on a hold of job %s", listener, job)

    def conflicted(self, job: str) -> None:
        for listener in self.listeners:
            try:
                listener.conflicted(job)
            except Exception:
                log.exception("listener %r failed on a conflict of job %s", listener, job)

    def errored(self, job: str, step: Step, error: Exception) -> None:
        for listener in self.listeners:
            try:
                listener.errored(job, step, error)
            except Exception:
                log.exception("listener %r failed on an error of job %s", listener, job)
