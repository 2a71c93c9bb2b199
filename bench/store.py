"""Store throughput, and the cost of durability for a whole supervised run, in one run.

    python bench/store.py [--quick] [--tasks N] [--batch 256] [--pg URL]

Part 2 runs the real supervisor over N no-op tasks without a store, then with each store
(every transition and its event written, in batches), and prints the per-task time and its
ratio to the run without a store: the per-task overhead of durability.

Simulates a no-op run the way the supervisor writes it: add N tasks (one ``created``
event each), then move every task through ``assigned``, ``running`` and ``completed``,
writing the changes in batches of up to ``--batch`` (one transaction per batch). Only the
transition writes are timed; the records are built beforehand. The figures worth quoting
are the ratios to the in-memory store, measured in the same run.

PostgreSQL is measured when a server answers at ``--pg`` (default: ``PLANRUN_BENCH_PG``,
then ``PLANRUN_TEST_PG``, then ``postgresql://postgres@127.0.0.1:5432/test``), inside a
temporary schema that is dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from planrun.core._errors import ConfigError, StoreError
from planrun.core._ledger import Event, Ledger
from planrun.core._task import Status, Task, transition
from planrun.stores import RunInfo, Store, open_store

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"

Change = tuple[Task, Event]


@dataclass(frozen=True)
class Result:
    """One backend's figures."""

    backend: str
    tasks: int
    transitions: int
    add_s: float
    write_s: float

    @property
    def rate(self) -> float:
        """Transitions written per second."""
        return self.transitions / self.write_s if self.write_s else float("inf")


def plan(n: int, batch: int) -> tuple[list[Task], list[Event], list[list[Change]]]:
    """The tasks, their ``created`` events, and the transition batches a supervisor writes."""
    ledger = Ledger()
    tasks = [Task(f"t{i:06d}", "noop", {"i": i}, created_at=0.0) for i in range(n)]
    created = [ledger.append(0.0, t.id, "created") for t in tasks]
    batches: list[list[Change]] = []
    for start in range(0, n, batch):
        chunk = tasks[start:start + batch]
        assigned = [
            transition(t, Status.ASSIGNED, assigned_to="w0", token=t.token + 1, lease=30.0)
            for t in chunk
        ]
        running = [transition(t, Status.RUNNING, started_at=1.0) for t in assigned]
        done = [
            transition(t, Status.COMPLETED, attempts=1, result={"ok": True}, finished_at=2.0)
            for t in running
        ]
        for stage, name in ((assigned, "assigned"), (running, "started"), (done, "completed")):
            batches.append(
                [(t, ledger.append(1.0, t.id, name, worker="w0", attempt=t.token)) for t in stage]
            )
    return tasks, created, batches


async def measure(backend: str, store: Store, n: int, batch: int) -> Result:
    """Add ``n`` tasks to a fresh run of ``store`` and time their transitions."""
    tasks, created, batches = plan(n, batch)
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    await store.open()
    try:
        await store.create_run(RunInfo(run_id, time.time(), goal="bench"))
        started = time.perf_counter()
        await store.add_tasks(run_id, tasks, created)
        added = time.perf_counter()
        for changes in batches:
            await store.write(run_id, changes)
        finished = time.perf_counter()
        state = await store.load(run_id)
    finally:
        await store.close()
    if sum(t.status is Status.COMPLETED for t in state.tasks) != n:
        raise SystemExit(f"{backend}: not every task completed")
    transitions = sum(len(b) for b in batches)
    return Result(backend, n, transitions, added - started, finished - added)


