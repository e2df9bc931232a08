"""Kubernetes Events for what dispatch does to a DispatchJob (``events.k8s.io/v1``).

:class:`EventRecorder` is a supervisor :class:`~dispatch._supervisor.Listener`. It posts an Event

* on every transition the supervisor records: a rule firing (``Recovering``: which cause ended which
  submission, which rule fired, who enforces it, how much budget is left) and the outcome
  (``Succeeded``, ``Failed`` with why no rule recovered it, ``Cancelled`` with who asked);
* on each orphan ended (``OrphanEnded``) and each live object ended because the job has an outcome
  (``ObjectEnded``);
* on a failed step (``BackendError``, once per distinct error in a row, so retries do not flood);
* when the operator calls :meth:`EventRecorder.refused` (``UnenforceableRule``) or
  :meth:`EventRecorder.invalid` (``InvalidSpec``).

Types are ``Normal`` or ``Warning`` only; reasons are the CamelCase constants of
:mod:`dispatch._constants`; ``reportingController`` is ``dispatch.dev/dispatch-operator``.

Posting never blocks the supervisor: an Event is queued (a small tuple, its time taken then) and
posted by at most ``max_sending`` background senders (:data:`MAX_SENDING`), at most
``max_pending`` queued or sending (more are dropped and logged); errors are logged, never raised.
Messages are redacted (:func:`dispatch._controller.logs.redact`) and cut to the API's 1 kB.

Recoveries before Events: while :meth:`EventRecorder.hold_while`'s predicate holds (the supervision
loop's urgent lane has jobs the workers have not reached), queued Events wait, one posted every
:data:`HELD_INTERVAL` so they never stall. Without a client-side write limit (``--write-qps auto``
on an API server with Priority and Fairness) nothing else puts a recovery's writes first, and a
mass preemption's ``Recovering`` Events were up to one write in eight of its burst.

An Event is never the only trace of a transition: the record's history and the conditions hold every
reason. So under load Events may be dropped (too many pending, the API refused one), but never
silently: each one lost is logged and told to ``on_dropped(reason)``, which the operator points at
the metric ``dispatch_events_dropped_total{reason}``. Their posts are routine writes for the write
limit (:func:`dispatch._kubeclient.urgent`), so they never take a token a recovery is waiting for.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Final

from .._constants import (
    API_VERSION,
    EVENT_NORMAL,
    EVENT_WARNING,
    KIND,
    REASON_BACKEND_ERROR,
    REASON_CANCELLED,
    REASON_EXPIRED,
    REASON_FAILED,
    REASON_HELD_OUTSIDE,
    REASON_INVALID_SPEC,
    REASON_OBJECT_ENDED,
    REASON_ORPHAN_ENDED,
    REASON_RECOVERING,
    REASON_RESUMED,
    REASON_RETRIED,
    REASON_SUCCEEDED,
    REASON_SUSPENDED,
    REASON_UNENFORCEABLE,
    REASON_UNQUEUEABLE,
    REPORTING_CONTROLLER,
)
from .._decide import (
    Authorize,
    Create,
    End,
    RecordCanonical,
    RecordEnd,
    RecordOutcome,
    RecordRestarts,
    RecordSettled,
    RecordStop,
    RecordSuspend,
    Release,
    Resume,
    Step,
    describe_step,
)
from .._dispatchjob import cause_text
from .._errors import PlanError
from .._kubeclient import urgent
from .._model import Cause, Record, State, cause_words, rule_causes
from .logs import redact

log = logging.getLogger("dispatch.events")

Body = dict[str, Any]
Post = Callable[[str, Body], Awaitable[None]]
"""Create one Event: (namespace, events.k8s.io/v1 Event body)."""
UidOf = Callable[[str, str], Awaitable[str | None]]
"""The uid of the DispatchJob (namespace, name), or None if it cannot be found."""
_Pending = tuple[str, str, str, str, str, datetime]
"""A queued Event: (job, type, reason, action, note, when it happened)."""

MAX_NOTE: Final = 1024
MAX_PENDING: Final = 4096
"""Events queued or sending. A queued Event is a tuple of its fields, 0.48 kB traced (its note is
most of it), so 4,096 cost about 2 MB: enough to hold every ``Recovering`` Event of a mass
preemption of 1,000 jobs back until the recoveries are done, where a task per pending Event (2.2
kB each) would have to be capped far lower and drop them."""
HELD_INTERVAL: Final = 1.0
"""While recoveries wait, one held Event is posted per this many seconds: Events still trickle out
during a long burst, and take under 1 % of its writes."""
HELD_POLL: Final = 0.1
"""How often a sender holding Events back looks whether the recoveries are done."""
MAX_SENDING: Final = 4
"""Events posted at once. Each post in flight holds a TLS connection, with asyncio's read buffer
and OpenSSL's, and the client keeps a connection in its pool while requests keep coming (aiohttp
reuses them in turn). Unbounded, Events would take their share of the write limit's burst of
100 tokens at the start of a mass preemption, a connection each. Four send more than the write
limit lets Events have."""


EVENT_REASONS: Final = frozenset(
    {
        REASON_BACKEND_ERROR,
        REASON_CANCELLED,
        REASON_FAILED,
        REASON_HELD_OUTSIDE,
        REASON_INVALID_SPEC,
        REASON_OBJECT_ENDED,
        REASON_ORPHAN_ENDED,
        REASON_RECOVERING,
        REASON_SUCCEEDED,
        REASON_UNENFORCEABLE,
        REASON_UNQUEUEABLE,
    }
)
"""Every reason this recorder posts: the bounded label set of ``dispatch_events_dropped_total``."""


def default_instance() -> str:
    """``reportingInstance``: the pod's name (HOSTNAME), else the host name."""
    return (os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or socket.gethostname())[:128]


