"""The app of the kill-and-resume test (``kill_app:app``): steps of pretend work, each
with an effect that records its key in a SQLite file (``$KILL_APP_TARGET``).

The target's table has the effect key as its primary key, so a repeated delivery (an
effect begun but not recorded when the process died) changes nothing there; every
delivery, repeated or not, is also logged in ``deliveries``.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
from typing import Any

from planrun import App, Registry, TaskContext
from planrun.core import KindSpec, Task


async def step(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    await asyncio.sleep(random.uniform(0.2, 0.6))
    return {"step": payload["n"]}


def deliver(task: Task, key: str) -> None:
    with sqlite3.connect(os.environ["KILL_APP_TARGET"], timeout=30) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS delivered (key TEXT PRIMARY KEY)")
        conn.execute("CREATE TABLE IF NOT EXISTS deliveries (key TEXT)")
        conn.execute("INSERT OR IGNORE INTO delivered VALUES (?)", (key,))
        conn.execute("INSERT INTO deliveries VALUES (?)", (key,))


registry = Registry([KindSpec("step", "One step of pretend work", handler=step)])
app = App(registry, effects={"step": deliver}, concurrency=6)
