"""The SQLite store's connection, runs and reads."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import sqlite3
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

from planrun.core import Event, RunInUse, StoreError, Task
from planrun.stores.base import (
    EVENT_ROW_KEYS,
    SCHEMA_VERSION,
    TASK_ROW_KEYS,
    RunInfo,
    RunOwner,
    RunState,
    RunSummary,
    check_lease,
    effect_from_row,
    event_from_row,
    event_values,
    load_queries,
    newer_schema,
    one_line,
    owner_from_row,
    run_from_row,
    run_row,
    summarize,
    task_from_row,
    task_values,
    unknown_run,
)

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


def _tasks_by_ids(conn: sqlite3.Connection, run_id: str, ids: str) -> list[Task]:
    rows = conn.execute(Q["get_tasks_by_ids"], {"run_id": run_id, "ids": ids})
    return [task_from_row(r) for r in rows]


class _SQLiteRows:
    """The SQLite store's connection, runs and reads."""

    def __init__(self, path: str, *, busy_timeout: float = 5.0, inline: bool = False) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"
        self.busy_timeout = busy_timeout
        self.inline = inline
        self._conn: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closing: Future[None] | None = None
        """The last :meth:`close`, still checkpointing on the store's thread."""

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

    async def set_run_status(self, run_id: str, status: str) -> None:
        """Change a run's status."""

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                if conn.execute(Q["set_run_status"], {"run_id": run_id, "status": status}) \
                        .rowcount == 0:
                    raise unknown_run(run_id)

        await self._with_conn(go)

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
        """The run, its tasks and effects without the ledger (a cheap poll)."""
        return await self._read(run_id, events=False)

    async def load_some(self, run_id: str, ids: Sequence[str]) -> list[Task]:
        """The tasks of ``ids`` that exist, in task order."""
        encoded = json.dumps(list(ids))

        def go(conn: sqlite3.Connection) -> list[Task]:
            with _transaction(conn, "BEGIN"):
                _require_run(conn, run_id)
                return _tasks_by_ids(conn, run_id, encoded)

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
