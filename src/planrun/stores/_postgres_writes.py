"""The Postgres store's writes: task rows with their events, effects, decisions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from planrun.core import Event, EventRow, StoreError, Task
from planrun.stores._postgres_rows import (
    EVENT_COLUMNS,
    Q,
    _arrays,
    _PostgresRows,
)

if TYPE_CHECKING:
    from psycopg import AsyncCursor
    from psycopg.rows import DictRow

    Cursor = AsyncCursor[DictRow]
from planrun.stores.base import (
    EVENT_ROW_KEYS,
    TASK_COLUMNS,
    EffectRecord,
    decision_lost,
    decision_row,
    dump_json,
    effect_from_row,
    event_row,
    keep_json,
    last_per_task,
    row_values,
    task_from_row,
    task_row,
    unknown_run,
)


class _PostgresWrites(_PostgresRows):
    """The Postgres store's writes: task rows with their events, effects, decisions."""

    async def record_decision(self, run_id: str, task_id: str, approve: bool,
                              note: str | None) -> Task:
        """Write a person's decision on a waiting row (see :meth:`Store.record_decision`)."""
        args = {"run_id": run_id, "ids": [task_id]}

        async def go(cur: Cursor) -> Task:
            await self._require_run(cur, run_id)
            await cur.execute(Q["get_tasks_by_ids"], args)
            found = [task_from_row(r, keep_json) for r in await cur.fetchall()]
            update = decision_row(run_id, found[0] if found else None, task_id, approve, note)
            await cur.execute(Q["record_decision"], update)
            if cur.rowcount == 0:  # decided meanwhile: say how, as a later call would
                await cur.execute(Q["get_tasks_by_ids"], args)
                again = [task_from_row(r, keep_json) for r in await cur.fetchall()]
                decision_row(run_id, again[0] if again else None, task_id, approve, note)
                raise decision_lost(task_id)
            await cur.execute(Q["get_tasks_by_ids"], args)
            return next(task_from_row(r, keep_json) for r in await cur.fetchall())

        return await self._tx(go)

    # --- tasks and events -------------------------------------------------------------------

    @staticmethod
    async def _raise_next_seq(cur: Cursor, run_id: str, events: Sequence[dict[str, Any]]) -> None:
        if events:
            after = max(e["seq"] for e in events) + 1
            await cur.execute(Q["raise_next_seq"], {"run_id": run_id, "after": after})

    @staticmethod
    async def _take_seqs(cur: Cursor, run_id: str, n: int) -> list[int]:
        """``n`` increasing seqs for store-made events (see the module docstring)."""
        await cur.execute(Q["take_seqs"], {"run_id": run_id, "n": n})
        seqs = sorted(int(r["seq"]) for r in await cur.fetchall())
        if len(seqs) != n:
            raise unknown_run(run_id)
        return seqs

    async def add_tasks(self, run_id: str, tasks: Sequence[Task], events: Sequence[Event]) -> None:
        """Insert new task rows and their events in one transaction."""
        await self._write_rows(run_id, "insert_tasks", [task_row(run_id, t) for t in tasks],
                               [event_row(run_id, e) for e in events])

    async def write(self, run_id: str, changes: Sequence[tuple[Task, Event]]) -> None:
        """Upsert every task row and append every event, all or nothing."""
        if not changes:
            return
        await self._write_rows(run_id, "upsert_tasks",
                               [task_row(run_id, t) for t in last_per_task(changes)],
                               [event_row(run_id, e) for _, e in changes])

    async def write_batch(self, run_id: str, tasks: Sequence[Task],
                          events: Sequence[EventRow]) -> None:
        """Upsert every row of ``tasks`` and append every event, all or nothing."""
        if not events and not tasks:
            return
        await self._write_rows(run_id, "upsert_tasks", [task_row(run_id, t) for t in tasks],
                               [dict(zip(EVENT_ROW_KEYS, row_values(run_id, r), strict=True))
                                for r in events])

    async def _write_rows(self, run_id: str, tasks_query: str, task_rows: list[dict[str, Any]],
                          event_rows: list[dict[str, Any]]) -> None:
        """Write task rows with ``tasks_query`` (insert or upsert) and append event rows, in
        one transaction that moves the run's seq counter past them."""
        tasks_in = _arrays(run_id, task_rows, TASK_COLUMNS)
        events_in = _arrays(run_id, event_rows, EVENT_COLUMNS)

        async def go(cur: Cursor) -> None:
            await self._require_run(cur, run_id)
            if task_rows:
                await cur.execute(Q[tasks_query], tasks_in)
            if event_rows:
                await cur.execute(Q["insert_events"], events_in)
            await self._raise_next_seq(cur, run_id, event_rows)

        await self._tx(go)

    async def append_event(self, run_id: str, event: Event) -> None:
        """Append one event that changes no row, numbered by the store."""

        async def go(cur: Cursor) -> None:
            [seq] = await self._take_seqs(cur, run_id, 1)  # no run row: an unknown run
            rows = [event_row(run_id, event, seq)]
            await cur.execute(Q["insert_events"], _arrays(run_id, rows, EVENT_COLUMNS))

        await self._tx(go)

    # --- effects ----------------------------------------------------------------------------

    async def effect_begin(self, run_id: str, task_id: str, key: str, at: float) -> EffectRecord:
        """Insert a ``started`` effect unless one exists; return the stored record."""
        args = {"run_id": run_id, "task_id": task_id, "key": key, "at": at}

        async def go(cur: Cursor) -> EffectRecord:
            await self._require_run(cur, run_id)
            await cur.execute(Q["effect_begin"], args)
            await cur.execute(Q["get_effect"], args)
            row = await cur.fetchone()
            if row is None:  # only if the run was deleted in between
                raise unknown_run(run_id)
            return effect_from_row(row, keep_json)

        return await self._tx(go)

    async def effect_done(
        self, run_id: str, task_id: str, result: Any, at: float, event: Event | None = None
    ) -> bool:
        """Mark a begun effect applied, with its event; an applied one stays as it is.

        The update waits for the row lock of a concurrent writer and then re-reads the
        state: of two processes finishing the same effect, one writes the event.
        """
        args = {
            "run_id": run_id,
            "task_id": task_id,
            "result": dump_json(result, f"effect result of task {task_id!r}"),
            "at": at,
        }
        row = None if event is None else event_row(run_id, event)

        async def go(cur: Cursor) -> bool:
            await cur.execute(Q["effect_done"], args)
            if cur.rowcount == 0:
                await cur.execute(Q["get_effect"], args)
                if await cur.fetchone() is None:
                    raise StoreError(f"no effect begun for task {task_id!r} of run {run_id!r}")
                return False
            if row is not None:
                numbered = dict(row)
                if numbered["seq"] < 0:
                    [numbered["seq"]] = await self._take_seqs(cur, run_id, 1)
                else:  # numbered by the caller
                    await self._raise_next_seq(cur, run_id, [numbered])
                await cur.execute(Q["insert_events"],
                                  _arrays(run_id, [numbered], EVENT_COLUMNS))
            return True

        return await self._tx(go)
