"""The scheduling core on its own: no driver, no store, no event loop, time given by hand.

Every call passes ``now``, so these tests run in virtual time by construction: a retry
"at 2.5 s" is checked by ticking the core at 2.4 and at 2.5. The behaviour suites
(``tests/integration/test_drivers*.py``) run the same rules through every driver; these
pin down the core's own answers, including the records it is fed in an order no driver
of today happens to produce.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from planrun.core._errors import ErrorClass, UsageError
from planrun.core._ledger import EventName as E
from planrun.core._registry import KindSpec, Registry, WorkerSpec
from planrun.core._routing import get_router
from planrun.core._task import Status, Task
from planrun.core.scheduling import Failure, RetryPolicy, Scheduler

EXACT = RetryPolicy(attempts=3, base=1.0, cap=4.0, jitter=0.0, max_retry_after=10.0)


class Recorder:
    """The core's sink: every decided change, in order."""

    def __init__(self) -> None:
        self.changes: list[tuple[str, str, str | None]] = []

    def __call__(self, task: Task, event: str, worker: str | None, detail: Any,
                 token: int) -> None:
        self.changes.append((task.id, event, worker))

    def events(self, task_id: str) -> list[str]:
        return [e for t, e, _ in self.changes if t == task_id]


def core(strategy: str = "balanced", workers: int = 1, capacity: int = 2,
         **options: Any) -> tuple[Scheduler, Recorder]:
    sink = Recorder()
    options.setdefault("retry", EXACT)
    s = Scheduler(router=get_router(strategy), sink=sink,
                  kinds=Registry([KindSpec("k"), KindSpec("other")]), **options)
    for i in range(workers):
        s.add_worker(WorkerSpec(f"w{i + 1}", None, capacity))
    return s, sink


def transient(msg: str = "timeout", retry_after: float | None = None) -> Failure:
    return Failure(f"TransientError: {msg}", ErrorClass.TRANSIENT, retry_after)


def permanent(msg: str = "bad") -> Failure:
    return Failure(f"PermanentError: {msg}", ErrorClass.PERMANENT)


def started(s: Scheduler, now: float) -> dict[str, Task]:
    return {t.id: t for _, t in s.dispatch(now)}


# ---- readiness and order -----------------------------------------------------------------


def test_a_task_is_ready_only_when_every_dependency_completed() -> None:
    s, _ = core(capacity=4)
    s.add([Task("c", "k", depends_on=("a", "b")), Task("a", "k"), Task("b", "k")], 0.0)
    s.start(0.0)
    first = started(s, 0.0)
    assert set(first) == {"a", "b"}
    s.complete("a", first["a"].token, 1, 1.0, "w1")
    assert started(s, 1.0) == {}  # c still waits for b
    s.complete("b", first["b"].token, 2, 2.0, "w1")
    assert set(started(s, 2.0)) == {"c"}


def test_the_critical_path_goes_first_under_balanced() -> None:
    s, _ = core(capacity=1)
    s.add([Task("short", "k", estimate_s=1.0), Task("long", "k", estimate_s=1.0),
           Task("tail", "k", estimate_s=5.0, depends_on=("long",))], 0.0)
    s.start(0.0)
    assert set(started(s, 0.0)) == {"long"}  # 6 s below it against 1 s


def test_round_robin_alternates_and_least_loaded_fills_the_idle_worker() -> None:
    s, sink = core("round_robin", workers=2, capacity=4)
    s.add([Task(f"t{i}", "k") for i in range(4)], 0.0)
    s.start(0.0)
    s.dispatch(0.0)
    assert [w for _, e, w in sink.changes if e == E.ASSIGNED] == ["w1", "w2", "w1", "w2"]
    s, sink = core("least_loaded", workers=2, capacity=4)
    s.add([Task("big", "k", estimate_s=10.0), Task("a", "k"), Task("b", "k")], 0.0)
    s.start(0.0)
    s.dispatch(0.0)
    assigned = {t: w for t, e, w in sink.changes if e == E.ASSIGNED}
    assert assigned["big"] != assigned["a"] and assigned["a"] == assigned["b"]


def test_a_kind_no_worker_does_waits_in_the_heap() -> None:
    s, _ = core()
    s.workers.clear()
    s.add_worker(WorkerSpec("only-k", {"k": 1.0}, 2))
    s.add([Task("x", "other"), Task("y", "k")], 0.0)
    s.start(0.0)
    assert not started(s, 0.0) or "x" not in started(s, 0.0)
    assert s.tasks["x"].status is Status.PENDING and not s.done


# ---- failures --------------------------------------------------------------------------


