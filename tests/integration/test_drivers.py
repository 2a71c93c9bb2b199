"""The scheduling rules, written once, run against every driver of the core.

Drivers: the in-process supervisor with no store and with the memory, SQLite and PostgreSQL
stores; and the supervisor with its attempts done by a worker process on DBOS (this test
process: DBOS runs one application per process), on SQLite and on PostgreSQL in real time.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pgtest import fresh_schema

from planrun.core._errors import (
    BudgetExceeded,
    PermanentError,
    StallError,
    TransientError,
    UsageError,
)
from planrun.core._registry import Handler, KindSpec, Registry, TaskContext, WorkerSpec
from planrun.core._task import Status, Task
from planrun.core.scheduling import RetryPolicy, Scheduler
from planrun.core.scheduling._check import index_problems
from planrun.runtime._clock import VirtualClock
from planrun.runtime._supervisor import RunResult, Supervisor
from planrun.stores import InMemoryStore, open_store

FAST = RetryPolicy(attempts=3, base=0.02, cap=0.1, jitter=0.0, max_retry_after=0.2)


class Quiet:
    """A worker's store connection that goes silent while its worker is silenced: no
    heartbeat (a stopped process). Its outcomes still go through, as a process woken up
    again would send them."""

    def __init__(self, store: Any, name: str, silenced: set[str]) -> None:
        self._store, self._name, self._silenced = store, name, silenced

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._store, attr)

    @property
    def silent(self) -> bool:
        return self._name in self._silenced

    async def heartbeat_worker(self, *args: Any) -> None:
        if not self.silent:
            await self._store.heartbeat_worker(*args)


@dataclass
class Driver:
    """How one driver runs a batch of tasks with handlers."""

    name: str
    store: str | None  # None, "memory", "sqlite", "postgres"
    mode: str | None  # None (in process), "dbos"
    virtual: bool
    url: str = ""
    silenced: set[str] = field(default_factory=set)
    """Workers that say nothing (see :class:`Quiet`); in process a handler that does not
    heartbeat is silent by itself."""
    over: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the run returned or raised (handlers that hang wait for it)."""
    resumed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when an interrupted run is resumed."""

    @property
    def external(self) -> bool:
        """Attempts done by worker processes that come and go."""
        return self.mode is not None

    @property
    def lease(self) -> float:
        """A short lease for reclaim tests: virtual seconds cost nothing."""
        return 2.0 if self.virtual else 1.0

    def silence(self, worker: str) -> None:
        self.silenced.add(worker)

    def wake(self, worker: str) -> None:
        self.silenced.discard(worker)

    def refused(self, result: RunResult) -> int:
        """Late results refused by their fencing token (``rejected`` events)."""
        return sum(1 for e in result.events if e.event == "rejected")

    def run(self, tasks: Sequence[Task], handlers: dict[str, Handler],
            interrupt: Callable[[], bool] | None = None, **options: Any) -> RunResult:
        """Run ``tasks`` to the end and return the result.

        With ``interrupt``: stop the driver as soon as it is true (an in-process supervisor
        is cancelled with its attempts; a coordinator is cancelled while its workers go
        on), then resume the stored run with a new driver of the same kind.
        """
        registry = Registry(KindSpec(k, handler=h) for k, h in handlers.items())
        options.setdefault("retry", FAST)
        if self.virtual:
            clock = VirtualClock()
            return clock.run(self._go(registry, list(tasks), options, interrupt, clock))
        try:
            return asyncio.run(asyncio.wait_for(
                self._go(registry, list(tasks), options, interrupt, None), 60))
        except TimeoutError as exc:  # say what the run was waiting for
            raise AssertionError(f"{self.name}: the run did not end: {self._where()}") from exc

    def _where(self) -> str:
        """The state a run that did not end was left in (the driver's mirror, the workers)."""
        core = getattr(getattr(self, "_driving", None), "core", None)
        if core is None:
            return "no driver"
        open_tasks = [f"{t.id}:{t.status.value}" for t in core.tasks.values() if not t.finished]
        failed = [repr(f.exception()) for f in getattr(self, "_serving", [])
                  if f.done() and not f.cancelled() and f.exception() is not None]
        return f"unfinished {open_tasks[:12]}; worker errors {failed}; facts {core.facts}"

    async def _open(self) -> Any:
        if self.store == "memory":
            if not hasattr(self, "_memory"):
                self._memory = InMemoryStore()
                await self._memory.open()
            return self._memory
        store = open_store(self.url)
        await store.open()
        return store

    async def _close(self, store: Any) -> None:
        if store is not None and self.store != "memory":
            with contextlib.suppress(Exception):  # a connection cancelled mid-query
                await store.close()

    @staticmethod
    async def _until(run: Awaitable[RunResult], interrupt: Callable[[], bool]) -> None:
        handle = asyncio.ensure_future(run)
        while not interrupt():
            if handle.done():
                raise AssertionError(f"the run ended before its interruption: {handle.result()}")
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # what was just decided reaches the store
        handle.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await handle

    async def _go(self, registry: Registry, tasks: list[Task], options: dict[str, Any],
                  interrupt: Callable[[], bool] | None, clock: VirtualClock | None
                  ) -> RunResult:
        self.over, self.resumed = asyncio.Event(), asyncio.Event()
        self._driving: Any = None
        self._serving: list[asyncio.Future[None]] = []
        workers = options.pop("workers", None) or [WorkerSpec("w1", None, 4),
                                                   WorkerSpec("w2", None, 4)]
        if not self.external:
            store = await self._open() if self.store else None
            opened = [store]

            def supervisor(run_id: str | None = None) -> Supervisor:
                return Supervisor(registry, workers, store=opened[-1], clock=clock, seed=0,
                                  run_id=run_id, **options)

            try:
                sup = self._driving = supervisor()
                sup.add_tasks(tasks)
                if interrupt is None:
                    return checked(sup.core, await sup.arun())
                await self._until(sup.arun(), interrupt)
                opened.append(await self._open())
                self.resumed.set()
                again = supervisor(sup.run_id)
                return checked(again.core, await again.aresume())
            finally:
                self.over.set()
                for s in opened:
                    await self._close(s)
        assert self.mode == "dbos"
        return await self._on_dbos(registry, tasks, workers, options, interrupt)

    async def _on_dbos(self, registry: Registry, tasks: list[Task], workers: list[WorkerSpec],
                       options: dict[str, Any], interrupt: Callable[[], bool] | None
                       ) -> RunResult:
        """The supervisor here, its attempts done by a worker process on DBOS (this one:
        DBOS runs one application per process) serving the kinds the workers do."""
        from planrun._facade import App
        from planrun.runtime._dbos_attempts import DBOSAttempts
        from planrun.runtime._dbos_worker import DBOSWorker

        lease = options.setdefault("stale_after", 5.0)
        kinds = None
        if all(w.skills is not None for w in workers):
            kinds = sorted({k for w in workers for k in w.skills or {}})
        worker_store = await self._open()
        worker = DBOSWorker(registry, Quiet(worker_store, "dbos-w", self.silenced), self.url,
                            name="dbos-w", kinds=kinds,
                            concurrency=sum(w.capacity for w in workers), lease_s=lease)
        serving = asyncio.ensure_future(worker.arun())
        self._serving = [serving]
        ready = asyncio.ensure_future(worker.ready.wait())
        await asyncio.wait([ready, serving], return_when=asyncio.FIRST_COMPLETED)
        if serving.done():
            serving.result()  # the worker could not start: say why
        opened = [await self._open()]
        attempts = DBOSAttempts(self.url, opened[0], lease_s=lease,
                                in_flight=sum(w.capacity for w in workers))
        app = attempts.app(App(registry))

        def supervisor(run_id: str | None = None) -> Supervisor:
            return Supervisor(app.registry, app.worker_specs(), store=opened[-1], seed=0,
                              run_id=run_id, **options)

        try:
            sup = self._driving = supervisor()
            sup.add_tasks(tasks)
            if interrupt is None:
                return checked(sup.core, await sup.arun())
            await self._until(sup.arun(), interrupt)
            opened.append(await self._open())
            attempts.store = opened[-1]
            self.resumed.set()
            again = supervisor(sup.run_id)
            return checked(again.core, await again.aresume())
        finally:
            self.over.set()
            await attempts.aclose()
            worker.stop()
            await asyncio.gather(serving, return_exceptions=True)
            for s in (*opened, worker_store):
                await self._close(s)


def checked(core: Scheduler, result: RunResult, queues: bool = True) -> RunResult:
    """``result``, once the driver's core is found to hold what its records imply (see
    :func:`planrun.core.scheduling._check.index_problems`): every rule below runs it."""
    problems = index_problems(core, queues=queues)
    assert problems == [], problems
    return result


DRIVERS = [
    ("supervisor", None, None, True),
    ("supervisor-memory", "memory", None, True),
    ("supervisor-sqlite", "sqlite", None, False),
    ("supervisor-postgres", "postgres", None, False),
    ("dbos-sqlite", "sqlite", "dbos", False),
    ("dbos-postgres", "postgres", "dbos", False),
]


NOT_ROUTED = {
    d[0]: "DBOS queues give attempts to the processes serving them: no strategy picks one"
    for d in DRIVERS if d[2] == "dbos"}
"""Drivers the routing rules do not apply to, and why."""
NOT_RESUMABLE = {d[0]: "no store: nothing outlives the run to resume it from"
                 for d in DRIVERS if d[1] is None}
"""Drivers the resume rule does not apply to, and why."""
ROUTED = [d for d in DRIVERS if d[0] not in NOT_ROUTED]
RESUMABLE = [d for d in DRIVERS if d[0] not in NOT_RESUMABLE]
ON_DBOS = [d for d in DRIVERS if d[2] == "dbos"]


def make_driver(param: tuple[str, str | None, str | None, bool],
                tmp_path: Path) -> Iterator[Driver]:
    name, store, mode, virtual = param
    d = Driver(name, store, mode, virtual)
    if store == "sqlite":
        d.url = f"sqlite:///{tmp_path / 'run.db'}"
    if store == "postgres":
        for url in fresh_schema("planrun_drv"):
            d.url = url
            yield d
        return
    yield d


@pytest.fixture(params=DRIVERS, ids=[d[0] for d in DRIVERS])
def driver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Driver]:
    yield from make_driver(request.param, tmp_path)


