"""The Postgres store's rows shared between processes: workers, leases, rate limits, budgets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from planrun.core import StoreError, Task
from planrun.stores._postgres_rows import (
    CHANNEL,
    Q,
    _by_pos,
    log,
)

if TYPE_CHECKING:
    from psycopg import AsyncConnection, AsyncCursor
    from psycopg.rows import DictRow

    Cursor = AsyncCursor[DictRow]
from planrun.stores._postgres_writes import _PostgresWrites
from planrun.stores.base import (
    LimiterState,
    SpendState,
    dump_json,
    keep_json,
    limiter_from_row,
    one_line,
    spend_from_row,
    start_statuses,
    task_from_row,
    worker_from_row,
)


class _PostgresShared(_PostgresWrites):
    """The Postgres store's rows shared between processes: workers, leases, rate limits, budgets."""

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
