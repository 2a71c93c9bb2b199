"""Approval gates, run against every in-process driver of the core, a restart and the CLI.

A gated task waits in status ``waiting``; a decision comes from the Python API, or from
another connection to the store (what ``planrun approve`` does), which the run's process
reads while the task waits. The drivers are those of ``test_drivers.py`` that run in
process (no store, memory, SQLite, PostgreSQL).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from pgtest import fresh_schema
from test_drivers import DRIVERS, Driver, ok

from planrun import Approval, approve_task, reject_task
from planrun.core._errors import UsageError
from planrun.core._registry import Handler, KindSpec, Registry, WorkerSpec
from planrun.core._task import Status, Task
from planrun.core.scheduling import RetryPolicy
from planrun.runtime._clock import VirtualClock
from planrun.runtime._supervisor import RunResult, Supervisor
from planrun.stores import open_store

FAST = RetryPolicy(attempts=3, base=0.02, cap=0.1, jitter=0.0, max_retry_after=0.2)
IN_PROCESS = [d for d in DRIVERS if d[2] is None]
JOB = Path(__file__).with_name("approval_job.py")
SRC = str(Path(__file__).resolve().parents[2] / "src")

Decision = tuple[str, bool, str | None]  # task id, approve?, note or reason


@pytest.fixture(params=IN_PROCESS, ids=[d[0] for d in IN_PROCESS])
def driver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Driver]:
    name, store, mode, virtual = request.param
    d = Driver(name, store, mode, virtual)
    if store == "sqlite":
        d.url = f"sqlite:///{tmp_path / 'run.db'}"
    if store == "postgres":
        for url in fresh_schema("planrun_appr"):
            d.url = url
            yield d
        return
    yield d


def run(driver: Driver, tasks: Sequence[Task], handlers: dict[str, Handler],
        decisions: Sequence[Decision] = (), via_store: bool = False,
        errors: list[str] | None = None, **options: Any) -> RunResult:
    """Run ``tasks``; decide each waiting task of ``decisions`` in turn as it waits."""
    registry = Registry(KindSpec(k, handler=h) for k, h in handlers.items())
    options.setdefault("retry", FAST)

    async def go() -> RunResult:
        store = await driver._open() if driver.store else None
        other = store
        if via_store and driver.store in ("sqlite", "postgres"):
            other = open_store(driver.url)
            await other.open()
        sup = Supervisor(registry, [WorkerSpec("w1", None, 4)], store=store, clock=clock,
                         seed=0, approval_poll=0.05, **options)
        sup.add_tasks(list(tasks))
        running = asyncio.ensure_future(sup.arun())
        try:
            for task_id, approve, text in decisions:
                while task_id not in sup.waiting and not running.done():
                    await asyncio.sleep(0.02)
                if running.done():
                    break
                if via_store:
                    assert other is not None
                    while not any(t.status is Status.WAITING for t in
                                  await other.load_some(sup.run_id, [task_id])):
                        await asyncio.sleep(0.02)  # the row is written in the next batch
                    if approve:
                        await approve_task(other, sup.run_id, task_id, text)
                    else:
                        await reject_task(other, sup.run_id, task_id, text or "no")
                    if errors is not None:  # deciding twice through the store
                        try:
                            await approve_task(other, sup.run_id, task_id, text)
                        except UsageError as exc:
                            errors.append(str(exc))
                elif approve:
                    sup.approve(task_id, text)
                    if errors is not None:
                        try:
                            sup.approve(task_id, text)
                        except UsageError as exc:
                            errors.append(str(exc))
                else:
                    sup.reject(task_id, text or "no")
            return await running
        finally:
            if other is not None and other is not store:
                await other.close()
            if store is not None and driver.store != "memory":
                await store.close()

    clock = VirtualClock() if driver.virtual else None
    if clock is not None:
        return clock.run(go())
    return asyncio.run(asyncio.wait_for(go(), 60))


def events_of(result: RunResult, task_id: str) -> list[str]:
    return [e.event for e in sorted(result.events, key=lambda e: e.seq) if e.task == task_id]


def test_a_task_waits_for_approval_before_it_starts(driver: Driver) -> None:
    started: list[str] = []

    async def pay(payload: Any, ctx: Any) -> str:
        started.append(ctx.task_id)
        return "paid"

    tasks = [Task(id="a", kind="k"), Task(id="pay", kind="pay", depends_on=("a",)),
             Task(id="after", kind="k", depends_on=("pay",))]
    result = run(driver, tasks, {"k": ok, "pay": pay}, [("pay", True, "ok by ann")],
                 approvals={"pay": "start"})
    assert result.ok and result.audit.clean
    assert started == ["pay"]
    assert events_of(result, "pay")[:4] == ["created", "waiting", "approved", "assigned"]
    approved = next(e for e in result.events if e.event == "approved")
    assert approved.detail["note"] == "ok by ann" and approved.detail["for"] == "start"
    assert result.tasks["pay"].cause == "approved"
    assert events_of(result, "after").index("started") > 0


def test_an_effect_waits_for_approval_and_is_applied_once(driver: Driver) -> None:
    sent: list[str] = []
    tasks = [Task(id="reply", kind="reply"), Task(id="next", kind="k", depends_on=("reply",))]
    result = run(driver, tasks, {"k": ok, "reply": ok}, [("reply", True, None)],
                 via_store=driver.store is not None,
                 effects={"reply": lambda t, k: sent.append(t.id)},
                 task_approvals={"reply": Approval("effect")})
    assert result.ok and result.audit.clean
    assert sent == ["reply"]
    ev = events_of(result, "reply")
    assert ev.index("started") < ev.index("waiting") < ev.index("approved") \
        < ev.index("completed") < ev.index("effect")  # the approval allows the completion
    assert result.tasks["reply"].result == "done reply"
    assert events_of(result, "next").index("created") == 0
    # the dependent started only after the approval
    seqs = {(e.task, e.event): e.seq for e in result.events}
    assert seqs[("next", "started")] > seqs[("reply", "approved")]


def test_a_rejected_task_is_dead_and_its_dependents_are_cancelled(driver: Driver) -> None:
    ran: list[str] = []

    async def pay(payload: Any, ctx: Any) -> str:
        ran.append(ctx.task_id)
        return "paid"

    tasks = [Task(id="pay", kind="pay"), Task(id="after", kind="k", depends_on=("pay",)),
             Task(id="free", kind="k")]
    result = run(driver, tasks, {"k": ok, "pay": pay}, [("pay", False, "not this month")],
                 via_store=driver.store is not None, approvals={"pay": "start"})
    pay_task = result.tasks["pay"]
    assert pay_task.status is Status.DEAD and pay_task.cause == "rejected"
    assert "not this month" in (pay_task.error or "")
    assert ran == []
    assert result.tasks["after"].status is Status.CANCELLED
    assert result.tasks["after"].cause == "pay"
    assert result.tasks["free"].status is Status.COMPLETED
    dead = next(e for e in result.events if e.event == "dead")
    assert dead.detail["cause"] == "rejected"


def test_a_rejection_aborts_the_run_under_abort_run(driver: Driver) -> None:
    tasks = [Task(id="pay", kind="pay"), Task(id="slow", kind="k", depends_on=("pay",))]
    result = run(driver, tasks, {"k": ok, "pay": ok}, [("pay", False, "no")],
                 approvals={"pay": "start"}, on_dead="abort_run")
    assert result.aborted_by == "pay"
    assert result.tasks["slow"].status is Status.CANCELLED


@pytest.mark.parametrize("default", ["reject", "approve"])
def test_an_approval_timeout_decides_by_default(driver: Driver, default: str) -> None:
    tasks = [Task(id="pay", kind="pay")]
    rule = Approval("start", timeout_s=0.3, on_timeout=default)  # type: ignore[arg-type]
    result = run(driver, tasks, {"pay": ok}, approvals={"pay": rule})
    task = result.tasks["pay"]
    if default == "reject":
        assert task.status is Status.DEAD and task.cause == "rejected"
        assert "timed out" in (task.error or "")
    else:
        assert task.status is Status.COMPLETED
        approved = next(e for e in result.events if e.event == "approved")
        assert approved.worker == "timeout"
    waiting = next(e for e in result.events if e.event == "waiting")
    assert waiting.detail["timeout_at"] is not None


def test_approving_twice_or_a_task_that_does_not_wait_is_an_error(driver: Driver) -> None:
    errors: list[str] = []
    tasks = [Task(id="pay", kind="pay")]
    result = run(driver, tasks, {"pay": ok}, [("pay", True, None)],
                 via_store=driver.store is not None, errors=errors, approvals={"pay": "start"})
    assert result.ok
    assert len(errors) == 1
    assert "pay" in errors[0] and ("already approved" in errors[0] or "not waiting" in errors[0])


def test_a_waiting_task_is_not_a_stall(driver: Driver) -> None:
    # stall_after is far shorter than the wait: the run waits for the person, not a stall.
    tasks = [Task(id="pay", kind="pay")]
    result = run(driver, tasks, {"pay": ok},
                 approvals={"pay": Approval("start", timeout_s=1.0, on_timeout="approve")},
                 stall_after=0.2)
    assert result.tasks["pay"].status is Status.COMPLETED
    approved = next(e for e in result.events if e.event == "approved")
    waiting = next(e for e in result.events if e.event == "waiting")
    assert approved.worker == "timeout" and approved.at - waiting.at >= 0.9


def test_approving_an_unknown_or_running_task_through_the_api_is_an_error() -> None:
    registry = Registry([KindSpec("k", handler=ok)])
    sup = Supervisor(registry, clock=VirtualClock())
    sup.add_tasks([Task(id="a", kind="k")])
    with pytest.raises(UsageError, match="no task 'zz'"):
        sup.approve("zz")
    with pytest.raises(UsageError, match=r"not waiting for approval \(it is pending"):
        sup.approve("a")
    with pytest.raises(UsageError, match="needs a reason"):
        sup.reject("a", "")
    with pytest.raises(UsageError, match="before must be"):
        Approval("later")  # type: ignore[arg-type]


# ---- across a real restart, decided from the command line ---------------------------------


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _statuses(url: str, run_id: str) -> dict[str, str]:
    async def go() -> dict[str, str]:
        store = open_store(url)
        await store.open()
        try:
            state = await store.load_tasks(run_id)
        finally:
            await store.close()
        return {t.id: t.status.value for t in state.tasks}

    return asyncio.run(go())


def _wait_for(url: str, run_id: str, want: dict[str, str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    seen: dict[str, str] = {}
    while time.monotonic() < deadline:
        try:
            seen = _statuses(url, run_id)
        except Exception:
            seen = {}
        if all(seen.get(k) == v for k, v in want.items()):
            return
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} never reached {want}: {seen}")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planrun", *args], capture_output=True,
                          text=True, env=_env(), timeout=60)


def test_an_approval_survives_a_supervisor_restart(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'run.db'}"
    outbox = tmp_path / "outbox.txt"
    first = subprocess.Popen([sys.executable, str(JOB), url, "r1", "run", str(outbox)],
                             env=_env(), stdout=subprocess.DEVNULL)
    try:
        _wait_for(url, "r1", {"reply": "waiting", "pay": "waiting"})
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    assert _statuses(url, "r1")["reply"] == "waiting"
    assert not outbox.exists()  # the effect waits for its approval
    # decided while no process runs the run: carried out at resume
    done = _cli("reject", "r1", "pay", "--reason", "not approved", "--db", url)
    assert done.returncode == 0, done.stderr
    second = subprocess.Popen([sys.executable, str(JOB), url, "r1", "resume", str(outbox)],
                              env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        _wait_for(url, "r1", {"pay": "dead", "after": "cancelled", "reply": "waiting"})
        assert not outbox.exists()
        # decided from another process while the resumed one runs
        done = _cli("approve", "r1", "reply", "--note", "checked", "--db", url, "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["decision"] == "approved"
        out, _ = second.communicate(timeout=60)
    finally:
        if second.poll() is None:
            second.kill()
            second.wait(timeout=30)
        if second.stdout is not None:
            second.stdout.close()
    assert second.returncode == 0
    final = json.loads(out.split("done", 1)[1])
    assert final == {"a": "completed", "reply": "completed", "pay": "dead",
                     "after": "cancelled"}
    assert outbox.read_text().splitlines() == ["reply r1:reply"]  # applied once
    again = _cli("approve", "r1", "reply", "--db", url)
    assert again.returncode == 2
    assert again.stderr.strip() == ("planrun: error: task 'reply' is not waiting for approval "
                                    "(it is completed)")


def test_cli_approve_and_reject_refuse_bad_input(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'run.db'}"

    async def seed() -> None:
        from planrun.stores.base import RunInfo

        store = open_store(url)
        await store.open()
        try:
            await store.create_run(RunInfo("r1", 0.0))
            await store.add_tasks("r1", [Task(id="a", kind="k")], [])
        finally:
            await store.close()

    asyncio.run(seed())
    unknown = _cli("approve", "r1", "zz", "--db", url)
    assert unknown.returncode == 2 and "has no task 'zz'" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1
    pending = _cli("approve", "r1", "a", "--db", url)
    assert pending.returncode == 2 and "not waiting for approval (it is pending)" in pending.stderr
    no_reason = _cli("reject", "r1", "a", "--db", url)
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
    empty = _cli("reject", "r1", "a", "--reason", " ", "--db", url)
    assert empty.returncode == 2 and "needs a reason" in empty.stderr


# ---- worker processes on DBOS: the run's process gates, the workers do ----------------------

EXTERNAL = [d for d in DRIVERS if d[2] == "dbos"]


@pytest.fixture(params=EXTERNAL, ids=[d[0] for d in EXTERNAL])
def external(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Driver]:
    name, store, mode, virtual = request.param
    d = Driver(name, store, mode, virtual)
    if store == "sqlite":
        d.url = f"sqlite:///{tmp_path / 'run.db'}"
    if store == "postgres":
        for url in fresh_schema("planrun_appr_ext"):
            d.url = url
            yield d
        return
    yield d


def run_external(driver: Driver, tasks: Sequence[Task], handlers: dict[str, Handler],
                 decisions: Sequence[Decision] = (), **options: Any) -> RunResult:
    """The run supervised here, its attempts done by a worker on DBOS; each decision is
    written through the store, as ``planrun approve`` writes it."""
    from planrun._facade import App
    from planrun.runtime import DBOSAttempts, DBOSWorker

    registry = Registry(KindSpec(k, handler=h) for k, h in handlers.items())

    async def decide(store: Any) -> None:
        for task_id, approve, text in decisions:
            while not any(t.status is Status.WAITING
                          for t in await _some(store, "rx", task_id)):
                await asyncio.sleep(0.02)
            if approve:
                await approve_task(store, "rx", task_id, text)
            else:
                await reject_task(store, "rx", task_id, text or "no")

    async def go() -> RunResult:
        stores = [await driver._open() for _ in range(3)]
        worker = DBOSWorker(registry, stores[1], driver.url, name="w1", concurrency=8,
                            lease_s=5.0)
        serving = asyncio.ensure_future(worker.arun())
        attempts = DBOSAttempts(driver.url, stores[0], lease_s=5.0)
        deciding = asyncio.ensure_future(decide(stores[2]))
        try:
            await worker.ready.wait()
            app = attempts.app(App(registry, effects=options.pop("effects", {}),
                                   approvals=options.pop("approvals", {})))
            sup = Supervisor(app.registry, app.worker_specs(), store=stores[0], run_id="rx",
                             effects=app.effects, approvals=app.approvals, stale_after=5.0,
                             retry=FAST, approval_poll=0.05, **options)
            sup.add_tasks(list(tasks))
            result = await sup.arun()
            await deciding
            return result
        finally:
            deciding.cancel()
            worker.stop()
            await attempts.aclose()
            await asyncio.gather(serving, deciding, return_exceptions=True)
            for s in stores:
                await s.close()

    return asyncio.run(asyncio.wait_for(go(), 60))


async def _some(store: Any, run_id: str, task_id: str) -> list[Task]:
    try:
        found: list[Task] = await store.load_some(run_id, [task_id])
    except Exception:  # the run is not created yet
        return []
    return found


def test_external_workers_start_a_task_only_once_approved(external: Driver) -> None:
    tasks = [Task(id="a", kind="k"), Task(id="pay", kind="pay", depends_on=("a",)),
             Task(id="after", kind="k", depends_on=("pay",)),
             Task(id="no", kind="pay"), Task(id="never", kind="k", depends_on=("no",))]
    result = run_external(external, tasks, {"k": ok, "pay": ok},
                          [("pay", True, "fine"), ("no", False, "too much")],
                          approvals={"pay": "start"})
    assert result.tasks["pay"].status is Status.COMPLETED
    assert result.tasks["after"].status is Status.COMPLETED
    ev = events_of(result, "pay")
    assert ev.index("waiting") < ev.index("approved") < ev.index("started")
    assert result.tasks["no"].status is Status.DEAD and result.tasks["no"].cause == "rejected"
    assert result.tasks["never"].status is Status.CANCELLED
    assert "started" not in events_of(result, "no")


def test_external_workers_hold_an_effect_until_approved(external: Driver) -> None:
    sent: list[str] = []
    tasks = [Task(id="reply", kind="reply"), Task(id="next", kind="k", depends_on=("reply",)),
             Task(id="spam", kind="reply"), Task(id="after", kind="k", depends_on=("spam",)),
             Task(id="quiet", kind="reply", payload={"skip": True})]
    result = run_external(external, tasks, {"k": ok, "reply": ok},
                          [("reply", True, "send it"), ("spam", False, "not this one")],
                          effects={"reply": lambda t, k: sent.append(t.id)},
                          approvals={"reply": Approval(
                              "effect", when=lambda t: not (t.payload or {}).get("skip"))})
    assert sorted(sent) == ["quiet", "reply"]
    ev = events_of(result, "reply")
    assert ev.index("started") < ev.index("waiting") < ev.index("approved") \
        < ev.index("completed") < ev.index("effect")
    assert ev.count("completed") == 1 and ev.count("effect") == 1
    assert result.tasks["reply"].result == "done reply"
    seqs = {(e.task, e.event): e.seq for e in result.events}
    assert seqs[("next", "started")] > seqs[("reply", "approved")]
    assert result.tasks["spam"].status is Status.DEAD and result.tasks["spam"].cause == "rejected"
    assert "effect" not in events_of(result, "spam")
    assert result.tasks["after"].status is Status.CANCELLED
    # the condition says no approval: the held result completes at once
    assert "approved" not in events_of(result, "quiet")
    assert result.tasks["quiet"].status is Status.COMPLETED
    assert result.audit.duplicates == 0 and result.audit.order_violations == 0


def test_a_condition_that_cannot_decide_asks_for_approval(driver: Driver) -> None:
    def broken(task: Task) -> bool:
        raise KeyError("category")

    tasks = [Task(id="r", kind="reply")]
    result = run(driver, tasks, {"reply": ok}, [("r", True, None)],
                 approvals={"reply": Approval("effect", when=broken)})
    assert result.ok and "waiting" in events_of(result, "r")


STORED = [d for d in IN_PROCESS if d[1] is not None]


@pytest.fixture(params=STORED, ids=[d[1] for d in STORED])
def stored(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Driver]:
    name, store, mode, virtual = request.param
    d = Driver(name, store, mode, virtual)
    if store == "sqlite":
        d.url = f"sqlite:///{tmp_path / 'run.db'}"
    if store == "postgres":
        for url in fresh_schema("planrun_appr_race"):
            d.url = url
            yield d
        return
    yield d


def test_two_decisions_at_once_on_a_store_only_one_is_taken(stored: Driver) -> None:
    driver = stored
    from planrun.core._task import transition
    from planrun.stores.base import RunInfo

    async def go() -> list[object]:
        stores = [await driver._open() for _ in range(2)]
        waiting = transition(Task(id="pay", kind="pay"), Status.WAITING, cause="approval:start")
        await stores[0].create_run(RunInfo("race", 0.0))
        await stores[0].add_tasks("race", [waiting], [])
        outcomes = await asyncio.gather(
            approve_task(stores[0], "race", "pay", "first"),
            reject_task(stores[1], "race", "pay", "second"), return_exceptions=True)
        (row,) = await stores[0].load_some("race", ["pay"])
        if driver.store != "memory":
            for s in stores:
                await s.close()
        return [*outcomes, row]

    first, second, row = asyncio.run(go())
    refused = [o for o in (first, second) if isinstance(o, UsageError)]
    assert len(refused) == 1 and "already" in str(refused[0])
    assert isinstance(row, Task) and row.status is Status.WAITING
    assert row.cause in ("approve:start", "reject:start")