@pytest.fixture(params=ROUTED, ids=[d[0] for d in ROUTED])
def routing_driver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Driver]:
    """Every driver where a strategy picks the worker (not peer mode: see NOT_ROUTED)."""
    yield from make_driver(request.param, tmp_path)


@pytest.fixture(params=ON_DBOS, ids=[d[0] for d in ON_DBOS])
def dbos_driver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Driver]:
    yield from make_driver(request.param, tmp_path)


@pytest.fixture(params=RESUMABLE, ids=[d[0] for d in RESUMABLE])
def durable_driver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Driver]:
    """Every driver with a store (see NOT_RESUMABLE)."""
    yield from make_driver(request.param, tmp_path)


def chain(n: int, kind: str = "k", prefix: str = "t") -> list[Task]:
    return [Task(id=f"{prefix}{i}", kind=kind,
                 depends_on=(f"{prefix}{i - 1}",) if i else ()) for i in range(n)]


async def ok(payload: Any, ctx: TaskContext) -> str:
    await asyncio.sleep(0.001)
    return f"done {ctx.task_id}"


def completion_order(result: RunResult) -> list[str]:
    return [e.task for e in sorted(result.events, key=lambda e: e.seq)
            if e.event == "completed"]


def assignments(result: RunResult) -> list[tuple[str, str | None]]:
    """(task, worker) of every ``assigned`` event, in ledger order."""
    return [(e.task, e.worker) for e in sorted(result.events, key=lambda e: e.seq)
            if e.event == "assigned"]


