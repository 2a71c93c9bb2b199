"""The SQLite store's rows shared between processes: workers, leases, rate limits, budgets."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from planrun.core import StoreError, Task
from planrun.stores._sqlite_rows import (
    Q,
    _append_started,
    _require_run,
    _tasks_by_ids,
    _transaction,
)
from planrun.stores._sqlite_writes import _SQLiteWrites
from planrun.stores.base import (
    LimiterState,
    SpendState,
    dump_json,
    limiter_from_row,
    spend_from_row,
    start_statuses,
    task_from_row,
    worker_from_row,
)


class _SQLiteShared(_SQLiteWrites):
    """The SQLite store's rows shared between processes: workers, leases, rate limits, budgets."""

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
