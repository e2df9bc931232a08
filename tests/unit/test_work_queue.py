"""The supervisor's work queue (dispatch._supervisor.WorkQueue) as the operator's loop uses it:
jobs added and removed while it runs, urgent work before routine work, never two turns of a job at
once, and a persistent queue that retries what a one-shot run_all would give up."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from dispatch._supervisor import Turn, WorkQueue


async def first_turns(n: int, prepare: Callable[[WorkQueue], None]) -> list[str]:
    """The first ``n`` jobs one worker takes from a queue that ``prepare`` filled (each turn DONE)."""
    order: list[str] = []
    done = asyncio.Event()

    async def handle(job: str) -> Turn:
        order.append(job)
        if len(order) == n:
            done.set()
        return Turn.DONE

    queue = WorkQueue(handle, poll_interval=60, retry_delays=(0.01,), forever=True)
    prepare(queue)
    worker = asyncio.create_task(queue.work())
    try:
        await asyncio.wait_for(done.wait(), 10)
    finally:
        worker.cancel()
    return order


async def test_urgent_jobs_are_taken_before_routine_ones_queued_earlier() -> None:
    def prepare(queue: WorkQueue) -> None:
        for job in ("routine-a", "routine-b"):
            queue.add(job)
        queue.add("recovery", urgent=True)
        queue.add("routine-a", urgent=True)  # already waiting: woken urgently, taken once

    assert await first_turns(3, prepare) == ["recovery", "routine-a", "routine-b"]


async def test_a_recovery_under_way_goes_on_before_recoveries_not_yet_begun() -> None:
    # Three jobs woken at once by a mass preemption, each needing three steps, one worker: each job
    # finishes its recovery before the next begins (round-robin would release none until the end).
    order: list[str] = []
    steps = dict.fromkeys(("a", "b", "c"), 3)
    done = asyncio.Event()

    async def handle(job: str) -> Turn:
        order.append(job)
        steps[job] -= 1
        if not any(steps.values()):
            done.set()
        return Turn.URGENT if steps[job] else Turn.WAIT

    queue = WorkQueue(handle, poll_interval=60, retry_delays=(0.01,), forever=True)
    for job in steps:
        queue.add(job, urgent=True)
    worker = asyncio.create_task(queue.work())
    try:
        await asyncio.wait_for(done.wait(), 10)
    finally:
        worker.cancel()
    assert order == ["a", "a", "a", "b", "b", "b", "c", "c", "c"]


async def test_jobs_come_and_go_while_it_runs_and_a_removed_job_has_no_turn_after() -> None:
    turns: dict[str, int] = {}
    gate = asyncio.Event()
    inside = asyncio.Event()
    late = asyncio.Event()

    async def handle(job: str) -> Turn:
        turns[job] = turns.get(job, 0) + 1
        if job == "late":
            late.set()
        if job == "slow":
            inside.set()
            await gate.wait()
        return Turn.WAIT

    queue = WorkQueue(handle, poll_interval=60, retry_delays=(0.01,), forever=True)
    workers = [asyncio.create_task(queue.work()) for _ in range(2)]
    try:
        queue.add("slow")
        await asyncio.wait_for(inside.wait(), 10)
        queue.enqueue("slow")  # woken while busy: looked at again once this turn is over
        removal = asyncio.create_task(queue.remove("slow"))
        await asyncio.sleep(0)
        assert not removal.done(), "remove() returned while a turn of the job was running"
        queue.add("late")
        await asyncio.wait_for(late.wait(), 10)
        gate.set()
        await asyncio.wait_for(removal, 10)
        queue.enqueue("slow")  # no longer supervised: ignored
        await asyncio.sleep(0.05)
    finally:
        for w in workers:
            w.cancel()
    assert turns["slow"] == 1
    assert "slow" not in queue.pending
    assert "late" in queue.pending


@pytest.mark.parametrize("persistent", [False, True])
async def test_a_bug_stops_one_job_in_run_all_and_is_retried_by_the_operator(persistent: bool) -> None:
    calls = 0

    async def handle(job: str) -> Turn:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise RuntimeError("a bug")
        return Turn.DONE

    queue = WorkQueue(handle, ["job"], poll_interval=60, retry_delays=(0.01,), persistent=persistent)
    await asyncio.wait_for(queue.work(), 10)
    if persistent:
        assert (calls, queue.errors) == (3, {})
    else:
        assert calls == 1
        assert isinstance(queue.errors["job"], RuntimeError)


async def test_the_operator_loop_runs_as_many_workers_as_its_flag_says() -> None:
    """``--workers``: 64 by default, at least 1, and exactly that many workers take turns."""
    from typing import Any, cast

    from dispatch._controller.loop import DEFAULT_WORKERS
    from dispatch._controller.main import ArgumentError, check_arguments, parser
    from dispatch._controller.runtime import Runtime

    assert parser().parse_args([]).workers == DEFAULT_WORKERS == 64
    for bad in ("0", "-1"):
        with pytest.raises(ArgumentError, match="--workers"):
            check_arguments(parser().parse_args([f"--workers={bad}"]))
    args = parser().parse_args(["--workers=3"])
    check_arguments(args)

    class Store:
        """What the loop's start asks of the record store: its shared watch."""

        watched = False

        def watch_all(self, on_event: object, on_synced: object) -> None:
            self.watched = True

    store = Store()
    runtime = Runtime(store=cast(Any, store), backends={}, workers=args.workers)
    loop = runtime.start_loop()
    try:
        assert store.watched
        workers = sorted(
            t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("dispatch-worker-")
        )
        assert workers == ["dispatch-worker-0", "dispatch-worker-1", "dispatch-worker-2"]
    finally:
        await loop.stop()
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("dispatch-worker-")]


