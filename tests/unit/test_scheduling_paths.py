"""The core's hot path decides as its general path does, on random runs.

:meth:`Scheduler.finish` (what the in-process supervisor calls when an attempt returns)
decides the common case in line; the coordinator reaches the same decisions through
:meth:`Scheduler.complete` and :meth:`Scheduler.release`. Two cores are driven through the
same random run (dependencies, resources, several workers and strategies, transient and
permanent failures, late results, heartbeats, leases running out), one finishing attempts
with ``finish`` and the other with ``complete`` + ``release``: after every step their
records and their ledgers must agree, and each core's incremental state (loads, active
counts, locks, dependency counts, queues, leases) must be what its records imply
(:func:`planrun.core.scheduling._check.index_problems`).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planrun.core._errors import ErrorClass
from planrun.core._registry import KindSpec, Registry, WorkerSpec
from planrun.core._routing import get_router
from planrun.core._task import Status, Task
from planrun.core.scheduling import Failure, RetryPolicy, Scheduler
from planrun.core.scheduling._check import index_problems

POLICY = RetryPolicy(attempts=3, base=0.5, cap=2.0, jitter=0.0, max_retry_after=5.0)


class Ledger:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str | None, int]] = []

    def __call__(self, task: Task, event: str, worker: str | None, detail: Any,
                 token: int) -> None:
        self.events.append((task.id, event, worker, token))


def build(rng: random.Random, strategy: str) -> tuple[list[Task], list[WorkerSpec]]:
    tasks = []
    for i in range(rng.randint(1, 14)):
        deps = tuple(sorted({f"t{rng.randrange(i)}" for _ in range(rng.randint(0, 2))}
                            if i else ()))
        resources = tuple(sorted({r for r in ("db", "gpu") if rng.random() < 0.2}))
        tasks.append(Task(f"t{i}", rng.choice(("k", "k", "other")), {"i": i},
                          depends_on=deps, resources=resources,
                          estimate_s=rng.choice((1.0, 2.5)), max_attempts=rng.randint(1, 3)))
    workers = [WorkerSpec("w1", None, rng.randint(1, 3))]
    for n in range(rng.randint(0, 2)):
        skills = None if strategy != "capability" else {"k": rng.choice((1.0, 2.0)),
                                                        "other": 1.0}
        workers.append(WorkerSpec(f"w{n + 2}", skills, rng.randint(1, 3)))
    return tasks, workers


def new_core(tasks: list[Task], workers: list[WorkerSpec], strategy: str) -> tuple[
        Scheduler, Ledger]:
    ledger = Ledger()
    core = Scheduler(router=get_router(strategy), retry=POLICY, sink=ledger, seed=7,
                     stale_after=4.0, max_reclaims=1,
                     kinds=Registry([KindSpec("k"), KindSpec("other")]))
    for spec in workers:
        core.add_worker(spec)
    core.add(tasks, 0.0)
    core.start(0.0)
    return core, ledger


def records(core: Scheduler) -> dict[str, tuple[Any, ...]]:
    return {t.id: (t.status, t.token, t.attempts, t.assigned_to, t.result, t.reclaims,
                   t.error, t.not_before) for t in core.tasks.values()}


def step(core: Scheduler, fast: bool, action: str, pick: int, now: float) -> None:
    """One thing happening to the run, the same way a driver would report it."""
    running = sorted(t.id for t in core.tasks.values() if t.status is Status.RUNNING)
    if action == "dispatch" or (action not in ("advance",) and not running):
        core.dispatch(now)
        return
    if action == "advance":
        core.tick(now)
        core.dispatch(now)
        return
    task = core.tasks[running[pick % len(running)]]
    worker = core.workers[task.assigned_to or ""]
    if action == "finish":
        if fast:
            core.finish(worker, task.id, task.token, {"done": task.id}, now)
            core.extra_starts()  # started in the core; a driver launches them
        elif core.complete(task.id, task.token, {"done": task.id}, now, worker.name):
            core.release(worker, core.tasks[task.id], now, dispatch=False)
    elif action == "late":  # a result carrying an older token: refused by both
        outcome = (core.finish(worker, task.id, task.token - 1, "late", now) if fast
                   else core.complete(task.id, task.token - 1, "late", now, worker.name))
        assert outcome is False
    elif action == "beat":
        core.heartbeat(task.id, task.token, now)
    else:
        transient = action == "transient"
        failure = Failure(f"{'TransientError' if transient else 'PermanentError'}: x",
                          ErrorClass.TRANSIENT if transient else ErrorClass.PERMANENT,
                          retry_after=1.0 if transient and pick % 2 else None)
        if core.fail(task.id, task.token, failure, now, worker.name):
            core.release(worker, core.tasks[task.id], now, dispatch=False)


ACTIONS = ("finish", "finish", "finish", "dispatch", "advance", "transient", "permanent",
           "late", "beat")


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1),
       strategy=st.sampled_from(("round_robin", "least_loaded", "capability", "balanced")))
def test_finish_decides_as_complete_and_release_do(seed: int, strategy: str) -> None:
    rng = random.Random(seed)
    tasks, workers = build(rng, strategy)
    fast, fast_log = new_core(tasks, workers, strategy)
    slow, slow_log = new_core(tasks, workers, strategy)
    fast.dispatch(0.0)
    slow.dispatch(0.0)
    now = 0.0
    for n in range(200):
        if fast.done and slow.done:
            break
        action, pick = rng.choice(ACTIONS), rng.randrange(1000)
        if action == "advance":
            now += rng.choice((0.3, 1.0, 4.5))
        step(fast, True, action, pick, now)
        step(slow, False, action, pick, now)
        where = f"seed {seed}, {strategy}, step {n} ({action})"
        assert records(fast) == records(slow), where
        assert fast_log.events == slow_log.events, where
        assert index_problems(fast) == [], where
        assert index_problems(slow) == [], where


@pytest.mark.parametrize("strategy", ["round_robin", "least_loaded", "capability", "balanced"])
def test_a_long_random_run_keeps_every_index_true_to_the_records(strategy: str) -> None:
    rng = random.Random(strategy)
    tasks = [Task(f"t{i}", "k", depends_on=(f"t{i - 1 - rng.randrange(5)}",) if i > 5 else (),
                  resources=("db",) if i % 13 == 0 else (), max_attempts=3)
             for i in range(300)]
    core, _ = new_core(tasks, [WorkerSpec("w1", None, 4), WorkerSpec("w2", None, 2)],
                       strategy)
    core.dispatch(0.0)
    now = 0.0
    while not core.done:
        action = rng.choice(ACTIONS)
        if action == "advance":
            now += 1.0
        step(core, True, action, rng.randrange(1000), now)
        assert index_problems(core) == [], action
    assert core.unfinished == 0


def test_the_check_names_what_an_index_got_wrong() -> None:
    """The checker itself: each kind of drift is reported (a check that cannot fail would
    make the two tests above pass whatever the core did)."""
    core, _ = new_core([Task("a", "k", resources=("db",)), Task("b", "k", depends_on=("a",)),
                        Task("c", "k")], [WorkerSpec("w1", None, 1)], "least_loaded")
    core.dispatch(0.0)
    assert index_problems(core) == []
    worker = core.workers["w1"]
    worker.active += 1
    worker.load_s += 3.0
    core.book.unfinished -= 1
    core.ready.locks["gpu"] = "c"
    core.ready.waiting["b"] = 0
    queued = worker.queue.popleft()
    problems = "\n".join(index_problems(core))
    assert "w1 has 2 active" in problems and "w1 has load" in problems
    assert "unfinished is 2" in problems and "locks are" in problems
    assert "b waits for 0 dependencies, the records say 1" in problems
    assert f"{queued} is assigned to w1 but not in its queue" in problems
    core.leases.heap.clear()
    assert any("with no lease entry" in p for p in index_problems(core))


def test_the_check_names_a_ready_task_nothing_will_give_out() -> None:
    core, _ = new_core([Task("a", "k"), Task("b", "k", depends_on=("a",))],
                       [WorkerSpec("w1", None, 1)], "least_loaded")
    assert index_problems(core) == []  # started: a waits in the ready heap
    core.ready.queued.discard("a")
    assert index_problems(core) == ["a is ready but nowhere queued, parked, delayed or asked for"]
    core.ready.queued.update({"a", "ghost"})
    assert index_problems(core) == ["ghost is marked queued but is in no ready heap"]
