"""The operator's supervisor: also writes what an observer sees into the DispatchJob, for ``kubectl get``.

The record holds recorded states only (a running job is ``pending``, and the cause of the last
ended run stays until the next one ends); the printer columns read the observed fields instead
(``status.observedState``, ``status.observedCause``), written here from the decision every step
already makes. Only when the supervisor has nothing to do but wait (a write step is followed by
another decision anyway) and only when they changed: an idle job costs no write.

A record write carries the observed fields of the decision that made it (a recovery's authorize
writes ``recovering``/``preempted`` along with the new submission), so the wait at the end of a
recovery finds them unchanged and writes nothing: one status write per recovery fewer.
"""

from __future__ import annotations

import contextlib

from .._api import observed_fields
from .._constants import STATUS_OBSERVED_NOTE
from .._decide import WRITES, Done, Wait
from .._errors import VersionConflict
from .._supervisor import Intent, Supervisor
from .store import KubeRecordStore


def _note(intent: Intent) -> str:
    """The current canonical's note (held outside dispatch, by whom), for ``status.observedNote``."""
    current = intent.record.current
    if current is None or current.canonical is None:
        return ""
    return next((o.note for o in intent.objects if o.id == current.canonical), "")


class ObservingSupervisor(Supervisor):
    """A :class:`~dispatch._supervisor.Supervisor` whose waiting decisions update the observed fields."""

    async def prepare(self, job: str) -> Intent:
        intent = await super().prepare(job)
        decision = intent.decision
        store = self.store
        if isinstance(decision.step, Wait | Done) and isinstance(store, KubeRecordStore):
            note = _note(intent)
            before = store.observed(job).get(STATUS_OBSERVED_NOTE, "")
            # Lost to a concurrent write: that write's watch event wakes the job, which decides again.
            with contextlib.suppress(VersionConflict):
                written = await store.observe(job, decision.state, decision.cause, intent.version, note)
                held = getattr(self.listener, "held", None)
                if written is not None and note and note != before and held is not None:
                    held(job, note)  # once per new holder: an Event says what status now shows
        return intent

    async def perform(self, intent: Intent) -> None:
        store = self.store
        if isinstance(intent.decision.step, WRITES) and isinstance(store, KubeRecordStore):
            decision = intent.decision
            store.observing(intent.record.job, observed_fields(decision.state, decision.cause, _note(intent)))
        await super().perform(intent)
