"""The shared rate limiter: the rate it achieves and what a call costs, with 1, 4, 8 processes.

    python bench/limiter.py [--quick] [--rpm 3000] [--seconds 5] [--pg URL]

For each store (SQLite file; PostgreSQL when a server answers) and each number of
processes P in 1, 4 and 8, P processes with 4 callers each draw on one
:class:`~planrun.model.SharedRateLimiter` key:

* **rate**: at ``--rpm`` for ``--seconds``; the achieved rate is the grants over the window
  from the first to the last, as a share of the configured rate (it must not pass 100 %
  by more than the burst of 2, nor fall far below it);
* **cost**: at a rate no caller ever waits for, the wall time of one ``acquire`` per
  process (P processes at once), and its ratio to the in-memory
  :class:`~planrun.model.RateLimiter`'s ``acquire`` measured in the same run.

PostgreSQL is measured in a temporary schema (dropped afterwards) at ``--pg`` (default
``PLANRUN_BENCH_PG``, then ``PLANRUN_TEST_PG``, then the local server).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from planrun.core._errors import ConfigError, StoreError
from planrun.model._limiter import RateLimiter
from planrun.model._limits import SharedRateLimiter
from planrun.stores import open_store

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
CALLERS = 4
"""Concurrent callers per process."""
FAST_RPM = 1e9
"""A rate nobody waits for: what is left is the limiter's own cost."""


@dataclass(frozen=True)
class Row:
    """One (store, processes) measurement."""

    backend: str
    processes: int
    rpm: float
    achieved_rpm: float
    cost_us: float


def _serve(url: str, key: str, rpm: float, seconds: float | None, calls: int | None,
           start_at: float, out: multiprocessing.Queue[tuple[list[float], float, int]]) -> None:
    """One process: CALLERS callers acquiring until ``seconds`` pass or ``calls`` are made."""

    async def go() -> tuple[list[float], float, int]:
        store = open_store(url)
        await store.open()
        limiter = SharedRateLimiter(store, key, requests_per_minute=rpm, request_burst=2)
        await limiter._configure()
        grants: list[float] = []
        await asyncio.sleep(max(0.0, start_at - time.time()))
        began = time.perf_counter()
        end = time.time() + seconds if seconds is not None else None

        async def caller() -> None:
            while (end is None or time.time() < end) and (calls is None or len(grants) < calls):
                await limiter.acquire()
                grants.append(time.time())

        await asyncio.gather(*(caller() for _ in range(CALLERS)))
        elapsed = time.perf_counter() - began
        await store.close()
        return grants, elapsed, limiter.store_calls

    out.put(asyncio.run(go()))


def _run(url: str, processes: int, rpm: float, seconds: float | None,
         calls: int | None) -> tuple[list[float], float, int]:
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[tuple[list[float], float, int]] = ctx.Queue()
    key = f"bench-{uuid.uuid4().hex[:8]}"
    start_at = time.time() + 1.5 + 0.3 * processes  # every process is up before the start
    procs = [ctx.Process(target=_serve, args=(url, key, rpm, seconds, calls, start_at, out))
             for _ in range(processes)]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    grants = sorted(g for r in results for g in r[0])
    return grants, max(r[1] for r in results), sum(r[2] for r in results)


def measure(backend: str, url: str, processes: int, rpm: float, seconds: float,
            calls: int) -> Row:
    """The achieved rate at ``rpm`` and the cost per call at a rate nobody waits for."""
    grants, _, _ = _run(url, processes, rpm, seconds, None)
    achieved = (len(grants) - 1) / (grants[-1] - grants[0]) * 60 if len(grants) > 1 else 0.0
    fast, elapsed, _ = _run(url, processes, FAST_RPM, None, calls)
    per_process = len(fast) / processes
    return Row(backend, processes, rpm, achieved, elapsed / per_process * 1e6)


def memory_cost_us(calls: int) -> float:
    """Wall time of one in-memory ``acquire`` (CALLERS callers, one process)."""

    async def go() -> float:
        limiter = RateLimiter(FAST_RPM, request_burst=2)
        done = 0
        began = time.perf_counter()

        async def caller() -> None:
            nonlocal done
            while done < calls:
                await limiter.acquire()
                done += 1

        await asyncio.gather(*(caller() for _ in range(CALLERS)))
        return (time.perf_counter() - began) / done * 1e6

    return asyncio.run(go())


@contextmanager
def _pg_schema(url: str) -> Iterator[str | None]:
    try:
        import psycopg
    except ImportError:
        yield None
        return
    schema = f"planrun_bench_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
    except psycopg.Error:
        yield None
        return
    sep = "&" if "?" in url else "?"
    try:
        yield f"{url}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 s windows, fewer calls")
    parser.add_argument("--rpm", type=float, default=3000.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--calls", type=int, default=400, help="calls per process (cost)")
    parser.add_argument("--pg", default=os.environ.get("PLANRUN_BENCH_PG")
                        or os.environ.get("PLANRUN_TEST_PG") or DEFAULT_PG)
    parser.add_argument("--processes", default="1,4,8")
    args = parser.parse_args(argv)
    seconds = 2.0 if args.quick else args.seconds
    calls = 100 if args.quick else args.calls
    counts = [int(n) for n in args.processes.split(",")]
    print(f"python {platform.python_version()} on {platform.machine()}, "
          f"{os.cpu_count()} cpus; {CALLERS} callers per process")
    memory = memory_cost_us(calls * 10)
    print(f"in-memory RateLimiter.acquire: {memory:.1f} us per call (baseline)")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp, _pg_schema(args.pg) as pg:
        backends = [("sqlite", f"sqlite:///{Path(tmp) / 'limits.db'}")]
        if pg is not None:
            backends.append(("postgres", pg))
        else:
            print("postgres: no server answers; skipped")
        for backend, url in backends:
            try:
                for n in counts:
                    rows.append(measure(backend, url, n, args.rpm, seconds, calls))
                    r = rows[-1]
                    print(f"{backend:<9} {n} processes: achieved {r.achieved_rpm:7.0f} of "
                          f"{r.rpm:.0f} rpm ({r.achieved_rpm / r.rpm:6.1%}); "
                          f"{r.cost_us:8.0f} us per call "
                          f"({r.cost_us / memory:5.0f}x in-memory)", flush=True)
            except (StoreError, ConfigError) as exc:
                print(f"{backend}: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
