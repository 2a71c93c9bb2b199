"""The SQLite store: one file, one connection, one transaction per call.

The file runs in WAL mode with ``synchronous=NORMAL`` (a commit survives a process crash;
a power cut may lose the last few) and a busy timeout, so several processes can share it.
Every write starts with ``BEGIN IMMEDIATE``: it takes the write lock up front (waiting up to
the busy timeout for another process's), so a write that reads first (an effect, a
decision) is atomic across processes and never turns a reader into a writer that
deadlocks. Batches of rows go through statements of many rows each (see
:meth:`SQLiteConnector._rows`), their values bound by position.

sqlite3 blocks, so a transaction runs whole on one private thread (the connection's only
user) and the event loop stays free; ``inline=True`` runs it on the loop's thread instead,
which keeps a :class:`planrun.runtime.VirtualClock` from advancing while a query runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential, wait_random

from planrun.core import StoreError
from planrun.stores._connector import (
    NOTHING,
    Mode,
    Query,
    Result,
    Rows,
    Statement,
    Tx,
    drive,
    load_queries,
)
from planrun.stores._sql import SQLStore
from planrun.stores.base import Decoder, load_json, one_line

__all__ = ["SQLiteConnector", "SQLiteStore"]

T = TypeVar("T")

Q = load_queries("sqlite")

_CLOCKED = frozenset(name for name, sql in Q.items() if ":wall_clock" in sql)
"""The queries that read this machine's clock (the dialect's ``now``)."""

_LISTS = frozenset(name for name, sql in Q.items() if "json_each(" in sql)
"""The queries that take a list (bound as JSON text)."""

_BEGIN: dict[Mode, str | None] = {"write": "BEGIN IMMEDIATE", "read": "BEGIN", "single": None}

_VALUES_AT_ONCE = 999
"""Values bound per statement of :meth:`SQLiteConnector._rows` at most: SQLite's lowest
default limit. An event row in a statement of 124 costs about 40 % less than in a statement
of its own, and a thread writing a batch while the event loop runs waits for the GIL once
per statement."""

Call = tuple[str, dict[str, Any]]
"""A recorded statement: the query's name and its arguments."""


def _dict_row(cursor: sqlite3.Cursor, values: tuple[Any, ...]) -> dict[str, Any]:
    return {col[0]: value for col, value in zip(cursor.description, values, strict=True)}


def _greatest(*values: Any) -> Any:
    """PostgreSQL's ``greatest``: the largest value that is not NULL."""
    return max((v for v in values if v is not None), default=None)


def _least(*values: Any) -> Any:
    """PostgreSQL's ``least``: the smallest value that is not NULL."""
    return min((v for v in values if v is not None), default=None)


def _floor(value: float | None) -> int | None:
    return None if value is None else math.floor(value)


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


@functools.cache
def _rows_statement(name: str, fragment: str, count: int) -> str:
    """Query ``name`` with its ``{rows}`` made ``count`` rows of ``fragment``."""
    return Q[name].replace("{rows}", ", ".join([Q[fragment]] * count))