async def test_a_backends_wake_up_puts_a_waiting_job_in_the_urgent_lane() -> None:
    def prepare(queue: WorkQueue) -> None:
        for job in ("a", "b"):
            queue.add(job)
        queue.wake_urgent("b")  # as the operator's loop subscribes each job to its backend
        queue.wake_urgent("gone")  # not (or no longer) supervised: nothing to do

    assert await first_turns(2, prepare) == ["b", "a"]


async def test_a_job_decided_before_the_first_list_is_whole_is_not_waited_for_again() -> None:
    """The kit's watches may be synced before the DispatchJob list is whole: jobs listed early have
    their turn then. The decided line must not wait for their next turn (a poll away: it came 5 s
    late at 10,000 jobs, BENCHMARKS.md) but only for the listed jobs that had none yet."""
    from typing import Any, cast

    from dispatch._controller.loop import SupervisionLoop
    from dispatch._controller.runtime import Runtime

    runtime = Runtime(store=cast(Any, object()), backends={})
    clock = iter([0.0, 2.5]).__next__
    loop = SupervisionLoop(runtime, clock=clock)
    loop._started = clock()
    for job in ("ns/early", "ns/late"):
        loop._on_event(job, {})
    loop._decided("ns/early")  # its turn, before the list is whole
    loop._on_synced()
    assert loop.decided_after is None  # ns/late has had no turn yet
    loop._decided("ns/late")
    assert loop.decided_after == 2.5


async def test_the_periodic_look_takes_only_the_jobs_it_is_told_to() -> None:
    """``looked``: after a quiet ``poll_interval`` only those jobs are queued again; a job left out
    has no turn but its first (and those its wake-ups bring)."""
    turns = {"polled": 0, "woken": 0}
    looked_twice = asyncio.Event()

    async def handle(job: str) -> Turn:
        turns[job] += 1
        if turns["polled"] == 3:
            looked_twice.set()
        return Turn.WAIT

    queue = WorkQueue(
        handle, poll_interval=0.02, retry_delays=(0.01,), forever=True, looked=lambda: ["polled"]
    )
    for job in turns:
        queue.add(job)
    worker = asyncio.create_task(queue.work())
    try:
        await asyncio.wait_for(looked_twice.wait(), 10)
    finally:
        worker.cancel()
    assert turns == {"polled": 3, "woken": 1}