def events_of(result: RunResult, task: str, name: str) -> list[Any]:
    return [e for e in result.events if e.task == task and e.event == name]


# ---- readiness ---------------------------------------------------------------------------


def test_nothing_starts_before_its_dependencies(driver: Driver) -> None:
    tasks = [
        Task(id="d", kind="k", depends_on=("b", "c")),
        Task(id="b", kind="k", depends_on=("a",)),
        Task(id="c", kind="k", depends_on=("a",)),
        Task(id="a", kind="k"),
    ]
    result = driver.run(tasks, {"k": ok})
    assert result.ok and result.audit.clean
    order = completion_order(result)
    assert order[0] == "a" and order[-1] == "d"
    assert result.tasks["d"].result == "done d"


# ---- routing: the four strategies, where the driver routes ---------------------------------


def gated(driver: Driver) -> Handler:
    """A handler whose task ``gate`` takes half a second with worker processes: the tasks
    after it become ready at once, when every worker process has long registered (the
    supervisor knows its workers from the start)."""
    gate_s = 0.5 if driver.external else 0.001

    async def work(payload: Any, ctx: TaskContext) -> str:
        await asyncio.sleep(gate_s if ctx.task_id == "gate" else 0.001)
        return f"done {ctx.task_id}"

    return work


def after_gate(tasks: Sequence[Task]) -> list[Task]:
    return [Task(id="gate", kind=tasks[0].kind),
            *(t.evolve(depends_on=("gate", *t.depends_on)) for t in tasks)]


