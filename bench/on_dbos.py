"""Runs on DBOS against the in-process supervisor, as they grow.

    python bench/on_dbos.py --quick     # 1,000 and 4,000 tasks
    python bench/on_dbos.py             # 1,000 / 4,000 / 20,000 tasks

For each size and kind (no-op tasks, and tasks that wait 20 ms as a model call waits on the
network), the same independent tasks run two ways on the local PostgreSQL server, each in
a schema of its own: the in-process supervisor with 32 slots (the baseline, measured in the
same run), and a run whose attempts go to four ``planrun worker`` processes (8 at a time
each, 32 in all) through DBOS queues. Printed: tasks per second with 32 at once, their
ratio to the baseline, and the latency a task gains by going to another process: a chain
of 200 tasks, one at a time, its time per task beyond the task's own work.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg

from planrun import App
from planrun.core import Task, WorkerSpec
from planrun.runtime import DBOSAttempts, Supervisor
from planrun.stores import open_store

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_app import registry  # noqa: E402

PG = os.environ.get("PLANRUN_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
PROCESSES, EACH = 4, 8
WORK_S = {"noop": 0.0, "wait20": 0.02}


def schema_url() -> tuple[str, str]:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return schema, f"{PG}?options=-csearch_path%3D{schema}"


def drop(schema: str) -> None:
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_dbos CASCADE")


CHAIN = 200


def tasks(kind: str, n: int, chained: bool = False) -> list[Task]:
    return [Task(id=f"t{i}", kind=kind, depends_on=(f"t{i - 1}",) if chained and i else ())
            for i in range(n)]


async def run(url: str, kind: str, n: int, attempts: DBOSAttempts | None) -> tuple[float, float]:
    """Tasks per second, 32 at once; and the ms a task of a chain took beyond its work."""
    store = open_store(url)
    await store.open()
    try:
        app = App(registry, workers=[WorkerSpec("here", None, PROCESSES * EACH)])
        if attempts is not None:
            app = attempts.app(app)
        rate_and_ms = []
        for batch in (tasks(kind, n), tasks(kind, CHAIN, chained=True)):
            sup = Supervisor(app.registry, app.worker_specs(), store=store, stall_after=600)
            sup.add_tasks(batch)
            started = time.perf_counter()
            result = await sup.arun()
            elapsed = time.perf_counter() - started
            assert result.ok and result.audit.clean, result.counts
            rate_and_ms.append((len(batch) / elapsed,
                                1000 * (elapsed / len(batch) - WORK_S[kind])))
        return rate_and_ms[0][0], rate_and_ms[1][1]
    finally:
        await store.close()


def on_dbos(kind: str, n: int) -> tuple[float, float]:
    schema, url = schema_url()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    workers = [subprocess.Popen(
        [sys.executable, "-m", "planrun.cli", "worker", "--db", url, "--app", "bench_app:app",
         "--name", f"b{i}", "--concurrency", str(EACH), "--idle-exit", "600"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for i in range(PROCESSES)]
    try:
        time.sleep(4.0)  # the workers launch DBOS and serve their queues

        async def go() -> tuple[float, float]:
            attempts = DBOSAttempts(url, app_name="bench_app:app", in_flight=PROCESSES * EACH)
            try:
                return await run(url, kind, n, attempts)
            finally:
                await attempts.aclose()

        return asyncio.run(go())
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.communicate(timeout=60)
        drop(schema)


def in_process(kind: str, n: int) -> tuple[float, float]:
    schema, url = schema_url()
    try:
        return asyncio.run(run(url, kind, n, None))
    finally:
        drop(schema)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 and 4,000 tasks only")
    parser.add_argument("--sizes", help="comma-separated task counts")
    args = parser.parse_args()
    sizes = [int(s) for s in (args.sizes or ("1000,4000" if args.quick else
                                             "1000,4000,20000")).split(",")]
    print(f"PostgreSQL; {PROCESSES} worker processes x {EACH} = {PROCESSES * EACH} attempts at "
          "once; tasks/s and ms added per task")
    print(f"{'kind':>7} {'tasks':>7} {'in-process':>11} {'+ms':>6} {'DBOS':>8} {'+ms':>6} "
          f"{'ratio':>6}")
    for kind in ("noop", "wait20"):
        for n in sizes:
            base, base_ms = in_process(kind, n)
            rate, ms = on_dbos(kind, n)
            print(f"{kind:>7} {n:>7} {base:>11.0f} {base_ms:>6.1f} {rate:>8.0f} {ms:>6.1f} "
                  f"{rate / base:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