async def test_only_jobs_of_a_backend_that_cannot_wake_them_are_looked_at_periodically() -> None:
    """The loop's periodic look skips the workload kit's jobs (it wakes them itself, on its watches
    and its own timers: :class:`~dispatch._protocols.SelfWaking`), also behind the metrics wrapper;
    a backend that makes no such promise (the Slurm adapter polls) keeps it, until the job is let go."""
    from typing import Any, cast

    from dispatch._backends.kubeflow._adapter import KubeflowBackend
    from dispatch._backends.memory._adapter import MemoryBackend
    from dispatch._controller.loop import SupervisionLoop
    from dispatch._controller.metrics import Metrics
    from dispatch._controller.runtime import Runtime
    from dispatch._protocols import Backend
    from tests.support.recorded import RecordedApi

    kit = KubeflowBackend(cast(Any, RecordedApi({"stream": [], "events": []})))
    kit.watches.tasks = [asyncio.get_running_loop().create_task(asyncio.sleep(3600))]  # no informer runs
    metrics = Metrics()
    backends: dict[str, Backend] = {
        "ns/kit": kit,
        "ns/kit-observed": metrics.observe_backend(kit),
        "ns/polled": MemoryBackend(),
        "ns/polled-observed": metrics.observe_backend(MemoryBackend()),
    }
    loop = SupervisionLoop(Runtime(store=cast(Any, object()), backends=backends))
    try:
        for job, backend in backends.items():
            loop._subscribe(job, backend)
        assert sorted(loop._looked) == ["ns/polled", "ns/polled-observed"]
        assert set(loop._unsubscribe) == set(backends)
        loop._let_go("ns/polled")
        assert sorted(loop._looked) == ["ns/polled-observed"]
        assert loop.queue.looked is not None
        assert list(loop.queue.looked()) == ["ns/polled-observed"]
    finally:
        for task in kit.watches.tasks:
            task.cancel()


async def test_a_job_let_go_has_a_turn_when_its_backend_tells_of_a_change_of_its_objects() -> None:
    """``subscribe_others``' wake (a settled job's late object): a job the watch shows and the loop let
    go is queued again; one already queued, one being deleted or one the watch never showed is not
    (an unknown job's turn would read it from the API server)."""
    from typing import Any, cast

    from dispatch._controller.loop import SupervisionLoop
    from dispatch._controller.runtime import Runtime

    class Known:
        def knows(self, job: str) -> bool:
            return job != "ns/unknown"

    loop = SupervisionLoop(Runtime(store=cast(Any, Known()), backends={}))
    loop.queue.add("ns/queued")
    loop._forgotten.add("ns/deleting")
    for job in ("ns/settled", "ns/queued", "ns/deleting", "ns/unknown"):
        loop._other(job)
    assert list(loop.queue.pending) == ["ns/queued", "ns/settled"]
    assert list(loop.queue.lanes[1]) == ["ns/queued", "ns/settled"]  # routine: nothing urgent


async def test_a_settled_jobs_turn_ends_what_an_overseeing_backend_still_shows() -> None:
    """``SupervisionLoop._settled``: a backend that sees every job's objects (``Overseeing``) is
    listed, and an object left held after the job settled (its creator died) is ended, the record
    untouched; a listing that fails lets the job go (the next wake or start looks again); a backend
    that is not overseeing is not listed at all (a request per settled job per start)."""
    from collections.abc import Sequence
    from typing import Any, cast

    from dispatch import JobSpec, MemoryBackend, ObjectView, Phase, Shape
    from dispatch._controller.loop import SupervisionLoop
    from dispatch._controller.runtime import Runtime
    from dispatch._controller.store import view_of
    from dispatch._errors import TransientBackendError
    from tests.support.records import at
    from tests.support.records import dispatch_job as job_body
    from tests.support.supervised import succeeded

    class Overseen(MemoryBackend):
        lists = 0
        failing = False

        def subscribe_others(self, wake: Callable[[str], None]) -> Callable[[], None]:
            return lambda: None

        async def list(self, job: str) -> Sequence[ObjectView]:
            self.lists += 1
            if self.failing:
                raise TransientBackendError("the cache is not synced")
            return await super().list(job)

    class Blind(MemoryBackend):
        lists = 0

        async def list(self, job: str) -> Sequence[ObjectView]:
            self.lists += 1
            return await super().list(job)

    overseen = Overseen(Shape.SLURM, auto_run=True)
    cluster, job = await succeeded(overseen, JobSpec(name="done", command=("train",)))
    record, version = await cluster.store.get(job)
    settled = view_of(at(job_body(record), 7))  # the slim view of the job the store keeps
    late = await overseen.create(job, 2, record.spec, record.plan)  # its creator died here
    blind = Blind(Shape.SLURM)
    loop = SupervisionLoop(
        Runtime(store=cast(Any, cluster.store), backends={"overseen": overseen, "blind": blind})
    )

    overseen.failing = True
    assert await loop._settled(job, settled, "overseen") is Turn.DONE
    assert {v.id: v.phase for v in await MemoryBackend.list(overseen, job)}[late] is Phase.HELD
    overseen.failing = False
    assert await loop._settled(job, settled, "overseen") is Turn.AGAIN
    assert all(v.phase is Phase.ENDED for v in await overseen.list(job))
    assert await loop._settled(job, settled, "overseen") is Turn.DONE
    assert await cluster.store.get(job) == (record, version)  # nothing written

    assert await loop._settled(job, settled, "blind") is Turn.DONE
    assert blind.lists == 0
    await cluster.aclose()