def test_round_robin_gives_each_capable_worker_its_turn(routing_driver: Driver) -> None:
    # Estimates that grow: a strategy ordering by critical path would start t5 first.
    fan = [Task(id=f"t{i}", kind="k", estimate_s=float(i + 1)) for i in range(6)]
    d = routing_driver
    result = d.run(after_gate(fan), {"k": gated(d)}, strategy="round_robin")
    assert result.ok and result.audit.clean
    got = [(t, w) for t, w in assignments(result) if t != "gate"]
    assert [t for t, _ in got] == [f"t{i}" for i in range(6)]  # the order they were added
    workers = [w for _, w in got]
    assert Counter(workers) == {"w1": 3, "w2": 3}
    assert all(a != b for a, b in itertools.pairwise(workers)), workers


def test_least_loaded_sends_work_to_the_worker_with_the_least_queued(
        routing_driver: Driver) -> None:
    fan = [Task(id="big", kind="k", estimate_s=10.0),
           *(Task(id=f"s{i}", kind="k", estimate_s=1.0) for i in range(4))]
    d = routing_driver
    result = d.run(after_gate(fan), {"k": gated(d)}, strategy="least_loaded")
    assert result.ok and result.audit.clean
    got = dict(a for a in assignments(result) if a[0] != "gate")
    # 10 s queued on one worker: the four 1 s tasks (4 s in all) all go to the other
    assert {got[f"s{i}"] for i in range(4)} == {"w1", "w2"} - {got["big"]}


def test_capability_routes_a_kind_only_to_workers_that_do_it(routing_driver: Driver) -> None:
    workers = [WorkerSpec("w1", {"plain": 1.0}, 4),
               WorkerSpec("w2", {"plain": 3.0, "special": 1.0}, 4)]
    fan = [*(Task(id=f"x{i}", kind="special") for i in range(2)),
           *(Task(id=f"p{i}", kind="plain") for i in range(4))]
    d = routing_driver
    result = d.run(after_gate(fan), {"plain": gated(d), "special": gated(d)},
                   strategy="capability", workers=workers)
    assert result.ok and result.audit.clean
    got = dict(a for a in assignments(result) if a[0] != "gate")
    assert got["x0"] == got["x1"] == "w2"  # the only worker doing "special"
    if not routing_driver.external:
        # the most skilled worker takes the kind (worker processes report kinds, not speeds)
        assert {got[f"p{i}"] for i in range(4)} == {"w2"}


