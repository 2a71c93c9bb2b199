"""PostgreSQL under faults: a writer stopped inside its transaction, commits out of order.

Against the real server (``PLANRUN_TEST_PG``), each test in a fresh schema. Every wait is
bounded: a stopped writer is stopped for a few seconds, and a call that would wait for it
longer than the server lets it hold its transaction fails the test instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
import pytest
from pgtest import fresh_schema

from planrun.core._ledger import Event
from planrun.core._task import Status, Task, transition
from planrun.stores import PostgresStore, RunInfo, SQLStore
from planrun.stores._connector import Mode
from planrun.stores.postgres import PostgresConnector

if TYPE_CHECKING:
    from planrun.stores.postgres import Cursor

pytestmark = pytest.mark.postgres

HERE = Path(__file__).parent
T = TypeVar("T")


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from fresh_schema()


async def new_run(store: PostgresStore, n: int) -> str:
    run_id = f"run-{uuid.uuid4().hex[:10]}"
    tasks = [Task(f"t{i}", "k") for i in range(n)]
    await store.create_run(RunInfo(run_id, 1.0))
    await store.add_tasks(run_id, tasks, [Event(i, 1.0, t.id, "created")
                                          for i, t in enumerate(tasks)])
    return run_id


def state_of(pid: int) -> str:
    """The process state letter from /proc (``T``: stopped)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2]


async def sessions(pg_url: str, name: str) -> list[str]:
    """The states of the server sessions named ``name``."""
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT state FROM pg_stat_activity WHERE application_name = %s", (name,))
        return [row[0] for row in await cur.fetchall()]


def completed(task: Task, worker: str) -> Task:
    running = transition(transition(task, Status.ASSIGNED, assigned_to=worker, token=1),
                         Status.RUNNING, started_at=2.0)
    return transition(running, Status.COMPLETED, result={"by": worker}, attempts=1,
                      finished_at=3.0)


async def bounded(aw: Awaitable[T], what: str, seconds: float = 5.0) -> T:
    try:
        return await asyncio.wait_for(aw, seconds)
    except TimeoutError:
        pytest.fail(f"{what} waited {seconds} s: blocked by the stopped writer")


IDLE = 3.0
"""Seconds the server lets the stopped writer sit inside its transaction."""