async def idle(queue: WorkQueue, workers: int) -> list[asyncio.Task[None]]:
    """``workers`` workers started on ``queue``, returned once every one of them waits."""
    tasks = [asyncio.create_task(queue.work()) for _ in range(workers)]
    for _ in range(100):  # each worker starts waiting on its first step
        await asyncio.sleep(0)
    assert len(queue.waiting) == workers
    return tasks


async def test_a_queued_job_wakes_one_idle_worker_not_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waking every idle worker for each job cost a reaction 4 % of its CPU (BENCHMARKS.md)."""
    done = asyncio.Event()

    async def handle(job: str) -> Turn:
        done.set()
        return Turn.WAIT

    queue = WorkQueue(handle, poll_interval=60, retry_delays=(0.01,), forever=True)
    workers = await idle(queue, 8)
    looks = 0
    take = queue._next

    def counted() -> str | None:
        nonlocal looks
        looks += 1
        return take()

    monkeypatch.setattr(queue, "_next", counted)
    try:
        queue.add("job")
        await asyncio.wait_for(done.wait(), 10)
        for _ in range(20):
            await asyncio.sleep(0)
        assert looks == 2  # one worker: the job, then nothing left
        assert len(queue.waiting) == 8
    finally:
        for worker in workers:
            worker.cancel()


async def test_idle_workers_leave_no_waits_behind_as_polls_go_by() -> None:
    queue = WorkQueue(_never, poll_interval=0.005, retry_delays=(0.01,), forever=True, looked=list)
    workers = await idle(queue, 4)
    try:
        await asyncio.sleep(0.2)  # about 40 periodic looks each
        assert len(queue.waiting) <= 4
    finally:
        for worker in workers:
            worker.cancel()


async def _never(job: str) -> Turn:
    raise AssertionError(f"no job was queued, yet {job} had a turn")


async def test_recovering_means_an_urgent_job_waits_for_a_worker() -> None:
    queue = WorkQueue(_never, poll_interval=60, retry_delays=(0.01,))
    queue.add("ns/routine")
    assert not queue.recovering()  # a first look or a poll is routine
    queue.wake_urgent("ns/routine")
    assert queue.recovering()
    assert queue._next() == "ns/routine"  # a worker takes it: no longer waiting
    assert not queue.recovering()
    queue.add("ns/gone", urgent=True)
    await queue.remove("ns/gone")  # removed while it waited
    assert not queue.recovering()


async def test_the_loop_holds_its_events_back_while_recoveries_wait_for_a_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever the write limit, a mass preemption's Events wait for its recoveries: the loop
    points its recorder at the urgent lane while it runs, and lets go when it stops."""
    from typing import Any, cast

    from dispatch._controller import events as events_module
    from dispatch._controller.events import EventRecorder
    from dispatch._controller.runtime import Runtime

    monkeypatch.setattr(events_module, "HELD_INTERVAL", 3600.0)  # nothing trickles but the first
    monkeypatch.setattr(events_module, "HELD_POLL", 0.01)
    posted: list[str] = []

    async def post(namespace: str, body: dict[str, Any]) -> None:
        posted.append(body["note"])

    class Store:
        def watch_all(self, on_event: object, on_synced: object) -> None:
            pass

    recorder = EventRecorder(post)
    runtime = Runtime(store=cast(Any, Store()), backends={}, events=recorder, workers=1)
    loop = runtime.start_loop()
    try:
        queue = loop.queue
        for _ in range(100):  # until the worker is idle, waiting for a wake
            if queue.waiting:
                break
            await asyncio.sleep(0)
        assert queue.waiting
        # A recovery waiting for a worker (as if the worker were busy): queued without a wake.
        queue.pending["ns/a"] = None
        queue.queued.add("ns/a")
        queue.lanes[0].append("ns/a")
        for note in ("first", "held"):
            recorder.emit("ns/b", "Normal", "Recovering", "Resubmit", note)
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert posted == ["first"]  # one trickles out, the other waits
        queue.queued.discard("ns/a")  # a worker took it
        await recorder.drain()
        assert posted == ["first", "held"]
        queue.queued.add("ns/a")  # waiting again as the loop stops
    finally:
        await loop.stop()
    recorder.emit("ns/b", "Normal", "Recovering", "Resubmit", "after")
    async with asyncio.timeout(5):  # held for an hour if the stopped loop still held it
        await recorder.drain()
    assert posted[-1] == "after"