def test_balanced_starts_the_longest_critical_path_first(routing_driver: Driver) -> None:
    # "s" is added first, but "l0" heads a chain three times as long
    tasks = [Task(id="s", kind="k"), *chain(3, prefix="l")]
    d = routing_driver
    result = d.run(after_gate(tasks), {"k": gated(d)}, strategy="balanced")
    assert result.ok and result.audit.clean
    order = [t for t, _ in assignments(result)]
    assert order.index("l0") < order.index("s"), order
    # with nothing else queued, the earliest finish for "s" is on the idle worker
    got = dict(assignments(result))
    assert got["s"] != got["l0"]


def test_on_dbos_queues_route_not_a_strategy(dbos_driver: Driver) -> None:
    result = dbos_driver.run([*chain(3), Task(id="free", kind="k")], {"k": ok},
                             strategy="round_robin")
    assert result.ok and result.audit.clean
    # every attempt went to the queues (one worker here), whichever process then took it
    assert {w for _, w in assignments(result)} == {"dbos"}
    assert {t.result for t in result.tasks.values()} == {f"done {t}" for t in result.tasks}


# ---- retries, backoff, budget of retries, permanent errors -------------------------------


def test_transient_errors_are_retried_until_they_succeed(driver: Driver) -> None:
    seen: Counter[str] = Counter()

    async def flaky(payload: Any, ctx: TaskContext) -> str:
        seen[ctx.task_id] += 1
        if seen[ctx.task_id] < 3:
            raise TransientError("try again")
        return "ok"

    result = driver.run([Task(id="f", kind="k")], {"k": flaky})
    task = result.tasks["f"]
    assert task.status is Status.COMPLETED and task.attempts == 3
    retries = [e for e in result.events if e.event == "retry"]
    assert len(retries) == 2


def test_retries_stop_at_max_attempts(driver: Driver) -> None:
    async def down(payload: Any, ctx: TaskContext) -> None:
        raise TransientError("the upstream is down")

    result = driver.run([Task(id="f", kind="k", max_attempts=2), *chain(2, prefix="x")],
                        {"k": down})
    assert result.tasks["f"].status is Status.DEAD and result.tasks["f"].attempts == 2


def test_the_run_wide_retry_budget_is_spent_once(driver: Driver) -> None:
    async def down(payload: Any, ctx: TaskContext) -> None:
        raise TransientError("the upstream is down")

    batch = [Task(id=f"f{i}", kind="k", max_attempts=10) for i in range(3)]
    result = driver.run(batch, {"k": down}, retry_budget=4)
    assert len([e for e in result.events if e.event == "retry"]) == 4
    assert all(t.status is Status.DEAD for t in result.tasks.values())
    assert sum(t.attempts for t in result.tasks.values()) == 3 + 4
    assert all((t.error or "").endswith("(retry budget exhausted)")
               for t in result.tasks.values())


def test_a_permanent_error_is_dead_at_once_and_cancels_its_dependents(driver: Driver) -> None:
    async def work(payload: Any, ctx: TaskContext) -> str:
        if ctx.task_id == "t0":
            raise PermanentError("400 bad request")
        return "ok"

    result = driver.run([*chain(3), Task(id="free", kind="k")], {"k": work})
    assert result.tasks["t0"].status is Status.DEAD and result.tasks["t0"].attempts == 1
    assert [result.tasks[t].status for t in ("t1", "t2")] == [Status.CANCELLED] * 2
    assert {result.tasks[t].cause for t in ("t1", "t2")} == {"t0"}
    assert result.tasks["free"].status is Status.COMPLETED


def test_abort_run_cancels_everything_left(driver: Driver) -> None:
    async def work(payload: Any, ctx: TaskContext) -> str:
        if ctx.task_id == "t0":
            raise PermanentError("boom")
        return "ok"

    result = driver.run(chain(3), {"k": work}, on_dead="abort_run")
    assert result.aborted_by == "t0"
    assert [result.tasks[t].status for t in ("t1", "t2")] == [Status.CANCELLED] * 2
    assert result.tasks["t1"].cause == "abort: t0 died"