class SQLiteConnector:
    """SQLite for :class:`~planrun.stores._sql.SQLStore`: one connection, on one thread.

    Args:
        path: the database file (created when absent), or ``":memory:"`` (a database that
            lives as long as this object; :meth:`close` keeps it).
        busy_timeout: seconds a call waits for another connection's write lock.
        inline: run transactions on the event loop's thread instead of a private one.
        record: keep every statement run in :attr:`calls`.
    """

    null_text = 0
    """A missing value of a nullable text column (the rows' NULLIF makes it NULL: sqlite3
    binds None slowly)."""
    null_real = ""
    """A missing value of a nullable number column."""

    def __init__(self, path: str, *, busy_timeout: float = 5.0, inline: bool = False,
                 record: bool = False) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"
        self.decode: Decoder = load_json
        self.busy_timeout = busy_timeout
        self.inline = inline
        self.calls: list[Call] | None = [] if record else None
        """Every statement run, oldest first (``record=True``; else None)."""
        self._conn: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closing: Future[None] | None = None
        """The last :meth:`close`, still checkpointing on the connector's thread."""

    @property
    def in_memory(self) -> bool:
        """True for a database in this process's memory."""
        return self.path == ":memory:"

    # --- connections ------------------------------------------------------------------------

    async def open(self, migrate: Callable[[], Tx[None]]) -> None:
        """Open the file, set WAL mode, and run ``migrate``."""
        if self._conn is not None:
            return
        if self._closing is not None:  # the last close's checkpoint first
            closing, self._closing = self._closing, None
            with contextlib.suppress(sqlite3.Error):
                await asyncio.wrap_future(closing)
        if not self.inline:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="planrun-sqlite")
        try:
            self._conn = await self._call(lambda: self._connect(migrate))
        except BaseException:
            self._shutdown()
            raise

    def open_here(self, migrate: Callable[[], Tx[None]]) -> None:
        """:meth:`open` at once, on this thread (a connector that runs ``inline``)."""
        if self._conn is None:
            try:
                self._conn = self._connect(migrate)
            except sqlite3.Error as exc:
                raise StoreError(f"{self.url}: {one_line(exc)}") from exc

    def _connect(self, migrate: Callable[[], Tx[None]]) -> sqlite3.Connection:
        """A new connection, set up, its schema migrated."""
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        try:
            conn.row_factory = _dict_row
            for name, function in (("greatest", _greatest), ("least", _least),
                                   ("floor", _floor)):
                conn.create_function(name, -1 if name != "floor" else 1, function,
                                     deterministic=True)
            if not self.in_memory:
                conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
                # Before the switch to WAL: a new file's switch then syncs it once less.
                conn.execute("PRAGMA synchronous = NORMAL")
                _enable_wal(conn, self.busy_timeout)
            conn.execute("PRAGMA foreign_keys = ON")
            self._transaction(conn, migrate(), "write")
        except BaseException:
            conn.close()
            raise
        return conn

    async def close(self) -> None:
        """Close the connection and its thread (a database in memory stays).

        Everything committed is in the file's write-ahead log already (a process crash
        loses none of it; see the module docstring for a power cut). The checkpoint SQLite
        runs as the last connection closes (it copies the log into the file and syncs both:
        some milliseconds after a large run) goes on on the connector's thread after this
        returns; the thread is joined before the process exits, and :meth:`open` waits for
        it.
        """
        if self.in_memory:
            return
        conn, self._conn = self._conn, None
        try:
            if conn is not None:
                if self._executor is None:
                    await self._call(conn.close)
                else:
                    self._closing = self._executor.submit(conn.close)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    # --- transactions -----------------------------------------------------------------------

    async def run(self, tx: Callable[[], Tx[T]], mode: Mode = "write") -> T:
        """Run ``tx()`` whole on the connector's thread; sqlite3 errors become StoreError."""
        conn = self._conn
        if conn is None:
            raise StoreError(f"{self.url}: the store is not open (call open() first)")
        return await self._call(lambda: self._transaction(conn, tx(), mode))

    async def _call(self, fn: Callable[[], T]) -> T:
        try:
            if self._executor is None:
                return fn()
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        except (sqlite3.Error, OverflowError) as exc:
            raise StoreError(f"{self.url}: {one_line(exc)}") from exc

    def _transaction(self, conn: sqlite3.Connection, tx: Tx[T], mode: Mode) -> T:
        begin = _BEGIN[mode]
        if begin is None:
            return drive(tx, lambda statement: self._execute(conn, statement))
        conn.execute(begin)
        try:
            out = drive(tx, lambda statement: self._execute(conn, statement))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return out

    def _execute(self, conn: sqlite3.Connection, statement: Statement) -> Result:
        if self.calls is not None:
            args = statement.args if isinstance(statement, Query) else {}
            self.calls.append((statement.name, dict(args)))
        if isinstance(statement, Rows):
            return self._rows(conn, statement)
        sql = Q[statement.name]
        if not sql:
            return NOTHING
        if not isinstance(statement, Query):  # a script
            for part in _statements(sql):
                conn.execute(part)
            return NOTHING
        args = statement.args
        if statement.name in _LISTS:
            args = {k: json.dumps(v) if isinstance(v, list) else v for k, v in args.items()}
        if statement.name in _CLOCKED:
            args = {**args, "wall_clock": time.time()}
        cursor = conn.execute(sql, args)
        return Result(cursor.fetchall(), cursor.rowcount)

    def _rows(self, conn: sqlite3.Connection, rows: Rows) -> Result:
        """Run ``rows`` in as many rows a statement as :data:`_VALUES_AT_ONCE` allows."""
        values, width = rows.values, len(rows.shape.columns)
        at_once = _VALUES_AT_ONCE // width
        count = len(values) // width
        whole = count - count % at_once
        if whole:
            statement = _rows_statement(rows.name, rows.shape.fragment, at_once)
            step = at_once * width
            for start in range(0, whole * width, step):
                conn.execute(statement, values[start:start + step])
        if whole < count:
            conn.execute(_rows_statement(rows.name, rows.shape.fragment, count - whole),
                         values[whole * width:])
        return Result([], count)


class SQLiteStore(SQLStore):
    """The store in one SQLite file (see the module).

    Args:
        path: the database file (created when absent), or ``":memory:"``.
        busy_timeout: seconds a call waits for another connection's write lock.
        inline: run queries on the event loop's thread instead of a private one.
    """

    connector: SQLiteConnector

    def __init__(self, path: str, *, busy_timeout: float = 5.0, inline: bool = False) -> None:
        super().__init__(SQLiteConnector(path, busy_timeout=busy_timeout, inline=inline))
        self.path = path