async def test_a_writer_stopped_inside_its_transaction_holds_the_run_only_until_cut_off(
    pg_url: str,
) -> None:
    store = PostgresStore(pg_url, max_size=4)
    await store.open()
    child: subprocess.Popen[str] | None = None
    try:
        run_id = await new_run(store, 11)  # seqs 0-10
        elsewhere = await new_run(store, 1)
        await store.limiter_configure("llm", rpm=60_000.0, tpm=None, request_burst=100.0,
                                      token_burst=1.0)
        await store.spend_open(run_id, max_tokens=10_000, max_cost=None)
        name = f"planrun-stall-{uuid.uuid4().hex[:8]}"
        child = subprocess.Popen(
            [sys.executable, str(HERE / "pg_stall_worker.py"), pg_url, run_id, "t0", "11",
             name, str(IDLE)],
            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert child.stdout is not None
        assert await bounded(asyncio.to_thread(child.stdout.readline), "the child") == "holding\n"
        while state_of(child.pid) != "T":
            await asyncio.sleep(0.01)
        assert await sessions(pg_url, name) == ["idle in transaction"]

        # While it is stopped, holding t0's row, seq 11 and the run's row, what needs none
        # of them goes on at once: effects and their store-numbered events, workers' beats,
        # shared limits, reads, another run's batch.
        for i in range(1, 6):
            task_id = f"t{i}"
            await bounded(store.effect_begin(run_id, task_id, f"key-{i}", 3.0), "effect_begin")
            assert await bounded(store.effect_done(
                run_id, task_id, {"sent": i}, 3.0,
                Event(-1, 3.0, task_id, "effect", None, 1, {"key": f"key-{i}"})), "effect_done")
            await bounded(store.register_worker(run_id, f"w{i}", ["k"], 1, 3.0),
                          "register_worker")
            await bounded(store.heartbeat_worker(run_id, f"w{i}", 4.0), "heartbeat_worker")
            assert await bounded(store.limiter_take("llm", 0.0), "limiter_take") == 0.0
            assert await bounded(store.spend_reserve(run_id, 10, 0.0), "spend_reserve") is None
            await bounded(store.spend_settle(run_id, 10, 0.0, 1, 5, 0, 5, 0.0), "spend_settle")
        other = completed(Task("t0", "k"), "w")
        await bounded(store.write_batch(elsewhere, [other],
                                        [(1, 3.0, "t0", "completed", "w", 1, None)]),
                      "another run's batch")
        seen = await bounded(store.load(run_id), "load")
        assert await bounded(store.run_owner(run_id), "run_owner") is None
        # Nothing above waited for the server to cut the stopped session off.
        assert await sessions(pg_url, name) == ["idle in transaction"]
        assert seen.tasks[0].status is Status.PENDING  # its write is not committed
        assert [e.task for e in seen.events if e.event == "effect"] == [
            f"t{i}" for i in range(1, 6)]

        # The run's next batch and a process taking the run over need the run's row: they
        # wait until the server cuts the stopped session off (rolling it back), then go on.
        started = time.monotonic()
        done = [completed(Task(f"t{i}", "k"), "w") for i in range(1, 11)]
        await bounded(store.write_batch(
            run_id, done, [(100 + i, 3.0, t.id, "completed", "w", 1, None)
                           for i, t in enumerate(done)]), "the run's next batch", 4 * IDLE)
        await bounded(store.acquire_run(run_id, "p2", 30.0, time.time()), "acquire_run",
                      4 * IDLE)
        assert time.monotonic() - started < 3 * IDLE
        assert await sessions(pg_url, name) == [] and state_of(child.pid) == "T"
        state = await store.load(run_id)
        assert [t.status for t in state.tasks] == [Status.PENDING] + [Status.COMPLETED] * 10
        assert sum(e.event == "completed" for e in state.events) == 10
        assert len({e.seq for e in state.events}) == len(state.events)
        spent = await store.spend(run_id)
        assert spent is not None and (spent.requests, spent.reserved_tokens) == (5, 0)

        # Continued, the child's write is run again on a new connection and lands once.
        child.send_signal(signal.SIGCONT)
        out, _ = await bounded(asyncio.to_thread(child.communicate), "the child", 30.0)
        assert child.returncode == 0 and out.strip() == "applied"
        after = await store.load(run_id)
        assert after.tasks[0].status is Status.COMPLETED
        assert [(e.seq, e.task) for e in after.events if e.worker == name] == [(11, "t0")]
        assert len({e.seq for e in after.events}) == len(after.events)
    finally:
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
            child.wait()
        await store.close()


class HeldOpen(PostgresConnector):
    """A connector whose write transactions wait, after their statements and before COMMIT,
    for ``hold`` (a coroutine): commits then finish in whatever order the test picks."""

    hold: Callable[[], Awaitable[None]] | None = None

    @contextlib.asynccontextmanager
    async def _transaction(self, conn: Any, mode: Mode) -> AsyncIterator[Cursor]:
        async with super()._transaction(conn, mode) as cur:
            yield cur
            if mode == "write" and self.hold is not None:
                await self.hold()


async def test_an_event_numbered_first_may_commit_last_and_nobody_waits_for_it(
    pg_url: str,
) -> None:
    held = HeldOpen(pg_url)
    slow, fast, reader = SQLStore(held), PostgresStore(pg_url), PostgresStore(pg_url)
    for store in (slow, fast, reader):
        await store.open()
    try:
        run_id = await new_run(fast, 2)
        for task_id in ("t0", "t1"):
            await fast.effect_begin(run_id, task_id, f"key-{task_id}", 2.0)
        gate, holding = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            holding.set()
            await gate.wait()

        def effect(task_id: str) -> Event:
            return Event(-1, 3.0, task_id, "effect", None, 1, {"key": f"key-{task_id}"})

        held.hold = hold
        first = asyncio.create_task(slow.effect_done(run_id, "t0", 1, 3.0, effect("t0")))
        await bounded(holding.wait(), "the slow writer")  # numbered, not committed
        assert await bounded(fast.effect_done(run_id, "t1", 2, 3.0, effect("t1")),
                             "the fast writer")
        await bounded(fast.append_event(run_id, effect("t1")), "append_event")

        seen = await reader.load(run_id)
        assert [e.task for e in seen.events if e.event == "effect"] == ["t1", "t1"]
        assert seen.effects["t0"].state == "started"
        gate.set()
        assert await first
        events = [e for e in (await reader.load(run_id)).events if e.event == "effect"]
        assert [e.task for e in events] == ["t0", "t1", "t1"]  # numbered first, committed last
        assert len({e.seq for e in events}) == 3
    finally:
        for store in (slow, fast, reader):
            await store.close()
