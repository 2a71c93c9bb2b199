"""The SQLite store's rows shared between processes: workers, rate limits, budgets."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from planrun.core import StoreError
from planrun.stores._sqlite_rows import (
    Q,
    _require_run,
    _transaction,
)
from planrun.stores._sqlite_writes import _SQLiteWrites
from planrun.stores.base import (
    LimiterState,
    SpendState,
    dump_json,
    limiter_from_row,
    spend_from_row,
    worker_from_row,
)


class _SQLiteShared(_SQLiteWrites):
    """The SQLite store's rows shared between processes: workers, rate limits, budgets."""

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

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                _require_run(conn, run_id)
                conn.execute(Q["register_worker"], args)

        await self._with_conn(go)

    async def heartbeat_worker(self, run_id: str, name: str, at: float) -> None:
        """Record that a registered worker is alive; an unknown worker is a StoreError."""
        args = {"run_id": run_id, "name": name, "at": at}

        def go(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                if conn.execute(Q["heartbeat_worker"], args).rowcount == 0:
                    raise StoreError(f"unknown worker {name!r} in run {run_id!r}")

        await self._with_conn(go)

    async def list_workers(self, run_id: str) -> list[dict[str, Any]]:
        """Registered workers, by name."""

        def go(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = conn.execute(Q["list_workers"], {"run_id": run_id})
            return [worker_from_row(r) for r in rows]

        return await self._with_conn(go)

    # --- limits shared by every process -----------------------------------------------------
    # Processes of one machine share one clock, so time is this process's time.time().

    async def limiter_configure(
        self, key: str, rpm: float | None, tpm: float | None, request_burst: float,
        token_burst: float, *, learned: bool = False,
    ) -> None:
        """Create the limiter row of ``key``, or set its rates (what it spent is kept);
        configured rates never replace the provider's (``learned``)."""
        row = {"key": key, "rpm": rpm, "tpm": tpm, "request_burst": request_burst,
               "token_burst": token_burst, "learned": learned}

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
