"""The Postgres store's rows shared between processes: workers, rate limits, budgets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from planrun.core import StoreError
from planrun.stores._postgres_rows import Q

if TYPE_CHECKING:
    from psycopg import AsyncCursor
    from psycopg.rows import DictRow

    Cursor = AsyncCursor[DictRow]
from planrun.stores._postgres_writes import _PostgresWrites
from planrun.stores.base import (
    LimiterState,
    SpendState,
    dump_json,
    keep_json,
    limiter_from_row,
    spend_from_row,
    worker_from_row,
)


class _PostgresShared(_PostgresWrites):
    """The Postgres store's rows shared between processes: workers, rate limits, budgets."""

    # --- workers ----------------------------------------------------------------------------

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
            await self._require_run(cur, run_id)
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
        """Registered workers, by name."""

        async def go(cur: Cursor) -> list[dict[str, Any]]:
            await cur.execute(Q["list_workers"], {"run_id": run_id})
            return [worker_from_row(r, keep_json) for r in await cur.fetchall()]

        return await self._tx(go)

    # --- limits shared by every process -----------------------------------------------------
    # Time is the server's clock (clock_timestamp()), which every machine shares.

    async def limiter_configure(
        self, key: str, rpm: float | None, tpm: float | None, request_burst: float,
        token_burst: float, *, learned: bool = False,
    ) -> None:
        """Create the limiter row of ``key``, or set its rates (what it spent is kept);
        configured rates never replace the provider's (``learned``)."""
        row = {"key": key, "rpm": rpm, "tpm": tpm, "request_burst": float(request_burst),
               "token_burst": float(token_burst), "learned": learned}

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
