"""The app of ``bench/on_dbos.py``'s worker processes (``bench_app:app``): a no-op kind and a
kind that waits 20 ms, as a model call would wait on the network."""

from __future__ import annotations

import asyncio
from typing import Any

from planrun import App, Registry, TaskContext
from planrun.core import KindSpec


async def noop(payload: dict[str, Any], ctx: TaskContext) -> int:
    return 1


async def wait20(payload: dict[str, Any], ctx: TaskContext) -> int:
    await asyncio.sleep(0.02)
    return 1


registry = Registry([KindSpec("noop", handler=noop), KindSpec("wait20", handler=wait20)])
app = App(registry)