def test_a_long_retry_after_is_clamped_and_the_run_goes_on(driver: Driver) -> None:
    seen: Counter[str] = Counter()

    async def limited(payload: Any, ctx: TaskContext) -> str:
        seen[ctx.task_id] += 1
        if seen[ctx.task_id] == 1:
            raise TransientError("429", retry_after=3600.0)
        return "ok"

    result = driver.run([Task(id="r", kind="k")], {"k": limited}, stall_after=30.0)
    assert result.tasks["r"].status is Status.COMPLETED and result.tasks["r"].attempts == 2
    assert result.makespan < 10.0  # clamped to max_retry_after (0.2 s), not an hour


# ---- reclaim and fencing -------------------------------------------------------------------


def test_a_silent_attempt_is_reclaimed_and_its_late_result_refused(driver: Driver) -> None:
    lease = driver.lease
    calls: Counter[str] = Counter()
    second = asyncio.Event()

    async def work(payload: Any, ctx: TaskContext) -> str:
        calls[ctx.task_id] += 1
        if ctx.task_id != "h":
            return "ok"
        if calls["h"] == 1:  # goes silent (no heartbeat) until another attempt has started
            driver.silence(ctx.worker)
            try:
                await asyncio.wait_for(second.wait(), 30 * lease)
            finally:
                driver.wake(ctx.worker)
            return "late"
        second.set()
        await asyncio.sleep(lease / 2)  # still running when the late result comes in
        return "fresh"

    result = driver.run([Task(id="h", kind="k"), Task(id="x", kind="k", depends_on=("h",))],
                        {"k": work}, stale_after=lease)
    assert result.ok and result.audit.clean
    h = result.tasks["h"]
    assert h.result == "fresh" and h.reclaims == 1 and calls["h"] == 2
    [reclaimed] = events_of(result, "h", "reclaimed")
    assert reclaimed.detail.get("reason") == "lease expired"
    [completed] = events_of(result, "h", "completed")
    assert completed.attempt > reclaimed.attempt  # under the token the reclaim moved on
    assert driver.refused(result) == 1  # the silent attempt's "late" was fenced off
    assert result.tasks["x"].status is Status.COMPLETED


def test_max_reclaims_makes_a_task_that_keeps_going_silent_dead(driver: Driver) -> None:
    async def work(payload: Any, ctx: TaskContext) -> str:
        if ctx.task_id == "h":
            driver.silence(ctx.worker)
            await driver.over.wait()
        return "ok"

    tasks = [Task(id="h", kind="k"), Task(id="x", kind="k", depends_on=("h",)),
             Task(id="free", kind="k")]
    result = driver.run(tasks, {"k": work}, stale_after=driver.lease, max_reclaims=1)
    h = result.tasks["h"]
    assert h.status is Status.DEAD and h.reclaims == 1
    assert "reclaimed 1 times" in (h.error or "")
    assert len(events_of(result, "h", "reclaimed")) == 1
    assert result.tasks["x"].status is Status.CANCELLED and result.tasks["x"].cause == "h"
    assert result.tasks["free"].status is Status.COMPLETED


# ---- stall ---------------------------------------------------------------------------------


def test_a_run_that_cannot_move_stalls(driver: Driver) -> None:
    stall = driver.lease

    async def hang(payload: Any, ctx: TaskContext) -> str:
        while not driver.over.is_set():  # alive (its lease renewed) but never done
            ctx.heartbeat()
            await asyncio.sleep(stall / 4)
        return "late"

    with pytest.raises(StallError, match=r"stalled: .* h \(running\)"):
        driver.run([Task(id="h", kind="k"), Task(id="x", kind="k", depends_on=("h",))],
                   {"k": hang}, stall_after=stall)


def test_a_kind_no_worker_does_is_refused_up_front_or_stalls(driver: Driver) -> None:
    workers = [WorkerSpec("w1", {"k": 1.0}, 4), WorkerSpec("w2", {"k": 1.0}, 4)]
    tasks = [Task(id="a", kind="k"), Task(id="o", kind="orphan")]
    handlers = {"k": ok, "orphan": ok}
    if not driver.external:  # the supervisor knows its workers before it starts
        with pytest.raises(UsageError, match="no registered worker does kind 'orphan'"):
            driver.run(tasks, handlers, workers=workers)
        return
    # worker processes come and go: a kind nobody serves waits (on its DBOS queue), then
    # stalls
    waits = "running" if driver.mode == "dbos" else "pending"
    with pytest.raises(StallError, match=rf"o \({waits}\)"):
        driver.run(tasks, handlers, workers=workers, stall_after=driver.lease)


