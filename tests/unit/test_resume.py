"""Durable runs in memory: every transition reaches the store, and resume carries on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from planrun.core._errors import StoreError, TransientError, UsageError
from planrun.core._ledger import analyze
from planrun.core._registry import KindSpec, Registry, TaskContext, WorkerSpec
from planrun.core._task import Status, Task, transition
from planrun.core.scheduling import RetryPolicy
from planrun.runtime._clock import VirtualClock
from planrun.runtime._supervisor import Supervisor
from planrun.stores import InMemoryStore

calls: list[str] = []


async def work(payload: Any, ctx: TaskContext) -> str:
    calls.append(ctx.task_id)
    await asyncio.sleep(0.001)
    return f"done {ctx.task_id}"


def make(store: InMemoryStore, run_id: str = "r1", **options: Any) -> Supervisor:
    registry = Registry([KindSpec("k", handler=work)])
    options.setdefault("clock", VirtualClock())
    return Supervisor(registry, [WorkerSpec("w", None, 2)], store=store, run_id=run_id,
                      seed=0, **options)


def chain(n: int) -> list[Task]:
    return [Task(id=f"t{i}", kind="k", depends_on=(f"t{i-1}",) if i else ()) for i in range(n)]


async def with_store(coro_fn: Any) -> Any:
    store = InMemoryStore()
    await store.open()
    return await coro_fn(store)


def test_every_transition_and_event_reaches_the_store() -> None:
    async def go(store: InMemoryStore) -> Any:
        sup = make(store, clock=None)
        sup.add_tasks(chain(4))
        result = await sup.arun()
        return result, await store.load("r1"), await store.list_runs()

    result, state, runs = asyncio.run(with_store(go))
    assert {t.id: t for t in state.tasks} == dict(result.tasks)
    assert [(e.seq, e.task, e.event) for e in state.events] == \
        [(e.seq, e.task, e.event) for e in result.events]
    assert analyze(state.tasks, state.events).clean
    assert runs[0].status == "finished" and runs[0].counts["completed"] == 4


def crashed_state() -> tuple[list[Task], Any]:
    """A run as a dead supervisor left it: done, running, assigned, failed, pending."""
    base = chain(5)
    done = transition(transition(transition(base[0], Status.ASSIGNED, token=1),
                                 Status.RUNNING), Status.COMPLETED, result="kept", attempts=1)
    running = transition(transition(base[1], Status.ASSIGNED, token=1, assigned_to="w"),
                         Status.RUNNING, lease=5.0)
    return [done, running, *base[2:]], None


def test_resume_keeps_results_and_reclaims_in_flight_work() -> None:
    calls.clear()

    async def go(store: InMemoryStore) -> Any:
        from planrun.stores.base import RunInfo

        tasks, _ = crashed_state()
        await store.create_run(RunInfo("r1", 0.0, "running"))
        await store.add_tasks("r1", tasks, [])
        sup = make(store, clock=None)
        return await sup.aresume(), await store.load("r1")

    result, state = asyncio.run(with_store(go))
    assert result.ok
    assert result.tasks["t0"].result == "kept"
    assert "t0" not in calls  # never run again
    t1 = result.tasks["t1"]
    # A restart reclaims without counting: only a lease that expired under a live driver
    # counts toward max_reclaims; and a reclaim consumes no attempt.
    assert t1.reclaims == 0 and t1.attempts == 1
    assert t1.token == 2  # a new assignment: the dead supervisor's token is stale
    reclaimed = [e for e in result.events if e.event == "reclaimed"]
    assert [e.detail["reason"] for e in reclaimed] == ["supervisor restart"]
    assert state.run.status == "finished"


def test_resume_keeps_backoff_deadlines() -> None:
    async def go(store: InMemoryStore) -> Any:
        from planrun.stores.base import RunInfo

        task = Task(id="t", kind="k", max_attempts=3)
        failed = transition(transition(transition(task, Status.ASSIGNED, token=1),
                                       Status.RUNNING),
                            Status.FAILED, attempts=1, not_before=50.0, error="x")
        await store.create_run(RunInfo("r1", 0.0, "running"))
        await store.add_tasks("r1", [failed], [])
        sup = make(store, clock=clock_result)
        return await sup.aresume()

    clock_result = VirtualClock()

    async def outer() -> Any:
        return await with_store(go)

    result = clock_result.run(outer())
    started = next(e.at for e in result.events if e.event == "started")
    assert started == pytest.approx(50.0)


def test_resume_cancels_dependents_of_a_task_that_died_before_the_crash() -> None:
    async def go(store: InMemoryStore) -> Any:
        from planrun.stores.base import RunInfo

        tasks = chain(3)
        dead = transition(tasks[0], Status.DEAD, error="boom")
        await store.create_run(RunInfo("r1", 0.0, "running"))
        await store.add_tasks("r1", [dead, *tasks[1:]], [])
        return await make(store, clock=None).aresume()

    result = asyncio.run(with_store(go))
    assert [result.tasks[t].status for t in ("t1", "t2")] == [Status.CANCELLED] * 2


def test_effect_begun_but_not_recorded_is_applied_again_with_the_same_key() -> None:
    applied: list[str] = []

    async def go(store: InMemoryStore) -> Any:
        from planrun.stores.base import RunInfo

        task = transition(transition(transition(Task(id="t", kind="k"), Status.ASSIGNED,
                                                token=1), Status.RUNNING),
                          Status.COMPLETED, result="r", attempts=1)
        await store.create_run(RunInfo("r1", 0.0, "running"))
        await store.add_tasks("r1", [task, Task(id="u", kind="k")], [])
        await store.effect_begin("r1", "t", "r1:t", 1.0)  # the crash came after this
        sup = make(store, clock=None, effects={"k": lambda t, key: applied.append(key)})
        result = await sup.aresume()
        return result, await store.load("r1")

    result, state = asyncio.run(with_store(go))
    assert applied.count("r1:t") == 1 and applied.count("r1:u") == 1
    assert {k: v.state for k, v in state.effects.items()} == {"t": "applied", "u": "applied"}
    assert result.audit.duplicate_effects == 0


def test_resume_misuse() -> None:
    async def go(store: InMemoryStore) -> None:
        sup = make(store, clock=None)
        sup.add(Task(id="x", kind="k"))
        with pytest.raises(UsageError, match="add none"):
            await sup.aresume()
        with pytest.raises(StoreError, match="unknown run"):
            await make(store, run_id="nope", clock=None).aresume()
        with pytest.raises(UsageError, match="needs a store"):
            registry = Registry([KindSpec("k", handler=work)])
            await Supervisor(registry).aresume()

    asyncio.run(with_store(go))


class FlakyStore(InMemoryStore):
    """Fails a few writes in a row, as a database restarting would."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def write_batch(self, run_id: str, tasks: Any, events: Any) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise StoreError("connection refused")
        await super().write_batch(run_id, tasks, events)


