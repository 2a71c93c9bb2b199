"""A 500-task durable job that kills itself with SIGKILL at a named point.

Run as a script by ``test_crash.py``::

    python crash_job.py DB_URL RUN_ID start|resume POINT:N TARGET_URL

POINT is ``event:<name>`` (the N-th ledger event of that name, which exists in memory but
is not yet committed), ``before_write`` / ``after_write`` (around the N-th store write),
``effect_applied`` (the N-th effect reached its target but is not recorded) or ``none``.

Every task has an effect: a row keyed by the effect key in the table ``delivered`` of
TARGET_URL (a SQLite file of its own, or the PostgreSQL schema of the run). The key is the
table's primary key, so a repeated delivery changes nothing there; each delivery, repeated
or not, is also logged in ``deliveries`` so the test sees how many repeats there were.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import sys
from typing import Any

from planrun import Registry, RetryPolicy, TaskContext
from planrun.core import KindSpec, Task, WorkerSpec
from planrun.core._errors import TransientError
from planrun.runtime import Supervisor
from planrun.stores import open_store

CHAINS, LENGTH = 100, 5


class Crash:
    def __init__(self, spec: str) -> None:
        point, _, n = spec.rpartition(":")
        self.point, self.n, self.seen = point, int(n or 0), 0

    def hit(self, point: str) -> None:
        if point == self.point:
            self.seen += 1
            if self.seen == self.n:
                os.kill(os.getpid(), signal.SIGKILL)


class CrashingStore:
    """Passes everything to the real store; may die around a write."""

    def __init__(self, inner: Any, crash: Crash) -> None:
        self._inner, self._crash = inner, crash

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def write(self, run_id: str, changes: Any) -> None:
        self._crash.hit("before_write")
        await self._inner.write(run_id, changes)
        self._crash.hit("after_write")

    async def write_batch(self, run_id: str, tasks: Any, events: Any) -> None:
        self._crash.hit("before_write")  # the supervisor's batches
        await self._inner.write_batch(run_id, tasks, events)
        self._crash.hit("after_write")


class Target:
    """The effects' target: a table with a unique key, in SQLite or PostgreSQL."""

    def __init__(self, url: str) -> None:
        self.sqlite = url.startswith("sqlite:///")
        if self.sqlite:
            self.conn: Any = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
            self.conn.execute("PRAGMA busy_timeout = 10000")
            mark, log_id = "?", "INTEGER PRIMARY KEY AUTOINCREMENT"
        else:
            import psycopg

            self.conn = psycopg.connect(url, autocommit=True)
            mark, log_id = "%s", "BIGSERIAL PRIMARY KEY"
        self.conn.execute("CREATE TABLE IF NOT EXISTS delivered "
                          "(key TEXT PRIMARY KEY, task TEXT NOT NULL)")
        self.conn.execute(f"CREATE TABLE IF NOT EXISTS deliveries (id {log_id}, key TEXT NOT NULL)")
        self.insert = (f"INSERT INTO delivered (key, task) VALUES ({mark}, {mark}) "
                       "ON CONFLICT (key) DO NOTHING")
        self.log = f"INSERT INTO deliveries (key) VALUES ({mark})"

    def deliver(self, key: str, task_id: str) -> None:
        """Insert the row of ``key`` (a no-op when it is there) and log the delivery."""
        if self.sqlite:  # one transaction
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute(self.insert, (key, task_id))
            self.conn.execute(self.log, (key,))
            self.conn.execute("COMMIT")
            return
        with self.conn.transaction():
            self.conn.execute(self.insert, (key, task_id))
            self.conn.execute(self.log, (key,))


def tasks() -> list[Task]:
    out = []
    for c in range(CHAINS):
        for s in range(LENGTH):
            i = c * LENGTH + s
            kind = "send" if s == LENGTH - 1 else "step"
            deps = (f"c{c}s{s - 1}",) if s else ()
            out.append(Task(id=f"c{c}s{s}", kind=kind, payload={"i": i, "flaky": i % 7 == 0},
                            depends_on=deps))
    return out


async def main(url: str, run_id: str, mode: str, spec: str, target_url: str) -> int:
    crash = Crash(spec)
    target = Target(target_url)

    async def work(payload: Any, ctx: TaskContext) -> dict[str, int]:
        await asyncio.sleep(random.uniform(0.005, 0.02))
        if payload["flaky"] and ctx.attempt == 1:  # the first assignment ever fails
            raise TransientError("flaky dependency")
        return {"value": int(payload["i"])}

    def send(task: Task, key: str) -> None:
        target.deliver(key, task.id)
        crash.hit("effect_applied")

    registry = Registry([KindSpec("step", handler=work), KindSpec("send", handler=work)])
    store = open_store(url)
    await store.open()
    sup = Supervisor(
        registry,
        [WorkerSpec(f"w{i}", None, 8) for i in range(4)],
        store=CrashingStore(store, crash),  # type: ignore[arg-type]
        run_id=run_id,
        effects={"step": send, "send": send},
        retry=RetryPolicy(attempts=3, base=0.01, cap=0.05),
        max_reclaims=0,  # a restart is no reclaim of an expired lease: none may count
        on_event=lambda event, task: crash.hit(f"event:{event.event}"),
        goal="crash test",
        seed=1,
    )
    try:
        if mode == "start":
            sup.add_tasks(tasks())
            result = await sup.arun()
        else:
            result = await sup.aresume()
    finally:
        await store.close()
        target.conn.close()
    return 0 if result.ok else 1


if __name__ == "__main__":
    url, run_id, mode, spec, target_url = sys.argv[1:6]
    sys.exit(asyncio.run(main(url, run_id, mode, spec, target_url)))
