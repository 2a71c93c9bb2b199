"""Workers in other processes: push and peer modes, reclaim of a killed worker, fencing,
and the headline: eight worker processes, one PostgreSQL database, 2,000 tickets, 2,000
replies."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dist_app import registry
from pgtest import fresh_schema

from planrun.core._errors import PermanentError, StoreError, TransientError, UsageError
from planrun.core._ledger import Event
from planrun.core._registry import KindSpec, Registry
from planrun.core._task import Status, Task, transition
from planrun.core.scheduling import RetryPolicy
from planrun.runtime._distributed import Coordinator, WorkerProcess
from planrun.runtime._supervisor import RunResult, Supervisor
from planrun.stores import open_store

HERE = Path(__file__).resolve().parent


def tickets(n: int) -> list[Task]:
    return [Task(id=f"T-{i:04d}", kind="triage", payload={"ticket": f"T-{i:04d}"})
            for i in range(n)]


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'dist.db'}"
        return
    yield from _pg_schema()


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from _pg_schema()


def _pg_schema() -> Iterator[str]:
    yield from fresh_schema("planrun_dist")


async def opened(url: str) -> Any:
    store = open_store(url)
    await store.open()
    return store


@pytest.mark.parametrize("mode", ["push", "peer"])
def test_in_process_workers_on_separate_connections(db_url: str, mode: str) -> None:
    sent: list[str] = []

    async def go() -> Any:
        coordinator_store = await opened(db_url)
        worker_stores = [await opened(db_url) for _ in range(3)]
        workers = [WorkerProcess(registry, s, name=f"w{i}", capacity=3, mode=mode, poll=0.02)
                   for i, s in enumerate(worker_stores)]
        handles = [asyncio.ensure_future(w.arun()) for w in workers]
        coordinator = Coordinator(registry, coordinator_store, mode=mode, poll=0.02,
                                  effects={"triage": lambda t, key: sent.append(key)})
        batch = tickets(60)
        batch[5] = batch[5].evolve(depends_on=("T-0000",))
        result = await coordinator.arun(batch)
        for w in workers:
            w.stop()
        await asyncio.gather(*handles)
        for s in [coordinator_store, *worker_stores]:
            await s.close()
        return result, workers

    result, workers = asyncio.run(go())
    assert result.ok and result.audit.clean
    assert len(sent) == 60 == len(set(sent))
    assert sum(w.done for w in workers) == 60
    assert all(w.done > 0 for w in workers)
    started = {e.task: e for e in result.events if e.event == "started"}
    done = {e.task: e for e in result.events if e.event == "completed"}
    # Dependencies hold across processes: in the ledger's order and in its clock.
    assert started["T-0005"].seq > done["T-0000"].seq
    assert started["T-0005"].at >= done["T-0000"].at


def test_push_mode_keeps_resource_locks_across_worker_processes(db_url: str) -> None:
    async def go() -> RunResult:
        stores = [await opened(db_url) for _ in range(4)]
        workers = [WorkerProcess(registry, s, name=f"w{i}", capacity=3, poll=0.01)
                   for i, s in enumerate(stores[1:])]
        handles = [asyncio.ensure_future(w.arun()) for w in workers]
        batch = [t.evolve(resources=("db",)) if i % 2 == 0 else t
                 for i, t in enumerate(tickets(16))]
        result = await Coordinator(registry, stores[0], poll=0.01).arun(batch)
        for w in workers:
            w.stop()
        await asyncio.gather(*handles)
        for s in stores:
            await s.close()
        return result

    result = asyncio.run(go())
    assert result.ok and result.audit.clean
    started = {e.task: e for e in result.events if e.event == "started"}
    done = {e.task: e for e in result.events if e.event == "completed"}
    holders = sorted((t for t in result.tasks.values() if t.resources),
                     key=lambda t: started[t.id].seq)
    assert len(holders) == 8
    for before, after in itertools.pairwise(holders):  # one "db" task at a time
        assert started[after.id].seq > done[before.id].seq
        assert started[after.id].at >= done[before.id].at
    free = [t.id for t in result.tasks.values() if not t.resources]
    assert len({started[t].worker for t in free}) > 1  # the others ran alongside


def test_peer_mode_refuses_tasks_that_name_resources(tmp_path: Path) -> None:
    async def go() -> None:
        store = await opened(f"sqlite:///{tmp_path / 'peer.db'}")
        try:
            coordinator = Coordinator(registry, store, mode="peer", stall_after=2.0)
            with pytest.raises(UsageError, match="resource locks need push mode"):
                await coordinator.arun([tickets(1)[0].evolve(resources=("db",))])
            assert await store.list_runs() == []  # refused before anything was written
        finally:
            await store.close()

    asyncio.run(go())


async def _always_transient(payload: Any, ctx: Any) -> None:
    raise TransientError("the upstream is down")


def test_the_coordinator_spends_a_run_wide_retry_budget(db_url: str) -> None:
    flaky = Registry([KindSpec("flaky", handler=_always_transient)])

    async def go() -> RunResult:
        stores = [await opened(db_url) for _ in range(2)]
        worker = WorkerProcess(flaky, stores[1], name="w", capacity=4, poll=0.01)
        serving = asyncio.ensure_future(worker.arun())
        batch = [Task(id=f"f{i}", kind="flaky", max_attempts=10) for i in range(3)]
        result = await Coordinator(flaky, stores[0], poll=0.01, retry_budget=4,
                                   retry=RetryPolicy(base=0.01, jitter=0.0)).arun(batch)
        worker.stop()
        await serving
        for s in stores:
            await s.close()
        return result

    result = asyncio.run(go())
    assert len([e for e in result.events if e.event == "retry"]) == 4
    assert all(t.status is Status.DEAD for t in result.tasks.values())
    assert sum(t.attempts for t in result.tasks.values()) == 3 + 4  # one each, four retries
    assert all((t.error or "").endswith("(retry budget exhausted)")
               for t in result.tasks.values())


def test_a_resumed_coordinator_keeps_what_the_retry_budget_spent(db_url: str) -> None:
    from planrun.stores import RunInfo

    async def go() -> RunResult:
        store = await opened(db_url)
        failed = transition(transition(transition(
            Task(id="f", kind="triage", max_attempts=10), Status.ASSIGNED, token=1,
            assigned_to="w"), Status.RUNNING), Status.FAILED, attempts=1, error="down",
            not_before=time.time() + 3600)
        await store.create_run(RunInfo("run-budget", time.time(), meta={"coordinated": True}))
        spent = [Event(i, 1.0, "f", "retry", None, 1) for i in range(2)]
        await store.add_tasks("run-budget", [failed], spent)
        try:
            return await Coordinator(registry, store, run_id="run-budget", poll=0.01,
                                     retry_budget=2, stall_after=5).aresume()
        finally:
            await store.close()

    result = asyncio.run(go())
    # Spent before: no retry now (nor a wait for its backoff), straight to dead.
    assert result.tasks["f"].status is Status.DEAD
    assert result.tasks["f"].error == "down (retry budget exhausted)"
    assert len([e for e in result.events if e.event == "retry"]) == 2


async def _nap(payload: Any, ctx: Any) -> str:
    await asyncio.sleep(float(payload["s"]))
    return "woke"


def test_limits_that_make_no_sense_are_refused_up_front() -> None:
    from planrun.stores import InMemoryStore

    store = InMemoryStore()
    with pytest.raises(UsageError, match="retry_budget must be >= 0"):
        Coordinator(registry, store, retry_budget=-1)
    with pytest.raises(UsageError, match="timeout must be > 0"):
        WorkerProcess(registry, store, timeout=0)
    with pytest.raises(UsageError, match="retry_budget must be >= 0"):
        Supervisor(registry, retry_budget=-2)
    with pytest.raises(UsageError, match="timeout must be > 0"):
        Supervisor(registry, timeout=-1.0)


def test_a_worker_process_bounds_each_attempt() -> None:
    from planrun.stores import InMemoryStore

    naps = Registry([KindSpec("own", handler=_nap, timeout_s=0.2),
                     KindSpec("default", handler=_nap)])

    async def go() -> RunResult:
        store = InMemoryStore()
        await store.open()
        worker = WorkerProcess(naps, store, name="w", poll=0.01, timeout=1.0)
        serving = asyncio.ensure_future(worker.arun())
        batch = [Task(id="own-slow", kind="own", payload={"s": 5}, max_attempts=1),
                 Task(id="own-quick", kind="own", payload={"s": 0.001}, max_attempts=1),
                 Task(id="default-slow", kind="default", payload={"s": 5}, max_attempts=1),
                 Task(id="default-ok", kind="default", payload={"s": 0.01}, max_attempts=1)]
        try:
            return await Coordinator(naps, store, poll=0.01, stall_after=10).arun(batch)
        finally:
            worker.stop()
            await serving

    tasks = asyncio.run(go()).tasks
    assert tasks["own-slow"].error == "TransientError: attempt timed out after 0.2 s"
    assert tasks["default-slow"].error == "TransientError: attempt timed out after 1.0 s"
    assert tasks["default-ok"].status is Status.COMPLETED  # under the worker's 1 s
    assert tasks["own-quick"].status is Status.COMPLETED


async def _fails_a(payload: Any, ctx: Any) -> int:
    if ctx.task_id == "a":
        raise PermanentError("boom")
    return 1


def test_a_death_cancels_every_transitive_dependent_of_an_external_run(db_url: str) -> None:
    work = Registry([KindSpec("k", handler=_fails_a)])

    async def go() -> RunResult:
        stores = [await opened(db_url) for _ in range(2)]
        worker = WorkerProcess(work, stores[1], name="w", poll=0.01)
        serving = asyncio.ensure_future(worker.arun())
        batch = [Task(id="a", kind="k"), Task(id="b", kind="k", depends_on=("a",)),
                 Task(id="c", kind="k", depends_on=("b",)),
                 Task(id="d", kind="k", depends_on=("b", "e")), Task(id="e", kind="k")]
        try:
            return await Coordinator(work, stores[0], poll=0.01, stall_after=5).arun(batch)
        finally:
            worker.stop()
            await serving
            for s in stores:
                await s.close()

    tasks = asyncio.run(go()).tasks
    assert {t.id: (t.status.value, t.cause) for t in tasks.values()} == {
        "a": ("dead", None), "b": ("cancelled", "a"), "c": ("cancelled", "a"),
        "d": ("cancelled", "a"), "e": ("completed", None)}


def test_after_the_first_read_a_coordinator_reads_only_what_changed() -> None:
    from planrun.stores import InMemoryStore

    async def go() -> tuple[InMemoryStore, RunResult]:
        store = InMemoryStore()
        await store.open()
        worker = WorkerProcess(registry, store, name="w", capacity=4, poll=0.01)
        serving = asyncio.ensure_future(worker.arun())
        result = await Coordinator(registry, store, poll=0.01).arun(tickets(40))
        worker.stop()
        await serving
        return store, result

    store, result = asyncio.run(go())
    assert result.ok and result.audit.clean
    rounds = store.calls_to("load_changed")
    assert len(rounds) > 10 and [c["after"] for c in rounds] == sorted(c["after"] for c in rounds)
    # Whole-run reads: the first build and the final report, however many rounds ran, and
    # the worker's one read of the run's approval rules (its meta) at its first result.
    assert len(store.calls_to("load")) == 3


class _Behind:
    """The coordinator's store while the coordinator falls behind: it reads no change (its
    cursor stays where it was) until ``caught_up`` is set, as a coordinator on a loaded
    machine reads late while peer workers go on."""

    def __init__(self, store: Any) -> None:
        self.store, self.caught_up = store, asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def load_changed(self, run_id: str, after: int) -> tuple[list[Task], int]:
        if after >= 0 and not self.caught_up.is_set():
            return [], after
        changed: tuple[list[Task], int] = await self.store.load_changed(run_id, after)
        return changed


async def _spawns_two(payload: Any, ctx: Any) -> str:
    if ctx.task_id == "p":
        ctx.spawn("child", {"fails": "permanently"})
        ctx.spawn("child", {"fails": "once"})
    return "spawned"


async def _child(payload: Any, ctx: Any) -> str:
    if payload["fails"] == "permanently":
        raise PermanentError("this child cannot be done")
    if ctx.attempt == 1:
        raise TransientError("the first try of this child times out")
    return "done on a retry"


def test_spawned_tasks_peers_failed_before_the_coordinator_read_them_are_decided(
        db_url: str) -> None:
    """A peer worker claims a spawned task as soon as its spawner's completion commits; a
    coordinator reading late first sees it already failed, and decides it then: dead (its
    join cancelled) for a permanent error, retried for a transient one."""
    work = Registry([KindSpec("spawn", handler=_spawns_two), KindSpec("child", handler=_child),
                     KindSpec("after", handler=_spawns_two)])

    async def go() -> RunResult:
        stores = [await opened(db_url) for _ in range(2)]
        behind = _Behind(stores[0])
        worker = WorkerProcess(work, stores[1], name="w", capacity=2, mode="peer", poll=0.01)
        serving = asyncio.ensure_future(worker.arun())
        retry = RetryPolicy(attempts=3, base=0.05, jitter=0.0)
        coordinator = Coordinator(work, behind, mode="peer", poll=0.01,  # type: ignore[arg-type]
                                  stall_after=20, retry=retry)

        async def catch_up() -> None:
            while True:  # both children failed, read from the store's own rows
                await asyncio.sleep(0.02)
                with contextlib.suppress(StoreError):
                    rows = {t.id: t.status for t in (await stores[1].load_tasks(
                        coordinator.run_id)).tasks}
                    if rows.get("p/0") is Status.FAILED and rows.get("p/1") is Status.FAILED:
                        break
            behind.caught_up.set()

        watcher = asyncio.ensure_future(catch_up())
        try:
            return await asyncio.wait_for(coordinator.arun(
                [Task("p", "spawn"), Task("j", "after", joins=("p",))]), 30)
        finally:
            watcher.cancel()
            worker.stop()
            await serving
            for s in stores:
                await s.close()

    tasks = asyncio.run(go()).tasks
    assert tasks["p"].status is Status.COMPLETED
    assert tasks["p/0"].status is Status.DEAD and tasks["p/0"].attempts == 1
    assert tasks["p/1"].status is Status.COMPLETED and tasks["p/1"].attempts == 2
    assert tasks["j"].status is Status.CANCELLED and tasks["j"].cause == "p/0"


class _SlowHeartbeat:
    """A worker's store whose heartbeat is slow: while it is in flight another connection
    completes a dependency, so the worker's round began before that completion."""

    def __init__(self, store: Any, meanwhile: Any) -> None:
        self.store, self.meanwhile = store, meanwhile

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def heartbeat_worker(self, *args: Any) -> None:
        await self.store.heartbeat_worker(*args)
        await self.meanwhile()


