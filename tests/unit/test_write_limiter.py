"""The operator's write limit (dispatch._kubeclient.WriteLimiter): a token bucket whose urgent lane
(recoveries) is served before its routine lane, and which only writes pass through; and how
``--write-qps auto`` chooses it, asking a local HTTP server for the answers a real API server cannot
be made to give (an error; the real ones, with and without Priority and Fairness, are
tests/integration/test_write_limit.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from dispatch._kubeclient import (
    DEFAULT_WRITE_QPS,
    FAIRNESS_HEADER,
    Connection,
    KubeClient,
    WriteLimiter,
    is_urgent,
    limit_writes,
    urgent,
)
from tests.support.local_http import serving


async def test_the_burst_passes_at_once_then_writes_wait() -> None:
    limiter = WriteLimiter(qps=1000.0, burst=3)
    for _ in range(3):
        await limiter.acquire()
    assert (limiter.granted, limiter.waited) == (3, 0)
    await limiter.acquire()
    assert (limiter.granted, limiter.waited) == (4, 1)


async def test_urgent_waiters_get_tokens_before_routine_ones_queued_earlier() -> None:
    limiter = WriteLimiter(qps=200.0, burst=1)
    await limiter.acquire()  # the bucket is empty now: everyone below waits
    order: list[str] = []

    async def write(name: str, flag: bool) -> None:
        with urgent(flag):
            await limiter.acquire()
        order.append(name)

    routine = [asyncio.create_task(write(f"routine-{i}", False)) for i in range(3)]
    await asyncio.sleep(0)  # the routine writes queue first
    recoveries = [asyncio.create_task(write(f"recovery-{i}", True)) for i in range(3)]
    await asyncio.gather(*routine, *recoveries)
    assert order == [f"recovery-{i}" for i in range(3)] + [f"routine-{i}" for i in range(3)]


async def test_a_cancelled_waiter_leaves_its_lane() -> None:
    limiter = WriteLimiter(qps=0.001, burst=1)  # no new token within the test
    await limiter.acquire()
    gone = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    assert limiter._waiting()
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert not limiter._waiting()  # nobody left to hand the next token to
    assert limiter.granted == 1


def test_urgency_is_scoped_to_the_block() -> None:
    assert not is_urgent()
    with urgent():
        assert is_urgent()
        with urgent(False):
            assert not is_urgent()
        assert is_urgent()
    assert not is_urgent()


@pytest.mark.parametrize(("qps", "burst"), [(0.0, 1), (-1.0, 5), (5.0, 0)])
def test_a_limit_that_would_never_let_a_write_through_is_refused(qps: float, burst: int) -> None:
    with pytest.raises(ValueError, match="qps > 0 and burst >= 1"):
        WriteLimiter(qps=qps, burst=burst)


class _Rest:
    def __init__(self) -> None:
        self.sent: list[str] = []

    async def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> str:
        self.sent.append(f"{method} {url}")
        return "ok"


class _Api:
    def __init__(self) -> None:
        self.rest_client = _Rest()


async def test_only_writes_other_than_the_leases_take_a_token() -> None:
    api: Any = _Api()
    limiter = WriteLimiter(qps=1.0, burst=10)
    limit_writes(api, limiter)
    limit_writes(api, limiter)  # wrapping twice counts once
    base = "https://k8s/apis/kubeflow.org/v1/namespaces/a/pytorchjobs"
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        assert await api.rest_client.request(method, base) == "ok"
    await api.rest_client.request("PUT", "https://k8s/apis/coordination.k8s.io/v1/namespaces/d/leases/x")
    assert limiter.granted == 4
    assert len(api.rest_client.sent) == 6


def test_the_flags_default_to_auto_and_refuse_what_cannot_work(capsys: pytest.CaptureFixture[str]) -> None:
    from dispatch._controller.main import WRITE_QPS_AUTO, ArgumentError, check_arguments, parser

    args = parser().parse_args([])
    assert (args.write_qps, args.write_burst) == (WRITE_QPS_AUTO, 100)
    assert parser().parse_args(["--write-qps=Auto"]).write_qps == WRITE_QPS_AUTO
    assert parser().parse_args(["--write-qps=20"]).write_qps == 20.0
    for argv, flag in ((["--write-qps=-1"], "--write-qps"), (["--write-burst=0"], "--write-burst")):
        with pytest.raises(ArgumentError, match=flag):
            check_arguments(parser().parse_args(argv))
    for word in ("fast", "nan", "inf"):
        with pytest.raises(SystemExit) as exit_:
            parser().parse_args([f"--write-qps={word}"])
        assert exit_.value.code == 2
        assert "--write-qps" in capsys.readouterr().err


@contextlib.asynccontextmanager
async def answering(headers: dict[str, str], status: int = 200) -> AsyncIterator[tuple[str, list[str]]]:
    seen: list[str] = []

    async def handle(req: web.Request) -> web.Response:
        seen.append(f"{req.method} {req.path}")
        return web.json_response({"major": "1"}, status=status, headers=headers)

    async with serving(handle) as host:
        yield host, seen


@pytest.mark.parametrize(
    ("headers", "status", "qps"),
    [
        ({FAIRNESS_HEADER: "7c19cac1"}, 200, 0.0),  # Priority and Fairness: no client-side limit
        ({}, 200, DEFAULT_WRITE_QPS),  # a server without it: Kueue's limit
        ({FAIRNESS_HEADER: "7c19cac1"}, 503, DEFAULT_WRITE_QPS),  # no answer to go by: the limit
        ({}, 403, DEFAULT_WRITE_QPS),
    ],
)
async def test_auto_asks_the_api_server_whether_it_sheds_load_itself(
    headers: dict[str, str], status: int, qps: float
) -> None:
    from dispatch._controller.main import WRITE_QPS_AUTO, choose_write_limit

    async with (
        answering(headers, status) as (host, seen),
        KubeClient(Connection(host=host)) as client,
    ):
        assert await choose_write_limit(client, WRITE_QPS_AUTO) == qps
    assert seen == ["GET /version"]


async def test_a_number_is_the_users_choice_and_asks_nothing() -> None:
    from dispatch._controller.main import choose_write_limit

    async with (
        answering({FAIRNESS_HEADER: "x"}) as (host, seen),
        KubeClient(Connection(host=host)) as client,
    ):
        assert await choose_write_limit(client, 20.0) == 20.0
        assert await choose_write_limit(client, 0.0) == 0.0
    assert seen == []