@contextmanager
def pg_schema(url: str) -> Iterator[str | None]:
    """A URL into a temporary schema, or None (with a reason printed) when unusable."""
    try:
        import psycopg
    except ImportError:
        print("postgres: skipped (psycopg not installed: pip install planrun[postgres])")
        yield None
        return
    schema = f"planrun_bench_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
    except psycopg.Error as exc:
        print(f"postgres: skipped ({str(exc).splitlines()[0]})")
        yield None
        return
    sep = "&" if "?" in url else "?"
    try:
        yield f"{url}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def table(results: Sequence[Result], batch: int) -> str:
    """The results as a plain-text table, with each rate's ratio to memory."""
    base = next((r.rate for r in results if r.backend == "memory"), None)
    head = (f"{'backend':<10} {'tasks':>7} {'transitions':>12} {'add s':>8} "
            f"{'write s':>8} {'transitions/s':>14} {'vs memory':>10}")
    lines = [f"batch size {batch}", head, "-" * len(head)]
    for r in results:
        ratio = f"{r.rate / base:.3f}x" if base else "-"
        lines.append(
            f"{r.backend:<10} {r.tasks:>7} {r.transitions:>12} {r.add_s:>8.3f} "
            f"{r.write_s:>8.3f} {r.rate:>14,.0f} {ratio:>10}"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> list[Result]:
    """Measure every backend that is available."""
    results = [await measure("memory", open_store("memory://"), args.tasks, args.batch)]
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        results.append(await measure("sqlite", open_store(url), args.tasks, args.batch))
    with pg_schema(args.pg) as pg_url:
        if pg_url is not None:
            try:
                store = open_store(pg_url)
                results.append(await measure("postgres", store, args.tasks, args.batch))
            except (StoreError, ConfigError) as exc:
                print(f"postgres: skipped ({exc})")
    return results


async def supervised(store: Store | None, n: int) -> float:
    """Seconds per task for a no-op supervised run of ``n`` tasks on ``store``."""
    from planrun.core._registry import KindSpec, Registry, TaskContext, WorkerSpec
    from planrun.runtime._supervisor import Supervisor

    async def noop(payload: object, ctx: TaskContext) -> None:
        return None

    if store is not None:
        await store.open()
    try:
        sup = Supervisor(Registry([KindSpec("noop", handler=noop)]),
                         [WorkerSpec("w", None, 64)], strategy="least_loaded", store=store)
        sup.add_tasks(Task(id=f"t{i}", kind="noop") for i in range(n))
        started = time.perf_counter()
        result = await sup.arun()
        elapsed = time.perf_counter() - started
        assert result.ok
    finally:
        if store is not None:
            await store.close()
    return elapsed / n


async def run_supervised(args: argparse.Namespace) -> list[tuple[str, float]]:
    """Per-task seconds of a supervised no-op run for no store and each backend."""
    n = args.tasks
    rows = [("no store", await supervised(None, n))]
    rows.append(("memory", await supervised(open_store("memory://"), n)))
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(("sqlite", await supervised(open_store(f"sqlite:///{Path(tmp) / 's.db'}"),
                                                n)))
    with pg_schema(args.pg) as pg_url:
        if pg_url is not None:
            rows.append(("postgres", await supervised(open_store(pg_url), n)))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run the benchmark, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run (2,000 tasks)")
    parser.add_argument("--tasks", type=int, help="tasks per backend (default 20,000)")
    parser.add_argument("--batch", type=int, default=256, help="changes per write (256)")
    parser.add_argument(
        "--pg",
        default=os.environ.get("PLANRUN_BENCH_PG", os.environ.get("PLANRUN_TEST_PG", DEFAULT_PG)),
        help="PostgreSQL URL (a temporary schema is created and dropped)",
    )
    args = parser.parse_args(argv)
    if args.tasks is None:
        args.tasks = 2_000 if args.quick else 20_000
    print(f"planrun store bench: python {platform.python_version()} on {platform.machine()}")
    results = asyncio.run(run(args))
    print(table(results, args.batch))
    print()
    rows = asyncio.run(run_supervised(args))
    base = rows[0][1]
    print(f"supervised no-op run, {args.tasks} tasks, 4 transitions each")
    print(f"{'store':<10} {'us/task':>9} {'vs no store':>12}")
    for name, per_task in rows:
        print(f"{name:<10} {per_task * 1e6:>9.1f} {per_task / base:>11.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