def test_a_transient_failure_is_retried_at_its_backoff_then_dead_at_max_attempts() -> None:
    s, sink = core()
    s.add([Task("t", "k", max_attempts=3)], 0.0)
    s.start(0.0)
    run = started(s, 0.0)["t"]
    s.fail("t", run.token, transient(), 0.0, "w1")
    assert s.tasks["t"].status is Status.FAILED and s.tasks["t"].not_before == 1.0
    s.tick(0.99)
    assert s.tasks["t"].status is Status.FAILED
    s.tick(1.0)
    assert s.tasks["t"].status is Status.PENDING
    run = started(s, 1.0)["t"]
    s.fail("t", run.token, transient(), 1.0, "w1")
    assert s.tasks["t"].not_before == 3.0  # the second retry waits 2 s
    s.tick(3.0)
    run = started(s, 3.0)["t"]
    s.fail("t", run.token, transient(), 3.0, "w1")
    assert s.tasks["t"].status is Status.DEAD and s.tasks["t"].attempts == 3
    assert sink.events("t").count(E.RETRY) == 2 and s.done


def test_retry_after_is_honoured_up_to_the_clamp() -> None:
    s, _ = core()
    s.add([Task("a", "k"), Task("b", "k")], 0.0)
    s.start(0.0)
    run = started(s, 0.0)
    s.fail("a", run["a"].token, transient(retry_after=5.0), 0.0, "w1")
    s.fail("b", run["b"].token, transient(retry_after=3600.0), 0.0, "w1")
    assert s.tasks["a"].not_before == 5.0
    assert s.tasks["b"].not_before == 10.0  # max_retry_after


def test_the_retry_budget_is_shared_by_the_run() -> None:
    s, _ = core(retry_budget=1)
    s.add([Task("a", "k"), Task("b", "k")], 0.0)
    s.start(0.0)
    run = started(s, 0.0)
    s.fail("a", run["a"].token, transient(), 0.0, "w1")
    s.fail("b", run["b"].token, transient(), 0.0, "w1")
    assert s.tasks["a"].status is Status.FAILED
    b = s.tasks["b"]
    assert b.status is Status.DEAD and "retry budget exhausted" in (b.error or "")


def test_a_permanent_error_is_dead_at_once_and_cancels_every_transitive_dependent() -> None:
    s, _ = core()
    s.add([Task("a", "k"), Task("b", "k", depends_on=("a",)),
           Task("c", "k", depends_on=("b",)), Task("free", "k")], 0.0)
    s.start(0.0)
    run = started(s, 0.0)
    s.fail("a", run["a"].token, permanent(), 0.0, "w1")
    assert s.tasks["a"].status is Status.DEAD and s.tasks["a"].attempts == 1
    assert [s.tasks[t].cause for t in "bc"] == ["a", "a"]
    assert s.tasks["free"].status is Status.RUNNING


def test_abort_run_cancels_everything_not_started() -> None:
    s, _ = core(on_dead="abort_run", capacity=1)
    s.add([Task("a", "k"), Task("x", "k"), Task("y", "k")], 0.0)
    s.start(0.0)
    run = started(s, 0.0)
    s.fail("a", run["a"].token, permanent(), 0.0, "w1")
    assert s.facts.aborted_by == "a"
    assert {s.tasks[t].status for t in "xy"} == {Status.CANCELLED}
    assert s.dispatch(1.0) == []


def test_a_budget_refusal_cancels_what_has_not_started_with_cause_budget() -> None:
    s, _ = core(capacity=1)
    s.add([Task("a", "k"), Task("b", "k", depends_on=("a",)), Task("c", "k")], 0.0)
    s.start(0.0)
    run = started(s, 0.0)
    s.fail("a", run["a"].token, Failure("BudgetExceeded: spent", ErrorClass.PERMANENT,
                                        budget=True), 0.0, "w1")
    assert s.facts.budget_exhausted
    assert {t.id: t.cause for t in s.tasks.values()} == {"a": "budget", "b": "budget",
                                                         "c": "budget"}
    assert s.done


# ---- leases, stall, effects --------------------------------------------------------------


def test_an_expired_lease_is_reclaimed_with_a_new_token_then_dead_past_max_reclaims() -> None:
    s, sink = core(stale_after=5.0, max_reclaims=1)
    s.add([Task("t", "k")], 0.0)
    s.start(0.0)
    first = started(s, 0.0)["t"]
    s.tick(4.9)
    assert s.tasks["t"].status is Status.RUNNING
    s.tick(5.0)
    assert s.tasks["t"].status is Status.PENDING and s.tasks["t"].token > first.token
    assert not s.complete("t", first.token, "late", 5.1, "w1")  # fenced off
    second = started(s, 5.1)["t"]
    s.tick(10.1)
    assert s.tasks["t"].status is Status.DEAD and "reclaimed 1 times" in (
        s.tasks["t"].error or "")
    assert E.REJECTED in sink.events("t")
    del second


