"""How a durable run's changes reach the store: gathered into batches while they keep coming,
every event kept and in order, a waiting row and an effect's completion written at once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from planrun.core._errors import StoreError
from planrun.core._ledger import Event, EventRow, as_event
from planrun.core._registry import KindSpec, Registry, TaskContext, WorkerSpec
from planrun.core._task import Status, Task
from planrun.runtime._clock import VirtualClock
from planrun.runtime._supervisor import Supervisor
from planrun.stores import InMemoryStore


class Recording(InMemoryStore):
    """A memory store that keeps every batch it was asked to write."""

    def __init__(self, fail_from: int | None = None) -> None:
        super().__init__()
        self.batches: list[list[tuple[Task, Event]]] = []
        self.fail_from = fail_from

    async def write_batch(self, run_id: str, tasks: Sequence[Task],
                          events: Sequence[EventRow]) -> None:
        if self.fail_from is not None and len(self.batches) >= self.fail_from:
            raise StoreError("the store went away")
        by_id = {t.id: t for t in tasks}
        self.batches.append([(by_id[row[2]], as_event(row)) for row in events])
        await super().write_batch(run_id, tasks, events)


def run(store: InMemoryStore, sup: Supervisor) -> Any:
    async def go() -> Any:
        await store.open()
        return await sup.arun()

    assert isinstance(sup.clock, VirtualClock)
    return sup.clock.run(go())


def supervisor(store: InMemoryStore, kinds: dict[str, Any], **options: Any) -> Supervisor:
    registry = Registry([KindSpec(kind, handler=handler) for kind, handler in kinds.items()])
    return Supervisor(registry, [WorkerSpec("w", None, 4)], store=store, run_id="r",
                      clock=VirtualClock(), seed=0, **options)


async def busy(payload: Any, ctx: TaskContext) -> str:
    for _ in range(3):  # the loop is never idle: changes keep coming
        await asyncio.sleep(0)
    return ctx.task_id


def test_changes_that_keep_coming_are_one_batch_with_each_row_once() -> None:
    store = Recording()
    sup = supervisor(store, {"k": busy})
    sup.add_tasks([Task(f"t{i}", "k") for i in range(40)])

    result = run(store, sup)

    assert result.ok
    # Without gathering, the flusher wrote after every turn of the loop: many batches, each
    # task's row written as assigned, as running, and as completed.
    assert len(store.batches) == 1
    assert len({t.id for t, _ in store.batches[0]}) == 40
    state = asyncio.run(store.load("r"))
    assert [(e.seq, e.task, e.event) for e in state.events] == \
        [(e.seq, e.task, e.event) for e in result.events]
    assert {t.id: t for t in state.tasks} == dict(result.tasks)


def test_a_failing_store_keeps_a_prefix_of_the_ledger() -> None:
    async def slow(payload: Any, ctx: TaskContext) -> str:
        await asyncio.sleep(1.0)
        return ctx.task_id

    store = Recording(fail_from=1)  # the batch with the completions fails
    sup = supervisor(store, {"k": slow}, store_patience=0.0)
    sup.add_tasks([Task(f"t{i}", "k") for i in range(4)])

    with pytest.raises(StoreError, match="went away"):
        run(store, sup)

    state = asyncio.run(store.load("r"))
    stored = [(e.seq, e.task, e.event) for e in state.events]
    kept = [(e.seq, e.task, e.event) for e in sup.ledger.events]
    assert stored == kept[:len(stored)] and len(stored) < len(kept)
    assert {e for _, _, e in stored} == {"created", "assigned", "started"}
    assert all(t.status is Status.RUNNING for t in state.tasks)


def test_a_waiting_row_is_written_without_waiting_for_the_batch() -> None:
    store = Recording()
    sup: Supervisor
    seen: list[int] = []

    async def watch(payload: Any, ctx: TaskContext) -> str:
        for turn in range(200):  # keeps the loop busy: a gathering batch would wait it out
            await asyncio.sleep(0)
            rows = await store.load_some("r", ["gate"])
            if not seen and rows and rows[0].status is Status.WAITING:
                seen.append(turn)
        sup.approve("gate")
        return ctx.task_id

    sup = supervisor(store, {"k": watch, "gated": busy}, approvals={"gated": "start"})
    sup.add_tasks([Task("gate", "gated"), Task("watcher", "k")])

    result = run(store, sup)

    assert result.ok
    assert seen and seen[0] < 10


def test_an_effect_finds_its_completion_stored() -> None:
    class Checking(Recording):
        async def effect_begin(self, run_id: str, task_id: str, key: str,
                               at: float) -> Any:
            stored = await self.load_some(run_id, [task_id])
            assert stored[0].status is Status.COMPLETED, "effect begun before its completion"
            return await super().effect_begin(run_id, task_id, key, at)

    applied: list[str] = []
    store = Checking()
    sup = supervisor(store, {"k": busy}, effects={"k": lambda task, key: applied.append(key)})
    sup.add_tasks([Task(f"t{i}", "k") for i in range(10)])

    result = run(store, sup)

    assert result.ok and sorted(applied) == sorted(f"r:t{i}" for i in range(10))