def test_a_task_waiting_for_a_known_retry_time_is_not_a_stall(driver: Driver) -> None:
    stall = driver.lease
    seen: Counter[str] = Counter()

    async def limited(payload: Any, ctx: TaskContext) -> str:
        seen[ctx.task_id] += 1
        if seen[ctx.task_id] == 1:
            raise TransientError("429", retry_after=1.5 * stall)
        return "ok"

    retry = RetryPolicy(attempts=3, base=0.02, cap=0.1, jitter=0.0, max_retry_after=3 * stall)
    result = driver.run([Task(id="r", kind="k")], {"k": limited}, stall_after=stall,
                        retry=retry)
    assert result.ok and result.tasks["r"].attempts == 2
    [failed] = events_of(result, "r", "failed")
    [retried] = events_of(result, "r", "retry")
    assert retried.at - failed.at >= 1.5 * stall - 0.05  # waited past stall_after, no stall


# ---- the budget stop ---------------------------------------------------------------------


def test_a_budget_stop_cancels_every_task_left_with_cause_budget(driver: Driver) -> None:
    async def spend(payload: Any, ctx: TaskContext) -> str:
        if ctx.task_id == "t0":
            raise BudgetExceeded("the run's token budget is spent")
        return "ok"

    result = driver.run([*chain(4), *chain(2, prefix="x")], {"k": spend}, stall_after=20.0)
    assert result.budget_exhausted
    left = [t for t in result.tasks.values() if t.status is not Status.COMPLETED]
    assert {t.id for t in left} >= {"t0", "t1", "t2", "t3"}
    assert all(t.status is Status.CANCELLED and t.cause == "budget" for t in left)
    assert result.makespan < 15.0  # within seconds, not a stall


# ---- the deadline ------------------------------------------------------------------------


def test_past_the_deadline_nothing_new_starts(driver: Driver) -> None:
    async def slow(payload: Any, ctx: TaskContext) -> str:
        await asyncio.sleep(0.4)
        return "ok"

    result = driver.run(chain(6), {"k": slow}, deadline_s=1.0)
    assert result.deadline_reached and not result.ok
    statuses = [result.tasks[f"t{i}"].status for i in range(6)]
    assert statuses[0] is Status.COMPLETED
    assert statuses[-1] is Status.CANCELLED and result.tasks["t5"].cause == "deadline"


# ---- resource locks ----------------------------------------------------------------------


def test_tasks_sharing_a_resource_never_overlap(driver: Driver) -> None:
    spans: dict[str, tuple[float, float]] = {}

    async def write(payload: Any, ctx: TaskContext) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(0.05)
        spans[ctx.task_id] = (start, loop.time())

    tasks = [Task(id=f"r{i}", kind="k", resources=("db",)) for i in range(4)]
    result = driver.run(tasks, {"k": write})
    assert result.ok
    ordered = sorted(spans.values())
    assert all(a[1] <= b[0] + 1e-9 for a, b in itertools.pairwise(ordered))


# ---- effects once, retried while they fail ----------------------------------------------


def test_an_effect_is_applied_once_and_retried_while_it_fails(driver: Driver) -> None:
    applied: Counter[str] = Counter()
    failures = Counter({"t1": 1})

    def send(task: Task, key: str) -> None:
        if failures[task.id]:
            failures[task.id] -= 1
            raise TransientError("503 from the mail API")
        applied[key] += 1

    result = driver.run(chain(3), {"k": ok}, effects={"k": send})
    assert result.ok, result.effects_failed
    assert sorted(applied.values()) == [1, 1, 1]
    assert result.audit.clean and result.audit.duplicate_effects == 0
    assert len([e for e in result.events if e.event == "effect"]) == 3