def test_a_heartbeat_keeps_the_lease() -> None:
    s, _ = core(stale_after=5.0)
    s.add([Task("t", "k")], 0.0)
    s.start(0.0)
    run = started(s, 0.0)["t"]
    s.heartbeat("t", run.token, 4.0)
    s.tick(6.0)
    assert s.tasks["t"].status is Status.RUNNING


def test_a_stall_is_no_change_for_stall_after_and_a_known_retry_time_is_none() -> None:
    s, _ = core(stall_after=10.0)
    s.add([Task("t", "k")], 0.0)
    s.start(0.0)
    s.workers.clear()  # nobody will take it
    assert not s.stalled(9.9) and s.stalled(10.0)
    slow = RetryPolicy(attempts=2, base=100.0, cap=100.0, jitter=0.0)
    s, _ = core(stall_after=10.0, stale_after=1000.0, retry=slow)
    s.add([Task("t", "k")], 0.0)
    s.start(0.0)
    run = started(s, 0.0)["t"]
    s.fail("t", run.token, transient(), 0.0, "w1")
    assert not s.stalled(50.0) and s.next_wakeup(50.0) == 100.0


def test_an_effect_is_due_once_after_the_completion_and_retried_while_it_fails() -> None:
    s, _ = core(effects={"k"}, effect_retry=RetryPolicy(attempts=2, base=1.0, jitter=0.0))
    s.add([Task("t", "k")], 0.0)
    s.start(0.0)
    run = started(s, 0.0)["t"]
    s.complete("t", run.token, "r", 1.0, "w1")
    assert not s.done
    assert [t.id for t in s.effects_due(1.0)] == ["t"]
    assert s.effects_due(1.0) == []  # handed out once until it reports
    assert s.effect_failed("t", "503", 1.0) == 2.0
    assert s.effects_due(1.5) == [] and [t.id for t in s.effects_due(2.0)] == ["t"]
    assert s.effect_failed("t", "503", 2.0) is None  # given up on, recorded
    assert s.facts.effects_failed == {"t": "503"} and s.done


def test_the_deadline_cancels_what_has_not_started() -> None:
    s, _ = core(capacity=1, deadline=5.0)
    s.add([Task("a", "k"), Task("b", "k")], 0.0)
    s.start(0.0)
    started(s, 0.0)
    s.tick(5.0)
    assert s.facts.deadline_reached and s.tasks["b"].cause == "deadline"
    assert s.tasks["a"].status is Status.RUNNING


def test_resource_locks_keep_two_holders_apart() -> None:
    s, _ = core(capacity=4)
    s.add([Task("a", "k", resources=("db",)), Task("b", "k", resources=("db",)),
           Task("c", "k")], 0.0)
    s.start(0.0)
    first = started(s, 0.0)
    assert set(first) == {"a", "c"}
    s.complete("a", first["a"].token, 1, 1.0, "w1")
    assert set(t.id for _, t in s.release(s.workers["w1"], s.tasks["a"], 1.0)) == {"b"}


def test_a_bad_policy_is_refused_with_one_line() -> None:
    with pytest.raises(UsageError, match="on_dead"):
        core(on_dead="explode")  # type: ignore[arg-type]


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_the_core_imports_no_store_model_prompt_or_event_loop() -> None:
    import planrun

    root = Path(planrun.__file__).parent
    todo = [p for p in (root / "core").rglob("*.py")]
    seen: set[Path] = set()
    reached: set[str] = set()
    while todo:  # the core's modules and every planrun module they reach
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imports(path):
            reached.add(name)
            if name.startswith("planrun."):
                parts = name.split(".")[1:]
                module = root.joinpath(*parts)
                todo += [q for q in (module.with_suffix(".py"), module / "__init__.py")
                         if q.exists()]
    io = ("planrun.stores", "planrun.model", "planrun.runtime", "planrun.obs", "planrun.dev",
          "planrun.cli", "asyncio", "sqlite3", "psycopg", "openai", "httpx", "socket")
    assert sorted(n for n in reached if n.split(".")[0] in io or n.startswith(io)) == []
    assert any(p.name == "_scheduler.py" for p in seen) and len(seen) > 6
    for path in (root / "core" / "scheduling").glob("*.py"):  # it reads no clock: ``now`` is given
        assert not {"time", "datetime"} & _imports(path), path.name


# ---- the driver's common path ----------------------------------------------------------


