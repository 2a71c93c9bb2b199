"""The Postgres store's connection, runs and reads."""

from __future__ import annotations

import functools
import logging
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

from planrun.core import ConfigError, RunInUse, StoreError, Task, UsageError
from planrun.stores.base import (
    SCHEMA_VERSION,
    RunInfo,
    RunOwner,
    RunState,
    RunSummary,
    check_lease,
    effect_from_row,
    event_from_row,
    keep_json,
    load_queries,
    mask_url,
    newer_schema,
    one_line,
    owner_from_row,
    run_from_row,
    run_row,
    summarize,
    task_from_row,
    unknown_run,
)

if TYPE_CHECKING:
    from psycopg import AsyncConnection, AsyncCursor
    from psycopg.rows import DictRow
    from psycopg_pool import AsyncConnectionPool

    Cursor = AsyncCursor[DictRow]


log = logging.getLogger("planrun.stores")

T = TypeVar("T")

Q = load_queries("postgres")

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


def _run_exists(run_id: str) -> StoreError:
    return StoreError(f"run {run_id!r} already exists; choose another run id, or resume it")


class _PostgresRows:
    """The Postgres store's connection, runs and reads."""

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

    async def _tx(self, fn: Callable[[Cursor], Awaitable[T]], snapshot: bool = False) -> T:
        """Run ``fn`` in one transaction, again on a connection error; translate errors.

        ``snapshot``: a read-only transaction whose statements see one snapshot.
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
        """Close the pool; calling it twice is harmless."""
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

        await self._tx(go)

    async def set_run_status(self, run_id: str, status: str) -> None:
        """Change a run's status."""

        async def go(cur: Cursor) -> None:
            await cur.execute(Q["set_run_status"], {"run_id": run_id, "status": status})
            if cur.rowcount == 0:
                raise unknown_run(run_id)

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
            await self._require_run(cur, run_id)
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
        """The run, its tasks and effects without the ledger (a cheap poll)."""
        return await self._read(run_id, events=False)

    async def load_some(self, run_id: str, ids: Sequence[str]) -> list[Task]:
        """The tasks of ``ids`` that exist, in task order."""
        args = {"run_id": run_id, "ids": list(ids)}

        async def go(cur: Cursor) -> list[Task]:
            await self._require_run(cur, run_id)
            await cur.execute(Q["get_tasks_by_ids"], args)
            return [task_from_row(r, keep_json) for r in await cur.fetchall()]

        return await self._tx(go, snapshot=True)

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

    @staticmethod
    async def _require_run(cur: Cursor, run_id: str) -> None:
        await cur.execute(Q["get_run"], {"run_id": run_id})
        if await cur.fetchone() is None:
            raise unknown_run(run_id)

