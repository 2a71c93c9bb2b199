"""The Memory store's rows shared between processes: workers, rate limits, budgets."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from planrun.core import StoreError
from planrun.stores._memory_rows import (
    Row,
    _ready_at,
)
from planrun.stores._memory_writes import _MemoryWrites
from planrun.stores.base import (
    LimiterState,
    SpendState,
    dump_json,
    limiter_from_row,
    spend_from_row,
    worker_from_row,
)


class _MemoryShared(_MemoryWrites):
    """The Memory store's rows shared between processes: workers, rate limits, budgets."""

    # --- workers ----------------------------------------------------------------------------

    async def register_worker(
        self, run_id: str, name: str, kinds: Sequence[str], capacity: int, at: float
    ) -> None:
        """Register (or re-register) a worker for a run."""
        self._record(
            "register_worker", run_id=run_id, name=name, kinds=list(kinds),
            capacity=capacity, at=at,
        )
        run = self._run(run_id)
        run.workers[name] = {
            "name": name,
            "kinds": dump_json(list(kinds), f"kinds of worker {name!r}"),
            "capacity": capacity,
            "last_heartbeat": at,
        }

    async def heartbeat_worker(self, run_id: str, name: str, at: float) -> None:
        """Record that a registered worker is alive; an unknown worker is a StoreError."""
        self._record("heartbeat_worker", run_id=run_id, name=name, at=at)
        run = self._runs.get(run_id)
        row = run.workers.get(name) if run is not None else None
        if row is None:
            raise StoreError(f"unknown worker {name!r} in run {run_id!r}")
        row["last_heartbeat"] = max(row["last_heartbeat"], at)

    async def list_workers(self, run_id: str) -> list[dict[str, Any]]:
        """Registered workers, by name."""
        self._record("list_workers", run_id=run_id)
        run = self._runs.get(run_id)
        if run is None:
            return []
        return [worker_from_row(run.workers[name]) for name in sorted(run.workers)]

    # --- limits shared by every process (the same rules as the SQL stores) ----------------

    async def limiter_configure(
        self, key: str, rpm: float | None, tpm: float | None, request_burst: float,
        token_burst: float, *, learned: bool = False,
    ) -> None:
        """Create the limiter row of ``key``, or set its rates; configured rates never
        replace the provider's (``learned``)."""
        self._record("limiter_configure", key=key, rpm=rpm, tpm=tpm)
        row = self._limits.setdefault(key, {
            "key": key, "requests_full_at": 0.0, "tokens_full_at": 0.0, "paused_until": 0.0,
            "acquired": 0, "penalties": 0, "minute": 0, "minute_count": 0, "prev_count": 0,
            "learned": False,
        })
        if learned or not row["learned"]:
            row.update(rpm=rpm, tpm=tpm, request_burst=request_burst, token_burst=token_burst,
                       learned=learned)

    def _limit(self, key: str) -> Row:
        row = self._limits.get(key)
        if row is None:
            raise StoreError(f"no limiter {key!r} (call limiter_configure first)")
        return row

    async def limiter_take(self, key: str, tokens: float) -> float:
        """Take one request and ``tokens`` if allowed now (0), else the seconds to wait."""
        self._record("limiter_take", key=key, tokens=tokens)
        row, now = self._limit(key), time.time()
        ready = _ready_at(row, tokens)
        if ready > now + 1e-6:
            return ready - now
        if row["rpm"] is not None:
            row["requests_full_at"] = max(row["requests_full_at"], now) + 60.0 / row["rpm"]
        if row["tpm"] is not None:
            row["tokens_full_at"] = max(row["tokens_full_at"], now) + tokens * 60.0 / row["tpm"]
        row["acquired"] += 1
        minute = int(now // 60)
        if minute == row["minute"]:
            row["minute_count"] += 1
        else:
            row["prev_count"] = row["minute_count"] if minute == row["minute"] + 1 else 0
            row["minute_count"], row["minute"] = 1, minute
        return 0.0

    async def limiter_give(self, key: str, tokens: float) -> None:
        """Give ``tokens`` back to the token bucket (negative: take more)."""
        self._record("limiter_give", key=key, tokens=tokens)
        row, now = self._limit(key), time.time()
        if row["tpm"] is not None:
            row["tokens_full_at"] = max(
                now, max(row["tokens_full_at"], now) - tokens * 60.0 / row["tpm"])

    async def limiter_defer(self, key: str, requests: float | None,
                            tokens: float | None) -> None:
        """Each bucket full again no sooner than the given seconds from now."""
        self._record("limiter_defer", key=key, requests=requests, tokens=tokens)
        row, now = self._limit(key), time.time()
        for column, seconds in (("requests_full_at", requests), ("tokens_full_at", tokens)):
            if seconds is not None:
                row[column] = max(row[column], now + seconds)

    async def limiter_pause(self, key: str, seconds: float) -> None:
        """Nobody takes anything from ``key`` for ``seconds``."""
        self._record("limiter_pause", key=key, seconds=seconds)
        row = self._limit(key)
        row["paused_until"] = max(row["paused_until"], time.time() + seconds)
        row["penalties"] += 1

    async def limiter_state(self, key: str) -> LimiterState | None:
        """The limiter row of ``key``."""
        row = self._limits.get(key)
        return None if row is None else limiter_from_row({**row, "now": time.time()})

    async def spend_open(self, run_id: str, max_tokens: int | None,
                         max_cost: float | None) -> None:
        """Create the spend row of a run (a limit given replaces the stored one)."""
        self._record("spend_open", run_id=run_id, max_tokens=max_tokens, max_cost=max_cost)
        row = self._spend.setdefault(run_id, {
            "run_id": run_id, "max_tokens": None, "max_cost": None, "requests": 0,
            "prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0,
            "reserved_tokens": 0, "reserved_cost": 0.0,
        })
        if max_tokens is not None:
            row["max_tokens"] = max_tokens
        if max_cost is not None:
            row["max_cost"] = max_cost

    def _spend_row(self, run_id: str) -> Row:
        row = self._spend.get(run_id)
        if row is None:
            raise StoreError(f"run {run_id!r} has no spend row (call spend_open first)")
        return row

    async def spend_reserve(self, run_id: str, tokens: int, cost: float) -> SpendState | None:
        """Hold back ``tokens`` and ``cost`` if they fit (None), else the refusing row."""
        self._record("spend_reserve", run_id=run_id, tokens=tokens, cost=cost)
        row = self._spend_row(run_id)
        used = row["prompt_tokens"] + row["completion_tokens"]
        if (row["max_tokens"] is not None
                and used + row["reserved_tokens"] + tokens > row["max_tokens"]) or (
                row["max_cost"] is not None
                and row["cost_usd"] + row["reserved_cost"] + cost > row["max_cost"] + 1e-12):
            return spend_from_row(row)
        row["reserved_tokens"] += tokens
        row["reserved_cost"] += cost
        return None

    async def spend_settle(
        self, run_id: str, reserved_tokens: int, reserved_cost: float, requests: int,
        prompt_tokens: int, cached_tokens: int, completion_tokens: int, cost_usd: float,
    ) -> None:
        """Give a reservation back and add what the request really used."""
        self._record("spend_settle", run_id=run_id, reserved_tokens=reserved_tokens,
                     requests=requests, prompt_tokens=prompt_tokens,
                     completion_tokens=completion_tokens)
        row = self._spend_row(run_id)
        row["reserved_tokens"] = max(0, row["reserved_tokens"] - reserved_tokens)
        row["reserved_cost"] = max(0.0, row["reserved_cost"] - reserved_cost)
        row["requests"] += requests
        row["prompt_tokens"] += prompt_tokens
        row["cached_tokens"] += cached_tokens
        row["completion_tokens"] += completion_tokens
        row["cost_usd"] += cost_usd

    async def spend_release_all(self, run_id: str) -> None:
        """Drop every reservation of a run."""
        self._record("spend_release_all", run_id=run_id)
        row = self._spend.get(run_id)
        if row is not None:
            row["reserved_tokens"], row["reserved_cost"] = 0, 0.0

    async def spend(self, run_id: str) -> SpendState | None:
        """The spend row of a run."""
        row = self._spend.get(run_id)
        return None if row is None else spend_from_row(row)
