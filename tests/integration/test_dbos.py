"""Runs whose attempts are done by worker processes through DBOS queues.

The run is supervised by the process that runs it (the scheduling core decides retries,
reclaims, deaths, locks); worker processes (``planrun worker``, or a :class:`DBOSWorker`
in this process: DBOS allows one application per process) do the attempts. What holds
across processes: resource locks, a run-wide retry budget, each attempt's time limit, a
death's cancellations, a killed worker's attempts reclaimed and finished elsewhere; and
what a worker process refuses, in one line: bad arguments, a database nothing answers at,
another application's queues.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from dbos_support import HERE, SRC, Spawned, holders, run_on_dbos, spawn_worker
from dist_app import registry as dist_registry
from dist_app import triage
from pgtest import fresh_schema

from planrun import Registry, TaskContext
from planrun.core import (
    KindSpec,
    PermanentError,
    RunResult,
    Status,
    Task,
    TransientError,
    UsageError,
)
from planrun.core.scheduling import RetryPolicy
from planrun.runtime import DBOSWorker
from planrun.runtime._dbos_wire import dbos_url
from planrun.stores import open_store

FAST = RetryPolicy(attempts=3, base=0.02, jitter=0.0)
ENV = {"PYTHONPATH": os.pathsep.join([str(HERE), SRC])}


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from fresh_schema("planrun_dbos")


def tickets(n: int) -> list[Task]:
    return [Task(id=f"T-{i:04d}", kind="triage", payload={"ticket": f"T-{i:04d}"})
            for i in range(n)]


def stop(*procs: subprocess.Popen[str]) -> list[str]:
    """SIGTERM each worker process still running; their stderr."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    return [p.communicate(timeout=60)[1] for p in procs]


async def with_worker(registry: Registry, url: str, tasks: list[Task], *,
                      timeout: float | None = None, **options: Any) -> RunResult:
    """``tasks`` run here, their attempts done by a DBOSWorker in this process."""
    store = open_store(url)
    await store.open()
    worker = DBOSWorker(registry, store, url, name="in-process", concurrency=4, lease_s=5.0,
                        timeout=timeout, app_name="dist_app:app")
    serving = asyncio.ensure_future(worker.arun())
    try:
        ready = asyncio.ensure_future(worker.ready.wait())
        await asyncio.wait([serving, ready], return_when=asyncio.FIRST_COMPLETED)
        if serving.done():
            serving.result()  # it failed to start: say why
        return await run_on_dbos(registry, tasks, url, lease=5.0, **options)
    finally:
        worker.stop()
        await asyncio.gather(serving, return_exceptions=True)
        await store.close()