def test_a_worker_never_stamps_a_start_before_the_dependency_it_waited_for(
        db_url: str) -> None:
    from planrun.stores import RunInfo

    async def go() -> tuple[Event, Event]:
        store, other = await opened(db_url), await opened(db_url)
        run_id = "run-stamp"
        first, second = tickets(2)
        await store.create_run(RunInfo(run_id, time.time()))
        await store.add_tasks(run_id, [first, second.evolve(depends_on=(first.id,))], [])

        async def finish_the_dependency() -> None:
            [claimed] = await other.claim(run_id, "elsewhere", ["triage"], None, 30.0)
            now = time.time()
            done = transition(claimed, Status.COMPLETED, result={"ok": True}, finished_at=now,
                              attempts=1, lease=None)
            event = Event(-1, now, claimed.id, "completed", "elsewhere", claimed.token)
            assert await other.write_fenced(run_id, done, event, claimed.token)

        worker = WorkerProcess(registry, _SlowHeartbeat(store, finish_the_dependency),
                               name="w", mode="peer")
        assert await worker._round([run_id])  # claimed the dependent in the same round
        await asyncio.gather(*(r.handle for r in list(worker._running.values())))
        events = (await store.load(run_id)).events
        for s in (store, other):
            await s.close()
        by = {(e.task, e.event): e for e in events}
        return by[first.id, "completed"], by[second.id, "started"]

    completed, started = asyncio.run(go())
    assert started.at >= completed.at and started.seq > completed.seq