def split_job(job: str) -> tuple[str, str]:
    """``"<namespace>/<name>"`` -> (namespace, name); a bare name is in ``default``."""
    namespace, sep, name = job.partition("/")
    return (namespace, name) if sep else ("default", job)


def _cause(cause: Cause | None) -> str:
    """A cause as status and ``kubectl dispatch`` say it (:func:`~dispatch._dispatchjob.cause_text`)."""
    if cause is None:
        return "unknown"
    return cause_text(cause.kind.value, cause.detail, cause.exit_code, cause.signal)


def _budget(left: int, budget: int) -> str:
    return f"budget {left} of {budget} left"


def describe(step: Step, before: Record, after: Record | None) -> tuple[str, str, str, str] | None:
    """(type, reason, action, message) of the Event for a step, or None when it deserves none."""
    if isinstance(step, Authorize) and step.rule is not None and after is not None:
        rule = after.plan.rules[step.rule]
        causes = rule_causes(rule.on, rule.exit_codes)
        message = (
            f"submission {step.submission - 1} ended with cause {_cause(step.cause)}; rule {step.rule} "
            f"({rule.action} on [{causes}]) fired, enforced by the {rule.enforcer}: "
            f"submission {step.submission} authorized, {_budget(rule.left, rule.budget)}"
        )
        changes = after.submissions[-1].changes if after.submissions else ()
        if changes:
            message += "; it runs with " + ", ".join(str(c) for c in changes)
        return EVENT_NORMAL, REASON_RECOVERING, "Resubmit", message
    if isinstance(step, RecordOutcome):
        n = before.current.n if before.current is not None else 0
        if step.state is State.SUCCEEDED:
            return (
                EVENT_NORMAL,
                REASON_SUCCEEDED,
                "Succeed",
                f"submission {n} succeeded; the job succeeded",
            )
        if step.state is State.CANCELLED:
            who = step.actor or (before.cancel.actor if before.cancel is not None else None)
            detail = step.cause.detail or (f"cancelled by {who}" if who is not None else "cancelled")
            note = f"job {detail}" if detail.startswith("cancelled") else f"job cancelled: {detail}"
            return EVENT_NORMAL, REASON_CANCELLED, "Cancel", note
        return (
            EVENT_WARNING,
            REASON_FAILED,
            "Fail",
            (
                f"submission {n} ended with cause {_cause(step.cause)} and the job failed: "
                f"{_why_failed(step, before)}"
            ),
        )
    if isinstance(step, RecordSuspend):
        n = before.current.n if before.current is not None else 0
        return (
            EVENT_NORMAL,
            REASON_SUSPENDED,
            "Suspend",
            f"suspended by {step.actor}: stopping submission {n}",
        )
    if isinstance(step, Resume):
        if step.retry is None:
            message = f"resumed by {step.actor}: submission {step.submission} authorized"
            return EVENT_NORMAL, REASON_RESUMED, "Resume", message
        fresh = f", rule {step.fresh_budget}'s budget renewed" if step.fresh_budget is not None else ""
        n = step.submission
        message = f"retried by {step.actor}: the failed job reopened, submission {n} authorized{fresh}"
        return EVENT_NORMAL, REASON_RETRIED, "Retry", message
    if isinstance(step, End):
        if step.stop is not None:
            message = (
                f"stopping object {step.object_id} with cause {step.stop}: SIGTERM, then SIGKILL "
                f"after {step.grace_seconds} s"
            )
            return EVENT_NORMAL, REASON_OBJECT_ENDED, "StopObject", message
        if step.orphan:
            message = (
                f"ended object {step.object_id}: it is not the object recorded for its submission "
                "(an orphan left by a creator that crashed or lost a race)"
            )
            return EVENT_NORMAL, REASON_ORPHAN_ENDED, "EndOrphan", message
        return (
            EVENT_NORMAL,
            REASON_OBJECT_ENDED,
            "EndObject",
            (f"ended object {step.object_id} because the job is {before.state}"),
        )
    return None