def test_an_effect_that_keeps_failing_makes_the_run_not_ok(driver: Driver) -> None:
    def send(task: Task, key: str) -> None:
        raise TransientError("503 from the mail API")

    from planrun.core.scheduling import EFFECT_RETRY

    assert EFFECT_RETRY.attempts > 1
    result = driver.run([Task(id="t", kind="k")], {"k": ok}, effects={"k": send},
                        effect_retry=RetryPolicy(attempts=2, base=0.01, jitter=0.0))
    assert not result.ok and "t" in result.effects_failed
    assert result.audit.missing_effects == ["t"] and not result.audit.clean


# ---- values a store cannot keep ----------------------------------------------------------


def test_a_result_that_is_not_json_fails_its_task_at_once(driver: Driver) -> None:
    async def when(payload: Any, ctx: TaskContext) -> Any:
        return {"when": datetime.datetime(2026, 1, 1)}

    result = driver.run([Task(id="t", kind="k")], {"k": when})
    task = result.tasks["t"]
    assert task.status is Status.DEAD and task.attempts == 1
    assert "datetime" in (task.error or "")


# ---- resume --------------------------------------------------------------------------------


def test_an_interrupted_run_resumes_each_task_once_keeping_retries_spent(
        durable_driver: Driver) -> None:
    d = durable_driver
    calls: Counter[str] = Counter()

    async def work(payload: Any, ctx: TaskContext) -> str:
        calls[ctx.task_id] += 1
        if ctx.task_id == "f" and calls["f"] == 1:
            raise TransientError("503")  # spends the run's one retry before the stop
        if ctx.task_id == "g":
            raise TransientError("503 again")  # after the resume: no retry is left
        if ctx.task_id in ("h1", "h2"):
            await d.resumed.wait()  # in flight when the driver stops
        return f"done {ctx.task_id}"

    tasks = [Task(id="f", kind="k"), Task(id="h1", kind="k"), Task(id="h2", kind="k"),
             Task(id="g", kind="k", depends_on=("h1",)),
             Task(id="after", kind="k", depends_on=("f", "h2"))]
    result = d.run(tasks, {"k": work}, retry_budget=1, max_reclaims=0,
                   interrupt=lambda: calls["f"] >= 2 and calls["h1"] > 0 and calls["h2"] > 0)
    for tid in ("f", "h1", "h2", "after"):
        assert result.tasks[tid].status is Status.COMPLETED, result.tasks[tid]
        assert len(events_of(result, tid, "completed")) == 1
        assert result.tasks[tid].reclaims == 0  # a restart is no reclaim (max_reclaims=0)
    assert result.tasks["after"].result == "done after"
    g = result.tasks["g"]
    assert g.status is Status.DEAD and g.attempts == 1
    assert (g.error or "").endswith("(retry budget exhausted)")
    assert len([e for e in result.events if e.event == "retry"]) == 1
    assert result.audit.duplicates == 0 and result.audit.order_violations == 0
    assert result.audit.missing == ["g"]
    # The stopped supervisor's attempts were put back and run again (on DBOS: the attempts
    # its stop left on their queues were cancelled there).
    assert {e.task for e in result.events if e.event == "reclaimed"} == {"h1", "h2"}
    assert calls["h1"] == calls["h2"] == 2


def test_every_driver_is_listed() -> None:
    names = [d[0] for d in DRIVERS]
    assert len(names) == len(set(names)) == 6
    assert {d[2] for d in DRIVERS} == {None, "dbos"}
    assert {d[1] for d in DRIVERS} == {None, "memory", "sqlite", "postgres"}
    # each exclusion is a mode without the feature, with its reason; everything else runs
    assert set(NOT_ROUTED) == {d[0] for d in DRIVERS if d[2] == "dbos"}
    assert set(NOT_RESUMABLE) == {"supervisor"}
    assert len(ROUTED) + len(NOT_ROUTED) == len(RESUMABLE) + len(NOT_RESUMABLE) == 6

