"""Runs on DBOS for the tests: worker processes started as ``planrun worker``, and the
process running the plan (a supervisor whose attempts go to DBOS queues) in the test."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from planrun import App, Registry, Supervisor, Task
from planrun.core import RunResult
from planrun.runtime import DBOSAttempts, EffectFn
from planrun.stores import open_store

HERE = Path(__file__).resolve().parent
SRC = str(HERE.parents[1] / "src")


def spawn_worker(url: str, name: str, *, app: str = "dist_app:app", concurrency: int = 4,
                 lease: float = 30.0, idle_exit: float = 120.0, extra: Sequence[str] = (),
                 env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """``planrun worker`` in a process of its own, its output kept."""
    return subprocess.Popen(
        [sys.executable, "-m", "planrun.cli", "worker", "--db", url, "--app", app,
         "--name", name, "--concurrency", str(concurrency), "--lease", str(lease),
         "--idle-exit", str(idle_exit), *extra],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), SRC]), **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def run_on_dbos(registry: Registry, tasks: Iterable[Task], url: str, *,
                      lease: float = 30.0, in_flight: int = 32, app_name: str = "dist_app:app",
                      effects: Mapping[str, EffectFn] | None = None, run_id: str | None = None,
                      started: asyncio.Event | None = None, **options: Any) -> RunResult:
    """Run ``tasks`` supervised here, their attempts done by worker processes."""
    store = open_store(url)
    await store.open()
    attempts = DBOSAttempts(url, store, app_name=app_name, in_flight=in_flight, lease_s=lease)
    try:
        app = attempts.app(App(registry, effects=dict(effects or {})))
        sup = Supervisor(app.registry, app.worker_specs(), store=store, effects=app.effects,
                         stale_after=lease, run_id=run_id, **options)
        sup.add_tasks(list(tasks))
        if started is not None:
            started.set()
        return await sup.arun()
    finally:
        await attempts.aclose()
        await store.close()
