"""PostgreSQL under faults: a writer stopped inside its transaction, commits out of order.

Against the real server (``PLANRUN_TEST_PG``), each test in a fresh schema. Every wait is
bounded: a stopped writer is stopped for a few seconds, and a write that would wait for it
fails the test instead of hanging.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from pgtest import fresh_schema

from planrun.core._ledger import Event
from planrun.core._task import Status, Task, transition
from planrun.stores import PostgresStore, RunInfo

if TYPE_CHECKING:
    from planrun.stores._postgres_rows import Cursor

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


async def sessions(store: PostgresStore, name: str) -> list[str]:
    """The states of the server sessions named ``name``."""

    async def go(cur: Cursor) -> list[str]:
        await cur.execute("SELECT state FROM pg_stat_activity WHERE application_name = %s",
                          (name,))
        return [r["state"] for r in await cur.fetchall()]

    return await store._tx(go)


async def finish(store: PostgresStore, run_id: str, worker: str) -> Task | None:
    """Claim one task and write its completion fenced, as a pull-mode worker does."""
    got = await store.claim(run_id, worker, ["k"], None, 30.0)
    if not got:
        return None
    done = transition(got[0], Status.COMPLETED, result={"by": worker}, attempts=1,
                      finished_at=3.0)
    assert await store.write_fenced(run_id, done, Event(-1, 3.0, done.id, "completed",
                                                        worker, done.token), done.token)
    return done


async def bounded(aw: Awaitable[T], what: str, seconds: float = 5.0) -> T:
    try:
        return await asyncio.wait_for(aw, seconds)
    except TimeoutError:
        pytest.fail(f"{what} waited {seconds} s: blocked by the stopped writer")


async def test_a_writer_stopped_inside_its_transaction_freezes_nothing(pg_url: str) -> None:
    store = PostgresStore(pg_url, max_size=4)
    await store.open()
    child: subprocess.Popen[str] | None = None
    try:
        run_id = await new_run(store, 41)
        [t0] = await store.claim(run_id, "stalled", ["k"], None, 30.0)  # the child's task
        cursor = (await store.load_changed(run_id, -1))[1]
        name = f"planrun-stall-{uuid.uuid4().hex[:8]}"
        child = subprocess.Popen(
            [sys.executable, str(HERE / "pg_stall_worker.py"), pg_url, run_id, t0.id,
             str(t0.token), name],
            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert child.stdout is not None
        assert await bounded(asyncio.to_thread(child.stdout.readline), "the child") == "holding\n"
        while state_of(child.pid) != "T":
            await asyncio.sleep(0.01)
        assert await sessions(store, name) == ["idle in transaction"]

        # While it is stopped, holding its transaction: others claim, complete and log.
        finished: list[Task] = []
        seen: dict[str, Task] = {}
        for i in range(40):
            done = await bounded(finish(store, run_id, f"w{i % 4}"), "a claim and write")
            assert done is not None
            finished.append(done)
            await bounded(store.append_event(run_id, Event(-1, 3.0, done.id, "effect", None,
                                                           done.token, {"key": done.id})),
                          "append_event")
            if i % 8 == 7:  # the coordinator keeps reading what changed
                changed, cursor = await bounded(store.load_changed(run_id, cursor),
                                                "load_changed")
                seen.update((t.id, t) for t in changed)
        # ...and the server cuts the stopped session off (idle_in_transaction 1 s).
        for _ in range(100):
            if not await sessions(store, name):
                break
            await asyncio.sleep(0.05)
        assert await sessions(store, name) == [] and state_of(child.pid) == "T"
        changed, cursor = await store.load_changed(run_id, cursor)
        seen.update((t.id, t) for t in changed)
        assert {t.id: t.status for t in finished} == {
            i: seen[i].status for i in (t.id for t in finished)}
        state = await store.load(run_id)
        assert sum(e.event == "completed" for e in state.events) == 40
        assert sum(e.event == "effect" for e in state.events) == 40
        assert len({e.seq for e in state.events}) == len(state.events)

        # Continued, the child's write is run again on a new connection and lands once.
        child.send_signal(signal.SIGCONT)
        out, _ = await bounded(asyncio.to_thread(child.communicate), "the child", 30.0)
        assert child.returncode == 0 and out.strip() == "applied"
        after = await store.load(run_id)
        assert [e.worker for e in after.events if e.event == "completed"].count(name) == 1
        assert after.tasks[0].status is Status.COMPLETED
        changed, _ = await store.load_changed(run_id, cursor)
        assert "t0" in {t.id for t in changed}
    finally:
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
            child.wait()
        await store.close()


class HeldOpen(PostgresStore):
    """A store whose write transactions wait, after their statements and before COMMIT,
    for ``hold`` (a coroutine): commits then finish in whatever order the test picks."""

    hold: Callable[[], Awaitable[None]] | None = None

    async def _tx(self, fn: Callable[[Cursor], Awaitable[Any]], snapshot: bool = False,
                  writing: str | None = None) -> Any:
        hold = self.hold if writing is not None else None

        async def held(cur: Cursor) -> Any:
            out = await fn(cur)
            if hold is not None:
                await hold()
            return out

        return await super()._tx(held, snapshot, writing)


async def test_load_changed_misses_nothing_when_commits_finish_out_of_seq_order(
    pg_url: str,
) -> None:
    slow, fast, reader = HeldOpen(pg_url), PostgresStore(pg_url), PostgresStore(pg_url)
    for store in (slow, fast, reader):
        await store.open()
    try:
        run_id = await new_run(fast, 2)
        _, cursor = await reader.load_changed(run_id, -1)
        gate, holding = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            holding.set()
            await gate.wait()

        slow.hold = hold
        a = transition(Task("t0", "k"), Status.ASSIGNED, assigned_to="w", token=1)
        b = transition(Task("t1", "k"), Status.ASSIGNED, assigned_to="w", token=1)
        first = asyncio.create_task(
            slow.write_fenced(run_id, a, Event(-1, 2.0, "t0", "assigned", "w", 1), 0))
        await bounded(holding.wait(), "the slow writer")  # numbered, not committed
        assert await bounded(fast.write_fenced(run_id, b, Event(-1, 2.0, "t1", "assigned",
                                                                "w", 1), 0), "the fast writer")

        changed, cursor = await reader.load_changed(run_id, cursor)
        assert [(t.id, t.status) for t in changed] == [("t1", Status.ASSIGNED)]
        gate.set()
        assert await first
        changed, cursor = await reader.load_changed(run_id, cursor)
        assert ("t0", Status.ASSIGNED) in [(t.id, t.status) for t in changed]
        events = {e.task: e.seq for e in (await reader.load(run_id)).events
                  if e.event == "assigned"}
        assert events["t0"] < events["t1"]  # t0 was numbered first and committed last
        assert (await reader.load_changed(run_id, cursor))[0] == []
    finally:
        for store in (slow, fast, reader):
            await store.close()


async def test_a_reader_following_busy_writers_ends_with_every_change(pg_url: str) -> None:
    rng = random.Random(7)

    async def jitter() -> None:  # commits land in an order unrelated to their seqs
        await asyncio.sleep(rng.uniform(0.0, 0.03))

    writers = [HeldOpen(pg_url) for _ in range(4)]
    reader = PostgresStore(pg_url)
    for store in (*writers, reader):
        store.hold = jitter if isinstance(store, HeldOpen) else None
        await store.open()
    try:
        run_id = await new_run(reader, 120)
        mirror = {t.id: t for t in (await reader.load(run_id)).tasks}
        _, cursor = await reader.load_changed(run_id, -1)
        stop = asyncio.Event()

        async def work(store: PostgresStore, name: str) -> None:
            while await finish(store, run_id, name) is not None:
                pass

        async def follow() -> None:
            nonlocal cursor
            while not stop.is_set():
                changed, cursor = await reader.load_changed(run_id, cursor)
                mirror.update((t.id, t) for t in changed)
                await asyncio.sleep(0.005)

        follower = asyncio.create_task(follow())
        await bounded(asyncio.gather(*(work(w, f"w{i}") for i, w in enumerate(writers))),
                      "the writers", 60.0)
        stop.set()
        await follower
        changed, cursor = await reader.load_changed(run_id, cursor)
        mirror.update((t.id, t) for t in changed)
        assert {t.id: t.status for t in mirror.values()} == {
            f"t{i}": Status.COMPLETED for i in range(120)}
    finally:
        for store in (*writers, reader):
            await store.close()
