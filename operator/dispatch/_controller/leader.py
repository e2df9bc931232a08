"""Lease-based leader election (``coordination.k8s.io/v1`` Lease), as client-go does it.

One replica of the operator holds a Lease in its own namespace and supervises; the others wait in
:meth:`LeaderElector.acquire` and take over once the holder stops renewing. This keeps a second
replica *useful* (fast takeover) and idle; it is **not** what keeps two replicas safe: a Lease has no
fencing token, so a paused leader may still write after it lost the Lease. Every record write is a
compare-and-swap on the API server, and that is what makes double authorization impossible.

The algorithm (the same as ``k8s.io/client-go/tools/leaderelection``):

* Every write is a create (fails with 409 if the Lease exists) or a PUT carrying the
  ``resourceVersion`` that was read (fails with 409 if anyone wrote in between), so of two
  candidates that race for an expired or released Lease exactly one wins.
* A Lease held by another identity is taken over only when it has expired both by its
  ``renewTime + leaseDurationSeconds`` and by this process's own clock since the holder's last
  renewal was *observed*. The second test makes takeover safe against clock skew between nodes
  (a candidate that just started waits one ``lease_duration`` before taking a Lease it has never
  seen renewed); a standby that has been watching takes over ``lease_duration`` after the last
  renewal.
* The leader renews every ``retry_period``. When it has not managed to renew for
  ``renew_deadline`` (shorter than ``lease_duration``, so it gives up before anyone may take
  over), or it finds the Lease held by someone else, it calls ``on_lost``; the operator then exits
  and Kubernetes restarts it as a candidate (controller-runtime does the same).
* On a clean shutdown :meth:`LeaderElector.release` clears ``holderIdentity`` so a standby takes
  over at its next poll instead of waiting for the Lease to expire.

Use::

    elector = LeaderElector(api_client, namespace, LEASE_NAME, default_identity())
    await elector.acquire()                                 # blocks until this process leads
    holding = asyncio.create_task(elector.hold(on_lost))    # on_lost: log and exit non-zero
    try:
        ...                                                 # run the operator
    finally:
        holding.cancel()
        await elector.release()
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .._errors import TransientBackendError
from .._kubeclient import Client, KubeError, request

log = logging.getLogger("dispatch.leader")

OnLost = Callable[[], Awaitable[None] | None]

_MICROTIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
_HTTP_NOT_FOUND = 404
_HTTP_CONFLICT = 409


def default_identity() -> str:
    """This process's identity: the Pod name (``POD_NAME`` from the downward API, else the host
    name) plus a random suffix, so a restarted container never mistakes its predecessor's Lease
    for its own (client-go's recommendation)."""
    base = os.environ.get("POD_NAME") or socket.gethostname() or "dispatch-operator"
    return f"{base}_{uuid.uuid4().hex[:8]}"


def _microtime(moment: datetime) -> str:
    """A ``metav1.MicroTime``: RFC 3339 with exactly six fractional digits, in UTC."""
    return moment.astimezone(UTC).strftime(_MICROTIME_FORMAT)


def _as_utc(moment: str | None) -> datetime | None:
    """A MicroTime (or any RFC 3339 time) as read from the Lease's JSON, in UTC."""
    if not moment:
        return None
    parsed = datetime.fromisoformat(moment.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


# Raw JSON, like every other request of the operator: no generated Lease models.
_LeaseError = (KubeError, TransientBackendError)


@dataclass(frozen=True, slots=True)
class LeaseView:
    """What one read of the Lease showed."""

    holder: str
    """``""`` when nobody holds it (never created, or released)."""
    renew_time: datetime | None
    lease_duration: float
    transitions: int
    resource_version: str
    acquire_time: datetime | None


class LeaderElector:
    """Elects one leader among the candidates that share a Lease ``namespace/name``."""

    def __init__(
        self,
        api: Client,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
    ) -> None:
        if not identity:
            raise ValueError("identity must not be empty")
        if not lease_duration > renew_deadline > retry_period > 0:
            raise ValueError(
                "need lease_duration > renew_deadline > retry_period > 0 "
                f"(got {lease_duration}, {renew_deadline}, {retry_period})"
            )
        self._api: Any = api  # either client: open_request needs only its call_api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._leading = False
        # The last Lease state seen (holder, renewTime, resourceVersion) and when (monotonic):
        # the local clock's view of whether the holder is still renewing.
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0

    @property
    def is_leader(self) -> bool:
        """True from a successful :meth:`acquire` until the Lease is lost or released."""
        return self._leading

    # ---- the three operations --------------------------------------------------------

    async def acquire(self) -> None:
        """Block until this candidate holds the Lease (poll every ``retry_period``)."""
        announced = ""
        while True:
            try:
                view = await self._try_acquire_or_renew()
            except _LeaseError as e:
                log.warning("leader election: cannot read or write Lease %s: %s", self._ref, _brief(e))
                view = None
            if view is not None and view.holder == self.identity:
                self._leading = True
                log.info("leader election: %s acquired Lease %s", self.identity, self._ref)
                return
            if view is not None and view.holder and view.holder != announced:
                announced = view.holder
                log.info("leader election: Lease %s is held by %s; waiting", self._ref, view.holder)
            await asyncio.sleep(self.retry_period)

    async def hold(self, on_lost: OnLost) -> None:
        """Renew the Lease every ``retry_period`` until cancelled.

        Returns after calling ``on_lost`` when no renewal succeeded for ``renew_deadline`` seconds
        or when the Lease turned out to be held by another identity.
        """
        if not self._leading:
            raise RuntimeError("hold() before acquire()")
        last_renewed = time.monotonic()
        reason = ""
        while True:
            await asyncio.sleep(self.retry_period)
            remaining = self.renew_deadline - (time.monotonic() - last_renewed)
            view: LeaseView | None = None
            if remaining > 0:
                try:
                    async with asyncio.timeout(remaining):
                        view = await self._try_acquire_or_renew()
                except (*_LeaseError, TimeoutError, OSError) as e:
                    log.warning("leader election: renewing Lease %s failed: %s", self._ref, _brief(e))
            if view is not None and view.holder == self.identity:
                last_renewed = time.monotonic()
                continue
            if view is not None and view.holder != self.identity:
                reason = f"the Lease is now held by {view.holder or 'nobody'}"
                break
            if time.monotonic() - last_renewed >= self.renew_deadline:
                reason = f"no renewal succeeded for {self.renew_deadline:g}s"
                break
        self._leading = False
        log.error("leader election: %s lost Lease %s: %s", self.identity, self._ref, reason)
        result = on_lost()
        if inspect.isawaitable(result):
            await result

    async def release(self) -> bool:
        """Give the Lease up (if this candidate still holds it) so a standby takes over at once.

        Best effort: returns False when the Lease was not ours or the write failed (the Lease then
        simply expires).
        """
        was_leading, self._leading = self._leading, False
        try:
            view = _view(await self._read())
            if view.holder != self.identity:
                return False
            now = datetime.now(UTC)
            body = self._body(
                view,
                holder=None,
                duration=1,
                acquire_time=view.acquire_time or now,
                renew_time=now,
                transitions=view.transitions,
            )
            await self._replace(body)
        except (*_LeaseError, OSError) as e:
            log.warning("leader election: releasing Lease %s failed: %s", self._ref, _brief(e))
            return False
        if was_leading:
            log.info("leader election: %s released Lease %s", self.identity, self._ref)
        return True

    # ---- internals -------------------------------------------------------------------

    @property
    def _ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def _path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"

    async def _read(self) -> dict[str, Any]:
        return await request(self._api, "GET", f"{self._path}/{self.name}")

    async def _replace(self, body: dict[str, Any]) -> dict[str, Any]:
        return await request(self._api, "PUT", f"{self._path}/{self.name}", body=body)

    async def _try_acquire_or_renew(self) -> LeaseView | None:
        """One attempt. Returns the Lease as it is after the attempt (``holder == identity`` when
        this candidate holds it), or None when a write lost a race (409): try again later."""
        now = datetime.now(UTC)
        try:
            lease = await self._read()
        except KubeError as e:
            if e.status != _HTTP_NOT_FOUND:
                raise
            return await self._create(now)
        view = _view(lease)
        self._observe(view)
        if view.holder and view.holder != self.identity and not self._expired(view, now):
            return view
        if view.holder == self.identity:
            acquire_time, transitions = view.acquire_time or now, view.transitions
        else:
            acquire_time, transitions = now, view.transitions + 1
        body = self._body(
            view,
            holder=self.identity,
            duration=self._duration_seconds,
            acquire_time=acquire_time,
            renew_time=now,
            transitions=transitions,
        )
        try:
            updated = await self._replace(body)
        except KubeError as e:
            if e.status == _HTTP_CONFLICT:
                return None  # someone wrote first; next attempt re-reads
            raise
        after = _view(updated)
        self._observe(after)
        return after

    async def _create(self, now: datetime) -> LeaseView | None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self._duration_seconds,
                "acquireTime": _microtime(now),
                "renewTime": _microtime(now),
                "leaseTransitions": 0,
            },
        }
        try:
            created = await request(self._api, "POST", self._path, body=body)
        except KubeError as e:
            if e.status == _HTTP_CONFLICT:
                return None  # another candidate created it first
            raise
        view = _view(created)
        self._observe(view)
        return view

    @property
    def _duration_seconds(self) -> int:
        return max(1, round(self.lease_duration))

    def _observe(self, view: LeaseView) -> None:
        key = (view.holder, view.resource_version)
        if key != self._observed:
            self._observed = key
            self._observed_at = time.monotonic()

    def _expired(self, view: LeaseView, now: datetime) -> bool:
        """Expired by the holder's own renewTime and by the local clock since we saw it change."""
        if view.renew_time is None:
            return True
        by_record = view.renew_time + timedelta(seconds=view.lease_duration) < now
        by_observation = time.monotonic() - self._observed_at > view.lease_duration
        return by_record and by_observation

    def _body(
        self,
        view: LeaseView,
        *,
        holder: str | None,
        duration: int,
        acquire_time: datetime,
        renew_time: datetime,
        transitions: int,
    ) -> dict[str, Any]:
        """A full Lease for a PUT, with the resourceVersion that was read (409 if stale)."""
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": view.resource_version,
            },
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": duration,
                "acquireTime": _microtime(acquire_time),
                "renewTime": _microtime(renew_time),
                "leaseTransitions": transitions,
            },
        }


def _view(lease: dict[str, Any]) -> LeaseView:
    spec = lease.get("spec") or {}
    return LeaseView(
        holder=spec.get("holderIdentity") or "",
        renew_time=_as_utc(spec.get("renewTime")),
        lease_duration=float(spec.get("leaseDurationSeconds") or 0),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str((lease.get("metadata") or {}).get("resourceVersion", "")),
        acquire_time=_as_utc(spec.get("acquireTime")),
    )


def _brief(error: BaseException) -> str:
    if isinstance(error, KubeError):
        return f"HTTP {error.status} {error.reason}"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


async def run_with_leader_election(
    elector: LeaderElector, body: Callable[[], Awaitable[None]], on_lost: OnLost
) -> None:
    """Acquire, run ``body`` while holding the Lease, release when ``body`` returns or raises.

    ``on_lost`` runs when the Lease is lost while ``body`` is still running; it should make the
    process exit (the Lease is not re-acquired in place).
    """
    await elector.acquire()
    holding = asyncio.create_task(elector.hold(on_lost), name="dispatch-leader-hold")
    try:
        await body()
    finally:
        holding.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await holding
        await elector.release()
