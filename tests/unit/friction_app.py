"""An app for the CLI's first-use tests (``friction_app:app``): ``fetch`` fails for the
source ``broken`` with a two-line permanent error and counts how many run at once."""

from __future__ import annotations

import asyncio
from typing import Any

from planrun import App, PermanentError, Registry, TaskContext
from planrun.core import KindSpec

running = {"now": 0, "most": 0}


async def fetch(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    running["now"] += 1
    running["most"] = max(running["most"], running["now"])
    try:
        await asyncio.sleep(0.01)
        if payload["source"] == "broken":
            raise PermanentError(f"source {payload['source']!r} does not exist\n"
                                 "(the second line says which sources do)")
        return {"ok": True}
    finally:
        running["now"] -= 1


app = App(Registry([KindSpec("fetch", "fetch a source", handler=fetch)]))
