"""A 500-task durable job that kills itself with SIGKILL at a named point.

Run as a script by ``test_crash.py``::

    python crash_job.py DB_URL RUN_ID start|resume POINT:N OUTBOX

POINT is ``event:<name>`` (the N-th ledger event of that name, which exists in memory but
is not yet committed), ``before_write`` / ``after_write`` (around the N-th store write),
``effect_applied`` (the N-th effect reached its target but is not recorded) or ``none``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
from typing import Any

from planrun import KindSpec, Registry, RetryPolicy, Supervisor, Task, TaskContext, WorkerSpec
from planrun.errors import TransientError
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


async def main(url: str, run_id: str, mode: str, spec: str, outbox: str) -> int:
    crash = Crash(spec)

    async def work(payload: Any, ctx: TaskContext) -> dict[str, int]:
        await asyncio.sleep(random.uniform(0.005, 0.02))
        if payload["flaky"] and ctx.attempt == 1:  # the first assignment ever fails
            raise TransientError("flaky dependency")
        return {"value": int(payload["i"])}

    def send(task: Task, key: str) -> None:
        with open(outbox, "a", encoding="utf-8") as fh:  # the target keeps every key it saw
            fh.write(json.dumps({"key": key, "task": task.id}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        crash.hit("effect_applied")

    registry = Registry([KindSpec("step", handler=work), KindSpec("send", handler=work)])
    store = open_store(url)
    await store.open()
    sup = Supervisor(
        registry,
        [WorkerSpec(f"w{i}", None, 8) for i in range(4)],
        store=CrashingStore(store, crash),  # type: ignore[arg-type]
        run_id=run_id,
        effects={"send": send},
        backoff=RetryPolicy(base=0.01, cap=0.05),
        max_reclaims=20,  # ten crashes may each catch the same task in flight
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
    return 0 if result.ok else 1


if __name__ == "__main__":
    url, run_id, mode, spec, outbox = sys.argv[1:6]
    sys.exit(asyncio.run(main(url, run_id, mode, spec, outbox)))
