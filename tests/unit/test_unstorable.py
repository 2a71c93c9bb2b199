"""A result that cannot be stored as JSON fails its task at once, naming type and path."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

from planrun import Registry, TaskContext
from planrun.core import KindSpec, Task, WorkerSpec
from planrun.runtime import Supervisor
from planrun.stores import InMemoryStore


async def when(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    return {"rows": [{"at": datetime.datetime(2026, 1, 1)}]}


async def test_an_unstorable_result_fails_its_task_at_once_and_nothing_is_lost() -> None:
    store = InMemoryStore()
    sup = Supervisor(Registry([KindSpec("k", handler=when)]), [WorkerSpec("w")],
                     store=store, store_patience=600.0)
    sup.add_tasks([Task("a", "k"), Task("b", "k", depends_on=("a",))])
    result = await asyncio.wait_for(sup.arun(), 30)  # not the 600 s a store outage is given
    a = result.tasks["a"]
    assert a.status.value == "dead" and a.attempts == 1  # permanent: not retried
    assert "UnstorableValue" in (a.error or "")
    assert "$.rows[0].at has type datetime.datetime" in (a.error or "")
    assert result.tasks["b"].status.value == "cancelled"
    state = await store.load(sup.run_id)
    assert state.run.status == "finished"
    assert {t.id: t.status.value for t in state.tasks} == {"a": "dead", "b": "cancelled"}


def test_without_a_store_the_report_is_still_json() -> None:
    import json

    sup = Supervisor(Registry([KindSpec("k", handler=when)]), [WorkerSpec("w")])
    sup.add_tasks([Task("a", "k")])
    result = sup.run()
    assert result.tasks["a"].status.value == "dead"
    json.dumps([t.to_dict() for t in result.tasks.values()], allow_nan=False)
