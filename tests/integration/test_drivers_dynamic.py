"""Plans that grow at run time, run against every driver of the core.

A handler spawns tasks with :meth:`TaskContext.spawn`; the addition is validated like a
plan, bounded, recorded with the spawner's completion in one write, and a join waits for
everything a task spawned. The drivers are those of ``test_drivers`` (in process with each
store, and a worker process on DBOS).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
import test_drivers
from pgtest import fresh_schema
from test_drivers import DRIVERS, Driver

from planrun.core._errors import PermanentError, TransientError
from planrun.core._registry import SpawnRequest, TaskContext
from planrun.core._task import Status, Task
from planrun.core.scheduling import SpawnLimits
from planrun.runtime._supervisor import RunResult
from planrun.stores import open_store


async def fetch(payload: Any, ctx: TaskContext) -> dict[str, int]:
    for i in range(int(payload["n"])):
        ctx.spawn("classify", {"i": i})
    return {"fetched": int(payload["n"])}


async def classify(payload: Any, ctx: TaskContext) -> dict[str, int]:
    await asyncio.sleep(0.001)
    return {"label": int(payload["i"]) % 3}


async def summary(payload: Any, ctx: TaskContext) -> dict[str, Any]:
    labels = [r["label"] for r in ctx.inputs.values() if isinstance(r, dict) and "label" in r]
    return {"n": len(labels), "labels": sorted(labels)}


driver = test_drivers.driver  # the fixture of every driver


@pytest.fixture(params=[d for d in DRIVERS if d[2] is None], ids=[d[0] for d in DRIVERS
                                                                  if d[2] is None])
def in_process(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """The in-process drivers: their supervisor reclaims a silent attempt itself (worker
    processes renew their own leases; their fencing is tested on the stores below)."""
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


HANDLERS = {"fetch": fetch, "classify": classify, "summary": summary}


def completions(result: RunResult) -> Counter[str]:
    return Counter(e.task for e in result.events if e.event == "completed")


def test_a_fan_out_is_joined_by_a_reduce(driver: Driver) -> None:
    tasks = [Task("fetch", "fetch", {"n": 7}),
             Task("sum", "summary", depends_on=("fetch",), joins=("fetch",))]
    result = driver.run(tasks, HANDLERS)
    assert result.ok, result.counts
    spawned = [t for t in result.tasks.values() if t.parent == "fetch"]
    assert sorted(t.id for t in spawned) == [f"fetch/{i}" for i in range(7)]
    assert result.tasks["sum"].result == {"n": 7, "labels": sorted(i % 3 for i in range(7))}
    assert set(result.tasks["sum"].depends_on) == {"fetch", *(t.id for t in spawned)}
    assert result.audit.clean, result.audit  # the reduce completed after every classify
    assert set(completions(result).values()) == {1}
    seq = {e.task: e.seq for e in result.events if e.event == "completed"}
    assert all(seq[t.id] < seq["sum"] for t in spawned)


def test_a_spawned_task_whose_kind_needs_approval_waits_before_it_starts(
        driver: Driver) -> None:
    from planrun import Approval

    tasks = [Task("fetch", "fetch", {"n": 2}),
             Task("sum", "summary", depends_on=("fetch",), joins=("fetch",))]
    # The timeout decides (no person in this test): the kind's rule approves, the rule of
    # one spawned task rejects.
    result = driver.run(tasks, HANDLERS, approvals={
        "classify": Approval("start", timeout_s=0.5, on_timeout="approve")},
        task_approvals={"fetch/1": Approval("start", timeout_s=0.5)})
    seq = {(e.task, e.event): e.seq for e in result.events}
    approved = next(e for e in result.events if e.task == "fetch/0" and e.event == "approved")
    assert approved.detail["for"] == "start" and approved.detail["by"] == "timeout"
    assert seq[("fetch/0", "created")] < seq[("fetch/0", "waiting")] \
        < seq[("fetch/0", "approved")] < seq[("fetch/0", "started")] \
        < seq[("fetch/0", "completed")]
    for tid in ("fetch/0", "fetch/1"):  # every driver logs the wait, once
        assert [e.event for e in result.events if e.task == tid].count("waiting") == 1
    assert result.tasks["fetch/0"].result == {"label": 0}
    rejected = result.tasks["fetch/1"]
    assert rejected.status is Status.DEAD and rejected.cause == "rejected"
    assert ("fetch/1", "started") not in seq
    assert result.tasks["sum"].status is Status.CANCELLED  # its join lost a task
    assert set(completions(result).values()) == {1}
    assert result.audit.order_violations == 0 and result.audit.duplicates == 0


def test_a_gated_task_waits_across_a_restart_and_starts_once(
        durable_driver: Driver) -> None:
    from planrun import Approval

    done: list[str] = []

    async def first(payload: Any, ctx: TaskContext) -> str:
        done.append(ctx.task_id)
        return "ok"

    tasks = [Task("a", "first"), Task("pay", "pay"), Task("after", "first", depends_on=("pay",))]
    result = durable_driver.run(
        tasks, {"first": first, "pay": first}, interrupt=lambda: "a" in done,
        approvals={"pay": Approval("start", timeout_s=1.5, on_timeout="approve")})
    ev = [e.event for e in sorted(result.events, key=lambda e: e.seq) if e.task == "pay"]
    assert ev.count("waiting") == 1 and ev.count("approved") == 1
    assert ev.index("waiting") < ev.index("approved") < ev.index("started")
    assert done.count("pay") == 1 and result.tasks["after"].status is Status.COMPLETED
    assert result.ok and result.audit.clean


async def nested(payload: Any, ctx: TaskContext) -> str:
    depth = int(payload["depth"])
    if depth:
        for _ in range(2):
            ctx.spawn("nested", {"depth": depth - 1})
    return ctx.task_id


async def count(payload: Any, ctx: TaskContext) -> int:
    return len(ctx.inputs)


def test_a_join_waits_for_what_the_spawned_tasks_spawn(driver: Driver) -> None:
    tasks = [Task("root", "nested", {"depth": 2}),
             Task("after", "count", joins=("root",))]
    result = driver.run(tasks, {"nested": nested, "count": count})
    assert result.ok, result.counts
    assert len(result.tasks) == 2 + 2 + 4  # root, after, two children, four grandchildren
    assert result.tasks["after"].result == 7  # root and its six descendants
    assert result.tasks["root/1/0"].parent == "root/1"
    assert result.audit.clean


async def bad_spawner(payload: Any, ctx: TaskContext) -> str:
    first = ctx.spawn("classify", {"i": 1})
    ctx.spawn("no_such_kind", {})
    ctx.spawn("classify", {"i": 2}, depends_on=[f"{ctx.task_id}/3"])  # a later sibling
    ctx.spawn("classify", {"i": 3}, depends_on=[first])
    return "asked"


def test_an_invalid_spawn_kills_the_spawner_with_every_problem_and_adds_nothing(
        driver: Driver) -> None:
    tasks = [Task("bad", "bad"), Task("next", "summary", depends_on=("bad",))]
    result = driver.run(tasks, {"bad": bad_spawner, **HANDLERS})
    bad = result.tasks["bad"]
    assert bad.status is Status.DEAD
    assert bad.error is not None and "unknown_kind" in bad.error
    assert "forward_dependency" in bad.error
    assert bad.error_class == "permanent" and bad.attempts == 1  # not retried
    assert set(result.tasks) == {"bad", "next"}  # nothing half-added
    assert result.tasks["next"].status is Status.CANCELLED


def test_spawning_is_bounded_per_task_and_in_depth(driver: Driver) -> None:
    tasks = [Task("wide", "fetch", {"n": 3}), Task("deep", "nested", {"depth": 2})]
    limits = SpawnLimits(max_per_task=2, max_depth=1)
    result = driver.run(tasks, {**HANDLERS, "nested": nested}, spawn_limits=limits)
    wide = result.tasks["wide"]
    assert wide.status is Status.DEAD and "too_many_tasks" in (wide.error or "")
    assert result.tasks["deep"].status is Status.COMPLETED  # depth 1 is allowed
    children = [t for t in result.tasks.values() if t.parent == "deep"]
    assert len(children) == 2
    assert all(t.status is Status.DEAD and "too_many_tasks" in (t.error or "")
               and "depth 2 of spawning" in (t.error or "") for t in children)
    assert not any(t.parent == "wide" or (t.parent or "").startswith("deep/")
                   for t in result.tasks.values())


def test_the_run_wide_task_bound_counts_the_plan(driver: Driver) -> None:
    tasks = [Task("a", "fetch", {"n": 2}), Task("b", "summary")]
    result = driver.run(tasks, HANDLERS, spawn_limits=SpawnLimits(max_tasks=3))
    assert result.tasks["a"].status is Status.DEAD
    assert "at most 3" in (result.tasks["a"].error or "")
    assert len(result.tasks) == 2


async def flaky_spawner(payload: Any, ctx: TaskContext) -> str:
    for i in range(3):
        ctx.spawn("classify", {"i": i})
    if ctx.attempt == 1:
        raise TransientError("the ticket API timed out")
    return "ok"


def test_a_failed_attempt_spawns_nothing_and_the_retry_spawns_once(driver: Driver) -> None:
    tasks = [Task("f", "flaky"), Task("sum", "summary", joins=("f",))]
    result = driver.run(tasks, {"flaky": flaky_spawner, **HANDLERS})
    assert result.ok, result.counts
    assert result.tasks["f"].attempts == 2
    assert sorted(t.id for t in result.tasks.values() if t.parent) == ["f/0", "f/1", "f/2"]
    assert result.tasks["sum"].result["n"] == 3
    assert sum(e.event == "created" for e in result.events) == 5
    assert result.audit.clean


async def slow_first_spawner(payload: Any, ctx: TaskContext) -> str:
    for i in range(2):
        ctx.spawn("classify", {"i": i})
    if ctx.attempt == 1:
        await asyncio.sleep(1.0)  # no heartbeat: the lease runs out, the task is reclaimed
    return f"attempt {ctx.attempt}"


async def slow_summary(payload: Any, ctx: TaskContext) -> dict[str, Any]:
    for _ in range(15):  # the reclaimed attempt returns meanwhile, and is refused
        ctx.heartbeat()
        await asyncio.sleep(0.1)
    return await summary(payload, ctx)


def test_a_reclaimed_spawner_adds_nothing_twice(in_process: Driver) -> None:
    driver = in_process
    tasks = [Task("s", "slow"), Task("sum", "summary", joins=("s",))]
    handlers = {**HANDLERS, "slow": slow_first_spawner, "summary": slow_summary}
    result = driver.run(tasks, handlers, stale_after=0.3)
    assert result.ok, result.counts
    assert any(e.event == "reclaimed" and e.task == "s" for e in result.events)
    assert any(e.event == "rejected" and e.task == "s" for e in result.events)
    assert sorted(t.id for t in result.tasks.values() if t.parent) == ["s/0", "s/1"]
    assert sum(e.event == "created" and e.task.startswith("s/") for e in result.events) == 2
    assert set(completions(result).values()) == {1}
    assert result.audit.clean


def test_spawn_requests_keep_their_order_and_ids() -> None:
    ctx = TaskContext(run_id="r", task_id="t", kind="k", attempt=1, worker="w", skill=1.0)
    assert ctx.spawn("a") == "t/0"
    assert ctx.spawn("b", {"x": 1}, depends_on=["t/0"], joins=["t0"]) == "t/1"
    assert ctx.spawned[1] == SpawnRequest("b", {"x": 1}, ("t/0",), ("t0",), 1.0)


# ---- replanning ----------------------------------------------------------------------------


async def doomed(payload: Any, ctx: TaskContext) -> str:
    raise PermanentError(f"source {payload.get('source', '?')} is gone")


async def research(payload: Any, ctx: TaskContext) -> str:
    return f"findings from {payload['source']}"


async def report(payload: Any, ctx: TaskContext) -> list[str]:
    return sorted(str(v) for v in ctx.inputs.values())


REPLAN_HANDLERS = {"doomed": doomed, "research": research, "report": report}


def research_plan() -> list[Task]:
    return [Task("scope", "research", {"source": "notes"}),
            Task("dig", "doomed", {"source": "archive"}, depends_on=("scope",)),
            Task("report", "report", depends_on=("dig",))]


def alternative(requests: list[Any]) -> Any:
    async def replanner(request: Any) -> list[SpawnRequest]:
        requests.append(request)
        dead = request.dead.id
        return [SpawnRequest("research", {"source": "mirror"}, request.dead.depends_on),
                SpawnRequest("report", {}, (f"{dead}/0",))]
    return replanner


def test_a_dead_task_is_replanned_and_the_replacement_runs(driver: Driver) -> None:
    asked: list[Any] = []
    result = driver.run(research_plan(), REPLAN_HANDLERS, on_dead="replan",
                            replanner=alternative(asked))
    tasks = result.tasks
    assert tasks["dig"].status is Status.DEAD and tasks["report"].status is Status.CANCELLED
    assert [r.dead.id for r in asked] == ["dig"]
    assert [t.id for t in asked[0].cancelled] == ["report"]
    assert asked[0].results == {"scope": "findings from notes"}
    assert tasks["dig/0"].status is Status.COMPLETED
    assert tasks["dig/0"].depends_on == ("scope",) and tasks["dig/0"].parent == "dig"
    assert tasks["dig/1"].result == ["findings from mirror"]
    [event] = [e for e in result.events if e.event == "replanned"]
    assert event.task == "dig" and "archive is gone" in event.detail["cause"]
    assert event.detail["tasks"] == ["dig/0", "dig/1"] and event.detail["replaces"] == ["report"]
    assert result.audit.order_violations == 0 and result.audit.duplicates == 0


def test_replanning_stops_at_max_replans(driver: Driver) -> None:
    asked: list[Any] = []

    async def still_doomed(request: Any) -> list[SpawnRequest]:
        asked.append(request)
        return [SpawnRequest("doomed", {"source": f"try {request.number}"},
                             request.dead.depends_on),
                SpawnRequest("report", {}, (f"{request.dead.id}/0",))]

    result = driver.run(research_plan(), REPLAN_HANDLERS, on_dead="replan",
                            replanner=still_doomed, max_replans=2)
    assert [r.number for r in asked] == [1, 2]
    assert [r.dead.id for r in asked] == ["dig", "dig/0"]
    assert sum(e.event == "replanned" for e in result.events) == 2
    last = result.tasks["dig/0/0"]  # the second replacement died too: no third replan
    assert last.status is Status.DEAD
    assert result.tasks["dig/0/1"].status is Status.CANCELLED
    assert not any(t.parent == "dig/0/0" for t in result.tasks.values())


def test_an_invalid_fragment_is_refused_and_the_dependents_stay_cancelled(
        driver: Driver) -> None:
    async def nonsense(request: Any) -> list[SpawnRequest]:
        return [SpawnRequest("no_such_kind", {}), SpawnRequest("report", {}, ("ghost",))]

    result = driver.run(research_plan(), REPLAN_HANDLERS, on_dead="replan",
                            replanner=nonsense)
    [event] = [e for e in result.events if e.event == "replan_failed"]
    assert "unknown_kind" in event.detail["error"] and "unknown_dependency" in event.detail["error"]
    assert set(result.tasks) == {"scope", "dig", "report"}
    assert result.tasks["report"].status is Status.CANCELLED


def test_without_a_replanner_replan_cancels_the_dependents(driver: Driver) -> None:
    result = driver.run(research_plan(), REPLAN_HANDLERS, on_dead="replan")
    assert result.tasks["dig"].status is Status.DEAD
    assert result.tasks["report"].status is Status.CANCELLED
    assert result.tasks["report"].cause == "dig"
    assert not any(e.event.startswith("replan") for e in result.events)


durable_driver = test_drivers.durable_driver  # every driver with a store


def test_a_replan_unanswered_when_the_driver_stopped_is_asked_again_on_resume(
        durable_driver: Driver) -> None:
    asked: list[Any] = []
    answer = alternative([])

    async def first_hangs(request: Any) -> list[SpawnRequest]:
        asked.append(request)
        if len(asked) == 1:  # the driver is stopped while the model is asked
            await asyncio.Event().wait()
        return list(await answer(request))

    result = durable_driver.run(research_plan(), REPLAN_HANDLERS, on_dead="replan",
                                replanner=first_hangs, interrupt=lambda: len(asked) == 1)
    assert [r.dead.id for r in asked] == ["dig", "dig"]
    assert [t.id for t in asked[1].cancelled] == ["report"]
    assert result.tasks["dig/1"].status is Status.COMPLETED
    assert result.tasks["dig/1"].result == ["findings from mirror"]
    assert sum(e.event == "replanned" for e in result.events) == 1
    assert set(completions(result).values()) == {1}
    assert result.audit.order_violations == 0 and result.audit.duplicates == 0


@pytest.mark.parametrize("url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_replan_cut_off_by_a_stop_is_asked_again_on_resume_once(url: str,
                                                                   tmp_path: Any) -> None:
    from planrun.core._registry import KindSpec, Registry
    from planrun.runtime._supervisor import Supervisor

    registry = Registry(KindSpec(k, handler=h) for k, h in REPLAN_HANDLERS.items())

    async def never(request: Any) -> list[SpawnRequest]:
        await asyncio.Event().wait()  # the process stops while the model is asked
        return []

    async def go(store_url: str) -> RunResult:
        store = open_store(store_url)
        await store.open()
        try:
            first = Supervisor(registry, store=store, run_id="rp", on_dead="replan",
                               replanner=never)
            first.add_tasks(research_plan())
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(first.arun(), 2.0)
            asked: list[Any] = []
            again = Supervisor(registry, store=store, run_id="rp", on_dead="replan",
                               replanner=alternative(asked))
            result = await again.aresume()
            assert [r.dead.id for r in asked] == ["dig"]
            return result
        finally:
            await store.close()

    def run(store_url: str) -> RunResult:
        return asyncio.run(go(store_url))

    if url == "sqlite":
        result = run(f"sqlite:///{tmp_path / 'replan.db'}")
    else:
        [result] = [run(u) for u in fresh_schema("planrun_replan")]
    assert result.tasks["dig/1"].status is Status.COMPLETED
    assert sum(e.event == "replanned" for e in result.events) == 1
    assert set(completions(result).values()) == {1}