def test_a_stale_result_is_refused_by_the_database(db_url: str) -> None:
    async def go() -> tuple[bool, bool]:
        store = await opened(db_url)
        coordinator = Coordinator(registry, store)
        await store.create_run(__import__("planrun.stores", fromlist=["RunInfo"]).RunInfo(
            coordinator.run_id, 0.0))
        task = tickets(1)[0]
        await store.add_tasks(coordinator.run_id, [task], [])
        running = transition(transition(task, Status.ASSIGNED, token=1, assigned_to="a"),
                             Status.RUNNING, lease=1.0)
        event = Event(-1, 0.0, task.id, "started", "a", 1, {})
        assert await store.write_fenced(coordinator.run_id, running, event, 0)
        coordinator.core.restore([task])
        coordinator.core.expire(running, 2.0)  # the lease ran out: token moves to 2
        await coordinator._write_decided()
        late = transition(running, Status.COMPLETED, result={"late": True})
        refused = await store.write_fenced(coordinator.run_id, late, event, 1)
        state = await store.load(coordinator.run_id)
        await store.close()
        return refused, state.tasks[0].status is Status.PENDING

    refused, still_pending = asyncio.run(go())
    assert refused is False and still_pending


def spawn_worker(url: str, name: str, concurrency: int = 4, env: dict[str, str] | None = None,
                 mode: str = "push", lease: float = 30.0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "planrun.cli", "worker", "--db", url, "--app", "dist_app:app",
         "--name", name, "--concurrency", str(concurrency), "--mode", mode,
         "--lease", str(lease), "--idle-exit", "60"],
        env={**os.environ, "PYTHONPATH": str(HERE), **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_eight_worker_processes_2000_tickets_2000_replies(pg_url: str) -> None:
    sent: Counter[str] = Counter()

    async def go() -> Any:
        store = await opened(pg_url)
        coordinator = Coordinator(registry, store, poll=0.1, stale_after=30.0,
                                  effects={"triage": lambda t, key: sent.update([key])})
        result = await coordinator.arun(tickets(2000))
        await store.close()
        return result

    workers = [spawn_worker(pg_url, f"w{i}") for i in range(8)]
    try:
        result = asyncio.run(go())
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        outputs = [w.communicate(timeout=60) for w in workers]
    assert all(w.returncode == 0 for w in workers), [o[1][-500:] for o in outputs]
    completed = [e for e in result.events if e.event == "completed"]
    assert len(completed) == 2000 and result.audit.clean
    assert len(sent) == 2000 and set(sent.values()) == {1}  # 2,000 replies, not 16,000
    per_worker = Counter(e.worker for e in completed)
    assert set(per_worker) == {f"w{i}" for i in range(8)}
    mean = 2000 / 8
    assert min(per_worker.values()) > mean * 0.5, per_worker  # nobody idle while others queue


def test_a_killed_worker_is_reclaimed_and_its_tasks_finished_by_others(db_url: str) -> None:
    slow = "T-0003,T-0004"
    env = {"DIST_APP_SLOW": slow, "DIST_APP_SLOW_S": "30"}

    async def go() -> Any:
        store = await opened(db_url)
        coordinator = Coordinator(registry, store, poll=0.05, stale_after=2.0)
        task = asyncio.ensure_future(coordinator.arun(tickets(12)))
        victim = spawn_worker(db_url, "victim", concurrency=12, env=env, lease=2.0)
        # wait until the victim holds the slow tickets, then kill it mid-task
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                state = await store.load_tasks(coordinator.run_id)
            except StoreError:  # the coordinator has not created the run yet
                state = None
            held = [t for t in state.tasks if t.id in slow.split(",")] if state else []
            if len(held) == 2 and all(t.status is Status.RUNNING and t.assigned_to == "victim"
                                      for t in held):  # both exist (add_tasks committed)
                break
            await asyncio.sleep(0.05)
        victim.send_signal(signal.SIGKILL)
        victim.communicate(timeout=30)
        helper = spawn_worker(db_url, "helper", concurrency=4, env=env, lease=2.0)
        result = await asyncio.wait_for(task, 60)
        helper.send_signal(signal.SIGTERM)
        helper.communicate(timeout=30)
        await store.close()
        return result

    result = asyncio.run(go())
    assert result.ok and result.audit.clean
    for tid in ("T-0003", "T-0004"):
        events = [(e.event, e.worker) for e in result.events if e.task == tid]
        assert ("reclaimed", "victim") in events
        assert events[-1] == ("completed", "helper")
        assert result.tasks[tid].reclaims == 1


def test_worker_cli_rejects_bad_arguments(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "planrun.cli", "worker", "--db", f"sqlite:///{tmp_path}/x.db",
         "--app", "dist_app:app", "--kinds", "nope"],
        env={**os.environ, "PYTHONPATH": str(HERE)}, capture_output=True, text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "unknown kind" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "planrun.cli", "worker", "--db", f"sqlite:///{tmp_path}/x.db",
         "--app", "dist_app:app", "--timeout", "0"],
        env={**os.environ, "PYTHONPATH": str(HERE)}, capture_output=True, text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--timeout: must be > 0" in proc.stderr