_ACTIONS: Final[dict[type, str]] = {
    Authorize: "AuthorizeSubmission",
    RecordEnd: "AwaitBackoff",
    Create: "CreateObject",
    RecordCanonical: "ChooseObject",
    Release: "ReleaseObject",
    End: "EndObject",
    RecordStop: "StopObject",
    RecordRestarts: "CountRestarts",
    RecordOutcome: "Conclude",
    RecordSettled: "Settle",
    RecordSuspend: "Suspend",
    Resume: "Resume",
}


def step_action(step: Step) -> str:
    """An Event's ``action`` for a step: a verb of the user's, not the step's class name."""
    return _ACTIONS.get(type(step), "Supervise")


def _why_failed(step: RecordOutcome, before: Record) -> str:
    kind = step.cause.kind
    index = before.spec.recovery.rule_for(step.cause)
    if index is None:
        said = cause_words(kind.value, step.cause.exit_code, step.cause.signal)
        return f"no rule covers {said} (it was listed as uncovered in the plan)"
    rule = before.plan.rules[index]
    if rule.left == 0:
        return f"rule {index} covers {kind} but its budget of {rule.budget} is spent"
    return f"rule {index} covers {kind} and is enforced by the {rule.enforcer}, which did not recover it"


def event_body(
    job: str,
    uid: str | None,
    *,
    type: str,
    reason: str,
    action: str,
    note: str,
    instance: str,
    now: datetime,
) -> Body:
    """An events.k8s.io/v1 Event about the DispatchJob ``job``."""
    if type not in (EVENT_NORMAL, EVENT_WARNING):
        raise ValueError(f"an Event is Normal or Warning, not {type!r}")
    namespace, name = split_job(job)
    regarding: Body = {"apiVersion": API_VERSION, "kind": KIND, "namespace": namespace, "name": name}
    if uid:
        regarding["uid"] = uid
    note = redact(note)
    if len(note.encode()) > MAX_NOTE:
        note = note.encode()[: MAX_NOTE - 3].decode(errors="ignore") + "..."
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": instance,
        "action": action,
        "reason": reason,
        "type": type,
        "regarding": regarding,
        "note": note,
    }


