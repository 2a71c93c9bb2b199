"""The SQLite store: one file, one connection, one transaction per call.

The file runs in WAL mode with ``synchronous=NORMAL`` (a commit survives a process crash;
a power cut may lose the last few) and a busy timeout, so several processes can share it.
Every write starts with ``BEGIN IMMEDIATE``: it takes the write lock up front, which makes
:meth:`SQLiteStore.claim` atomic across processes and never turns a reader into a writer
that deadlocks. Batches of rows go through statements of many rows each (see
:func:`_rows`), their values bound by position.

sqlite3 blocks, so calls run on one private thread (the connection's only user) and the
event loop stays free; ``inline=True`` runs them on the loop's thread instead, which keeps
a :class:`planrun.VirtualClock` from advancing while a query runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from planrun.core import Event, EventRow, RunInUse, StoreError, Task
from planrun.stores.base import (
    EVENT_ROW_KEYS,
    SCHEMA_VERSION,
    TASK_ROW_KEYS,
    Added,
    EffectRecord,
    LimiterState,
    RunInfo,
    RunOwner,
    RunState,
    RunSummary,
    SpendState,
    Waiters,
    WidenConflict,
    added_events,
    check_lease,
    decision_lost,
    decision_row,
    dump_json,
    effect_from_row,
    event_from_row,
    event_row,
    event_values,
    last_per_task,
    limiter_from_row,
    load_queries,
    newer_schema,
    one_line,
    owner_from_row,
    row_values,
    run_from_row,
    run_row,
    spend_from_row,
    start_statuses,
    started_event,
    summarize,
    task_from_row,
    task_row,
    task_values,
    unknown_run,
    widened_rows,
    worker_from_row,
)

__all__ = ["SQLiteStore"]

T = TypeVar("T")
Row = dict[str, Any]

Q = load_queries("sqlite")


def _dict_row(cursor: sqlite3.Cursor, values: tuple[Any, ...]) -> Row:
    return {col[0]: value for col, value in zip(cursor.description, values, strict=True)}


@contextmanager
def _transaction(conn: sqlite3.Connection, begin: str = "BEGIN IMMEDIATE") -> Iterator[None]:
    conn.execute(begin)
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


_FINAL_TEXT = frozenset({"completed", "dead", "cancelled"})


def _locked(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)


def _enable_wal(conn: sqlite3.Connection, patience: float) -> None:
    """Put the file in WAL mode (it stays so), waiting out other connections doing the same.

    Switching the journal mode of a new file answers "database is locked" at once, without
    the busy handler, while another process opens the same file: retry for ``patience`` s.
    """
    for attempt in Retrying(retry=retry_if_exception(_locked), reraise=True,
                            stop=stop_after_delay(patience),
                            wait=wait_exponential(0.005, max=0.2) + wait_random(0, 0.01)):
        with attempt:
            conn.execute("PRAGMA journal_mode = WAL")


def _statements(script: str) -> Iterator[str]:
    """Split a script into statements (sqlite3's ``execute`` takes one at a time)."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending.strip()
            pending = ""
    if pending.strip():
        yield pending.strip()


def _require_run(conn: sqlite3.Connection, run_id: str) -> None:
    if conn.execute(Q["get_run"], {"run_id": run_id}).fetchone() is None:
        raise unknown_run(run_id)


_NULL_TEXT = 0
"""A missing value of a nullable text column in ``task_values_row`` and ``event_values_row``
(their NULLIF turns it into NULL; sqlite3 binds None slowly)."""

_NULL_REAL = ""
"""A missing value of a nullable number column in ``task_values_row``."""


_VALUES_AT_ONCE = 999
"""Values bound per statement of :func:`_rows` at most: SQLite's lowest default limit. An
event row in a statement of 124 costs about 40 % less than in a statement of its own, and a
thread writing a batch while the event loop runs waits for the GIL once per statement."""

_ROW_OF = {"insert_tasks_rows": "task_values_row", "upsert_tasks_rows": "task_values_row",
           "insert_events_rows": "event_values_row"}
"""The many-row statements and the row each repeats."""

_EVENT_WIDTH = len(EVENT_ROW_KEYS)
_WIDTH = {"task_values_row": len(TASK_ROW_KEYS), "event_values_row": _EVENT_WIDTH}
"""Values per row."""


@functools.cache
def _rows_statement(name: str, count: int) -> str:
    """Query ``name`` with its ``{rows}`` made ``count`` rows."""
    return Q[name].replace("{rows}", ", ".join([Q[_ROW_OF[name]]] * count))


def _task_params(run_id: str, tasks: Iterable[Task]) -> list[Any]:
    """The values of the rows of ``tasks``, one row after another, for :func:`_rows`.

    One flat list: each row's tuple is dropped as soon as it is copied, so a batch of
    thousands of rows leaves the garbage collector no container per row to count and walk.
    """
    params: list[Any] = []
    for task in tasks:
        params += task_values(run_id, task, _NULL_TEXT, _NULL_REAL)
    return params


def _event_params(run_id: str, events: Iterable[Event], first: int | None = None) -> list[Any]:
    """The values of the rows of ``events`` (numbered from ``first`` if given), one row after
    another, for :func:`_rows` (see :func:`_task_params`)."""
    params: list[Any] = []
    if first is None:
        for event in events:
            params += event_values(run_id, event, None, _NULL_TEXT)
    else:
        for i, event in enumerate(events):
            params += event_values(run_id, event, first + i, _NULL_TEXT)
    return params


def _rows(conn: sqlite3.Connection, name: str, params: list[Any]) -> None:
    """Run query ``name`` (one of :data:`_ROW_OF`) over the rows whose values ``params``
    holds one after another, in order, as many rows a statement as
    :data:`_VALUES_AT_ONCE` allows."""
    width = _WIDTH[_ROW_OF[name]]
    at_once = _VALUES_AT_ONCE // width
    rows = len(params) // width
    whole = rows - rows % at_once
    if whole:
        statement = _rows_statement(name, at_once)
        step = at_once * width
        for start in range(0, whole * width, step):
            conn.execute(statement, params[start:start + step])
    if whole < rows:
        conn.execute(_rows_statement(name, rows - whole), params[whole * width:])


def _raise_next_seq(conn: sqlite3.Connection, run_id: str, last: int | None) -> None:
    """After events with caller-assigned seqs, the highest being ``last`` (None: none)."""
    if last is not None:
        conn.execute(Q["raise_next_seq"], {"run_id": run_id, "after": last + 1})


def _last_seq(params: list[Any]) -> int | None:
    """The highest seq of the event rows in ``params`` (see :func:`_event_params`), or None."""
    return max(params[1::_EVENT_WIDTH]) if params else None


def _take_seqs(conn: sqlite3.Connection, run_id: str, n: int) -> int:
    """Reserve ``n`` seqs of the run's counter; return the first."""
    conn.execute(Q["take_seqs"], {"run_id": run_id, "n": n})
    row = conn.execute(Q["get_next_seq"], {"run_id": run_id}).fetchone()
    return int(row["next_seq"]) - n


def _append_started(
    conn: sqlite3.Connection, run_id: str, tasks: Sequence[Task], now: float
) -> None:
    first = _take_seqs(conn, run_id, len(tasks))
    started = [started_event(t, now, first + i) for i, t in enumerate(tasks)]
    _rows(conn, "insert_events_rows", _event_params(run_id, started))


def _tasks_by_ids(conn: sqlite3.Connection, run_id: str, ids: str) -> list[Task]:
    rows = conn.execute(Q["get_tasks_by_ids"], {"run_id": run_id, "ids": ids})
    return [task_from_row(r) for r in rows]


class SQLiteStore:
    """A :class:`~planrun.stores.base.Store` in one SQLite file.

    Args:
        path: the database file (created when absent), or ``":memory:"``.
        busy_timeout: seconds a call waits for another connection's write lock.
        inline: run queries on the event loop's thread instead of a private one.
    """

    def __init__(self, path: str, *, busy_timeout: float = 5.0, inline: bool = False) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"
        self.busy_timeout = busy_timeout
        self.inline = inline
        self._conn: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closing: Future[None] | None = None
        """The last :meth:`close`, still checkpointing on the store's thread."""
        self._waiters = Waiters()

    def __repr__(self) -> str:
        return f"SQLiteStore({self.url!r})"

    # --- plumbing ---------------------------------------------------------------------------

    async def _run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the store's thread; translate sqlite3 errors into StoreError."""
        try:
            if self._executor is None:
                return fn()
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        except (sqlite3.Error, OverflowError) as exc:
            raise StoreError(f"{self.url}: {one_line(exc)}") from exc

    async def _with_conn(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn
        if conn is None:
            raise StoreError(f"{self.url}: the store is not open (call open() first)")
        return await self._run(lambda: fn(conn))

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        try:
            conn.row_factory = _dict_row
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            # Before the switch to WAL: a new file's switch then syncs it once less.
            conn.execute("PRAGMA synchronous = NORMAL")
            _enable_wal(conn, self.busy_timeout)
            conn.execute("PRAGMA foreign_keys = ON")
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        with _transaction(conn):
            conn.execute(Q["schema_table"])
            found = conn.execute(Q["schema_version"]).fetchone()["version"] or 0
            if found > SCHEMA_VERSION:
                raise newer_schema(self.url, found)
            for version in range(found + 1, SCHEMA_VERSION + 1):
                for statement in _statements(Q[f"migrate_{version}"]):
                    conn.execute(statement)
            if found != SCHEMA_VERSION:
                conn.execute(Q["clear_version"])
                conn.execute(Q["stamp_version"], {"version": SCHEMA_VERSION})

    # --- lifecycle --------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the file, set WAL mode, and create or migrate the schema."""
        if self._conn is not None:
            return
        if self._closing is not None:  # the last close's checkpoint first
            closing, self._closing = self._closing, None
            with contextlib.suppress(sqlite3.Error):
                await asyncio.wrap_future(closing)
        if not self.inline:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="planrun-sqlite")
        try:
            self._conn = await self._run(self._connect)
        except BaseException:
            self._shutdown()
            raise

    async def close(self) -> None:
        """Close the connection and its thread.

        Everything committed is in the file's write-ahead log already (a process crash
        loses none of it; see the module docstring for a power cut). The checkpoint SQLite
        runs as the last connection closes (it copies the log into the file and syncs both:
        some milliseconds after a large run) goes on on the store's thread after this
        returns; the thread is joined before the process exits, and :meth:`open` on this
        store waits for it.
        """
        conn, self._conn = self._conn, None
        try:
            if conn is not None:
                if self._executor is None:
                    await self._run(conn.close)
                else:
                    self._closing = self._executor.submit(conn.close)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    # --- runs -------------------------------------------------------------------------------

    async def create_run(self, run: RunInfo) -> None:
        """Insert a run; an existing id is a StoreError."""
        row = run_row(run)

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                try:
                    conn.execute(Q["create_run"], row)
                except sqlite3.IntegrityError:
                    raise StoreError(
                        f"run {run.id!r} already exists in {self.url}; choose another run id, "
                        "or resume it"
                    ) from None

        await self._with_conn(go)
        self._waiters.notify(run.id)

    async def set_run_status(self, run_id: str, status: str) -> None:
        """Change a run's status."""

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                if conn.execute(Q["set_run_status"], {"run_id": run_id, "status": status}) \
                        .rowcount == 0:
                    raise unknown_run(run_id)

        await self._with_conn(go)
        self._waiters.notify(run_id)

    async def acquire_run(self, run_id: str, owner: str, ttl: float, now: float, *,
                          take_from: str | None = None) -> None:
        """Own the run until ``now + ttl`` unless another owner's lease holds (RunInUse)."""
        check_lease(ttl)
        args = {"run_id": run_id, "owner": owner, "until": now + ttl, "now": now,
                "take_from": take_from}

        def go(conn: sqlite3.Connection) -> RunOwner | None:
            with _transaction(conn):
                if conn.execute(Q["acquire_run"], args).rowcount == 1:
                    return None
                row = conn.execute(Q["get_owner"], args).fetchone()
                if row is None:
                    raise unknown_run(run_id)
                return owner_from_row(row)

        holder = await self._with_conn(go)
        if holder is not None:
            raise RunInUse(run_id, holder.name, holder.until, now)

    async def renew_run(self, run_id: str, owner: str, ttl: float, now: float) -> bool:
        """Extend ``owner``'s lease; False when another owner holds the run."""
        check_lease(ttl)
        args = {"run_id": run_id, "owner": owner, "until": now + ttl}

        def go(conn: sqlite3.Connection) -> bool:
            with _transaction(conn):
                if conn.execute(Q["renew_run"], args).rowcount == 1:
                    return True
                _require_run(conn, run_id)
                return False

        return await self._with_conn(go)

    async def release_run(self, run_id: str, owner: str) -> None:
        """Give up ``owner``'s lease (nothing changes when another holds it)."""
        args = {"run_id": run_id, "owner": owner}

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                _require_run(conn, run_id)
                conn.execute(Q["release_run"], args)

        await self._with_conn(go)
        self._waiters.notify(run_id)

    async def run_owner(self, run_id: str) -> RunOwner | None:
        """The stored owner and lease end, or None."""

        def go(conn: sqlite3.Connection) -> RunOwner | None:
            row = conn.execute(Q["get_owner"], {"run_id": run_id}).fetchone()
            if row is None:
                raise unknown_run(run_id)
            return owner_from_row(row)

        return await self._with_conn(go)

    async def load(self, run_id: str) -> RunState:
        """Everything about one run, read in one snapshot."""
        return await self._read(run_id, events=True)

    async def load_tasks(self, run_id: str) -> RunState:
        """The run, its tasks and effects without the ledger (a coordinator's poll)."""
        return await self._read(run_id, events=False)

    async def load_some(self, run_id: str, ids: Sequence[str]) -> list[Task]:
        """The tasks of ``ids`` that exist, in task order."""
        encoded = json.dumps(list(ids))

        def go(conn: sqlite3.Connection) -> list[Task]:
            with _transaction(conn, "BEGIN"):
                _require_run(conn, run_id)
                return _tasks_by_ids(conn, run_id, encoded)

        return await self._with_conn(go)

    async def load_changed(self, run_id: str, after: int) -> tuple[list[Task], int]:
        """Tasks named by events after ``after``, and the last seq read (one snapshot)."""
        args = {"run_id": run_id, "after": after}

        def go(conn: sqlite3.Connection) -> tuple[list[Task], int]:
            with _transaction(conn, "BEGIN"):
                _require_run(conn, run_id)
                last = conn.execute(Q["last_seq"], args).fetchone()["seq"]
                if last is None:
                    return [], after
                tasks = [task_from_row(r) for r in conn.execute(Q["changed_tasks"], args)]
            return tasks, int(last)

        return await self._with_conn(go)

    async def _read(self, run_id: str, events: bool) -> RunState:
        def go(conn: sqlite3.Connection) -> RunState:
            with _transaction(conn, "BEGIN"):
                row = conn.execute(Q["get_run"], {"run_id": run_id}).fetchone()
                if row is None:
                    raise unknown_run(run_id)
                args = {"run_id": run_id}
                tasks = [task_from_row(r) for r in conn.execute(Q["get_tasks"], args)]
                ledger = ([event_from_row(r) for r in conn.execute(Q["get_events"], args)]
                          if events else [])
                effects = [effect_from_row(r) for r in conn.execute(Q["get_effects"], args)]
            return RunState(run_from_row(row), tasks, ledger, {e.task_id: e for e in effects})

        return await self._with_conn(go)

    async def list_runs(self) -> list[RunSummary]:
        """Every run, oldest first, with its task counts."""

        def go(conn: sqlite3.Connection) -> list[RunSummary]:
            with _transaction(conn, "BEGIN"):
                runs = [run_from_row(r) for r in conn.execute(Q["list_runs"])]
                counts = conn.execute(Q["count_tasks"]).fetchall()
            return summarize(runs, counts)

        return await self._with_conn(go)

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
        self._waiters.notify(run_id)

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
        self._waiters.notify(run_id)

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
        self._waiters.notify(run_id)

    async def write_fenced(
        self, run_id: str, task: Task, event: Event, expect_token: int,
        added: Added = (), widened: Sequence[tuple[Task, Event]] = (),
    ) -> bool:
        """Apply one change only over ``expect_token`` and an unfinished row (with what it
        added and widened, all or nothing)."""
        row = task_row(run_id, task) | {"expect_token": expect_token}

        def go(conn: sqlite3.Connection) -> bool:
            with _transaction(conn):
                if conn.execute(Q["fenced_update"], row).rowcount == 0:
                    return False
                _grow(conn, run_id, event, added, widened)
                return True

        applied = await self._with_conn(go)
        if applied:
            self._waiters.notify(run_id)
        return applied

    async def write_added(
        self, run_id: str, event: Event, added: Added,
        widened: Sequence[tuple[Task, Event]] = (),
    ) -> None:
        """Append ``event`` with what it added and widened, in one transaction."""

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                _require_run(conn, run_id)
                _grow(conn, run_id, event, added, widened)

        await self._with_conn(go)
        self._waiters.notify(run_id)

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
        self._waiters.notify(run_id)

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

        applied = await self._with_conn(go)
        if applied and row is not None:
            self._waiters.notify(run_id)
        return applied

    # --- workers and distribution -----------------------------------------------------------

    async def register_worker(
        self, run_id: str, name: str, kinds: Sequence[str], capacity: int, at: float
    ) -> None:
        """Register (or re-register) a worker for a run."""
        args = {
            "run_id": run_id,
            "name": name,
            "kinds": dump_json(list(kinds), f"kinds of worker {name!r}"),
            "capacity": capacity,
            "at": at,
        }

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                _require_run(conn, run_id)
                conn.execute(Q["register_worker"], args)

        await self._with_conn(go)
        self._waiters.notify(run_id)

    async def heartbeat_worker(self, run_id: str, name: str, at: float) -> None:
        """Record that a registered worker is alive; an unknown worker is a StoreError."""
        args = {"run_id": run_id, "name": name, "at": at}

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                if conn.execute(Q["heartbeat_worker"], args).rowcount == 0:
                    raise StoreError(f"unknown worker {name!r} in run {run_id!r}")

        await self._with_conn(go)

    async def list_workers(self, run_id: str) -> list[dict[str, Any]]:
        """Registered workers with their in-flight task counts (``active``)."""

        def go(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = conn.execute(Q["list_workers"], {"run_id": run_id})
            return [worker_from_row(r) for r in rows]

        return await self._with_conn(go)

    async def claim(
        self,
        run_id: str,
        worker: str,
        kinds: Sequence[str],
        now: float | None,
        lease_s: float,
        limit: int = 1,
    ) -> list[Task]:
        """Move up to ``limit`` ready tasks to running on ``worker`` (pull mode)."""
        if limit < 1 or not kinds:
            return []
        args: dict[str, Any] = {
            "run_id": run_id,
            "worker": worker,
            "kinds": json.dumps(list(kinds)),
            "limit": limit,
        }
        return await self._start(run_id, "claim_candidates", "start_tasks", args, now, lease_s)

    async def take_assigned(
        self, run_id: str, worker: str, now: float | None, lease_s: float, limit: int = 1
    ) -> list[Task]:
        """Move tasks assigned to ``worker`` to running (push mode)."""
        if limit < 1:
            return []
        args: dict[str, Any] = {"run_id": run_id, "worker": worker, "limit": limit}
        return await self._start(run_id, "assigned_candidates", "start_assigned", args, now,
                                 lease_s)

    async def _start(
        self,
        run_id: str,
        candidates: str,
        start: str,
        args: dict[str, Any],
        now: float | None,
        lease_s: float,
    ) -> list[Task]:
        """Pick candidates and move them to running, with a ``started`` event each, at once.

        Without ``now`` the stamp is read after ``BEGIN IMMEDIATE`` holds the write lock:
        every write committed before it, a dependency's completion included, is older.
        """

        def go(conn: sqlite3.Connection) -> list[Task]:
            with _transaction(conn):
                stamp = time.time() if now is None else now
                args.update(now=stamp, lease=stamp + lease_s,
                            **start_statuses(claimed=start == "start_tasks"))
                ids = [r["id"] for r in conn.execute(Q[candidates], args)]
                if not ids:
                    return []
                args["ids"] = json.dumps(ids)
                conn.execute(Q[start], args)
                tasks = _tasks_by_ids(conn, run_id, args["ids"])
                _append_started(conn, run_id, tasks, stamp)
                return tasks

        tasks = await self._with_conn(go)
        if tasks:
            self._waiters.notify(run_id)
        return tasks

    async def renew(self, run_id: str, task_id: str, token: int, lease: float) -> bool:
        """Extend a lease; False when the token is stale or the task is not in flight."""
        args = {"run_id": run_id, "task_id": task_id, "token": token, "lease": lease}

        def go(conn: sqlite3.Connection) -> bool:
            with _transaction(conn):
                return conn.execute(Q["renew"], args).rowcount == 1

        return await self._with_conn(go)

    async def expired(self, run_id: str, now: float) -> list[Task]:
        """Assigned or running tasks whose lease is before ``now``."""

        def go(conn: sqlite3.Connection) -> list[Task]:
            rows = conn.execute(Q["expired"], {"run_id": run_id, "now": now})
            return [task_from_row(r) for r in rows]

        return await self._with_conn(go)

    async def wait_for_change(self, run_id: str, timeout: float) -> None:
        """Poll: wait ``timeout`` seconds, or less when this store itself writes the run."""
        await self._waiters.wait(run_id, timeout)

    # --- limits shared by every process -----------------------------------------------------
    # Processes of one machine share one clock, so time is this process's time.time().

    async def limiter_configure(
        self, key: str, rpm: float | None, tpm: float | None, request_burst: float,
        token_burst: float,
    ) -> None:
        """Create the limiter row of ``key``, or set its rates (what it spent is kept)."""
        row = {"key": key, "rpm": rpm, "tpm": tpm, "request_burst": request_burst,
               "token_burst": token_burst}

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                conn.execute(Q["limiter_configure"], row)

        await self._with_conn(go)

    async def limiter_take(self, key: str, tokens: float) -> float:
        """Take one request and ``tokens`` if allowed now (0), else the seconds to wait."""

        def go(conn: sqlite3.Connection) -> float:
            with _transaction(conn):
                now = time.time()
                args = {"key": key, "cost": float(tokens), "now": now}
                if conn.execute(Q["limiter_take"], args).rowcount:
                    return 0.0
                row = conn.execute(Q["limiter_ready_at"], args).fetchone()
                if row is None:
                    raise StoreError(f"no limiter {key!r} (call limiter_configure first)")
                return max(1e-6, float(row["ready_at"]) - now)

        return await self._with_conn(go)

    async def limiter_give(self, key: str, tokens: float) -> None:
        """Give ``tokens`` back to the token bucket (negative: take more)."""
        args = {"key": key, "amount": float(tokens)}

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                conn.execute(Q["limiter_give"], {**args, "now": time.time()})

        await self._with_conn(go)

    async def limiter_defer(self, key: str, requests: float | None,
                            tokens: float | None) -> None:
        """Each bucket full again no sooner than the given seconds from now."""
        args = {"key": key, "requests": requests, "tokens": tokens}

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                conn.execute(Q["limiter_defer"], {**args, "now": time.time()})

        await self._with_conn(go)

    async def limiter_pause(self, key: str, seconds: float) -> None:
        """Nobody takes anything from ``key`` for ``seconds``."""

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                conn.execute(Q["limiter_pause"],
                             {"key": key, "seconds": float(seconds), "now": time.time()})

        await self._with_conn(go)

    async def limiter_state(self, key: str) -> LimiterState | None:
        """The limiter row of ``key``."""

        def go(conn: sqlite3.Connection) -> LimiterState | None:
            row = conn.execute(Q["limiter_state"], {"key": key, "now": time.time()}).fetchone()
            return None if row is None else limiter_from_row(row)

        return await self._with_conn(go)

    async def spend_open(self, run_id: str, max_tokens: int | None,
                         max_cost: float | None) -> None:
        """Create the spend row of a run (a limit given replaces the stored one)."""
        args = {"run_id": run_id, "max_tokens": max_tokens, "max_cost": max_cost}

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                conn.execute(Q["spend_open"], args)

        await self._with_conn(go)

    async def spend_reserve(self, run_id: str, tokens: int, cost: float) -> SpendState | None:
        """Hold back ``tokens`` and ``cost`` if they fit (None), else the refusing row."""
        args = {"run_id": run_id, "tokens": int(tokens), "cost": float(cost)}

        def go(conn: sqlite3.Connection) -> SpendState | None:
            with _transaction(conn):
                if conn.execute(Q["spend_reserve"], args).rowcount:
                    return None
                row = conn.execute(Q["spend_get"], args).fetchone()
            if row is None:
                raise StoreError(f"run {run_id!r} has no spend row (call spend_open first)")
            return spend_from_row(row)

        return await self._with_conn(go)

    async def spend_settle(
        self, run_id: str, reserved_tokens: int, reserved_cost: float, requests: int,
        prompt_tokens: int, cached_tokens: int, completion_tokens: int, cost_usd: float,
    ) -> None:
        """Give a reservation back and add what the request really used."""
        args = {"run_id": run_id, "reserved_tokens": int(reserved_tokens),
                "reserved_cost": float(reserved_cost), "requests": int(requests),
                "prompt_tokens": int(prompt_tokens), "cached_tokens": int(cached_tokens),
                "completion_tokens": int(completion_tokens), "cost_usd": float(cost_usd)}

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                conn.execute(Q["spend_settle"], args)

        await self._with_conn(go)

    async def spend_release_all(self, run_id: str) -> None:
        """Drop every reservation of a run."""

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                conn.execute(Q["spend_release_all"], {"run_id": run_id})

        await self._with_conn(go)

    async def spend(self, run_id: str) -> SpendState | None:
        """The spend row of a run."""

        def go(conn: sqlite3.Connection) -> SpendState | None:
            row = conn.execute(Q["spend_get"], {"run_id": run_id}).fetchone()
            return None if row is None else spend_from_row(row)

        return await self._with_conn(go)


def _grow(conn: sqlite3.Connection, run_id: str, event: Event, added: Added,
          widened: Sequence[tuple[Task, Event]]) -> None:
    """Inside a write's transaction: widen the joiners, insert the added rows, and append
    ``event`` with theirs, numbered in order (a joiner changed meanwhile: WidenConflict)."""
    events = [event]
    for wide_row, (_, wide_event) in zip(widened_rows(run_id, widened), widened, strict=True):
        if conn.execute(Q["fenced_update"], wide_row).rowcount:
            events.append(wide_event)
            continue
        held = conn.execute(Q["get_tasks_by_ids"], {
            "run_id": run_id, "ids": json.dumps([wide_row["id"]])}).fetchall()
        if held and held[0]["status"] not in _FINAL_TEXT:
            raise WidenConflict(f"task {wide_row['id']!r} changed since it was read")
    if added:
        _rows(conn, "insert_tasks_rows", _task_params(run_id, [t for t, _ in added]))
        events.extend(added_events(added))
    seq = _take_seqs(conn, run_id, len(events))
    _rows(conn, "insert_events_rows", _event_params(run_id, events, seq))