def test_a_coordinator_that_died_is_resumed(db_url: str) -> None:
    sent: list[str] = []

    async def go() -> Any:
        stores = [await opened(db_url) for _ in range(3)]
        workers = [WorkerProcess(registry, s, name=f"w{i}", capacity=2, poll=0.02)
                   for i, s in enumerate(stores[1:])]
        handles = [asyncio.ensure_future(w.arun()) for w in workers]
        first = Coordinator(registry, stores[0], poll=0.02,
                            effects={"triage": lambda t, key: sent.append(key)})
        dying = asyncio.ensure_future(first.arun(tickets(30)))
        while sum(w.done for w in workers) < 8:
            await asyncio.sleep(0.01)
        dying.cancel()  # the coordinator dies mid-run; workers keep what they hold
        await asyncio.gather(dying, return_exceptions=True)
        second = Coordinator(registry, stores[0], run_id=first.run_id, poll=0.02,
                             effects={"triage": lambda t, key: sent.append(key)})
        result = await second.aresume()
        for w in workers:
            w.stop()
        await asyncio.gather(*handles)
        for s in stores:
            await s.close()
        return result

    result = asyncio.run(go())
    assert result.ok and result.audit.clean
    # Every reply sent; a repeat can only be an effect the dead coordinator applied but had
    # not yet recorded (at most the four it applies at once), and it carries the same key.
    assert len(set(sent)) == 30 and len(sent) - 30 <= 4
    effects = [e for e in result.events if e.event == "effect"]
    assert len({e.task for e in effects}) == 30


