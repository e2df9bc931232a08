"""The in-memory record store: the tutorial's ``recordstest``, and the embedded default.

Records are immutable, so the store keeps the objects themselves: a reader can never change what
another reader sees, and consecutive versions share everything they did not change.
"""

from __future__ import annotations

from ._errors import JobExists, JobNotFound, VersionConflict
from ._model import Record
from ._protocols import Subscribers, Unsubscribe, Versioned, Wake


class MemoryStore:
    """Records in a dict, with compare-and-swap on an integer version."""

    def __init__(self) -> None:
        self._records: dict[str, tuple[Record, int]] = {}
        self._subscribers = Subscribers()
        self.writes = 0
        self.conflicts = 0

    async def create(self, record: Record) -> str:
        if record.job in self._records:
            raise JobExists(record.job)
        self._records[record.job] = (record, 1)
        self.writes += 1
        self._notify(record.job)
        return "1"

    async def get(self, job: str) -> Versioned:
        try:
            record, version = self._records[job]
        except KeyError:
            raise JobNotFound(job) from None
        return Versioned(record, str(version))

    async def put(self, record: Record, expected: str) -> str:
        current = self._records.get(record.job)
        if current is None:
            raise JobNotFound(record.job)
        if str(current[1]) != expected:
            self.conflicts += 1
            raise VersionConflict(record.job, expected, str(current[1]))
        version = current[1] + 1
        self._records[record.job] = (record, version)
        self.writes += 1
        self._notify(record.job)
        return str(version)

    def jobs(self) -> list[str]:
        return list(self._records)

    def subscribe(self, job: str, wake: Wake) -> Unsubscribe:
        return self._subscribers.subscribe(job, wake)

    def _notify(self, job: str) -> None:
        self._subscribers.notify(job)
