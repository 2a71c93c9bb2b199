"""The scheduling rules, written once, run against every driver of the core.

Drivers: the in-process supervisor with no store and with the memory, SQLite and PostgreSQL
stores; external workers (a coordinator and in-process worker processes on their own store
connections) in push and peer mode, on the memory store under a virtual clock and on SQLite
and PostgreSQL in real time. A rule that needs what a mode cannot do (resource locks in peer
mode) asserts that the mode refuses it.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pgtest import fresh_schema

from planrun.clock import VirtualClock
from planrun.distributed import Coordinator, WorkerProcess
from planrun.errors import BudgetExceeded, PermanentError, TransientError, UsageError
from planrun.registry import Handler, KindSpec, Registry, TaskContext, WorkerSpec
from planrun.scheduling import RetryPolicy
from planrun.stores import InMemoryStore, open_store
from planrun.supervisor import RunResult, Supervisor
from planrun.task import Status, Task

FAST = RetryPolicy(attempts=3, base=0.02, cap=0.1, jitter=0.0, max_retry_after=0.2)


@dataclass
class Driver:
    """How one driver runs a batch of tasks with handlers."""

    name: str
    store: str | None  # None, "memory", "sqlite", "postgres"
    mode: str | None  # None (in process), "push", "peer"
    virtual: bool
    url: str = ""

    @property
    def external(self) -> bool:
        return self.mode is not None

    def run(self, tasks: Sequence[Task], handlers: dict[str, Handler],
            **options: Any) -> RunResult:
        """Run ``tasks`` to the end and return the result."""
        registry = Registry(KindSpec(k, handler=h) for k, h in handlers.items())
        options.setdefault("retry", FAST)
        if self.virtual:
            clock = VirtualClock()
            return clock.run(self._go(registry, list(tasks), options, clock))
        return asyncio.run(asyncio.wait_for(self._go(registry, list(tasks), options, None), 60))

    async def _open(self) -> Any:
        if self.store == "memory":
            if not hasattr(self, "_memory"):
                self._memory = InMemoryStore()
                await self._memory.open()
            return self._memory
        store = open_store(self.url)
        await store.open()
        return store

    async def _go(self, registry: Registry, tasks: list[Task], options: dict[str, Any],
                  clock: VirtualClock | None) -> RunResult:
        if not self.external:
            store = await self._open() if self.store else None
            workers = options.pop("workers", None) or [WorkerSpec("w1", None, 4),
                                                       WorkerSpec("w2", None, 4)]
            sup = Supervisor(registry, workers, store=store, clock=clock, seed=0, **options)
            sup.add_tasks(tasks)
            try:
                return await sup.arun()
            finally:
                if store is not None and self.store != "memory":
                    await store.close()
        options.pop("workers", None)
        options.pop("stale_after", None)
        lease = options.pop("lease_s", 5.0)
        coordinator_store = await self._open()
        worker_stores = [await self._open() for _ in range(2)]
        assert self.mode in ("push", "peer")
        procs = [WorkerProcess(registry, s, name=f"w{i}", capacity=4, mode=self.mode,
                               poll=0.01, lease_s=lease, clock=clock)
                 for i, s in enumerate(worker_stores, 1)]
        serving = [asyncio.ensure_future(p.arun()) for p in procs]
        try:
            coordinator = Coordinator(registry, coordinator_store, mode=self.mode,
                                      poll=0.01, stale_after=lease, clock=clock, **options)
            return await coordinator.arun(tasks)
        finally:
            for p in procs:
                p.stop()
            await asyncio.gather(*serving, return_exceptions=True)
            if self.store != "memory":
                for s in [coordinator_store, *worker_stores]:
                    await s.close()


DRIVERS = [
    ("supervisor", None, None, True),
    ("supervisor-memory", "memory", None, True),
    ("supervisor-sqlite", "sqlite", None, False),
    ("supervisor-postgres", "postgres", None, False),
    ("push-memory", "memory", "push", True),
    ("peer-memory", "memory", "peer", True),
    ("push-sqlite", "sqlite", "push", False),
    ("peer-postgres", "postgres", "peer", False),
]


@pytest.fixture(params=DRIVERS, ids=[d[0] for d in DRIVERS])
def driver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Driver]:
    name, store, mode, virtual = request.param
    d = Driver(name, store, mode, virtual)
    if store == "sqlite":
        d.url = f"sqlite:///{tmp_path / 'run.db'}"
    if store == "postgres":
        for url in fresh_schema("planrun_drv"):
            d.url = url
            yield d
        return
    yield d


def chain(n: int, kind: str = "k", prefix: str = "t") -> list[Task]:
    return [Task(id=f"{prefix}{i}", kind=kind,
                 depends_on=(f"{prefix}{i - 1}",) if i else ()) for i in range(n)]


async def ok(payload: Any, ctx: TaskContext) -> str:
    await asyncio.sleep(0.001)
    return f"done {ctx.task_id}"


def completion_order(result: RunResult) -> list[str]:
    return [e.task for e in sorted(result.events, key=lambda e: e.seq)
            if e.event == "completed"]


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
    if driver.mode == "peer":
        with pytest.raises(UsageError, match="push mode"):
            driver.run(tasks, {"k": write})
        return
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

    from planrun.scheduling import EFFECT_RETRY

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


def test_every_driver_is_listed() -> None:
    names = [d[0] for d in DRIVERS]
    assert len(names) == len(set(names)) == 8
    assert {d[2] for d in DRIVERS} == {None, "push", "peer"}
    assert {d[1] for d in DRIVERS} == {None, "memory", "sqlite", "postgres"}

