"""The supervisor: dispatch, retries, reclaim, fencing, dead tasks, locks, stalls, effects."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from planrun.core._errors import (
    BudgetExceeded,
    InvalidPlan,
    PermanentError,
    RunAborted,
    StallError,
    TransientError,
    UsageError,
)
from planrun.core._registry import KindSpec, Registry, TaskContext, WorkerSpec
from planrun.core._task import Status, Task
from planrun.core.scheduling import RetryPolicy
from planrun.runtime._clock import RealClock, VirtualClock
from planrun.runtime._supervisor import Supervisor

Handler = Callable[[Any, TaskContext], Any]


def supervisor(
    handlers: dict[str, Handler],
    workers: list[WorkerSpec] | None = None,
    **options: Any,
) -> Supervisor:
    registry = Registry(KindSpec(k, handler=h) for k, h in handlers.items())
    options.setdefault("clock", VirtualClock())
    options.setdefault("seed", 0)
    return Supervisor(registry, workers, **options)


async def ok(payload: Any, ctx: TaskContext) -> dict[str, Any]:
    await asyncio.sleep(ctx.estimate_s / ctx.skill)
    return {"task": ctx.task_id, "worker": ctx.worker}


def events_of(result: Any, task: str) -> list[str]:
    return [e.event for e in result.events if e.task == task]


def test_runs_dependencies_in_order_and_audits_clean() -> None:
    sup = supervisor({"k": ok})
    sup.add_tasks([
        Task(id="c", kind="k", depends_on=("b",)),
        Task(id="b", kind="k", depends_on=("a",)),
        Task(id="a", kind="k"),
    ])
    result = sup.run()
    assert result.ok and result.audit.clean
    done = {t.id: t.finished_at for t in result.tasks.values()}
    assert done["a"] < done["b"] < done["c"]  # type: ignore[operator]
    assert events_of(result, "a") == ["created", "assigned", "started", "completed"]
    assert result.tasks["a"].result == {"task": "a", "worker": "worker"}


def test_each_task_goes_to_exactly_one_worker() -> None:
    workers = [WorkerSpec(f"w{i}", None, 2) for i in range(4)]
    sup = supervisor({"k": ok}, workers, strategy="least_loaded")
    sup.add_tasks(Task(id=f"t{i}", kind="k") for i in range(40))
    result = sup.run()
    started = [e for e in result.events if e.event == "started"]
    assert len(started) == 40 == len({e.task for e in started})
    assert sum(int(w["tasks"]) for w in result.workers.values()) == 40
    assert all(w["tasks"] == 10 for w in result.workers.values())


def test_capacity_limits_concurrency_per_worker() -> None:
    running = 0
    peak = 0

    async def track(payload: Any, ctx: TaskContext) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(1)
        running -= 1

    sup = supervisor({"k": track}, [WorkerSpec("w", None, 3)])
    sup.add_tasks(Task(id=f"t{i}", kind="k") for i in range(10))
    result = sup.run()
    assert peak == 3
    assert result.makespan == pytest.approx(4.0)  # ceil(10 / 3) rounds of 1 s


def test_transient_errors_retry_with_exponential_backoff() -> None:
    calls: list[float] = []

    async def flaky(payload: Any, ctx: TaskContext) -> str:
        calls.append(asyncio.get_running_loop().time())
        if len(calls) < 3:
            raise TransientError("try again")
        return "ok"

    sup = supervisor({"k": flaky}, retry=RetryPolicy(attempts=3, base=2.0, cap=60.0, jitter=0.0))
    sup.add(Task(id="t", kind="k"))
    result = sup.run()
    assert calls == [0.0, 2.0, 6.0]  # waits 2 s, then 4 s
    task = result.tasks["t"]
    assert task.status is Status.COMPLETED and task.attempts == 3
    assert events_of(result, "t").count("failed") == 2
    failed = [e for e in result.events if e.event == "failed"]
    assert [e.detail["retry_at"] for e in failed] == [2.0, 6.0]


def test_the_default_backoff_jitter_takes_up_to_25_percent_off_and_caps() -> None:
    import random

    from planrun.core.scheduling import SCHEDULER_RETRY

    rng = random.Random(1)
    for attempt, nominal in [(1, 2.0), (2, 4.0), (3, 8.0), (6, 60.0), (9, 60.0)]:
        delays = [SCHEDULER_RETRY.backoff(attempt, rng) for _ in range(200)]
        assert min(delays) >= nominal * 0.75 and max(delays) <= nominal
        assert max(delays) - min(delays) > nominal * 0.2  # there is jitter


def test_retry_after_is_honoured_as_a_minimum_wait() -> None:
    calls: list[float] = []

    async def limited(payload: Any, ctx: TaskContext) -> str:
        calls.append(asyncio.get_running_loop().time())
        if len(calls) == 1:
            raise TransientError("429", retry_after=30.0)
        return "ok"

    sup = supervisor({"k": limited}, retry=RetryPolicy(attempts=3, jitter=0.0))
    sup.add(Task(id="t", kind="k"))
    sup.run()
    assert calls == [0.0, 30.0]


def test_permanent_error_is_dead_at_once_after_one_attempt() -> None:
    calls = 0

    async def broken(payload: Any, ctx: TaskContext) -> None:
        nonlocal calls
        calls += 1
        raise PermanentError("400 bad request")

    sup = supervisor({"k": broken})
    sup.add(Task(id="t", kind="k"))
    task = sup.run().tasks["t"]
    assert calls == 1
    assert task.status is Status.DEAD and task.attempts == 1
    assert task.error_class == "permanent" and "400 bad request" in (task.error or "")


def test_unknown_exceptions_are_permanent_timeouts_transient() -> None:
    async def bug(payload: Any, ctx: TaskContext) -> None:
        raise KeyError("oops")

    async def slow(payload: Any, ctx: TaskContext) -> None:
        await asyncio.sleep(100)

    sup = supervisor({"bug": bug, "slow": slow}, timeout=10.0,
                     retry=RetryPolicy(attempts=3, jitter=0.0))
    sup.add_tasks([Task(id="b", kind="bug"), Task(id="s", kind="slow")])
    result = sup.run()
    assert result.tasks["b"].attempts == 1 and result.tasks["b"].error_class == "permanent"
    slow_task = result.tasks["s"]
    assert slow_task.status is Status.DEAD and slow_task.attempts == 3
    assert slow_task.error_class == "transient" and "timed out" in (slow_task.error or "")


def test_a_kinds_timeout_overrides_the_supervisors() -> None:
    async def nap(payload: Any, ctx: TaskContext) -> str:
        await asyncio.sleep(float(payload["s"]))
        return "woke"

    registry = Registry([KindSpec("quick", handler=nap, timeout_s=5.0),
                         KindSpec("patient", handler=nap, timeout_s=500.0),
                         KindSpec("default", handler=nap)])
    sup = Supervisor(registry, timeout=30.0, stale_after=1000.0, clock=VirtualClock(), seed=0,
                     max_attempts=1)
    sup.add_tasks([Task(id="q", kind="quick", payload={"s": 10}),
                   Task(id="p", kind="patient", payload={"s": 100}),
                   Task(id="d", kind="default", payload={"s": 60})])
    tasks = sup.run().tasks
    assert tasks["q"].status is Status.DEAD
    assert tasks["q"].error == "TransientError: attempt timed out after 5.0 s"
    assert tasks["p"].status is Status.COMPLETED  # 100 s, under its own 500 s
    assert tasks["d"].error == "TransientError: attempt timed out after 30.0 s"


def test_a_kind_timeout_must_be_positive() -> None:
    with pytest.raises(UsageError, match="timeout_s must be > 0"):
        KindSpec("k", timeout_s=0)


def test_retry_budget_is_shared_by_the_whole_run() -> None:
    async def always(payload: Any, ctx: TaskContext) -> None:
        raise TransientError("down")

    sup = supervisor({"k": always}, retry_budget=3, max_attempts=10)
    sup.add_tasks(Task(id=f"t{i}", kind="k") for i in range(3))
    result = sup.run()
    failed = [e for e in result.events if e.event == "failed"]
    assert len(failed) == 3  # three retries in all, then everything is dead
    assert all(t.status is Status.DEAD for t in result.tasks.values())
    assert any("retry budget exhausted" in (t.error or "") for t in result.tasks.values())


def test_failover_to_another_worker_of_the_same_skill() -> None:
    async def picky(payload: Any, ctx: TaskContext) -> str:
        if ctx.worker == "a":
            raise TransientError("a is sick")
        return ctx.worker

    sup = supervisor({"k": picky}, [WorkerSpec("a"), WorkerSpec("b")], strategy="round_robin")
    sup.add(Task(id="t", kind="k"))
    result = sup.run()
    assert result.tasks["t"].result == "b"
    assigned = [e.worker for e in result.events if e.event == "assigned"]
    assert assigned == ["a", "b"]


def test_dead_task_cancels_transitive_dependents_and_independent_work_finishes() -> None:
    async def work(payload: Any, ctx: TaskContext) -> str:
        if ctx.task_id == "root":
            raise PermanentError("no")
        return "ok"

    sup = supervisor({"k": work})
    sup.add_tasks([
        Task(id="root", kind="k"),
        Task(id="child", kind="k", depends_on=("root",)),
        Task(id="grandchild", kind="k", depends_on=("child",)),
        Task(id="other", kind="k"),
        Task(id="after_other", kind="k", depends_on=("other",)),
    ])
    result = sup.run()
    statuses = {k: t.status for k, t in result.tasks.items()}
    assert statuses == {
        "root": Status.DEAD,
        "child": Status.CANCELLED,
        "grandchild": Status.CANCELLED,
        "other": Status.COMPLETED,
        "after_other": Status.COMPLETED,
    }
    assert result.tasks["grandchild"].cause == "root"
    assert "started" not in events_of(result, "child")
    assert result.aborted_by is None


def test_abort_run_stops_everything_when_a_task_dies() -> None:
    async def work(payload: Any, ctx: TaskContext) -> str:
        await asyncio.sleep(1)
        if ctx.task_id == "migrate":
            raise PermanentError("migration failed")
        return "ok"

    sup = supervisor({"k": work}, [WorkerSpec("w", None, 1)], on_dead="abort_run")
    sup.add_tasks([
        Task(id="migrate", kind="k"),
        Task(id="deploy", kind="k", depends_on=("migrate",)),
        Task(id="unrelated", kind="k"),
    ])
    result = sup.run()
    assert result.aborted_by == "migrate"
    assert result.tasks["unrelated"].status is Status.CANCELLED
    assert result.tasks["unrelated"].cause == "abort: migrate died"
    with pytest.raises(RunAborted, match="migrate"):
        result.raise_for_status()


def test_silent_worker_is_reclaimed_after_stale_after() -> None:
    async def work(payload: Any, ctx: TaskContext) -> str:
        if ctx.worker == "ghost":
            await asyncio.Event().wait()  # dies without a word
        await asyncio.sleep(5)
        return ctx.worker

    sup = supervisor({"k": work}, [WorkerSpec("ghost"), WorkerSpec("alive")],
                     strategy="round_robin", stale_after=90.0)
    sup.add(Task(id="t", kind="k"))
    result = sup.run()
    task = result.tasks["t"]
    assert task.status is Status.COMPLETED and task.result == "alive"
    assert task.reclaims == 1 and task.attempts == 1  # a reclaim costs no attempt
    reclaimed = [e for e in result.events if e.event == "reclaimed"]
    assert len(reclaimed) == 1 and reclaimed[0].worker == "ghost"
    assert reclaimed[0].at == pytest.approx(90.0)
    assert task.finished_at == pytest.approx(95.0)


def test_heartbeats_keep_a_long_task_alive() -> None:
    async def long(payload: Any, ctx: TaskContext) -> str:
        for _ in range(10):
            await asyncio.sleep(20)
            ctx.heartbeat()
        return "done"

    sup = supervisor({"k": long}, stale_after=30.0)
    sup.add(Task(id="t", kind="k"))
    result = sup.run()
    assert result.tasks["t"].status is Status.COMPLETED
    assert "reclaimed" not in events_of(result, "t")


def test_a_heartbeat_renews_its_own_attempt_only() -> None:
    # One slot: the asyncio task that ran a carries on with b; a's heartbeat, called while
    # b runs, is a finished attempt's and leaves b's lease alone.
    beats: list[Callable[[], None]] = []
    leases: list[tuple[float | None, float | None]] = []

    async def work(payload: Any, ctx: TaskContext) -> str:
        if ctx.task_id == "a":
            beats.append(ctx.heartbeat)
            return "a"
        before = sup.core.tasks["b"].lease
        await asyncio.sleep(5)
        beats[0]()
        leases.append((before, sup.core.tasks["b"].lease))
        ctx.heartbeat()
        leases.append((before, sup.core.tasks["b"].lease))
        return "b"

    sup = supervisor({"k": work}, [WorkerSpec("w", None, 1)], stale_after=30.0)
    sup.add_tasks([Task(id="a", kind="k"), Task(id="b", kind="k")])
    result = sup.run()
    assert result.ok
    (before, after_a), (_, after_b) = leases
    assert before is not None and after_a == before
    assert after_b == pytest.approx(before + 5.0)


def test_task_that_kills_every_worker_ends_dead_after_the_reclaim_cap() -> None:
    async def poison(payload: Any, ctx: TaskContext) -> None:
        await asyncio.Event().wait()

    sup = supervisor({"p": poison, "k": ok}, stale_after=10.0, max_reclaims=2)
    sup.add_tasks([Task(id="p", kind="p"), Task(id="after", kind="k", depends_on=("p",))])
    result = sup.run()
    task = result.tasks["p"]
    assert task.status is Status.DEAD and task.reclaims == 2
    assert "reclaimed 2 times" in (task.error or "")
    assert result.tasks["after"].status is Status.CANCELLED


def test_late_result_of_a_reclaimed_attempt_is_fenced_off() -> None:
    async def work(payload: Any, ctx: TaskContext) -> str:
        if ctx.attempt == 1:
            await asyncio.sleep(50)  # slow, silent, but alive
            return "late"
        for _ in range(4):  # the second attempt heartbeats while it works
            await asyncio.sleep(10)
            ctx.heartbeat()
        return "fresh"

    sup = supervisor({"k": work}, [WorkerSpec("a"), WorkerSpec("b")], stale_after=20.0)
    sup.add(Task(id="t", kind="k"))
    result = sup.run()
    assert result.tasks["t"].result == "fresh"
    rejected = [e for e in result.events if e.event == "rejected"]
    assert len(rejected) == 1 and rejected[0].attempt == 1
    assert rejected[0].at == pytest.approx(50.0)
    assert events_of(result, "t").count("completed") == 1
    assert result.audit.duplicates == 0


def test_effect_applies_once_even_when_a_reclaimed_task_finishes_twice() -> None:
    sent: list[tuple[str, str]] = []

    async def draft(payload: Any, ctx: TaskContext) -> str:
        if ctx.attempt == 1:
            await asyncio.sleep(50)  # silent, reclaimed at 20, but alive: finishes at 50
        else:
            for _ in range(4):
                await asyncio.sleep(10)
                ctx.heartbeat()
        return f"reply {ctx.attempt}"

    def send(task: Task, key: str) -> None:
        sent.append((task.id, key))

    sup = supervisor({"draft": draft}, [WorkerSpec("a"), WorkerSpec("b")], stale_after=20.0,
                     effects={"draft": send}, run_id="r1")
    sup.add(Task(id="t", kind="draft"))
    result = sup.run()
    assert sent == [("t", "r1:t")]
    # The reclaim moved the token on, so the late first attempt's result is fenced off;
    # the result is the one of the attempt holding the current token.
    assert result.tasks["t"].result == f"reply {result.tasks['t'].token}" != "reply 1"
    assert events_of(result, "t").count("rejected") == 1
    assert events_of(result, "t").count("effect") == 1
    assert result.audit.duplicate_effects == 0


def test_resource_locks_exclude_but_do_not_order() -> None:
    intervals: dict[str, tuple[float, float]] = {}

    async def write(payload: Any, ctx: TaskContext) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(3)
        intervals[ctx.task_id] = (start, loop.time())

    sup = supervisor({"k": write}, [WorkerSpec("a", None, 4), WorkerSpec("b", None, 4)])
    sup.add_tasks([
        Task(id="x1", kind="k", resources=("report.csv",)),
        Task(id="x2", kind="k", resources=("report.csv",)),
        Task(id="x3", kind="k", resources=("report.csv", "db")),
        Task(id="free", kind="k"),
    ])
    result = sup.run()
    assert result.ok
    locked = sorted(intervals[t] for t in ("x1", "x2", "x3"))
    for (_, end), (start, _) in itertools.pairwise(locked):
        assert start >= end  # never two at once
    assert intervals["free"][0] == 0.0  # unrelated work is not held back
    assert result.makespan == 9.0


def test_stall_is_an_error_not_a_hang() -> None:
    async def stuck(payload: Any, ctx: TaskContext) -> None:
        await asyncio.Event().wait()

    sup = supervisor({"k": stuck}, stale_after=10_000.0, stall_after=300.0)
    sup.add(Task(id="t", kind="k"))
    with pytest.raises(StallError, match=r"stalled.*t \(running\)"):
        sup.run()


def test_budget_exhaustion_cancels_the_rest_with_cause_budget() -> None:
    spent = 0

    async def call(payload: Any, ctx: TaskContext) -> str:
        nonlocal spent
        await asyncio.sleep(1)
        if spent >= 2:
            raise BudgetExceeded("token budget of 2000 would be exceeded")
        spent += 1
        return "ok"

    sup = supervisor({"k": call}, [WorkerSpec("w", None, 1)])
    sup.add_tasks(Task(id=f"t{i}", kind="k") for i in range(6))
    result = sup.run()
    assert result.budget_exhausted
    assert result.counts["completed"] == 2 and result.counts["cancelled"] == 4
    assert {t.cause for t in result.tasks.values() if t.status is Status.CANCELLED} == {"budget"}


class Ticket(BaseModel):
    subject: str


class Label(BaseModel):
    category: str


def test_payload_and_result_models_are_enforced_as_permanent_errors() -> None:
    async def classify(payload: Ticket, ctx: TaskContext) -> Any:
        assert isinstance(payload, Ticket)
        return {"category": "billing"} if payload.subject == "refund" else {"nope": 1}

    registry = Registry([KindSpec("classify", "", Ticket, Label, classify)])
    sup = Supervisor(registry, clock=VirtualClock())
    sup.add_tasks([
        Task(id="good", kind="classify", payload={"subject": "refund"}),
        Task(id="bad_payload", kind="classify", payload={"title": "x"}),
        Task(id="bad_result", kind="classify", payload={"subject": "other"}),
    ])
    result = sup.run()
    assert result.tasks["good"].result == {"category": "billing"}
    for tid, needle in [("bad_payload", "invalid payload"), ("bad_result", "fails its model")]:
        task = result.tasks[tid]
        assert task.status is Status.DEAD and task.attempts == 1 and needle in (task.error or "")


def test_sync_handlers_run_in_a_thread() -> None:
    threads: set[str] = set()

    def blocking(payload: Any, ctx: TaskContext) -> int:
        threads.add(threading.current_thread().name)
        return int(payload["n"]) * 2

    for clock in (RealClock(), VirtualClock()):
        sup = supervisor({"k": blocking}, clock=clock)
        sup.add_tasks(Task(id=f"t{i}", kind="k", payload={"n": i}) for i in range(5))
        result = sup.run()
        assert [t.result for t in result.tasks.values()] == [0, 2, 4, 6, 8]
    assert threading.main_thread().name not in threads


def test_idempotency_key_is_stable_across_retries() -> None:
    keys: list[str] = []

    async def flaky(payload: Any, ctx: TaskContext) -> None:
        keys.append(ctx.idempotency_key)
        if len(keys) < 2:
            raise TransientError("again")

    sup = supervisor({"k": flaky}, run_id="run-1")
    sup.add(Task(id="t", kind="k", payload={"x": 1}))
    sup.run()
    assert len(keys) == 2 and keys[0] == keys[1] and keys[0].startswith("planrun-")


def test_misuse_is_reported_clearly() -> None:
    sup = supervisor({"k": ok})
    with pytest.raises(UsageError, match="kind 'nope' is not registered"):
        sup.add(Task(id="x", kind="nope"))
    with pytest.raises(UsageError, match="unknown or later"):
        sup.add(Task(id="y", kind="k", depends_on=("missing",)))
    with pytest.raises(InvalidPlan) as err:
        sup.add_tasks([Task(id="a", kind="k", depends_on=("b",)),
                       Task(id="b", kind="k", depends_on=("a",))])
    assert err.value.problems[0].code == "cycle"
    with pytest.raises(UsageError, match="unknown strategy"):
        supervisor({"k": ok}, strategy="fastest")
    with pytest.raises(UsageError, match="on_dead"):
        supervisor({"k": ok}, on_dead="ignore")  # type: ignore[arg-type]

    nobody = supervisor({"k": ok, "z": ok}, [WorkerSpec("w", {"k": 1.0})])
    nobody.add(Task(id="z", kind="z"))
    with pytest.raises(UsageError, match="no registered worker does kind 'z'"):
        nobody.run()


async def test_sync_run_inside_a_loop_runs_on_a_thread_as_in_a_notebook() -> None:
    sup = supervisor({"k": ok})
    sup.add(Task(id="t", kind="k"))
    result = sup.run()  # a running loop here, as in a Jupyter cell
    assert result.ok and result.makespan == 1.0  # still virtual time


async def test_virtual_clock_refuses_a_foreign_loop() -> None:
    sup = supervisor({"k": ok})
    sup.add(Task(id="t", kind="k"))
    with pytest.raises(UsageError, match="VirtualClock"):
        await sup.arun()


async def test_async_run_under_the_real_clock() -> None:
    async def quick(payload: Any, ctx: TaskContext) -> str:
        return ctx.task_id

    sup = supervisor({"k": quick}, clock=RealClock())
    sup.add_tasks(Task(id=f"t{i}", kind="k", depends_on=(f"t{i-1}",) if i else ())
                  for i in range(20))
    result = await sup.arun()
    assert result.ok and result.audit.clean


def test_progress_hook_sees_every_event() -> None:
    seen: list[tuple[str, str]] = []
    sup = supervisor({"k": ok}, on_event=lambda e, t: seen.append((e.event, t.status.value)))
    sup.add(Task(id="t", kind="k"))
    result = sup.run()
    assert [s[0] for s in seen] == [e.event for e in result.events]
    assert seen[-1] == ("completed", "completed")


def test_handlers_receive_the_results_of_their_dependencies() -> None:
    async def add(payload: Any, ctx: TaskContext) -> int:
        return int(payload["n"]) + sum(ctx.inputs.values())

    sup = supervisor({"k": add})
    sup.add_tasks([
        Task(id="a", kind="k", payload={"n": 1}),
        Task(id="b", kind="k", payload={"n": 10}),
        Task(id="c", kind="k", payload={"n": 100}, depends_on=("a", "b")),
    ])
    assert sup.run().tasks["c"].result == 111


def _chain_tasks(n: int) -> list[Task]:
    return [Task(id=f"t{i}", kind="k", depends_on=(f"t{i - 3}",) if i >= 3 else ())
            for i in range(n)]


async def _quick(payload: Any, ctx: TaskContext) -> str:
    return ctx.task_id


def test_a_listener_sees_the_events_a_run_without_one_keeps() -> None:
    seen: list[Any] = []
    runs = []
    for listener in (None, lambda event, task: seen.append(event)):
        sup = supervisor({"k": _quick}, [WorkerSpec("w", None, 2)], on_event=listener)
        sup.add_tasks(_chain_tasks(40))
        runs.append(sup.run())
    quiet, heard = runs
    assert quiet.ok and heard.ok and quiet.audit == heard.audit
    assert len(quiet.events) == len(heard.events) == len(seen) == 40 * 4
    assert list(heard.events) == seen
    for i in range(40):
        tid = f"t{i}"
        assert events_of(quiet, tid) == events_of(heard, tid) == [
            "created", "assigned", "started", "completed"]
    assert {t.id: t.result for t in quiet.tasks.values()} == {f"t{i}": f"t{i}" for i in range(40)}


def test_each_attempt_runs_in_the_context_its_start_left() -> None:
    import contextvars

    current: contextvars.ContextVar[str] = contextvars.ContextVar("current", default="")
    mismatches: list[str] = []

    def listener(event: Any, task: Task) -> None:
        if event.event == "started":
            current.set(task.id)  # what a tracer does: a span current for the attempt

    async def check(payload: Any, ctx: TaskContext) -> None:
        await asyncio.sleep(0)
        if current.get() != ctx.task_id:
            mismatches.append(f"{ctx.task_id} ran in {current.get()!r}")

    sup = supervisor({"k": check}, [WorkerSpec("w", None, 3)], on_event=listener)
    # Fan-outs: one completion starts three attempts at once, each after its own listener call.
    sup.add_tasks([Task(id="root", kind="k"),
                   *(Task(id=f"c{i}", kind="k", depends_on=("root",)) for i in range(6)),
                   *(Task(id=f"g{i}", kind="k", depends_on=(f"c{i % 6}",)) for i in range(12))])
    assert sup.run().ok
    assert mismatches == []


def test_attempts_that_never_wait_leave_the_loop_its_turns() -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    async def main() -> Any:
        sup = Supervisor(Registry([KindSpec("k", handler=_quick)]),
                         [WorkerSpec("w", None, 1)])
        sup.add_tasks(Task(id=f"t{i}", kind="k") for i in range(400))
        side = asyncio.ensure_future(ticker())
        try:
            return await sup.arun()
        finally:
            side.cancel()

    result = asyncio.run(main())
    assert result.ok and len(result.tasks) == 400
    assert ticks >= 400 // 16  # the other task ran while one worker went through them all


def test_handlers_that_never_wait_still_let_the_loop_go_round() -> None:
    """One asyncio task runs attempt after attempt; when the handler never waits, it gives
    the loop a turn every 16 attempts (a timer, another coroutine run meanwhile), and not
    more often when the handler itself waited."""
    turns: list[int] = []
    done: list[str] = []

    async def instant(payload: Any, ctx: TaskContext) -> None:
        done.append(ctx.task_id)

    async def watch() -> None:
        while len(done) < 640:
            turns.append(len(done))
            await asyncio.sleep(0)

    async def go() -> Any:
        sup = Supervisor(Registry([KindSpec("k", handler=instant)]),
                         [WorkerSpec("w", None, 1)], strategy="least_loaded")
        sup.add_tasks([Task(id=f"t{i}", kind="k") for i in range(640)])
        watcher = asyncio.ensure_future(watch())
        result = await sup.arun()
        await watcher
        return result

    result = asyncio.run(go())
    assert result.ok
    gaps = [b - a for a, b in itertools.pairwise(turns)]
    assert len(turns) >= 640 // 16 - 2 and max(gaps) <= 17, (len(turns), max(gaps))
