"""A result that cannot be stored as JSON stops a durable run at once, naming type and path."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest

from planrun import KindSpec, Registry, Supervisor, Task, TaskContext, UnstorableValue, WorkerSpec
from planrun.stores import InMemoryStore


async def when(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    return {"rows": [{"at": datetime.datetime(2026, 1, 1)}]}


async def test_an_unstorable_result_is_not_retried_and_not_lost() -> None:
    store = InMemoryStore()
    sup = Supervisor(Registry([KindSpec("k", handler=when)]), [WorkerSpec("w")],
                     store=store, store_patience=600.0)
    sup.add_tasks([Task("a", "k")])
    with pytest.raises(UnstorableValue, match=r"task 'a' result cannot be stored as JSON: "
                       r"\$\.rows\[0\]\.at has type datetime\.datetime"):
        await asyncio.wait_for(sup.arun(), 30)  # not the 600 s a store outage is given
    state = await store.load(sup.run_id)
    assert state.run.status == "running"  # never recorded as finished with the result lost
    assert [t.status.value for t in state.tasks] != ["completed"]
