"""The Memory store's writes: task rows with their events, effects, decisions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from planrun.core import (
    Event,
    EventRow,
    StoreError,
    Task,
    as_event,
)
from planrun.stores._memory_rows import (
    Row,
    _checked,
    _MemoryRows,
    _Run,
)
from planrun.stores.base import (
    EFFECT_APPLIED,
    EFFECT_STARTED,
    EffectRecord,
    decision_row,
    dump_json,
    effect_from_row,
    event_row,
    task_from_row,
    task_row,
)


class _MemoryWrites(_MemoryRows):
    """The Memory store's writes: task rows with their events, effects, decisions."""

    # --- tasks and events -------------------------------------------------------------------

    def _append(self, run: _Run, events: Sequence[Row]) -> None:
        """Append events; one already stored under its seq is kept as it is (as the
        databases' unique ``(run, seq)`` does)."""
        for event in events:
            if event["seq"] not in run.seqs:
                run.seqs.add(event["seq"])
                run.events.append(event)
        if events:
            run.next_seq = max(run.next_seq, max(e["seq"] for e in events) + 1)

    async def add_tasks(self, run_id: str, tasks: Sequence[Task], events: Sequence[Event]) -> None:
        """Insert new task rows and their events, all or nothing."""
        self._record("add_tasks", run_id=run_id, tasks=list(tasks), events=list(events))
        run = self._run(run_id)
        rows = [_checked(task_row(run_id, t)) for t in tasks]
        event_rows = [event_row(run_id, e) for e in events]
        ids = [r["id"] for r in rows]
        duplicate = next((i for i in ids if i in run.tasks), None)
        if duplicate is None and len(set(ids)) != len(ids):
            duplicate = next(i for i in ids if ids.count(i) > 1)
        if duplicate is not None:
            raise StoreError(f"task {duplicate!r} already exists in run {run_id!r}")
        run.tasks.update((r["id"], r) for r in rows)
        self._append(run, event_rows)

    async def write(self, run_id: str, changes: Sequence[tuple[Task, Event]]) -> None:
        """Upsert every task row and append every event, all or nothing."""
        self._record("write", run_id=run_id, changes=list(changes))
        if not changes:
            return
        run = self._run(run_id)
        rows = [_checked(task_row(run_id, t)) for t, _ in changes]
        event_rows = [event_row(run_id, e) for _, e in changes]
        for row in rows:
            run.tasks[row["id"]] = row
        self._append(run, event_rows)

    async def write_batch(self, run_id: str, tasks: Sequence[Task],
                          events: Sequence[EventRow]) -> None:
        """:meth:`write` of the same changes: each event with its task's record."""
        by_id = {t.id: t for t in tasks}
        await self.write(run_id, [(by_id[r[2]], as_event(r)) for r in events])

    async def record_decision(self, run_id: str, task_id: str, approve: bool,
                              note: str | None) -> Task:
        """Write a person's decision on a waiting row (see :meth:`Store.record_decision`)."""
        self._record("record_decision", run_id=run_id, task_id=task_id, approve=approve,
                     note=note)
        run = self._run(run_id)
        stored = run.tasks.get(task_id)
        args = decision_row(run_id, None if stored is None else task_from_row(stored), task_id,
                            approve, note)
        assert stored is not None  # decision_row refused an unknown task
        run.tasks[task_id] = {**stored, "cause": args["cause"], "error": args["error"]}
        return task_from_row(run.tasks[task_id])

    async def append_event(self, run_id: str, event: Event) -> None:
        """Append one event that changes no row, numbered by the store."""
        self._record("append_event", run_id=run_id, event=event)
        run = self._run(run_id)
        self._append(run, [event_row(run_id, event, run.next_seq)])

    # --- effects ----------------------------------------------------------------------------

    async def effect_begin(self, run_id: str, task_id: str, key: str, at: float) -> EffectRecord:
        """Insert a ``started`` effect unless one exists; return the stored record."""
        self._record("effect_begin", run_id=run_id, task_id=task_id, key=key, at=at)
        effects = self._run(run_id).effects
        row = effects.setdefault(
            task_id,
            {"task_id": task_id, "key": key, "state": EFFECT_STARTED, "result": "null",
             "at": at},
        )
        return effect_from_row(row)

    async def effect_done(
        self, run_id: str, task_id: str, result: Any, at: float, event: Event | None = None
    ) -> bool:
        """Mark a begun effect applied (with its event); an applied one stays as it is."""
        self._record("effect_done", run_id=run_id, task_id=task_id, result=result, at=at,
                     event=event)
        encoded = dump_json(result, f"effect result of task {task_id!r}")
        rows = [] if event is None else [event_row(run_id, event)]  # encode before any change
        run = self._runs.get(run_id)
        row = run.effects.get(task_id) if run is not None else None
        if run is None or row is None:
            raise StoreError(f"no effect begun for task {task_id!r} of run {run_id!r}")
        if row["state"] != EFFECT_STARTED:
            return False
        row.update(state=EFFECT_APPLIED, result=encoded, at=at)
        if rows:
            if event is not None and event.seq < 0:
                rows[0]["seq"] = run.next_seq
            self._append(run, rows)
        return True
