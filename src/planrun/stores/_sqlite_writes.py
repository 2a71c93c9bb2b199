"""The SQLite store's writes: task rows with their events, effects, decisions."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from planrun.core import Event, EventRow, StoreError, Task
from planrun.stores._sqlite_rows import (
    _NULL_TEXT,
    Q,
    _event_params,
    _last_seq,
    _raise_next_seq,
    _require_run,
    _rows,
    _SQLiteRows,
    _take_seqs,
    _task_params,
    _tasks_by_ids,
    _transaction,
)
from planrun.stores.base import (
    EffectRecord,
    decision_lost,
    decision_row,
    dump_json,
    effect_from_row,
    event_row,
    last_per_task,
    row_values,
)


class _SQLiteWrites(_SQLiteRows):
    """The SQLite store's writes: task rows with their events, effects, decisions."""

    # --- tasks and events -------------------------------------------------------------------

    async def add_tasks(self, run_id: str, tasks: Sequence[Task], events: Sequence[Event]) -> None:
        """Insert new task rows and their events in one transaction."""
        task_rows = _task_params(run_id, tasks)
        event_rows = _event_params(run_id, events)

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                _require_run(conn, run_id)
                _rows(conn, "insert_tasks_rows", task_rows)
                _rows(conn, "insert_events_rows", event_rows)
                _raise_next_seq(conn, run_id, _last_seq(event_rows))

        await self._with_conn(go)

    async def write(self, run_id: str, changes: Sequence[tuple[Task, Event]]) -> None:
        """Upsert every task row and append every event, all or nothing."""
        if not changes:
            return
        # A task changed several times in one batch needs only its last row written.
        task_rows = _task_params(run_id, last_per_task(changes))
        event_rows = _event_params(run_id, (e for _, e in changes))

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                _require_run(conn, run_id)
                _rows(conn, "upsert_tasks_rows", task_rows)
                _rows(conn, "insert_events_rows", event_rows)
                _raise_next_seq(conn, run_id, _last_seq(event_rows))

        await self._with_conn(go)

    async def write_batch(self, run_id: str, tasks: Sequence[Task],
                          events: Sequence[EventRow]) -> None:
        """Upsert every row of ``tasks`` and append every event, all or nothing."""
        if not events and not tasks:
            return
        task_rows = _task_params(run_id, tasks)
        event_rows: list[Any] = []
        for row in events:
            event_rows += row_values(run_id, row, _NULL_TEXT)

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                _require_run(conn, run_id)
                _rows(conn, "upsert_tasks_rows", task_rows)
                _rows(conn, "insert_events_rows", event_rows)
                _raise_next_seq(conn, run_id, _last_seq(event_rows))

        await self._with_conn(go)

    async def record_decision(self, run_id: str, task_id: str, approve: bool,
                              note: str | None) -> Task:
        """Write a person's decision on a waiting row (see :meth:`Store.record_decision`)."""

        def go(conn: sqlite3.Connection) -> Task:
            with _transaction(conn):
                _require_run(conn, run_id)
                found = _tasks_by_ids(conn, run_id, json.dumps([task_id]))
                args = decision_row(run_id, found[0] if found else None, task_id, approve, note)
                if conn.execute(Q["record_decision"], args).rowcount == 0:
                    raise decision_lost(task_id)
                return _tasks_by_ids(conn, run_id, json.dumps([task_id]))[0]

        return await self._with_conn(go)

    async def append_event(self, run_id: str, event: Event) -> None:
        """Append one event that changes no row, numbered by the store."""

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                _require_run(conn, run_id)
                seq = _take_seqs(conn, run_id, 1)
                _rows(conn, "insert_events_rows", _event_params(run_id, [event], seq))

        await self._with_conn(go)

    # --- effects ----------------------------------------------------------------------------

    async def effect_begin(self, run_id: str, task_id: str, key: str, at: float) -> EffectRecord:
        """Insert a ``started`` effect unless one exists; return the stored record."""
        args = {"run_id": run_id, "task_id": task_id, "key": key, "at": at}

        def go(conn: sqlite3.Connection) -> EffectRecord:
            with _transaction(conn):
                _require_run(conn, run_id)
                conn.execute(Q["effect_begin"], args)
                return effect_from_row(conn.execute(Q["get_effect"], args).fetchone())

        return await self._with_conn(go)

    async def effect_done(
        self, run_id: str, task_id: str, result: Any, at: float, event: Event | None = None
    ) -> bool:
        """Mark a begun effect applied, with its event; an applied one stays as it is."""
        args = {
            "run_id": run_id,
            "task_id": task_id,
            "result": dump_json(result, f"effect result of task {task_id!r}"),
            "at": at,
        }
        row = None if event is None else event_row(run_id, event)

        def go(conn: sqlite3.Connection) -> bool:
            with _transaction(conn):
                if conn.execute(Q["effect_done"], args).rowcount == 0:
                    if conn.execute(Q["get_effect"], args).fetchone() is None:
                        raise StoreError(
                            f"no effect begun for task {task_id!r} of run {run_id!r}")
                    return False
                if row is not None:
                    numbered = dict(row)
                    if numbered["seq"] < 0:
                        numbered["seq"] = _take_seqs(conn, run_id, 1)
                    conn.execute(Q["insert_event"], numbered)
                    _raise_next_seq(conn, run_id, numbered["seq"])
                return True

        return await self._with_conn(go)
