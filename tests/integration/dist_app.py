"""The app that worker processes of the distributed tests load (``dist_app:app``).

``triage`` drafts a reply to a ticket (a few milliseconds of pretend work); the reply is
*sent* by the coordinator's effect, never by a worker. A ticket whose id is listed in
``$DIST_APP_SLOW`` takes ``$DIST_APP_SLOW_S`` seconds on its first assignment (a worker
that is killed meanwhile leaves it running). ``$DIST_APP_WORK_S`` sets the pretend work of
every ticket in seconds (default a few milliseconds).
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

from planrun import App, Registry, TaskContext
from planrun.core import KindSpec


async def triage(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    slow = os.environ.get("DIST_APP_SLOW", "").split(",")
    if ctx.task_id in slow and ctx.attempt == 1:
        await asyncio.sleep(float(os.environ.get("DIST_APP_SLOW_S", "60")))
    work = os.environ.get("DIST_APP_WORK_S")
    await asyncio.sleep(float(work) if work else random.uniform(0.002, 0.008))
    return {"ticket": payload["ticket"], "reply": f"Hello, about {payload['ticket']}...",
            "worker": ctx.worker}


registry = Registry([KindSpec("triage", "Draft the reply to one ticket", handler=triage)])
app = App(registry)