def test_a_store_briefly_down_loses_nothing() -> None:
    async def go() -> Any:
        store = FlakyStore(failures=3)
        await store.open()
        sup = make(store, clock=None, retry=RetryPolicy(attempts=3, base=0.01))
        sup.add_tasks(chain(3))
        result = await sup.arun()
        return result, await store.load("r1")

    result, state = asyncio.run(go())
    assert result.ok
    assert len(state.events) == len(result.events)
    assert analyze(state.tasks, state.events).clean


def test_a_store_down_for_good_stops_the_run_with_store_error() -> None:
    async def go() -> Any:
        store = FlakyStore(failures=10**9)
        await store.open()
        sup = make(store, clock=None, store_patience=0.5)
        sup.add_tasks(chain(2))
        await sup.arun()

    with pytest.raises(StoreError, match="connection refused"):
        asyncio.run(go())


def test_transient_failure_is_durable_with_its_deadline() -> None:
    attempts = 0

    async def flaky(payload: Any, ctx: TaskContext) -> str:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise TransientError("again")
        return "ok"

    async def go(store: InMemoryStore) -> Any:
        registry = Registry([KindSpec("k", handler=flaky)])
        sup = Supervisor(registry, store=store, run_id="r1", clock=None,
                         retry=RetryPolicy(attempts=3, base=0.01, jitter=0.0))
        sup.add(Task(id="t", kind="k"))
        await sup.arun()
        return await store.load("r1")

    state = asyncio.run(with_store(go))
    failed = [e for e in state.events if e.event == "failed"]
    assert len(failed) == 1 and "retry_at" in failed[0].detail