def planrun(*argv: str, cwd: Path | None = None, env: Mapping[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planrun.cli", *argv], cwd=cwd,
                          env={**os.environ, **ENV, **(env or {})}, capture_output=True,
                          text=True, timeout=120)


def one_line(stderr: str) -> str:
    """The one line an error is said in (no traceback, nothing else)."""
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    return stderr


# ---- resource locks, dependencies ---------------------------------------------------------


def test_resource_locks_hold_across_worker_processes(pg_url: str) -> None:
    workers = [spawn_worker(pg_url, f"w{i}", concurrency=3, env={"DIST_APP_WORK_S": "0.15"})
               for i in range(2)]
    batch = [t.evolve(resources=("db",)) if i % 2 == 0 else t
             for i, t in enumerate(tickets(16))]
    batch[1] = batch[1].evolve(depends_on=("T-0000",))
    try:
        for w in workers:  # both are up (the banner comes once the app is loaded)
            assert w.first_line().startswith("worker ")
        result = asyncio.run(asyncio.wait_for(
            run_on_dbos(dist_registry, batch, pg_url, run_id="locks"), 120))
    finally:
        logs = stop(*workers)
    assert all(w.returncode == 0 for w in workers), [log[-1500:] for log in logs]
    assert result.ok and result.audit.clean, result.audit
    started = {e.task: e for e in result.events if e.event == "started"}
    done = {e.task: e for e in result.events if e.event == "completed"}
    lockers = sorted((t for t in result.tasks.values() if t.resources),
                     key=lambda t: started[t.id].seq)
    assert len(lockers) == 8
    for before, after in itertools.pairwise(lockers):  # one "db" task at a time
        assert started[after.id].seq > done[before.id].seq, (before.id, after.id)
        assert started[after.id].at >= done[before.id].at
    # The dependency held too, in the ledger's order and its clock.
    assert started["T-0001"].seq > done["T-0000"].seq
    assert started["T-0001"].at >= done["T-0000"].at
    # The tasks were done by both processes (what a lock held here is held across them).
    by = Counter(t.result["worker"] for t in result.tasks.values())
    assert set(by) == {"w0", "w1"}, by
    held = holders(pg_url, "locks")
    assert {held[t.id, t.token] for t in result.tasks.values()} == {"w0", "w1"}


# ---- retries, time limits, deaths ---------------------------------------------------------


async def always_transient(payload: Any, ctx: TaskContext) -> None:
    raise TransientError("the upstream is down")


def test_the_run_spends_a_run_wide_retry_budget_on_dbos(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'budget.db'}"
    flaky = Registry([KindSpec("flaky", handler=always_transient)])
    batch = [Task(id=f"f{i}", kind="flaky", max_attempts=10) for i in range(3)]
    result = asyncio.run(asyncio.wait_for(with_worker(
        flaky, url, batch, run_id="budget", retry_budget=4, retry=FAST), 120))
    assert len([e for e in result.events if e.event == "retry"]) == 4
    assert all(t.status is Status.DEAD for t in result.tasks.values())
    assert sum(t.attempts for t in result.tasks.values()) == 3 + 4  # one each, four retries
    assert all((t.error or "").endswith("(retry budget exhausted)")
               for t in result.tasks.values()), [t.error for t in result.tasks.values()]
    # Every attempt went through DBOS to the worker, one workflow each.
    held = holders(url, "budget")
    assert len(held) == 7 and set(held.values()) == {"in-process"}


def test_a_worker_process_bounds_each_attempt_and_a_timeout_retries(pg_url: str) -> None:
    # T-0001's first attempt would take 60 s; the worker's --timeout 1 ends it, as a
    # transient failure, and the retry (quick) completes it.
    worker = spawn_worker(pg_url, "w0", extra=["--timeout", "1"],
                          env={"DIST_APP_SLOW": "T-0001", "DIST_APP_SLOW_S": "60"})
    try:
        result = asyncio.run(asyncio.wait_for(
            run_on_dbos(dist_registry, tickets(4), pg_url, run_id="bound", retry=FAST), 120))
    finally:
        [log] = stop(worker)
    assert worker.returncode == 0, log[-1500:]
    assert result.ok and result.audit.clean
    slow = result.tasks["T-0001"]
    assert slow.status is Status.COMPLETED and slow.attempts == 2 and slow.token == 2
    [failed] = [e for e in result.events if e.event == "failed"]
    assert failed.task == "T-0001" and failed.attempt == 1
    assert failed.detail["error"] == "TransientError: attempt timed out after 1.0 s"
    # Transient: retried (a permanent failure would have been its death).
    assert [e.task for e in result.events if e.event == "retry"] == ["T-0001"]
    assert all(result.tasks[f"T-{i:04d}"].attempts == 1 for i in (0, 2, 3))
    assert "worker w0: 4 completed, 1 failed" in log


async def nap(payload: Mapping[str, Any], ctx: TaskContext) -> str:
    await asyncio.sleep(float(payload["s"]))
    return "woke"


def test_a_kinds_own_time_limit_wins_over_the_workers(pg_url: str) -> None:
    naps = Registry([KindSpec("own", handler=nap, timeout_s=0.3),
                     KindSpec("default", handler=nap)])
    batch = [Task(id="own-slow", kind="own", payload={"s": 60}, max_attempts=1),
             Task(id="own-quick", kind="own", payload={"s": 0.01}, max_attempts=1),
             Task(id="default-slow", kind="default", payload={"s": 60}, max_attempts=1),
             Task(id="default-ok", kind="default", payload={"s": 0.6}, max_attempts=1)]
    tasks = asyncio.run(asyncio.wait_for(
        with_worker(naps, pg_url, batch, timeout=1.5), 120)).tasks
    assert tasks["own-slow"].error == "TransientError: attempt timed out after 0.3 s"
    assert tasks["default-slow"].error == "TransientError: attempt timed out after 1.5 s"
    assert tasks["own-slow"].status is tasks["default-slow"].status is Status.DEAD
    assert tasks["default-ok"].status is Status.COMPLETED  # over the kind-less 0.3, under 1.5
    assert tasks["own-quick"].status is Status.COMPLETED


async def fails_a(payload: Any, ctx: TaskContext) -> int:
    if ctx.task_id == "a":
        raise PermanentError("boom")
    return 1


def test_a_death_cancels_every_transitive_dependent(pg_url: str) -> None:
    work = Registry([KindSpec("k", handler=fails_a)])
    batch = [Task(id="a", kind="k"), Task(id="b", kind="k", depends_on=("a",)),
             Task(id="c", kind="k", depends_on=("b",)),
             Task(id="d", kind="k", depends_on=("b", "e")), Task(id="e", kind="k")]
    result = asyncio.run(asyncio.wait_for(with_worker(work, pg_url, batch, run_id="death"),
                                          120))
    assert {t.id: (t.status.value, t.cause) for t in result.tasks.values()} == {
        "a": ("dead", None), "b": ("cancelled", "a"), "c": ("cancelled", "a"),
        "d": ("cancelled", "a"), "e": ("completed", None)}
    assert result.tasks["a"].error == "PermanentError: boom" and result.tasks["a"].attempts == 1
    # Only a and e were ever put on a queue: the cancelled never reached a worker.
    assert set(holders(pg_url, "death")) == {("a", 1), ("e", 1)}


# ---- a killed worker process -----------------------------------------------------------


def test_a_killed_worker_process_is_reclaimed_and_its_tasks_finished_by_another(
        pg_url: str) -> None:
    slow = ["T-0003", "T-0004"]
    env = {"DIST_APP_SLOW": ",".join(slow), "DIST_APP_SLOW_S": "60"}
    lease = 3.0
    sent: Counter[str] = Counter()
    victim = spawn_worker(pg_url, "victim", concurrency=12, lease=lease, env=env)
    helper: subprocess.Popen[str] | None = None

    def victim_holds_the_slow_ones() -> bool:
        try:
            held = holders(pg_url, "kill")
        except Exception:  # DBOS's tables are not made yet
            return False
        return all(held.get((t, 1)) == "victim" for t in slow)

    async def go() -> RunResult:
        nonlocal helper
        run = asyncio.ensure_future(run_on_dbos(
            dist_registry, tickets(12), pg_url, run_id="kill", lease=lease,
            effects={"triage": lambda task, key: sent.update([key])}))
        while not await asyncio.to_thread(victim_holds_the_slow_ones):
            assert not run.done(), "the run ended before the victim held the slow tickets"
            await asyncio.sleep(0.1)
        victim.send_signal(signal.SIGKILL)
        await asyncio.to_thread(victim.communicate, timeout=30)
        helper = spawn_worker(pg_url, "helper", concurrency=4, lease=lease, env=env)
        return await asyncio.wait_for(run, 120)

    try:
        result = asyncio.run(go())
    finally:
        procs = [p for p in (victim, helper) if p is not None]
        logs = stop(*procs)
    assert victim.returncode == -signal.SIGKILL
    assert helper is not None and helper.returncode == 0, logs[-1][-1500:]
    assert result.ok and result.audit.clean, result.audit
    completed = Counter(e.task for e in result.events if e.event == "completed")
    assert completed == Counter({t.id: 1 for t in tickets(12)})  # each task once
    assert len(sent) == 12 and set(sent.values()) == {1}  # each reply once, by its key
    assert sent.keys() == {f"kill:{t.id}" for t in tickets(12)}
    for tid in slow:
        task = result.tasks[tid]
        reclaimed = [e for e in result.events if e.task == tid and e.event == "reclaimed"]
        assert reclaimed and reclaimed[0].detail.get("reason") == "lease expired"
        assert task.reclaims == len(reclaimed) and task.result["worker"] == "helper"
    held = holders(pg_url, "kill")
    assert {held[tid, 1] for tid in slow} == {"victim"}
    assert all(held[t.id, t.token] == "helper" for t in result.tasks.values()
               if t.id in slow)


# ---- what is refused, in one line -----------------------------------------------------


@pytest.mark.parametrize(("flags", "says"), [
    (["--kinds", "triage,nope"], "unknown kind(s) ['nope']"),
    (["--concurrency", "0"], "--concurrency"),
    (["--concurrency", "many"], "--concurrency"),
    (["--timeout", "0"], "--timeout: must be > 0"),
])
def test_the_worker_cli_refuses_bad_arguments_in_one_line(
        tmp_path: Path, flags: list[str], says: str) -> None:
    done = planrun("worker", "--db", f"sqlite:///{tmp_path / 'w.db'}", "--app",
                   "dist_app:app", "--idle-exit", "1", *flags)
    assert done.returncode == 2, done.stderr
    assert says in one_line(done.stderr)
    assert not (tmp_path / "w.db.dbos").exists()  # DBOS never started


def test_a_run_on_dbos_whose_database_does_not_answer_fails_in_one_line(
        tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"goal": "two tickets", "tasks": [
        {"kind": "triage", "payload": {"ticket": f"T-{i}"}, "depends_on": []}
        for i in range(2)]}))
    before = sorted(tmp_path.iterdir())
    done = planrun("run", str(plan), "--app", "dist_app:app", "--workers", "external",
                   "--db", "postgresql://postgres@127.0.0.1:1/test", "--quiet", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "127.0.0.1:1" in one_line(done.stderr), done.stderr
    assert done.stdout == ""
    assert sorted(tmp_path.iterdir()) == before  # nothing created


def test_another_apps_worker_is_refused_the_queues_of_its_kinds(tmp_path: Path) -> None:
    # limits_app and the tickets example both have a kind named classify_ticket: its queue
    # is the first app's; the second app's worker process is refused, and registers none of
    # its queues. An app whose kinds have other names shares the database.
    from dbos import DBOSClient

    url = f"sqlite:///{tmp_path / 'apps.db'}"
    env = {"OPENAI_API_KEY": "sk-not-used-0000000000000000"}
    first = spawn_worker(url, "first", app="limits_app:app", env=env)
    client = DBOSClient(system_database_url=dbos_url(url))

    def registered() -> bool:
        try:
            return client.retrieve_queue("planrun.classify_ticket") is not None
        except Exception:  # DBOS's tables are not made yet
            return False

    try:
        deadline = time.monotonic() + 60
        while not registered():
            assert first.poll() is None, first.communicate()[1][-1500:]
            assert time.monotonic() < deadline, "the first worker registered no queue"
            time.sleep(0.1)
        second = planrun("worker", "--db", url, "--app", "planrun.examples.tickets:make_app",
                         "--name", "second", "--idle-exit", "1", env=env)
        other = planrun("worker", "--db", url, "--app", "kill_app:app", "--name", "other",
                        "--idle-exit", "1")
        queues = {q.name: q.application_name for q in client.list_queues(
            application_name=["limits_app-app", "planrun-examples-tickets-make_app",
                              "kill_app-app"])}
    finally:
        client.destroy()
        [first_log] = stop(first)
    assert second.returncode == 2, second.stderr
    line = one_line(second.stderr.split("\n", 1)[1])  # after its banner
    assert "planrun.classify_ticket belong to application(s) limits_app-app" in line
    assert queues == {"planrun.classify_ticket": "limits_app-app",
                      "planrun.step": "kill_app-app"}, queues
    assert other.returncode == 0 and "worker other: 0 completed, 0 failed" in other.stderr, \
        other.stderr
    assert first.returncode == 0 and "worker first: 0 completed" in first_log, first_log


# ---- a worker process that lacks a kind ---------------------------------------------------


async def summarize(payload: Mapping[str, Any], ctx: TaskContext) -> str:
    return f"summarized by {ctx.worker}"


def test_a_worker_process_lacking_a_kind_says_so_and_serves_the_others(pg_url: str) -> None:
    work = Registry([KindSpec("triage", handler=triage),
                     KindSpec("summarize", handler=summarize)])
    batch = [*tickets(6), Task(id="sum", kind="summarize")]
    proc: subprocess.Popen[str] | None = None

    async def state_of(store: Any) -> dict[str, Task]:
        try:
            return {t.id: t for t in (await store.load_tasks("wants")).tasks}
        except Exception:  # the run is not created yet
            return {}

    async def go() -> tuple[RunResult, dict[str, Task]]:
        nonlocal proc
        run = asyncio.ensure_future(run_on_dbos(
            work, batch, pg_url, run_id="wants", meta={"workers": "external"}, retry=FAST))
        store = open_store(pg_url)
        await store.open()
        try:
            while not await state_of(store):
                await asyncio.sleep(0.05)
            proc = spawn_worker(pg_url, "w0", env={"DIST_APP_WORK_S": "0.01"})
            while not all(t.status is Status.COMPLETED
                          for t in (await state_of(store)).values() if t.kind == "triage"):
                assert proc.poll() is None and not run.done()
                await asyncio.sleep(0.05)
            meanwhile = await state_of(store)  # the triage done; sum waits on its queue
            summarizer = DBOSWorker(Registry([KindSpec("summarize", handler=summarize)]),
                                    store, pg_url, name="summarizer", lease_s=5.0,
                                    app_name="dist_app:app")
            serving = asyncio.ensure_future(summarizer.arun())
            try:
                return await asyncio.wait_for(run, 60), meanwhile
            finally:
                summarizer.stop()
                await serving
        finally:
            await store.close()

    try:
        result, meanwhile = asyncio.run(go())
    finally:
        logs = stop(proc) if proc is not None else [""]
    assert proc is not None and proc.returncode == 0, logs[0][-1500:]
    assert ("worker w0: run wants needs kind(s) summarize, which this worker does not do; "
            "it serves the others") in logs[0]
    assert "worker w0: 6 completed, 0 failed" in logs[0]
    assert not meanwhile["sum"].finished
    assert result.ok and result.audit.clean
    assert result.tasks["sum"].result == "summarized by summarizer"
    assert result.tasks["sum"].attempts == 1  # it waited; nobody failed it
    assert {t.result["worker"] for t in result.tasks.values() if t.kind == "triage"} == {"w0"}


def test_a_worker_refuses_what_makes_no_sense_before_it_starts() -> None:
    store = open_store("memory://")
    url = "sqlite:///never.db"
    for options, says in [({"kinds": ["nope"]}, "unknown kind"),
                          ({"concurrency": 0}, "concurrency must be >= 1"),
                          ({"lease_s": 0.0}, "lease_s must be > 0"),
                          ({"timeout": 0.0}, "timeout must be > 0")]:
        with pytest.raises(UsageError, match=says):
            DBOSWorker(dist_registry, store, url, **options)


def test_an_application_with_its_own_dbos_instance_serves_planruns_attempts(
        pg_url: str) -> None:
    """own_dbos_app.py launches DBOS itself with a workflow of its own, registers planrun's
    beside it, and serves the attempts with ``DBOSWorker(..., launch=False)``."""
    proc = Spawned([sys.executable, str(HERE / "own_dbos_app.py"), pg_url],
                   env={**os.environ, **ENV})
    try:
        out = proc.output_once(lambda text: "ready" in text, stdout=True)
        assert "own workflow: 42\nready" in out, proc.communicate(timeout=60)
        result = asyncio.run(run_on_dbos(dist_registry, tickets(20), pg_url))
    finally:
        err = stop(proc)[0]
    assert proc.returncode == 0, err[-2000:]
    assert result.ok, [t.error for t in result.tasks.values() if t.error]
    assert {t.result["worker"] for t in result.tasks.values()} == {"embedded"}