def test_an_effect_finished_by_a_dying_and_a_resuming_coordinator_is_logged_once(
        db_url: str) -> None:
    # The first coordinator is inside its effect when the second resumes the run: the
    # second sees the effect begun, applies it again (same key), and meanwhile the first's
    # record lands. One of them writes the effect and its event, never both.
    keys: list[str] = []

    async def go() -> RunResult:
        stores = [await opened(db_url) for _ in range(3)]
        worker = WorkerProcess(registry, stores[2], name="w", poll=0.01)
        serving = asyncio.ensure_future(worker.arun())
        inside, release = asyncio.Event(), asyncio.Event()

        async def first_effect(task: Task, key: str) -> str:
            keys.append(key)
            inside.set()
            await release.wait()
            return "sent by the first"

        first = Coordinator(registry, stores[0], poll=0.01, effects={"triage": first_effect})
        dying = asyncio.ensure_future(first.arun(tickets(1)))
        await inside.wait()

        async def second_effect(task: Task, key: str) -> str:
            keys.append(key)
            release.set()  # the first's commit lands while the second applies it again
            while (await stores[2].load(first.run_id)).effects[task.id].state != "applied":
                await asyncio.sleep(0.005)
            return "sent by the second"

        second = Coordinator(registry, stores[1], run_id=first.run_id, poll=0.01,
                             effects={"triage": second_effect})
        result = await second.aresume()
        await dying
        worker.stop()
        await serving
        for s in stores:
            await s.close()
        return result

    result = asyncio.run(go())
    effects = [e for e in result.events if e.event == "effect"]
    assert len(keys) == 2 and len(set(keys)) == 1  # applied twice, with one key
    assert len(effects) == 1 and result.audit.duplicate_effects == 0 and result.audit.clean


