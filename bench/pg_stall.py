"""PostgreSQL write throughput while one writer is stopped inside its transaction.

    python bench/pg_stall.py [--seconds 3] [--writers 8] [--pg URL]

Eight writers (one pool, a connection each) claim a task and write its completion fenced,
as pull-mode workers do, for ``--seconds``: first with nothing else going on (the
baseline, measured in the same run), then while another process sits stopped (SIGSTOP)
in the middle of the same kind of write, its event inserted and its transaction open, as
a GC pause or a stalled VM leaves it. Prints events/s in both phases and their ratio:
near 1 when no writer waits for another, near 0 when one stopped writer holds a lock that
every other writer needs.

The stopped process is continued afterwards. PostgreSQL is the one at ``--pg`` (default
``PLANRUN_BENCH_PG``, then ``PLANRUN_TEST_PG``, then the local server), inside a temporary
schema that is dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any
from urllib.parse import quote

from planrun.core._ledger import Event
from planrun.core._task import Status, Task, transition
from planrun.stores import PostgresStore, RunInfo

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"


def _store(url: str, **kwargs: Any) -> PostgresStore:
    # Timeouts only where the store has them (the bench also measures older code).
    known = inspect.signature(PostgresStore).parameters
    return PostgresStore(url, **{k: v for k, v in kwargs.items() if k in known})


async def _finish(store: PostgresStore, run_id: str, worker: str) -> int:
    """Claim one task and write its completion: the events written (2, or 0 when none)."""
    got = await store.claim(run_id, worker, ["k"], None, 60.0)
    if not got:
        return 0
    done = transition(got[0], Status.COMPLETED, result=1, attempts=1, finished_at=time.time())
    ok = await store.write_fenced(run_id, done, Event(-1, time.time(), done.id, "completed",
                                                      worker, done.token), done.token)
    return 2 if ok else 1


async def _phase(store: PostgresStore, run_id: str, writers: int, seconds: float) -> float:
    """Events per second that ``writers`` write in ``seconds`` (calls still waiting at the
    end are abandoned and not counted)."""
    counts = [0] * writers
    deadline = time.monotonic() + seconds

    async def one(i: int) -> None:
        while time.monotonic() < deadline:
            counts[i] += await _finish(store, run_id, f"w{i}")

    tasks = [asyncio.create_task(one(i)) for i in range(writers)]
    await asyncio.wait(tasks, timeout=seconds + 0.5)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return sum(counts) / seconds


async def _child(url: str, run_id: str, task_id: str, token: int) -> None:
    import psycopg

    store = _store(url, min_size=1, max_size=1)
    await store.open()
    original = psycopg.AsyncCursor.execute
    stopped = False

    async def execute(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        nonlocal stopped
        result = await original(self, query, params, **kwargs)
        if not stopped and "INSERT INTO planrun_events" in str(query):
            stopped = True
            print("holding", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        return result

    psycopg.AsyncCursor.execute = execute  # type: ignore[method-assign]
    [task] = await store.load_some(run_id, [task_id])
    done = transition(task, Status.COMPLETED, result=1, attempts=1, finished_at=time.time())
    try:
        await store.write_fenced(run_id, done, Event(-1, time.time(), task_id, "completed",
                                                     "stalled", token), token)
    except Exception as exc:  # cut off while stopped, or refused: either is fine here
        print(f"child: {exc}", file=sys.stderr)
    await store.close()


async def _main(url: str, writers: int, seconds: float) -> None:
    import psycopg

    schema = f"planrun_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    scoped = f"{url}{'&' if '?' in url else '?'}options={quote(f'-csearch_path={schema}')}"
    child: subprocess.Popen[str] | None = None
    store = _store(scoped, max_size=writers + 1)
    try:
        await store.open()
        run_id = "bench"
        tasks = [Task(f"t{i}", "k") for i in range(20_000)]
        await store.create_run(RunInfo(run_id, time.time()))
        await store.add_tasks(run_id, tasks, [Event(i, 0.0, t.id, "created")
                                              for i, t in enumerate(tasks)])
        await _phase(store, run_id, writers, 0.5)  # warm the pool
        before = await _phase(store, run_id, writers, seconds)

        [held] = await store.claim(run_id, "stalled", ["k"], None, 600.0)
        child = subprocess.Popen(
            [sys.executable, __file__, "--child", scoped, run_id, held.id, str(held.token)],
            stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        if child.stdout.readline() != "holding\n":
            raise SystemExit("the stalled writer did not start")
        during = await _phase(store, run_id, writers, seconds)
    finally:
        if child is not None:
            child.send_signal(signal.SIGCONT)
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
        await store.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    print(f"{writers} writers, {seconds:g} s per phase")
    print(f"events/s, nothing stopped:          {before:8.0f}")
    print(f"events/s, one writer stopped in tx: {during:8.0f}")
    print(f"ratio: {during / before:.2f}")


def main() -> None:
    """Parse the arguments and run the bench (or, with ``--child``, the stalled writer)."""
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        url, run_id, task_id, token = sys.argv[2:6]
        asyncio.run(_child(url, run_id, task_id, int(token)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--pg", default=os.environ.get("PLANRUN_BENCH_PG")
                        or os.environ.get("PLANRUN_TEST_PG") or DEFAULT_PG)
    args = parser.parse_args()
    asyncio.run(_main(args.pg, args.writers, args.seconds))


if __name__ == "__main__":
    main()