def test_finish_records_the_completion_and_starts_the_workers_next_queued_task() -> None:
    s, sink = core(capacity=1)
    s.add([Task("a", "k"), Task("b", "k"), Task("c", "k", depends_on=("a",))], 0.0)
    s.start(0.0)
    a = started(s, 0.0)["a"]
    assert s.tasks["b"].status is Status.ASSIGNED  # queued behind a on the one slot
    nxt = s.finish(s.workers["w1"], "a", a.token, "ra", 1.0)
    assert isinstance(nxt, Task) and nxt.id == "b" and nxt.status is Status.RUNNING
    assert s.tasks["a"].status is Status.COMPLETED and s.tasks["a"].result == "ra"
    assert s.workers["w1"].active == 1 and s.workers["w1"].done == 1
    # c became ready, but finish gives nothing out: the next dispatch does
    assert s.tasks["c"].status is Status.PENDING
    assert s.finish(s.workers["w1"], "b", nxt.token, "rb", 2.0) is True  # nothing queued
    assert [t.id for _, t in s.dispatch(2.0)] == ["c"]
    assert sink.events("a") == [E.CREATED, E.ASSIGNED, E.STARTED, E.COMPLETED]


def test_finish_refuses_a_fenced_outcome_and_takes_the_long_way_for_a_resource() -> None:
    s, sink = core(capacity=2, stale_after=5.0)
    s.add([Task("a", "k"), Task("r", "k", resources=("db",)),
           Task("r2", "k", resources=("db",))], 0.0)
    s.start(0.0)
    run = started(s, 0.0)
    s.tick(5.0)  # both leases ran out: reclaimed, new tokens
    assert s.finish(s.workers["w1"], "a", run["a"].token, "late", 5.5) is False
    assert E.REJECTED in sink.events("a") and s.tasks["a"].status is not Status.COMPLETED
    again = started(s, 6.0)
    assert s.finish(s.workers["w1"], "r", again["r"].token, "ok", 7.0) is True
    assert s.tasks["r"].status is Status.COMPLETED
    assert [t.id for _, t in s.dispatch(7.0)] == ["r2"]  # the lock it held is free


def test_release_without_dispatch_leaves_what_became_ready_to_the_next_dispatch() -> None:
    s, _ = core(capacity=1)
    s.add([Task("a", "k"), Task("b", "k", depends_on=("a",))], 0.0)
    s.start(0.0)
    a = started(s, 0.0)["a"]
    s.complete("a", a.token, 1, 1.0, "w1")
    assert s.release(s.workers["w1"], s.tasks["a"], 1.0, dispatch=False) == []
    assert s.tasks["b"].status is Status.PENDING
    assert [t.id for _, t in s.dispatch(1.0)] == ["b"]


# ---- workers met after their tasks -------------------------------------------------------


def test_a_worker_first_seen_after_its_tasks_counts_them_as_its_load() -> None:
    """A core that restores stored tasks before it meets the workers holding them: a
    worker it meets then starts with what is in flight on it, not with nothing (its
    active count went below zero when those tasks ended)."""
    from planrun.core.scheduling._check import index_problems

    s, _ = core(workers=0)
    s.restore([Task("a", "k", status=Status.RUNNING, assigned_to="w9", token=1, lease=50.0,
                    estimate_s=2.0),
               Task("b", "k", status=Status.ASSIGNED, assigned_to="w9", token=1, lease=50.0,
                    estimate_s=3.0),
               Task("c", "k")])
    s.start(0.0)
    worker = s.add_worker(WorkerSpec("w9", {"k": 1.0}, 2))
    assert (worker.active, worker.load_s) == (1, 5.0)
    assert s.complete("a", 1, "ra", 1.0, "w9")
    assert (worker.active, worker.load_s) == (0, 3.0)
    assert index_problems(s, queues=False) == []


def test_the_repairs_of_the_plan_added_go_to_the_sink_as_repaired_events() -> None:
    from planrun.core import Repair

    s, sink = core()
    details: list[Any] = []
    s.use_sink(lambda task, event, worker, detail, token: (
        sink(task, event, worker, detail, token), details.append(detail)))
    asked = Repair("model", "cycle", 0, "a cycle", attempt=2)
    fix = Repair("code", "self_dependency", 1, "dropped", rule="drop_self_dependency",
                 attempt=2, final_task=1)
    plan = [Task(id="a", kind="k"), Task(id="b", kind="k", depends_on=("a",))]
    s.add(plan, 0.0)
    s.ready.repaired(plan, [asked, fix])
    assert sink.changes == [("a", E.CREATED, None), ("b", E.CREATED, None),
                            ("a", E.REPAIRED, None), ("b", E.REPAIRED, None)]
    assert details[2:] == [asked.to_dict(), fix.to_dict()]
    # no status changed: both tasks are pending, a ready and b waiting for it
    assert {t.status for t in s.tasks.values()} == {Status.PENDING}
    s.ready.repaired(plan, [])
    assert len(sink.changes) == 4
