"""Per-task supervisor overhead with no-op async workers, against asyncio.gather.

    python bench/dispatch.py --quick      # 1,000 / 10,000 / 100,000 tasks, one round each
    python bench/dispatch.py              # the same sizes, best of three rounds

The baseline, measured in the same run, is plain ``asyncio.gather`` over the same no-op
coroutine with a semaphore of the same concurrency. The figure that matters is the ratio,
and how it moves with size: a flat per-task cost means dispatch does not scan the task set.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from typing import Any

from planrun.registry import KindSpec, Registry, TaskContext, WorkerSpec
from planrun.supervisor import Supervisor
from planrun.task import Task

CONCURRENCY = 64


async def noop(payload: Any, ctx: TaskContext) -> None:
    return None


async def baseline(n: int) -> float:
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> None:
        async with sem:
            await noop({}, None)  # type: ignore[arg-type]

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - started


async def supervised(n: int, chained: bool) -> float:
    registry = Registry([KindSpec("noop", handler=noop)])
    sup = Supervisor(registry, [WorkerSpec("w", None, CONCURRENCY)], strategy="least_loaded")
    started = time.perf_counter()
    # Every 10th task depends on the one before it, so readiness tracking is exercised.
    sup.add_tasks(
        Task(id=f"t{i}", kind="noop", depends_on=(f"t{i - 1}",) if chained and i % 10 else ())
        for i in range(n)
    )
    result = await sup.arun()
    elapsed = time.perf_counter() - started
    assert result.ok, result.counts
    return elapsed


def best(fn: Any, n: int, rounds: int, *args: Any) -> float:
    times = []
    for _ in range(rounds):
        gc.collect()
        times.append(asyncio.run(fn(n, *args)))
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round per size")
    parser.add_argument("--sizes", default="1000,10000,100000")
    args = parser.parse_args()
    rounds = 1 if args.quick else 3
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"no-op tasks, concurrency {CONCURRENCY}, best of {rounds}")
    header = f"{'tasks':>8} {'gather us/task':>15} {'planrun us/task':>16} {'ratio':>7}"
    print(header + f" {'chained us/task':>16} {'ratio':>7}")
    for n in sizes:
        base = best(baseline, n, rounds) / n * 1e6
        flat = best(supervised, n, rounds, False) / n * 1e6
        chain = best(supervised, n, rounds, True) / n * 1e6
        print(f"{n:>8} {base:>15.2f} {flat:>16.2f} {flat / base:>7.1f}"
              f" {chain:>16.2f} {chain / base:>7.1f}")


if __name__ == "__main__":
    main()