class EventRecorder:
    """Posts Events for what the supervisor does; a Listener. See the module docstring."""

    def __init__(
        self,
        post: Post,
        *,
        uid_of: UidOf | None = None,
        instance: str | None = None,
        max_pending: int = MAX_PENDING,
        max_sending: int = MAX_SENDING,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_dropped: Callable[[str], None] | None = None,
    ) -> None:
        self._post = post
        self._on_dropped = on_dropped
        self._uid_of = uid_of
        self.instance = instance or default_instance()
        self.max_pending = max_pending
        self.max_sending = max_sending
        self._clock = clock
        self._uids: dict[str, str] = {}
        self._queue: deque[_Pending] = deque()
        self._senders: set[asyncio.Task[None]] = set()
        self._sending = 0
        self._held: Callable[[], bool] | None = None
        self._held_post = 0.0
        """When the next Event may be posted while held (the event loop's clock)."""
        self._closing = False
        self._last_error: dict[str, str] = {}
        self.dropped = 0
        """Events not posted because ``max_pending`` were pending (or no event loop was running, or
        the operator stopped before they could be posted)."""
        self.failed = 0
        """Events the API refused or that could not be sent."""

    @classmethod
    def for_client(
        cls,
        api: Any,
        *,
        instance: str | None = None,
        on_request: Callable[[str, str, int | None], None] | None = None,
        max_pending: int = MAX_PENDING,
        on_dropped: Callable[[str], None] | None = None,
    ) -> EventRecorder:
        """A recorder posting with a client's raw JSON requests (events.k8s.io/v1), either
        kubernetes_asyncio's ``ApiClient`` or :class:`dispatch._kubeclient._transport.KubeClient`.

        ``on_request(verb, resource, code)`` is told about each API request (e.g.
        :meth:`dispatch._controller.metrics.Metrics.api_request`); ``code`` is None when there was no
        answer or a transient one (429, 5xx).
        """
        from .._constants import GROUP, PLURAL, VERSION
        from .._kubeclient import KubeError, request

        def count(verb: str, resource: str, code: int | None) -> None:
            if on_request is not None:
                on_request(verb, resource, code)

        async def post(namespace: str, body: Body) -> None:
            try:
                await request(api, "POST", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events", body=body)
            except KubeError as e:
                count("create", "events", e.status or None)
                raise
            except Exception:
                count("create", "events", None)
                raise
            count("create", "events", 201)

        async def uid_of(namespace: str, name: str) -> str | None:
            path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"
            try:
                obj = await request(api, "GET", path)
            except KubeError as e:
                count("get", "dispatchjobs", e.status or None)
                return None
            count("get", "dispatchjobs", 200)
            uid = obj.get("metadata", {}).get("uid")
            return str(uid) if uid else None

        return cls(post, uid_of=uid_of, instance=instance, max_pending=max_pending, on_dropped=on_dropped)

    # ------------------------------------------------------------------ hooks for the operator

    def remember(self, job: str, uid: str) -> None:
        """The DispatchJob's uid (from the body kopf hands a handler), so no GET is needed."""
        self._uids[job] = uid

    def forget(self, job: str) -> None:
        self._uids.pop(job, None)
        self._last_error.pop(job, None)

    def refused(self, job: str, error: PlanError) -> None:
        """The job was refused: a rule nobody would enforce, or a queue Kueue cannot serve here."""
        reason = REASON_UNQUEUEABLE if error.field is not None else REASON_UNENFORCEABLE
        self.emit(job, EVENT_WARNING, reason, "Refuse", f"refused: {error}")

    def waiting(self, job: str, reason: str, message: str) -> None:
        """The job waits before anything is created: a Warning, since it needs a person (or an
        operator that serves its backend) to go on."""
        self.emit(job, EVENT_WARNING, reason, "Wait", message)

    def invalid(self, job: str, message: str) -> None:
        """The job was refused: its spec is invalid."""
        self.emit(job, EVENT_WARNING, REASON_INVALID_SPEC, "Refuse", f"refused: {message}")

    def expired(self, job: str, note: str) -> None:
        self.emit(job, EVENT_NORMAL, REASON_EXPIRED, "Delete", note)

    def hold_while(self, held: Callable[[], bool] | None) -> None:
        """Hold queued Events back while ``held()`` is true (recoveries are waiting for a worker)."""
        self._held = held

    @property
    def pending(self) -> int:
        """Events queued or being posted."""
        return len(self._queue) + self._sending

    def emit(self, job: str, type: str, reason: str, action: str, note: str) -> None:
        """Post one Event in the background (never blocks, never raises)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._dropped(reason)
            log.warning("no event loop: event %s for %s dropped", reason, job, extra={"job": job})
            return
        if self.pending >= self.max_pending:
            self._dropped(reason)
            log.warning(
                "%d events pending: event %s for %s dropped",
                self.pending,
                reason,
                job,
                extra={"job": job},
            )
            return
        self._queue.append((job, type, reason, action, note, self._clock()))
        if len(self._senders) < min(self.max_sending, len(self._queue)):
            with urgent(False):  # the task copies this context: its posts are routine writes
                task = loop.create_task(self._drain_queue(), name="dispatch-events")
            self._senders.add(task)
            task.add_done_callback(self._senders.discard)

    async def drain(self) -> None:
        """Wait until every pending Event is posted (or failed)."""
        while self._senders:
            await asyncio.gather(*list(self._senders), return_exceptions=True)

    async def aclose(self, grace: float = 5.0) -> None:
        """Give pending Events ``grace`` seconds (held no more), then drop, count and log what is
        left."""
        self._closing = True
        if self._senders:
            _done, pending = await asyncio.wait(list(self._senders), timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._queue:
            log.warning("the operator stops: %d events not posted", len(self._queue))
            while self._queue:
                self._dropped(self._queue.popleft()[2])

    def _holding(self) -> bool:
        """Whether a held Event must wait now; if not and recoveries wait, the next may come only
        :data:`HELD_INTERVAL` later."""
        if self._held is None or self._closing:
            return False
        try:
            held = self._held()
        except Exception:  # a bug in the predicate must not keep Events back for ever
            log.exception("could not tell whether recoveries are waiting")
            return False
        if not held:
            return False
        now = asyncio.get_running_loop().time()
        if now < self._held_post:
            return True
        self._held_post = now + HELD_INTERVAL
        return False

    async def _drain_queue(self) -> None:
        """One sender: post queued Events until none is left."""
        while self._queue:
            if self._holding():
                await asyncio.sleep(HELD_POLL)
                continue
            job, type, reason, action, note, now = self._queue.popleft()
            self._sending += 1
            try:
                await self._send(job, type, reason, action, note, now)
            except asyncio.CancelledError:
                self._dropped(reason)  # the operator stops: not posted, but counted
                raise
            finally:
                self._sending -= 1
        # Leave the set now, not in the done callback: an Event queued before that callback runs
        # would otherwise find a sender that has already finished and wait for the next emit.
        task = asyncio.current_task()
        if task is not None:
            self._senders.discard(task)

    async def _send(self, job: str, type: str, reason: str, action: str, note: str, now: datetime) -> None:
        try:
            uid = self._uids.get(job)
            if uid is None and self._uid_of is not None:
                uid = await self._uid_of(*split_job(job))
                if uid is not None:
                    self._uids[job] = uid
            body = event_body(
                job,
                uid,
                type=type,
                reason=reason,
                action=action,
                note=note,
                instance=self.instance,
                now=now,
            )
            await self._post(body["metadata"]["namespace"], body)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self.failed += 1
            self._tell(reason)
            log.warning("could not post event %s for %s: %s", reason, job, error, extra={"job": job})

    def _dropped(self, reason: str) -> None:
        self.dropped += 1
        self._tell(reason)

    def _tell(self, reason: str) -> None:
        if self._on_dropped is not None:
            try:
                self._on_dropped(reason)
            except Exception:  # a metric's bug must not break the caller's step
                log.exception("on_dropped failed for an event %s", reason)

    # ------------------------------------------------------------------ Listener

    def stepped(self, job: str, step: Step, before: Record, after: Record | None) -> None:
        self._last_error.pop(job, None)
        try:
            found = describe(step, before, after)
        except Exception:  # never let an Event break a step
            log.exception("could not describe a step of %s", job, extra={"job": job})
            return
        if found is not None:
            self.emit(job, *found)
        if after is not None and after.settled:
            self._last_error.pop(job, None)

    def held(self, job: str, note: str) -> None:
        """The current object is held outside dispatch: a Warning, since the job will not run until
        its holder lets go, and dispatch will not undo the hold."""
        self.emit(job, EVENT_WARNING, REASON_HELD_OUTSIDE, "Wait", note)

    def conflicted(self, job: str) -> None:
        """A lost compare-and-swap is routine (metrics count it); no Event."""

    def errored(self, job: str, step: Step, error: Exception) -> None:
        message = f"failed while {describe_step(step)}: {error}"  # the user's words, not a class name
        if self._last_error.get(job) == message:
            return
        self._last_error[job] = message
        self.emit(job, EVENT_WARNING, REASON_BACKEND_ERROR, step_action(step), message)
