"""A kit's stop writes in the write limit's urgent lane, whoever started it (a watch event, a routine
list()): it is the first write of a recovery, and the release's fence waits for it. Routine, a mass
preemption's stops waited behind every other job's recovery writes, and each release with them."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch._errors import TransientBackendError
from dispatch._kubeclient import is_urgent, urgent
from dispatch._workload import WorkloadBackend
from tests.support.kit import JOB, restarted_kit


async def test_a_stop_started_in_a_routine_turn_writes_urgently(observer: list[WorkloadBackend]) -> None:
    backend, api = restarted_kit(observer)
    lanes: list[bool] = []
    answer = api.call_api

    async def call_api(path: str, method: str, **options: Any) -> Any:
        if method != "GET":
            lanes.append(is_urgent())
        return await answer(path, method, **options)

    api.call_api = call_api  # type: ignore[method-assign]
    with urgent(False):
        await backend.list(JOB)  # starts the stop
    with pytest.raises(TransientBackendError):
        await backend.quiesce(JOB)  # waits for it: this API refuses it
    assert lanes == [True]