def test_resume_keeps_what_the_retry_budget_has_spent() -> None:
    runs: list[str] = []

    async def always_transient(payload: Any, ctx: TaskContext) -> str:
        runs.append(ctx.task_id)
        raise TransientError("still down")

    async def go(store: InMemoryStore) -> Any:
        from planrun.core._ledger import Event
        from planrun.stores.base import RunInfo

        # Before the crash, "a" failed once and spent the run's only retry.
        task = Task(id="a", kind="k", max_attempts=5)
        failed = transition(transition(transition(task, Status.ASSIGNED, token=1),
                                       Status.RUNNING),
                            Status.FAILED, attempts=1, not_before=0.0, error="down")
        await store.create_run(RunInfo("r1", 0.0, "running"))
        await store.add_tasks("r1", [failed, Task(id="b", kind="k", max_attempts=5)],
                              [Event(0, 0.0, "a", "failed", "w", 1, {"retry_at": 0.0})])
        sup = Supervisor(Registry([KindSpec("k", handler=always_transient)]), store=store,
                         run_id="r1", clock=None, retry_budget=1,
                         retry=RetryPolicy(attempts=3, base=0.001, jitter=0.0))
        return await sup.aresume()

    result = asyncio.run(with_store(go))
    assert sorted(runs) == ["a", "b"]  # one more attempt each, and no retry
    assert all(t.status is Status.DEAD for t in result.tasks.values())
    assert all("retry budget exhausted" in (t.error or "") for t in result.tasks.values())
    assert [e.task for e in result.events if e.event == "failed"] == ["a"]  # the old one


def test_an_effect_applied_before_the_crash_is_neither_applied_nor_logged_again() -> None:
    applied: list[str] = []

    async def go(store: InMemoryStore) -> Any:
        from planrun.core._ledger import Event
        from planrun.stores.base import RunInfo

        done = transition(transition(transition(Task(id="t", kind="k"), Status.ASSIGNED,
                                                token=1), Status.RUNNING),
                          Status.COMPLETED, result="r", attempts=1)
        await store.create_run(RunInfo("r1", 0.0, "running"))
        await store.add_tasks("r1", [done, Task(id="u", kind="k")],
                              [Event(0, 1.0, "t", "completed", "w", 1)])
        await store.effect_begin("r1", "t", "r1:t", 1.0)
        assert await store.effect_done("r1", "t", None, 2.0,
                                       Event(-1, 2.0, "t", "effect", None, 1, {"key": "r1:t"}))
        sup = make(store, clock=None, effects={"k": lambda t, key: applied.append(key)})
        return await sup.aresume(), await store.load("r1")

    result, state = asyncio.run(with_store(go))
    assert applied == ["r1:u"]
    assert [e.task for e in state.events if e.event == "effect"] == ["t", "u"]
    assert [e.task for e in result.events if e.event == "effect"] == ["t", "u"]
    assert result.audit.clean


def test_resuming_a_finished_run_reports_no_negative_duration(tmp_path: Any) -> None:
    """The tasks of a finished run ended before the resume began: it lasted 0 s."""
    from planrun import plan_and_run, resume_run

    app = Registry([KindSpec("k", handler=work)])
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    plan = {"goal": "g", "tasks": [{"kind": "k"}, {"kind": "k", "depends_on": [0]}]}
    first = plan_and_run(plan, app, store=db, run_id="r1")
    assert first.ok and first.duration_s >= 0
    again = resume_run("r1", app, db)
    assert again.ok and again.duration_s == 0.0 and again.result.makespan == 0.0
    assert again.summary().splitlines()[0] == "run r1: completed 2 in 0.0 s"
    assert again.to_dict()["duration_s"] == 0.0
