"""What this process knows about one object (:class:`Tracked`), and the stop it decided on (:class:`Stop`).

Everything known about an object is kept in one place, by object id: its body from the watch, our
own last write, its pods, what they said before they went, its last view and verdict, its stop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime

from .._kubeclient import Packed
from .._model import Cause, ObjectView
from ._classify import Verdict
from ._evidence import Evidence
from ._mask import Body


@dataclass(eq=False)
class Stop:
    """A stop this process has decided on: the object is reported ended with ``cause`` from then on."""

    oid: str
    job: str
    submission: int
    cause: Cause
    deferrable: bool
    """The controller finishes the object itself (a failed pod it does not restart): the patch
    waits up to ``stop_grace`` for that, unless a release needs the object stopped now."""
    settle_waits: bool = False
    """Deferred, yet settling waits for it: the controller normally finishes the object itself but
    may not (restarts past the rule's budget: see ``Verdict.stop_after_grace``)."""
    now: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    landed: bool = False
    """The object is stopped on the API server (by us or its controller) or gone."""
    error: Exception | None = None


@dataclass(eq=False)
class Tracked:
    """Everything this process knows about one object (by id), in one place."""

    job: str | None = None
    """The job it belongs to, from its labels (or the create that made it)."""
    body: Packed | None = None
    """Its projection as the watch last showed it (packed: :meth:`Packed.body` decodes it)."""
    overlay: Packed | None = None
    """The projection of our own last write, until the watch shows it (or something newer)."""
    pods: dict[str, Packed] = field(default_factory=dict)
    """Its pods' projections by key, from the pod watch (kept after the object goes, while they
    still run)."""
    ended_by_us: bool = False
    retained: Evidence | None = None
    """What a pod said about the end of the object, kept for when the pod is gone."""
    last_restart: Cause | None = None
    incarnations: dict[str, int] = field(default_factory=dict)
    """Pod uid -> most in-place restarts seen (a recreated pod starts again from 0)."""
    restarts: int = 0
    started_at: datetime | None = None
    """The earliest start its pods showed (:func:`pods_started`), kept for when they are gone."""
    last_view: ObjectView | None = None
    verdict: tuple[tuple[object, ...], Verdict] | None = None
    released_at: float | None = None
    looked: float = 0.0
    """When (monotonic) its evidence may be looked for on the API server again."""
    stop: Stop | None = None
    sweeping: bool = False

    def current(self) -> Packed | None:
        mine, cached = self.overlay, self.body
        if mine is None:
            return cached
        if cached is None or (mine.version or 0) > (cached.version or 0):
            return mine
        return cached

    def pod_bodies(self) -> list[Body]:
        return [pod.body() for pod in self.pods.values()]

    def forgotten(self) -> Tracked:
        """What is left once the object is gone from the API server: its pods still running."""
        return Tracked(job=self.job, pods=self.pods)


_fields_sets: dict[frozenset[str], set[str]] = {}


def kept_view(view: ObjectView) -> ObjectView:
    """``view`` as the cache keeps it (each object's verdict and last view): its
    ``model_fields_set`` one shared set per combination of fields, where pydantic gives every
    instance its own (a set of five names is 728 bytes, more than the rest of the view together).
    The models are frozen, so nothing adds to the set in place; ``model_copy`` copies it first."""
    fields = view.__pydantic_fields_set__
    shared = _fields_sets.setdefault(frozenset(fields), fields)
    if shared is not fields:
        object.__setattr__(view, "__pydantic_fields_set__", shared)
    return view
