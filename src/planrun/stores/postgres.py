"""The PostgreSQL store: the same rows in a server several machines share.

Connections come from a psycopg 3 ``AsyncConnectionPool``; every call is one transaction
(a read of a whole run sees one snapshot), or one statement on its own (autocommit) when
it is one statement, as a limiter's take is.

A dropped connection is the pool's to replace; a call that fails with a connection error
(or a deadlock or serialization failure, a lock wait past ``lock_timeout``, a session cut off
by ``idle_in_transaction_session_timeout``) is run again, whole, a few times with backoff
(tenacity) before it becomes a :class:`~planrun.StoreError`. A retried write whose
first commit reached the server before the connection dropped stores its events once
(one event per ``(run, seq)``).

No writer waits for another to number its events
-------------------------------------------------
A store-made event (an ``effect`` from :meth:`~planrun.stores._sql.SQLStore.append_event`
or :meth:`~planrun.stores._sql.SQLStore.effect_done`) takes
``seq_base + nextval('planrun_event_seq')``: a sequence hands out distinct, increasing
numbers without a lock held to commit, so a writer stopped inside its transaction (SIGSTOP,
a long GC pause, a stalled VM) holds only the rows it is changing. ``seq_base`` is kept
past every seq a caller numbered itself (the supervisor numbers its own ledger; a run has
one driver at a time, see the owner lease), so the two never meet. Store-made seqs are
unique and increasing per run, not dense, and a later one may commit first. A batch its
caller numbered moves ``seq_base`` past its events, so it holds the run's row until it
commits: the run's next batch, or a process taking the run over, waits for it (at most
until the server cuts a stopped session off, below).

Every connection sets ``idle_in_transaction_session_timeout`` (default 10 s) and
``lock_timeout`` (default 5 s): the server cuts off a session that sits idle inside a
transaction, rolling it back and releasing its locks, so a stopped process cannot hold
anything for long, and a call waiting for a lock gives up (and is retried) rather than
wait behind it. Both are constructor arguments; ``None`` keeps the server's setting.

psycopg is imported only when a store is made, so planrun imports without the
``postgres`` extra; without it, :class:`PostgresStore` raises
:class:`~planrun.core.ConfigError`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar
from urllib.parse import urlsplit

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from planrun.core import ConfigError, StoreError, UsageError
from planrun.stores._connector import (
    NOTHING,
    Mode,
    Query,
    Result,
    Rows,
    Tx,
    load_queries,
    pyformat,
)
from planrun.stores._sql import SQLStore
from planrun.stores.base import Decoder, keep_json, mask_url, one_line

if TYPE_CHECKING:
    from psycopg import AsyncConnection, AsyncCursor
    from psycopg.rows import DictRow
    from psycopg_pool import AsyncConnectionPool
    from typing_extensions import Unpack

    Cursor = AsyncCursor[DictRow]

__all__ = ["PostgresConnector", "PostgresOptions", "PostgresStore"]

log = logging.getLogger("planrun.stores")

T = TypeVar("T")

Q = {name: pyformat(sql) for name, sql in load_queries("postgres").items()}

LOCK_TIMEOUT = 5.0
"""Default ``lock_timeout`` of every connection, in seconds."""
IDLE_IN_TRANSACTION_TIMEOUT = 10.0
"""Default ``idle_in_transaction_session_timeout`` of every connection, in seconds."""



class PostgresOptions(TypedDict, total=False):
    """The settings of a :class:`PostgresStore` (see its arguments)."""

    min_size: int
    max_size: int
    connect_timeout: float
    pool_timeout: float
    attempts: int
    application_name: str
    lock_timeout: float | None
    idle_in_transaction_timeout: float | None


DEFAULTS: PostgresOptions = {
    "min_size": 1, "max_size": 8, "connect_timeout": 5.0, "pool_timeout": 10.0,
    "attempts": 4, "application_name": "planrun", "lock_timeout": LOCK_TIMEOUT,
    "idle_in_transaction_timeout": IDLE_IN_TRANSACTION_TIMEOUT,
}
"""What a setting not given is."""

_FLOATS = frozenset(
    {"estimate_s", "lease", "not_before", "created_at", "started_at", "finished_at", "at"}
)
_INTS = frozenset({"attempts", "max_attempts", "token", "reclaims", "seq", "attempt"})


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


def _cell(column: str, value: Any) -> Any:
    if value is None:
        return None
    if column in _FLOATS:
        return float(value)
    if column in _INTS:
        return int(value)
    return value


def _arrays(columns: Sequence[str], values: list[Any]) -> dict[str, Any]:
    """Flat rows as one list per column: a whole batch goes in one ``unnest`` statement.

    ``run_id`` (the first column) is one value; numbers are made uniform per column
    (psycopg dumps a list of one type only).
    """
    width = len(columns)
    try:
        arrays = {c: [_cell(c, v) for v in values[i::width]]
                  for i, c in enumerate(columns) if i}
    except (TypeError, ValueError) as exc:
        raise StoreError(f"a row cannot be stored: {exc}") from exc
    return {"run_id": values[0] if values else None, **arrays}


class PostgresConnector:
    """PostgreSQL for :class:`~planrun.stores._sql.SQLStore`: a pool, retried transactions.

    Arguments as for :class:`PostgresStore`; a setting not given is its :data:`DEFAULTS`.
    """

    null_text = None
    null_real = None

    def __init__(self, url: str, **options: Unpack[PostgresOptions]) -> None:
        settings: PostgresOptions = {**DEFAULTS, **options}
        for name in ("lock_timeout", "idle_in_transaction_timeout"):
            value = settings[name]
            if value is not None and not value > 0:
                raise UsageError(f"{name} must be a positive number of seconds or None, "
                                 f"not {value!r}")
        self._drivers = _drivers()
        self._conninfo = url
        self._secret = _password(url)
        self.url = mask_url(url)
        self.decode: Decoder = keep_json
        self.min_size: int = settings["min_size"]
        self.max_size: int = settings["max_size"]
        self.connect_timeout: float = settings["connect_timeout"]
        self.pool_timeout: float = settings["pool_timeout"]
        self.attempts: int = settings["attempts"]
        self.application_name: str = settings["application_name"]
        self.lock_timeout: float | None = settings["lock_timeout"]
        self.idle_in_transaction_timeout: float | None = settings["idle_in_transaction_timeout"]
        self._pool: AsyncConnectionPool[Any] | None = None

    # --- errors and retries -----------------------------------------------------------------

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

    # --- connections ------------------------------------------------------------------------

    def _connect_kwargs(self) -> dict[str, Any]:
        return {
            "connect_timeout": max(1, round(self.connect_timeout)),
            "application_name": self.application_name,
        }

    async def _configure(self, conn: AsyncConnection[Any], locks: bool = True) -> None:
        """Set the session's timeouts (see the module docstring); ``conn`` is in autocommit."""
        settings = [("idle_in_transaction_session_timeout", self.idle_in_transaction_timeout)]
        if locks:
            settings.append(("lock_timeout", self.lock_timeout))
        for name, seconds in settings:
            if seconds is not None:
                value = f"{max(1, round(seconds * 1000))}ms"
                await conn.execute(Q["set_session"], {"name": name, "value": value})

    async def open(self, migrate: Callable[[], Tx[None]]) -> None:
        """Connect, run ``migrate`` on a connection of its own, then open the pool."""
        if self._pool is not None:
            return
        d = self._drivers
        try:
            conn = await d.psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True, **self._connect_kwargs())
        except d.psycopg.Error as exc:
            raise self._error(exc, "cannot connect: ") from exc
        try:
            async with conn:
                await self._configure(conn, locks=False)  # opens wait for one another
                async with self._transaction(conn, "write") as cur:
                    await self._drive(cur, migrate())
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

    async def close(self) -> None:
        """Close the pool; calling it twice is harmless."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    # --- transactions -----------------------------------------------------------------------

    async def run(self, tx: Callable[[], Tx[T]], mode: Mode = "write") -> T:
        """Run ``tx()`` on a pooled connection, again on a connection error; psycopg errors
        become StoreError."""
        pool = self._pool
        if pool is None:
            raise StoreError(f"{self.url}: the store is not open (call open() first)")

        async def once() -> T:
            async with pool.connection() as conn, self._transaction(conn, mode) as cur:
                return await self._drive(cur, tx())

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

    @contextlib.asynccontextmanager
    async def _transaction(self, conn: AsyncConnection[Any], mode: Mode) -> AsyncIterator[Cursor]:
        """A cursor of ``conn`` inside a transaction of ``mode`` (none for ``single``)."""
        async with contextlib.AsyncExitStack() as stack:
            if mode != "single":
                await stack.enter_async_context(conn.transaction())
            cur: Cursor = await stack.enter_async_context(
                conn.cursor(row_factory=self._drivers.dict_row))
            if mode == "read":
                await cur.execute(Q["snapshot"])
            yield cur

    async def _drive(self, cur: Cursor, tx: Tx[T]) -> T:
        """:func:`~planrun.stores._connector.drive`, awaiting each statement."""
        try:
            statement = next(tx)
            while True:
                statement = tx.send(await self._execute(cur, statement))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            tx.close()

    async def _execute(self, cur: Cursor, statement: Query | Rows | Any) -> Result:
        sql = Q[statement.name]
        if not sql:
            return NOTHING
        if isinstance(statement, Rows):
            await cur.execute(sql, _arrays(statement.shape.columns, statement.values))
            return Result([], cur.rowcount)
        await cur.execute(sql, statement.args if isinstance(statement, Query) else None)
        rows = await cur.fetchall() if cur.description else []
        return Result(list(rows), cur.rowcount)


class PostgresStore(SQLStore):
    """The store in PostgreSQL (see the module).

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

    connector: PostgresConnector

    def __init__(self, url: str, **options: Unpack[PostgresOptions]) -> None:
        super().__init__(PostgresConnector(url, **options))
