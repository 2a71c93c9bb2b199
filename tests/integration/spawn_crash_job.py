"""A durable fan-out job that kills itself with SIGKILL at a named point.

Run as a script by ``test_spawn_crash.py``::

    python spawn_crash_job.py DB_URL RUN_ID start|resume POINT:N

Twenty fetch tasks each spawn ten classify tasks when they complete; a summary joins every
fetch. POINT is as for ``crash_job.py`` (``event:created:15`` dies with an addition half
handed to the store's batch, not yet committed).
"""

from __future__ import annotations

import asyncio
import random
import sys
from typing import Any

from crash_job import Crash, CrashingStore

from planrun import Registry, RetryPolicy, TaskContext
from planrun.core import KindSpec, Task, WorkerSpec
from planrun.runtime import Supervisor
from planrun.stores import open_store

FETCHES, FAN = 20, 10


async def fetch(payload: Any, ctx: TaskContext) -> int:
    await asyncio.sleep(random.uniform(0.002, 0.01))
    for i in range(FAN):
        ctx.spawn("classify", {"i": i})
    return FAN


async def classify(payload: Any, ctx: TaskContext) -> int:
    await asyncio.sleep(random.uniform(0.002, 0.01))
    return int(payload["i"])


async def summary(payload: Any, ctx: TaskContext) -> int:
    return len(ctx.inputs)


def tasks() -> list[Task]:
    fetches = [Task(f"f{i}", "fetch") for i in range(FETCHES)]
    return [*fetches, Task("sum", "summary", joins=tuple(t.id for t in fetches))]


async def main(url: str, run_id: str, mode: str, spec: str) -> int:
    crash = Crash(spec)
    registry = Registry([KindSpec("fetch", handler=fetch), KindSpec("classify", handler=classify),
                         KindSpec("summary", handler=summary)])
    store = open_store(url)
    await store.open()
    sup = Supervisor(
        registry, [WorkerSpec(f"w{i}", None, 8) for i in range(2)],
        store=CrashingStore(store, crash),  # type: ignore[arg-type]
        run_id=run_id, retry=RetryPolicy(attempts=3, base=0.01, cap=0.05), max_reclaims=20,
        on_event=lambda event, task: crash.hit(f"event:{event.event}"), seed=1,
    )
    try:
        if mode == "start":
            sup.add_tasks(tasks())
            result = await sup.arun()
        else:
            result = await sup.aresume()
    finally:
        await store.close()
    return 0 if result.ok else 1


if __name__ == "__main__":
    url, run_id, mode, spec = sys.argv[1:5]
    sys.exit(asyncio.run(main(url, run_id, mode, spec)))
