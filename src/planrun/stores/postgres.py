"""The PostgreSQL store: the same rows in a server several machines share.

Connections come from a psycopg 3 ``AsyncConnectionPool``. Worker processes on any machine
claim work with one ``UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED) RETURNING``,
so two claimers never take the same task and neither waits for the other. Every change
sends ``NOTIFY planrun, '<run id>'`` at commit; :meth:`PostgresStore.wait_for_change`
listens on a connection of its own.

A dropped connection is the pool's to replace; a call that fails with a connection error
(or a deadlock or serialization failure, a lock wait past ``lock_timeout``, a session cut off
by ``idle_in_transaction_session_timeout``) is run again, whole, a few times with backoff
(tenacity) before it becomes a :class:`~planrun.StoreError`. A retried write whose
first commit reached the server before the connection dropped stores its events once
(one event per ``(run, seq)``).

No writer waits for another to number its events
-------------------------------------------------
A store-made event (a claim's ``started``, a fenced write's, an ``effect``) takes
``seq_base + nextval('planrun_event_seq')``: a sequence hands out distinct, increasing
numbers without a lock held to commit, so a writer stopped inside its transaction (SIGSTOP,
a long GC pause, a stalled VM) holds only the task rows it is changing. ``seq_base`` is kept
past every seq a caller numbered itself (the in-process supervisor numbers its own ledger;
a run has one driver at a time, see the owner lease), so the two never meet. Store-made
seqs are unique and increasing per run, not dense.

Every connection sets ``idle_in_transaction_session_timeout`` (default 10 s) and
``lock_timeout`` (default 5 s): the server cuts off a session that sits idle inside a
transaction, rolling it back and releasing its locks, so a stopped process cannot hold
anything for long, and a call waiting for a lock gives up (and is retried) rather than
wait behind it. Both are constructor arguments; ``None`` keeps the server's setting.

Reading what changed, in commit order
-------------------------------------
Numbers handed out at insert time are not commit order: a reader may see seq 6 committed
while seq 5 is still in flight, and a cursor "after 6" would skip 5 for good. So
:meth:`PostgresStore.load_changed` does not use seqs as its cursor. Each event row carries
the id of the transaction that wrote it (``xid``, from ``pg_current_xact_id()``), and every
transaction that may add events to a run first takes a shared advisory lock named after
the run (no writer waits for it). The cursor is a transaction id ``h``: the lowest id among
the transactions holding that lock, read from ``pg_locks``, or, when none does, the xmax of
that statement's snapshot. A writer takes the lock before it gets an id, so any writer with
an id below ``h`` has ended before ``h`` was read, and a later statement sees its events.
The next call reads every event with ``xid >= h``: a transaction still in flight is read
when it commits, and a change committed after an older, slower one is read (again) until
the older one ends: a task may come back twice, never be missed. Only this run's writers
hold the cursor back, and the session timeout bounds how long a stopped one can.

psycopg is imported only when a store is made, so planrun imports without the
``postgres`` extra; without it, :class:`PostgresStore` raises
:class:`~planrun.ConfigError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from planrun.core import ConfigError, Event, EventRow, RunInUse, StoreError, Task, UsageError
from planrun.stores.base import (
    EVENT_ROW_KEYS,
    SCHEMA_VERSION,
    TASK_COLUMNS,
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
    keep_json,
    last_per_task,
    limiter_from_row,
    load_queries,
    mask_url,
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
    unknown_run,
    widened_rows,
    worker_from_row,
)

if TYPE_CHECKING:
    from psycopg import AsyncConnection, AsyncCursor
    from psycopg.rows import DictRow
    from psycopg_pool import AsyncConnectionPool

    Cursor = AsyncCursor[DictRow]

__all__ = ["PostgresStore"]

log = logging.getLogger("planrun.stores")

T = TypeVar("T")

Q = load_queries("postgres")
CHANNEL = "planrun"

LOCK_TIMEOUT = 5.0
"""Default ``lock_timeout`` of every connection, in seconds."""
IDLE_IN_TRANSACTION_TIMEOUT = 10.0
"""Default ``idle_in_transaction_session_timeout`` of every connection, in seconds."""


@functools.cache
def _drivers() -> SimpleNamespace:
    """psycopg and its pool, imported on first use."""
    try:
        import psycopg
        import psycopg_pool
        from psycopg.rows import dict_row
    except ImportError as exc:
        raise ConfigError(
            "the PostgreSQL store needs psycopg 3: pip install planrun[postgres]"
        ) from exc
    return SimpleNamespace(psycopg=psycopg, pool=psycopg_pool, dict_row=dict_row)


def _password(url: str) -> str | None:
    try:
        return urlsplit(url).password
    except ValueError:
        return None


_FLOATS = frozenset(
    {"estimate_s", "lease", "not_before", "created_at", "started_at", "finished_at", "at"}
)
_INTS = frozenset({"attempts", "max_attempts", "token", "reclaims", "seq", "attempt"})
EVENT_COLUMNS = ("seq", "at", "task", "event", "worker", "attempt", "detail")


def _cell(column: str, value: Any) -> Any:
    if value is None:
        return None
    if column in _FLOATS:
        return float(value)
    if column in _INTS:
        return int(value)
    return value


def _arrays(
    run_id: str, rows: Sequence[dict[str, Any]], columns: Sequence[str]
) -> dict[str, Any]:
    """Rows as one list per column: a whole batch goes in one ``unnest`` statement.

    Numbers are made uniform per column (psycopg dumps a list of one type only).
    """
    try:
        arrays = {c: [_cell(c, row[c]) for row in rows] for c in columns}
    except (TypeError, ValueError) as exc:
        raise StoreError(f"a row cannot be stored: {exc}") from exc
    return {"run_id": run_id, **arrays}


def _by_pos(rows: list[DictRow]) -> list[Task]:
    return [task_from_row(r, keep_json) for r in sorted(rows, key=lambda r: r["pos"])]


class PostgresStore:
    """A :class:`~planrun.stores.base.Store` in PostgreSQL.

    Args:
        url: a libpq URL, ``postgresql://user:password@host:port/db`` (``postgres://`` too);
            tables go to the first schema of the connection's ``search_path``, which an
            ``?options=-csearch_path%3Dname`` query can set.
        min_size, max_size: the connection pool's bounds.
        connect_timeout: seconds to wait for a connection when opening.
        pool_timeout: seconds a call waits for a free (or re-established) connection.
        attempts: tries of a call that fails with a connection error, before StoreError.
        application_name: how the connections appear in ``pg_stat_activity``.
        lock_timeout: seconds a statement waits for a lock before it fails (and the call is
            retried); ``None`` keeps the server's setting.
        idle_in_transaction_timeout: seconds after which the server cuts off one of these
            sessions sitting idle inside a transaction (its process stopped), rolling the
            transaction back; ``None`` keeps the server's setting.
    """

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        connect_timeout: float = 5.0,
        pool_timeout: float = 10.0,
        attempts: int = 4,
        application_name: str = "planrun",
        lock_timeout: float | None = LOCK_TIMEOUT,
        idle_in_transaction_timeout: float | None = IDLE_IN_TRANSACTION_TIMEOUT,
    ) -> None:
        for name, value in (("lock_timeout", lock_timeout),
                            ("idle_in_transaction_timeout", idle_in_transaction_timeout)):
            if value is not None and not value > 0:
                raise UsageError(f"{name} must be a positive number of seconds or None, "
                                 f"not {value!r}")
        self._drivers = _drivers()
        self._conninfo = url
        self._secret = _password(url)
        self.url = mask_url(url)
        self.min_size = min_size
        self.max_size = max_size
        self.connect_timeout = connect_timeout
        self.pool_timeout = pool_timeout
        self.attempts = attempts
        self.application_name = application_name
        self.lock_timeout = lock_timeout
        self.idle_in_transaction_timeout = idle_in_transaction_timeout
        self._pool: AsyncConnectionPool[Any] | None = None
        self._waiters = Waiters()
        self._listener: asyncio.Task[None] | None = None
        self._listen_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"PostgresStore({self.url!r})"

    # --- plumbing ---------------------------------------------------------------------------

    def _error(self, exc: BaseException, doing: str = "") -> StoreError:
        text = one_line(exc)
        if self._secret:
            text = text.replace(self._secret, "***")
        return StoreError(f"{self.url}: {doing}{text}")

    def _retryable(self, exc: BaseException) -> bool:
        d = self._drivers
        if isinstance(exc, d.psycopg.errors.IdleInTransactionSessionTimeout):
            return True  # the server rolled the transaction back: run it again
        return isinstance(exc, d.psycopg.OperationalError) and not isinstance(
            exc, d.pool.PoolTimeout | d.pool.PoolClosed
        )

    @staticmethod
    def _log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning("store call failed (attempt %d), retrying: %s", state.attempt_number, exc)

    def _connect_kwargs(self) -> dict[str, Any]:
        return {
            "connect_timeout": max(1, round(self.connect_timeout)),
            "application_name": self.application_name,
        }

    async def _connect(self, **kwargs: Any) -> AsyncConnection[Any]:
        conn: AsyncConnection[Any] = await self._drivers.psycopg.AsyncConnection.connect(
            self._conninfo, **self._connect_kwargs(), **kwargs
        )
        return conn

    async def _configure(self, conn: AsyncConnection[Any], locks: bool = True) -> None:
        """Set the session's timeouts (see the module docstring); ``conn`` is in autocommit."""
        settings = [("idle_in_transaction_session_timeout", self.idle_in_transaction_timeout)]
        if locks:
            settings.append(("lock_timeout", self.lock_timeout))
        for name, seconds in settings:
            if seconds is not None:
                value = f"{max(1, round(seconds * 1000))}ms"
                await conn.execute(Q["set_session"], {"name": name, "value": value})

    async def _tx(
        self,
        fn: Callable[[Cursor], Awaitable[T]],
        snapshot: bool = False,
        writing: str | None = None,
    ) -> T:
        """Run ``fn`` in one transaction, again on a connection error; translate errors.

        ``writing`` names the run when ``fn`` may add events to it: the transaction takes the
        run's writing lock first (see :meth:`load_changed`).
        """
        pool = self._pool
        if pool is None:
            raise StoreError(f"{self.url}: the store is not open (call open() first)")
        d = self._drivers

        async def once() -> T:
            async with pool.connection() as conn, conn.transaction():
                cur: Cursor
                async with conn.cursor(row_factory=d.dict_row) as cur:
                    if snapshot:
                        await cur.execute(Q["snapshot"])
                    if writing is not None:
                        await cur.execute(Q["writing"], {"run_id": writing})
                    return await fn(cur)

        return await self._retried(once)

    async def _retried(self, once: Callable[[], Awaitable[T]]) -> T:
        """``once()``, tried again after a connection error; psycopg errors translated."""
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential(multiplier=0.05, max=1.0) + wait_random(0, 0.05),
            retry=retry_if_exception(self._retryable),
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            return await retrying(once)
        except self._drivers.psycopg.Error as exc:
            raise self._error(exc) from exc

    async def _statement(self, sql: str, args: dict[str, Any]) -> DictRow | None:
        """Run one statement on its own (autocommit: one round trip); its first row."""
        pool = self._pool
        if pool is None:
            raise StoreError(f"{self.url}: the store is not open (call open() first)")
        d = self._drivers

        async def once() -> DictRow | None:
            async with pool.connection() as conn:
                cur: Cursor
                async with conn.cursor(row_factory=d.dict_row) as cur:
                    await cur.execute(sql, args)
                    return await cur.fetchone() if cur.description else None

        return await self._retried(once)

    # --- lifecycle --------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect, create or migrate the schema, then open the pool."""
        if self._pool is not None:
            return
        d = self._drivers
        try:
            conn = await self._connect(autocommit=True)
        except d.psycopg.Error as exc:
            raise self._error(exc, "cannot connect: ") from exc
        try:
            async with conn:
                await self._configure(conn, locks=False)  # opens wait for one another
                await self._migrate(conn)
            pool: AsyncConnectionPool[Any] = d.pool.AsyncConnectionPool(
                self._conninfo,
                min_size=self.min_size,
                max_size=self.max_size,
                timeout=self.pool_timeout,
                kwargs={"autocommit": True, **self._connect_kwargs()},
                configure=self._configure,
                open=False,
                name="planrun",
            )
            await pool.open(wait=True, timeout=self.connect_timeout)
        except d.psycopg.Error as exc:
            raise self._error(exc, "cannot open: ") from exc
        self._pool = pool

    async def _migrate(self, conn: AsyncConnection[Any]) -> None:
        async with conn.transaction(), conn.cursor(row_factory=self._drivers.dict_row) as cur:
            await cur.execute(Q["schema_lock"])
            await cur.execute(Q["schema_table"])
            await cur.execute(Q["schema_version"])
            row = await cur.fetchone()
            found = int(row["version"] or 0) if row else 0
            if found > SCHEMA_VERSION:
                raise newer_schema(self.url, found)
            for version in range(found + 1, SCHEMA_VERSION + 1):
                await cur.execute(Q[f"migrate_{version}"])
            if found != SCHEMA_VERSION:
                await cur.execute(Q["clear_version"])
                await cur.execute(Q["stamp_version"], {"version": SCHEMA_VERSION})

    async def close(self) -> None:
        """Stop listening and close the pool."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    # --- runs -------------------------------------------------------------------------------

    async def create_run(self, run: RunInfo) -> None:
        """Insert a run; an existing id is a StoreError."""
        row = run_row(run)

        async def go(cur: Cursor) -> None:
            try:
                await cur.execute(Q["create_run"], row)
            except self._drivers.psycopg.errors.UniqueViolation:
                raise _run_exists(run.id) from None
            await cur.execute(Q["notify"], {"run_id": run.id})

        await self._tx(go)

    async def set_run_status(self, run_id: str, status: str) -> None:
        """Change a run's status."""

        async def go(cur: Cursor) -> None:
            await cur.execute(Q["set_run_status"], {"run_id": run_id, "status": status})
            if cur.rowcount == 0:
                raise unknown_run(run_id)
            await cur.execute(Q["notify"], {"run_id": run_id})

        await self._tx(go)

    async def acquire_run(self, run_id: str, owner: str, ttl: float, now: float, *,
                          take_from: str | None = None) -> None:
        """Own the run until ``now + ttl`` unless another owner's lease holds (RunInUse)."""
        check_lease(ttl)
        args = {"run_id": run_id, "owner": owner, "until": now + ttl, "now": now,
                "take_from": take_from}

        async def go(cur: Cursor) -> RunOwner | None:
            await cur.execute(Q["acquire_run"], args)
            if await cur.fetchone() is not None:
                await cur.execute(Q["notify"], {"run_id": run_id})
                return None
            await cur.execute(Q["get_owner"], args)
            row = await cur.fetchone()
            if row is None:
                raise unknown_run(run_id)
            return owner_from_row(row)

        holder = await self._tx(go)
        if holder is not None:
            raise RunInUse(run_id, holder.name, holder.until, now)

    async def renew_run(self, run_id: str, owner: str, ttl: float, now: float) -> bool:
        """Extend ``owner``'s lease; False when another owner holds the run."""
        check_lease(ttl)
        args = {"run_id": run_id, "owner": owner, "until": now + ttl}

        async def go(cur: Cursor) -> bool:
            await cur.execute(Q["renew_run"], args)
            if await cur.fetchone() is not None:
                return True
            await self._require_run(cur, run_id)
            return False

        return await self._tx(go)

    async def release_run(self, run_id: str, owner: str) -> None:
        """Give up ``owner``'s lease (nothing changes when another holds it)."""
        args = {"run_id": run_id, "owner": owner}

        async def go(cur: Cursor) -> None:
            await self._touch(cur, run_id)
            await cur.execute(Q["release_run"], args)

        await self._tx(go)

    async def run_owner(self, run_id: str) -> RunOwner | None:
        """The stored owner and lease end, or None."""

        async def go(cur: Cursor) -> RunOwner | None:
            await cur.execute(Q["get_owner"], {"run_id": run_id})
            row = await cur.fetchone()
            if row is None:
                raise unknown_run(run_id)
            return owner_from_row(row)

        return await self._tx(go)

    async def load(self, run_id: str) -> RunState:
        """Everything about one run, read in one snapshot."""
        return await self._read(run_id, events=True)

    async def load_tasks(self, run_id: str) -> RunState:
        """The run, its tasks and effects without the ledger (a coordinator's poll)."""
        return await self._read(run_id, events=False)

    async def load_some(self, run_id: str, ids: Sequence[str]) -> list[Task]:
        """The tasks of ``ids`` that exist, in task order."""
        args = {"run_id": run_id, "ids": list(ids)}

        async def go(cur: Cursor) -> list[Task]:
            await self._require_run(cur, run_id)
            await cur.execute(Q["get_tasks_by_ids"], args)
            return [task_from_row(r, keep_json) for r in await cur.fetchall()]

        return await self._tx(go, snapshot=True)

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

    async def load_changed(self, run_id: str, after: int) -> tuple[list[Task], int]:
        """Tasks named by events of transactions from cursor ``after`` on, and the next
        cursor: a transaction horizon, so that no change is missed whatever order
        concurrent writers commit in (see the module docstring). READ COMMITTED on
        purpose: the tasks are read by a statement that starts after the horizon's.
        """
        args = {"run_id": run_id, "after": after}

        async def go(cur: Cursor) -> tuple[list[Task], int]:
            await self._require_run(cur, run_id)
            await cur.execute(Q["horizon"], args)
            row = await cur.fetchone()
            horizon = int(row["horizon"]) if row is not None else after
            await cur.execute(Q["changed_tasks"], args)
            tasks = [task_from_row(r, keep_json) for r in await cur.fetchall()]
            return tasks, max(after, horizon)

        return await self._tx(go)

    async def _read(self, run_id: str, events: bool) -> RunState:
        args = {"run_id": run_id}

        async def go(cur: Cursor) -> RunState:
            await cur.execute(Q["get_run"], args)
            row = await cur.fetchone()
            if row is None:
                raise unknown_run(run_id)
            await cur.execute(Q["get_tasks"], args)
            tasks = [task_from_row(r, keep_json) for r in await cur.fetchall()]
            ledger = []
            if events:
                await cur.execute(Q["get_events"], args)
                ledger = [event_from_row(r, keep_json) for r in await cur.fetchall()]
            await cur.execute(Q["get_effects"], args)
            effects = [effect_from_row(r, keep_json) for r in await cur.fetchall()]
            return RunState(
                run_from_row(row, keep_json), tasks, ledger, {e.task_id: e for e in effects}
            )

        return await self._tx(go, snapshot=True)

    async def list_runs(self) -> list[RunSummary]:
        """Every run, oldest first, with its task counts."""

        async def go(cur: Cursor) -> list[RunSummary]:
            await cur.execute(Q["list_runs"])
            runs = [run_from_row(r, keep_json) for r in await cur.fetchall()]
            await cur.execute(Q["count_tasks"])
            return summarize(runs, await cur.fetchall())

        return await self._tx(go, snapshot=True)

    # --- tasks and events -------------------------------------------------------------------

    @staticmethod
    async def _require_run(cur: Cursor, run_id: str) -> None:
        await cur.execute(Q["get_run"], {"run_id": run_id})
        if await cur.fetchone() is None:
            raise unknown_run(run_id)

    @staticmethod
    async def _touch(cur: Cursor, run_id: str) -> None:
        await cur.execute(Q["touch_run"], {"run_id": run_id})
        if await cur.fetchone() is None:
            raise unknown_run(run_id)

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

    async def _append_started(
        self, cur: Cursor, run_id: str, tasks: Sequence[Task], now: float
    ) -> None:
        seqs = await self._take_seqs(cur, run_id, len(tasks))
        rows = [event_row(run_id, started_event(t, now, seq)) for t, seq in zip(tasks, seqs,
                                                                                 strict=True)]
        await cur.execute(Q["insert_events"], _arrays(run_id, rows, EVENT_COLUMNS))
        await cur.execute(Q["notify"], {"run_id": run_id})

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
            await self._touch(cur, run_id)
            if task_rows:
                await cur.execute(Q[tasks_query], tasks_in)
            if event_rows:
                await cur.execute(Q["insert_events"], events_in)
            await self._raise_next_seq(cur, run_id, event_rows)

        await self._tx(go, writing=run_id)

    async def write_fenced(
        self, run_id: str, task: Task, event: Event, expect_token: int,
        added: Added = (), widened: Sequence[tuple[Task, Event]] = (),
    ) -> bool:
        """Apply one change only over ``expect_token`` and an unfinished row (with what it
        added and widened, all or nothing)."""
        row = task_row(run_id, task) | {"expect_token": expect_token}

        async def go(cur: Cursor) -> bool:
            await cur.execute(Q["fenced_update"], row)
            if await cur.fetchone() is None:
                return False
            await self._grow(cur, run_id, event, added, widened)
            return True

        return await self._tx(go, writing=run_id)

    async def _grow(self, cur: Cursor, run_id: str, event: Event, added: Added,
                    widened: Sequence[tuple[Task, Event]]) -> None:
        """Inside a write's transaction: widen the joiners, insert the added rows, and
        append ``event`` with theirs, numbered in order (a joiner changed: WidenConflict)."""
        events = [event]
        for wide_row, (_, wide_event) in zip(widened_rows(run_id, widened), widened,
                                             strict=True):
            await cur.execute(Q["fenced_update"], wide_row)
            if await cur.fetchone() is not None:
                events.append(wide_event)
                continue
            await cur.execute(Q["get_tasks_by_ids"], {"run_id": run_id,
                                                      "ids": [wide_row["id"]]})
            held = await cur.fetchall()
            if held and held[0]["status"] not in ("completed", "dead", "cancelled"):
                raise WidenConflict(f"task {wide_row['id']!r} changed since it was read")
        if added:
            await cur.execute(Q["insert_tasks"], _arrays(
                run_id, [task_row(run_id, t) for t, _ in added], TASK_COLUMNS))
            events.extend(added_events(added))
        seqs = await self._take_seqs(cur, run_id, len(events))
        rows = [event_row(run_id, e, seq) for e, seq in zip(events, seqs, strict=True)]
        await cur.execute(Q["insert_events"], _arrays(run_id, rows, EVENT_COLUMNS))
        await cur.execute(Q["notify"], {"run_id": run_id})

    async def write_added(
        self, run_id: str, event: Event, added: Added,
        widened: Sequence[tuple[Task, Event]] = (),
    ) -> None:
        """Append ``event`` with what it added and widened, in one transaction."""

        async def go(cur: Cursor) -> None:
            await self._touch(cur, run_id)
            await self._grow(cur, run_id, event, added, widened)

        await self._tx(go, writing=run_id)

    async def append_event(self, run_id: str, event: Event) -> None:
        """Append one event that changes no row, numbered by the store."""

        async def go(cur: Cursor) -> None:
            await self._touch(cur, run_id)
            [seq] = await self._take_seqs(cur, run_id, 1)
            rows = [event_row(run_id, event, seq)]
            await cur.execute(Q["insert_events"], _arrays(run_id, rows, EVENT_COLUMNS))
            await cur.execute(Q["notify"], {"run_id": run_id})

        await self._tx(go, writing=run_id)

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
                await cur.execute(Q["notify"], {"run_id": run_id})
            return True

        return await self._tx(go, writing=run_id)

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

        async def go(cur: Cursor) -> None:
            await self._touch(cur, run_id)
            await cur.execute(Q["register_worker"], args)

        await self._tx(go)

    async def heartbeat_worker(self, run_id: str, name: str, at: float) -> None:
        """Record that a registered worker is alive; an unknown worker is a StoreError."""

        async def go(cur: Cursor) -> None:
            await cur.execute(Q["heartbeat_worker"], {"run_id": run_id, "name": name, "at": at})
            if cur.rowcount == 0:
                raise StoreError(f"unknown worker {name!r} in run {run_id!r}")

        await self._tx(go)

    async def list_workers(self, run_id: str) -> list[dict[str, Any]]:
        """Registered workers with their in-flight task counts (``active``)."""

        async def go(cur: Cursor) -> list[dict[str, Any]]:
            await cur.execute(Q["list_workers"], {"run_id": run_id})
            return [worker_from_row(r, keep_json) for r in await cur.fetchall()]

        return await self._tx(go)

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
        args = {"run_id": run_id, "worker": worker, "kinds": list(kinds), "limit": limit}
        return await self._start("claim", args, now, lease_s)

    async def take_assigned(
        self, run_id: str, worker: str, now: float | None, lease_s: float, limit: int = 1
    ) -> list[Task]:
        """Move tasks assigned to ``worker`` to running (push mode)."""
        if limit < 1:
            return []
        args = {"run_id": run_id, "worker": worker, "limit": limit}
        return await self._start("take_assigned", args, now, lease_s)

    async def _start(
        self, query: str, args: dict[str, Any], now: float | None, lease_s: float
    ) -> list[Task]:
        """Move the tasks ``query`` picks to running, with a ``started`` event each.

        Without ``now`` the stamp is read inside the transaction, just before the statement
        whose snapshot sees the dependencies completed: their writers stamped them earlier.
        """

        async def go(cur: Cursor) -> list[Task]:
            stamp = time.time() if now is None else now
            statuses = start_statuses(claimed=query == "claim")
            await cur.execute(Q[query], {**args, **statuses, "now": stamp,
                                         "lease": stamp + lease_s})
            tasks = _by_pos(await cur.fetchall())
            if tasks:
                await self._append_started(cur, run_id=args["run_id"], tasks=tasks, now=stamp)
            return tasks

        return await self._tx(go, writing=args["run_id"])

    async def renew(self, run_id: str, task_id: str, token: int, lease: float) -> bool:
        """Extend a lease; False when the token is stale or the task is not in flight."""
        args = {"run_id": run_id, "task_id": task_id, "token": token, "lease": lease}

        async def go(cur: Cursor) -> bool:
            await cur.execute(Q["renew"], args)
            return cur.rowcount == 1

        return await self._tx(go)

    async def expired(self, run_id: str, now: float) -> list[Task]:
        """Assigned or running tasks whose lease is before ``now``."""

        async def go(cur: Cursor) -> list[Task]:
            await cur.execute(Q["expired"], {"run_id": run_id, "now": now})
            return [task_from_row(r, keep_json) for r in await cur.fetchall()]

        return await self._tx(go)

    # --- notifications ----------------------------------------------------------------------

    # --- limits shared by every process -----------------------------------------------------
    # Time is the server's clock (clock_timestamp()), which every machine shares.

    async def limiter_configure(
        self, key: str, rpm: float | None, tpm: float | None, request_burst: float,
        token_burst: float,
    ) -> None:
        """Create the limiter row of ``key``, or set its rates (what it spent is kept)."""
        row = {"key": key, "rpm": rpm, "tpm": tpm, "request_burst": float(request_burst),
               "token_burst": float(token_burst)}

        async def go(cur: Cursor) -> None:
            await cur.execute(Q["limiter_configure"], row)

        await self._tx(go)

    async def limiter_take(self, key: str, tokens: float) -> float:
        """Take one request and ``tokens`` if allowed now (0), else the seconds to wait."""
        row = await self._statement(Q["limiter_take"], {"key": key, "cost": float(tokens)})
        if row is None:
            raise StoreError(f"no limiter {key!r} (call limiter_configure first)")
        return 0.0 if row["taken"] else max(1e-6, float(row["wait"]))

    async def limiter_give(self, key: str, tokens: float) -> None:
        """Give ``tokens`` back to the token bucket (negative: take more)."""
        await self._statement(Q["limiter_give"], {"key": key, "amount": float(tokens)})

    async def limiter_defer(self, key: str, requests: float | None,
                            tokens: float | None) -> None:
        """Each bucket full again no sooner than the given seconds from now."""
        await self._statement(Q["limiter_defer"],
                              {"key": key, "requests": requests, "tokens": tokens})

    async def limiter_pause(self, key: str, seconds: float) -> None:
        """Nobody takes anything from ``key`` for ``seconds``."""

        async def go(cur: Cursor) -> None:
            await cur.execute(Q["limiter_pause"], {"key": key, "seconds": float(seconds)})

        await self._tx(go)

    async def limiter_state(self, key: str) -> LimiterState | None:
        """The limiter row of ``key``."""

        async def go(cur: Cursor) -> LimiterState | None:
            await cur.execute(Q["limiter_state"], {"key": key})
            row = await cur.fetchone()
            return None if row is None else limiter_from_row(row)

        return await self._tx(go)

    async def spend_open(self, run_id: str, max_tokens: int | None,
                         max_cost: float | None) -> None:
        """Create the spend row of a run (a limit given replaces the stored one)."""
        args = {"run_id": run_id, "max_tokens": max_tokens, "max_cost": max_cost}

        async def go(cur: Cursor) -> None:
            await cur.execute(Q["spend_open"], args)

        await self._tx(go)

    async def spend_reserve(self, run_id: str, tokens: int, cost: float) -> SpendState | None:
        """Hold back ``tokens`` and ``cost`` if they fit (None), else the refusing row."""
        args = {"run_id": run_id, "tokens": int(tokens), "cost": float(cost)}

        async def go(cur: Cursor) -> SpendState | None:
            await cur.execute(Q["spend_reserve"], args)
            if await cur.fetchone() is not None:
                return None
            await cur.execute(Q["spend_get"], args)
            row = await cur.fetchone()
            if row is None:
                raise StoreError(f"run {run_id!r} has no spend row (call spend_open first)")
            return spend_from_row(row)

        return await self._tx(go)

    async def spend_settle(
        self, run_id: str, reserved_tokens: int, reserved_cost: float, requests: int,
        prompt_tokens: int, cached_tokens: int, completion_tokens: int, cost_usd: float,
    ) -> None:
        """Give a reservation back and add what the request really used."""
        args = {"run_id": run_id, "reserved_tokens": int(reserved_tokens),
                "reserved_cost": float(reserved_cost), "requests": int(requests),
                "prompt_tokens": int(prompt_tokens), "cached_tokens": int(cached_tokens),
                "completion_tokens": int(completion_tokens), "cost_usd": float(cost_usd)}

        async def go(cur: Cursor) -> None:
            await cur.execute(Q["spend_settle"], args)

        await self._tx(go)

    async def spend_release_all(self, run_id: str) -> None:
        """Drop every reservation of a run."""

        async def go(cur: Cursor) -> None:
            await cur.execute(Q["spend_release_all"], {"run_id": run_id})

        await self._tx(go)

    async def spend(self, run_id: str) -> SpendState | None:
        """The spend row of a run."""

        async def go(cur: Cursor) -> SpendState | None:
            await cur.execute(Q["spend_get"], {"run_id": run_id})
            row = await cur.fetchone()
            return None if row is None else spend_from_row(row)

        return await self._tx(go)

    async def wait_for_change(self, run_id: str, timeout: float) -> None:
        """Wait for a ``NOTIFY`` about the run, or ``timeout`` seconds.

        Without a listening connection (it could not connect) this is a plain sleep: the
        caller polls, as it would with SQLite.
        """
        if await self._listening():
            await self._waiters.wait(run_id, timeout)
        else:
            await asyncio.sleep(timeout)

    async def _listening(self) -> bool:
        async with self._listen_lock:
            if self._listener is not None and not self._listener.done():
                return True
            if self._pool is None:
                return False
            try:
                conn = await self._connect(autocommit=True)
                await conn.execute(f"LISTEN {CHANNEL}")
            except self._drivers.psycopg.Error as exc:
                log.warning("%s: cannot LISTEN, polling instead: %s", self.url, one_line(exc))
                return False
            self._listener = asyncio.create_task(self._listen(conn), name="planrun-listen")
            return True

    async def _listen(self, conn: AsyncConnection[Any]) -> None:
        try:
            async with conn:
                async for note in conn.notifies():
                    self._waiters.notify(note.payload)
        except self._drivers.psycopg.Error as exc:
            log.warning("%s: listening connection lost: %s", self.url, one_line(exc))


def _run_exists(run_id: str) -> StoreError:
    return StoreError(f"run {run_id!r} already exists; choose another run id, or resume it")