class Unreliable:
    """A store that drops out: every call fails while ``down`` is set."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.down, self.failed = inner, False, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                self.failed += 1
                raise StoreError("connection lost")
            return await attr(*args, **kwargs)

        return call


def test_a_worker_that_loses_the_database_waits_and_never_drops_a_result() -> None:
    from planrun.stores import InMemoryStore

    async def go() -> Any:
        shared = InMemoryStore()
        await shared.open()
        flaky = Unreliable(shared)
        worker = WorkerProcess(registry, flaky, name="w", capacity=2, poll=0.01, lease_s=30)  # type: ignore[arg-type]
        handle = asyncio.ensure_future(worker.arun())
        coordinator = Coordinator(registry, shared, poll=0.01)
        run = asyncio.ensure_future(coordinator.arun(tickets(20)))
        while worker.done < 5:
            await asyncio.sleep(0.005)
        flaky.down = True  # mid-run: the worker can neither take work nor report
        at_outage = worker.done
        await asyncio.sleep(0.3)
        reported_while_down = worker.done - at_outage
        flaky.down = False
        result = await asyncio.wait_for(run, 30)
        worker.stop()
        await handle
        return result, flaky.failed, reported_while_down, worker

    result, failed, reported_while_down, worker = asyncio.run(go())
    assert failed > 0  # it did try, and backed off
    assert result.ok and result.audit.clean
    assert worker.done == 20 and worker.rejected == 0  # results held back, none lost
    assert reported_while_down == 0  # nothing is reported that cannot be fenced
