"""Per-task cost of external runs (worker processes through one database) as runs grow.

    python bench/coordinator.py --quick      # 1,000 / 4,000 tasks
    python bench/coordinator.py              # 1,000 / 4,000 / 16,000 tasks

Each size runs the same no-op tasks three ways on a fresh SQLite file: the in-process
supervisor writing through the store (the baseline, measured in the same run), a
coordinator in push mode with four workers, and the same in peer mode. The workers run in
this process on their own connections, as ``planrun worker`` processes would; with real
processes the database work is the same. The figures that matter are the ratios to the
baseline and how they move with size: a flat per-task cost means a coordinator round
reads what changed, not the whole run.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from planrun.core._registry import KindSpec, Registry, TaskContext, WorkerSpec
from planrun.core._task import Task
from planrun.runtime._distributed import Coordinator, Mode, WorkerProcess
from planrun.runtime._supervisor import Supervisor
from planrun.stores import Store, open_store

WORKERS = 4
CAPACITY = 16


async def noop(payload: Any, ctx: TaskContext) -> int:
    return 1


REGISTRY = Registry([KindSpec("k", handler=noop)])


def tasks(n: int) -> list[Task]:
    return [Task(id=f"t{i}", kind="k") for i in range(n)]


async def opened(url: str) -> Store:
    store = open_store(url)
    await store.open()
    return store


async def supervised(url: str, n: int) -> float:
    store = await opened(url)
    try:
        sup = Supervisor(REGISTRY, [WorkerSpec(f"w{i}", None, CAPACITY) for i in range(WORKERS)],
                         store=store)
        sup.add_tasks(tasks(n))
        started = time.perf_counter()
        result = await sup.arun()
        assert result.ok, result.counts
        return time.perf_counter() - started
    finally:
        await store.close()


async def external(url: str, n: int, mode: Mode) -> float:
    stores = [await opened(url) for _ in range(WORKERS + 1)]
    workers = [WorkerProcess(REGISTRY, s, name=f"w{i}", capacity=CAPACITY, poll=0.05, mode=mode)
               for i, s in enumerate(stores[1:])]
    handles = [asyncio.ensure_future(w.arun()) for w in workers]
    try:
        started = time.perf_counter()
        result = await Coordinator(REGISTRY, stores[0], poll=0.05, mode=mode).arun(tasks(n))
        elapsed = time.perf_counter() - started
        assert result.ok and result.audit.clean, result.counts
        return elapsed
    finally:
        for w in workers:
            w.stop()
        await asyncio.gather(*handles)
        for s in stores:
            await s.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 and 4,000 tasks only")
    parser.add_argument("--sizes", help="comma-separated task counts")
    args = parser.parse_args()
    sizes = [int(s) for s in (args.sizes or ("1000,4000" if args.quick else
                                             "1000,4000,16000")).split(",")]
    print(f"no-op tasks, {WORKERS} workers x {CAPACITY}, SQLite, per-task microseconds")
    print(f"{'tasks':>7} {'supervisor':>11} {'push':>8} {'ratio':>6} {'peer':>8} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as folder:
        for n in sizes:
            row = []
            for name in ("supervisor", "push", "peer"):
                url = f"sqlite:///{Path(folder) / f'{name}-{n}.db'}"
                if name == "supervisor":
                    seconds = asyncio.run(supervised(url, n))
                else:
                    seconds = asyncio.run(external(url, n, name))  # type: ignore[arg-type]
                row.append(seconds / n * 1e6)
            base, push, peer = row
            print(f"{n:>7} {base:>11.0f} {push:>8.0f} {push / base:>6.1f} "
                  f"{peer:>8.0f} {peer / base:>6.1f}")


if __name__ == "__main__":
    main()
