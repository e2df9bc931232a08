"""The operator's supervisor: also writes what an observer sees into the DispatchJob, for ``kubectl get``.

The record holds recorded states only (a running job is ``pending``, and the cause of the last
ended run stays until the next one ends); the printer columns read the observed fields instead
(``status.observedState``, ``status.observedCause``), written here from the decision every step
already makes. Only when the supervisor has nothing to do but wait (a write step is followed by
another decision anyway) and only when they changed: an idle job costs no write.

A record write carries the observed fields of the decision that made it (a recovery's authorize
writes ``recovering``/``preempted`` along with the new submission: :meth:`ObservingSupervisor.write`
passes them to the store's ``put``), so the wait at the end of a recovery finds them unchanged and
writes nothing: one status write per recovery fewer.

``status.cost`` (what recovery cost: :mod:`dispatch._cost`) goes with the writes there are anyway: a
failure's end is a record write, and the next submission beginning to run changes the observed
state; so it costs no write of its own.

``status.observedNote`` says why the current object does not run: held outside dispatch (with a
Warning Event, once per holder), or its pods unschedulable (the kit's ``waiting``: no Event of
dispatch's own); while a rule's backoff runs, when the next submission is due. A write that
would change the note alone waits while recoveries wait for a worker
(:attr:`ObservingSupervisor.defer_note`): it is routine work.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from .._constants import STATUS_OBSERVED_NOTE
from .._cost import recovery_cost
from .._decide import Done, Wait
from .._dispatchjob import observed_fields
from .._errors import VersionConflict
from .._model import ObjectView, Record
from .._protocols import Backend
from .._supervisor import Intent, Supervisor
from .ports import DispatchJobStore, StepListener


def _canonical(intent: Intent) -> ObjectView | None:
    current = intent.record.current
    if current is None or current.canonical is None:
        return None
    return next((o for o in intent.objects if o.id == current.canonical), None)


def _note(view: ObjectView | None) -> str:
    """What ``status.observedNote`` shows of the current canonical: held outside dispatch (by
    whom), or else why it does not run yet (its pods unschedulable)."""
    return (view.note or view.waiting) if view is not None else ""


def _shown_note(intent: Intent) -> str:
    """The note of a waiting decision: a backoff's wait says when the next submission is due (its
    canonical has ended, so it has no note of its own); any other wait, the canonical's note."""
    step = intent.decision.step
    if isinstance(step, Wait) and step.until is not None:
        return step.why
    return _note(_canonical(intent))


class ObservingSupervisor(Supervisor):
    """A :class:`~dispatch._supervisor.Supervisor` whose waiting decisions update the observed fields,
    and whose record writes carry them."""

    store: DispatchJobStore
    listener: StepListener | None

    def __init__(
        self,
        backend: Backend,
        store: DispatchJobStore,
        *,
        listener: StepListener | None = None,
        poll_interval: float = 5.0,
    ) -> None:
        super().__init__(backend, store, listener=listener, poll_interval=poll_interval)

    defer_note: Callable[[str], bool] | None = None
    """Asked before a write that would change the note alone: True puts it off, and the caller
    looks at the job again later. The supervision loop answers True while recoveries wait for a
    worker, and queues the job as routine work: after a mass preemption every resubmission waits
    for capacity, and its note must not take a write from a recovery still waiting."""

    async def prepare(self, job: str) -> Intent:
        intent = await super().prepare(job)
        decision = intent.decision
        store = self.store
        if isinstance(decision.step, Wait | Done):
            view = _canonical(intent)
            note = _shown_note(intent)
            hold = view.note if view is not None else ""
            shown = store.observed(job)  # a copy: the note taken out, the fields beside it stay
            before = shown.pop(STATUS_OBSERVED_NOTE, "")
            if note != before and self.defer_note is not None:
                alone = observed_fields(decision.state, decision.cause) == shown  # the note alone changes
                if alone and self.defer_note(job):
                    return intent
            # Lost to a concurrent write: that write's watch event wakes the job, which decides again.
            with contextlib.suppress(VersionConflict):
                cost = recovery_cost(intent.record, intent.objects)
                written = await store.observe(job, decision.state, decision.cause, intent.version, note, cost)
                if written is not None and hold and hold != before and self.listener is not None:
                    # Once per new holder: an Event says what status now shows. A wait for
                    # capacity has none of its own: kube-scheduler's FailedScheduling is on the pod.
                    self.listener.held(job, hold)
        return intent

    async def write(self, intent: Intent, record: Record) -> None:
        """Write ``record`` with the observed fields its decision shows and what recovery cost with
        the objects it was decided on (the PUT replaces the status)."""
        decision = intent.decision
        observed = observed_fields(decision.state, decision.cause, _note(_canonical(intent)))
        await self.store.put(record, intent.version, observed, recovery_cost(record, intent.objects))
