"""Limits that hold across every process of a run: one rate limit and one budget.

A :class:`~planrun.model.RateLimiter` is an object of one event loop: eight worker
processes, each with its own, would send eight times the configured rate. The limits here
live in the database the run already uses (PostgreSQL across machines, SQLite between the
processes of one machine), so every process of the run draws on the same ones:

:class:`SharedRateLimiter`
    requests per minute and tokens per minute for one *limit key* (a model, an API key, a
    name the user chose), with the semantics of :class:`~planrun.model.RateLimiter`:
    ``request_burst`` requests may go back to back (default 1: evenly spaced), a request
    takes what the provider counts for it (its prompt's estimate plus its output bound), a
    request larger than the token bucket waits for a full bucket and borrows,
    :meth:`~SharedRateLimiter.penalize` (a 429 anywhere) pauses every caller of every
    process for the server's ``Retry-After``, and :meth:`~SharedRateLimiter.observe` corrects
    the row with the provider's ``x-ratelimit-*`` headers, whichever process read them.
:class:`SharedBudget`
    the run's budget (tokens and USD) as one row: before a request a reservation is taken
    atomically (refused with :class:`~planrun.BudgetExceeded` when spent + reserved +
    this request would pass a limit, so no new call starts anywhere), and after it the
    reservation is replaced by the usage the server reported. What was spent is stored with
    the run, so a resumed run continues from it. A request that would fit in what is left
    but not beside the reservations of calls in flight waits for them to settle.

Both work through :class:`~planrun.core.SharedLimits`, a few calls each one short
transaction, which the stores implement: the model layer imports no store.

**Why not a library.** pyrate-limiter has SQLite and PostgreSQL buckets, but they are
sliding-window *logs*: one row per unit of weight in a window (a 3,000-token request is
3,000 rows, PostgreSQL's weight column is a ``SMALLINT``), with no way to give units back
(our reconcile) or to pause every caller after a 429, and its PostgreSQL bucket is
synchronous. Redis-based limiters need a server the run does not otherwise have. What we
need is small: each bucket kept as a GCRA "full again at" time in one row per key,
updated by one ``UPDATE ... SET full_at = max(full_at, now) + cost / rate WHERE <ready>``
(the same arithmetic as :class:`~planrun.model.RateLimiter`). It costs one transaction
per call; ``bench/limiter.py`` measures it.

**Time.** PostgreSQL uses the server's clock (machines whose clocks differ still agree);
SQLite, which only processes of one machine share, uses ``time.time()``. Waiting is
``asyncio.sleep`` between attempts, so a shared limiter runs in real time only (not under
:class:`~planrun.runtime.VirtualClock`). Inside a process callers queue first come, first
served; across processes the first to ask when a slot opens gets it.

**Keys.** :func:`limit_key` names the limit the way providers enforce it: per model and per
API key. The key itself is never stored: only the first 16 hex digits of its SHA-256.

**Crashes.** A process that dies mid-request leaves its reservation held, which makes the
budget stricter, never looser; a resumed single-process run drops them
(:meth:`SharedBudget.open` with ``release=True``).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from planrun.core import BudgetExceeded, LimiterState, SharedLimits, SpendState, UsageError
from planrun.model._budget import Budget, Tally
from planrun.model._limiter import ProviderLimits, behind, check_rates, token_capacity

__all__ = [
    "Limiter",
    "RunLimits",
    "SharedBudget",
    "SharedRateLimiter",
    "limit_key",
]


@runtime_checkable
class Limiter(Protocol):
    """What a :class:`~planrun.Model` needs of a rate limiter (in memory or shared).

    ``reconcile`` and ``penalize`` may return an awaitable (a shared limiter writes to
    its database); the Model awaits it before going on.
    """

    async def acquire(self, tokens_estimate: int = 0) -> None:
        """Wait for this caller's turn, then take one request and the estimated tokens."""
        ...

    def reconcile(self, estimated: int, actual: int) -> Awaitable[None] | None:
        """Correct a request's token estimate with the tokens it really used."""
        ...

    def penalize(self, retry_after: float) -> Awaitable[None] | None:
        """The server said 429: nobody sends anything for ``retry_after`` seconds."""
        ...

    def observe(self, limits: ProviderLimits) -> Awaitable[None] | None:
        """Correct the limits with what a response's ``x-ratelimit-*`` headers say."""
        ...


def limit_key(model: str, api_key: str | None = None, name: str | None = None) -> str:
    """The key a limit is kept under: ``name`` when given, else the model and the API key.

    The API key is never part of it: ``gpt-4o-mini@key:3b1f...`` holds 16 hex digits of
    its SHA-256, which tell two keys apart and reveal nothing.
    """
    if name:
        return name
    if not api_key:
        return model
    digest = hashlib.sha256(api_key.encode()).hexdigest()[:16]
    return f"{model}@key:{digest}"


class SharedRateLimiter:
    """Requests-per-minute and tokens-per-minute limits kept in a store, for every process.

    Example::

        store = open_store("postgresql://...")
        await store.open()
        limiter = SharedRateLimiter(store, "gpt-4o-mini", requests_per_minute=600)
        model = Model(limiter=limiter)      # in every worker process: one rate for all

    Arguments as for :class:`~planrun.model.RateLimiter`, plus the opened ``store`` and
    the ``key`` (see :func:`limit_key`). The rates are written to the key's row on first
    use (what the buckets hold is kept), unless the row holds rates the provider reported:
    those stand until the provider reports others, and this limiter goes by them.
    """

    def __init__(
        self,
        store: SharedLimits,
        key: str,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        *,
        request_burst: float = 1.0,
        token_burst: float | None = None,
    ) -> None:
        check_rates("SharedRateLimiter", requests_per_minute, tokens_per_minute, request_burst)
        if not key:
            raise UsageError("SharedRateLimiter: key must not be empty")
        self.store = store
        self.key = key
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self.request_burst = float(request_burst)
        self._token_burst = token_burst
        self.token_burst = token_capacity(tokens_per_minute, token_burst)
        self._configured = False
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.waited = 0.0
        """Seconds callers of this process spent waiting here, summed."""
        self.acquired = 0
        """Requests this process was let through."""
        self.store_calls = 0
        """Store round trips made (a measure of the limiter's own cost)."""

    def __repr__(self) -> str:
        return (
            f"SharedRateLimiter(key={self.key!r}, requests_per_minute="
            f"{self.requests_per_minute}, tokens_per_minute={self.tokens_per_minute})"
        )

    def _queue(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._loop is not loop:
            self._lock, self._loop = asyncio.Lock(), loop
        return self._lock

    async def _configure(self) -> None:
        """On first use: write the configured rates, unless the row holds the provider's
        (another process read its headers first); then go by the row's rates."""
        if not self._configured:
            await self.store.limiter_configure(
                self.key, self.requests_per_minute, self.tokens_per_minute,
                self.request_burst, self.token_burst)
            state = await self.store.limiter_state(self.key)
            if state is not None and state.learned:
                self._adopt(state.rpm, state.tpm)
            self._configured = True

    def _adopt(self, rpm: float | None, tpm: float | None) -> None:
        self.requests_per_minute, self.tokens_per_minute = rpm, tpm
        self.token_burst = token_capacity(tpm, self._token_burst)

    async def acquire(self, tokens_estimate: int = 0) -> None:
        """Wait for this caller's turn, then take one request and ``tokens_estimate`` tokens.

        Callers of one process queue in order; the one at the head asks the store, which
        either takes the request and tokens at once or says how long to wait.
        """
        start = time.monotonic()
        async with self._queue():
            await self._configure()
            while True:
                self.store_calls += 1
                wait = await self.store.limiter_take(self.key, float(tokens_estimate))
                if wait <= 0:
                    break
                await asyncio.sleep(wait)
            self.acquired += 1
        self.waited += time.monotonic() - start

    async def reconcile(self, estimated: int, actual: int) -> None:
        """Correct a request's token estimate with the tokens it really used."""
        if self.tokens_per_minute is not None and estimated != actual:
            await self._configure()
            self.store_calls += 1
            await self.store.limiter_give(self.key, float(estimated - actual))

    async def penalize(self, retry_after: float) -> None:
        """The server said 429: no process sends anything for ``retry_after`` seconds."""
        if retry_after <= 0:
            return
        await self._configure()
        self.store_calls += 1
        await self.store.limiter_pause(self.key, float(retry_after))

    async def observe(self, limits: ProviderLimits) -> None:
        """Correct the key's row with a response's ``x-ratelimit-*`` headers: the provider's
        limits replace the configured ones (one write when they change), and a bucket that
        holds more than the provider says remains is emptied to that (one write when so)."""
        await self._configure()
        rpm = limits.requests_limit or self.requests_per_minute
        tpm = limits.tokens_limit or self.tokens_per_minute
        if (rpm, tpm) != (self.requests_per_minute, self.tokens_per_minute):
            self._adopt(rpm, tpm)
            self.store_calls += 1
            await self.store.limiter_configure(self.key, rpm, tpm, self.request_burst,
                                               self.token_burst, learned=True)
        requests = (behind(self.request_burst, rpm / 60, limits.requests_remaining, limits.age)
                    if rpm else None)
        tokens = (behind(self.token_burst, tpm / 60, limits.tokens_remaining, limits.age)
                  if tpm else None)
        if requests is not None or tokens is not None:
            self.store_calls += 1
            await self.store.limiter_defer(self.key, requests, tokens)

    async def state(self) -> LimiterState | None:
        """The key's row: rates, requests let through, the rate of the last minute."""
        return await self.store.limiter_state(self.key)


class SharedBudget:
    """The budget of one run, kept in its store and drawn on by every process of the run.

    :class:`~planrun.model.Usage` calls :meth:`reserve` before each request and
    :meth:`settle` after it (``Usage(budget=..., shared=SharedBudget(store, run_id))``).

    ``enforce=False`` (a run without a budget) skips the reservation and only adds what
    was used: one store call per request instead of two.
    """

    def __init__(self, store: SharedLimits, run_id: str, *, enforce: bool = True,
                 poll: float = 0.05, patience: float = 120.0) -> None:
        self.store = store
        self.run_id = run_id
        self.enforce = enforce
        self.poll = poll
        self.patience = patience

    def __repr__(self) -> str:
        return f"SharedBudget(run_id={self.run_id!r}, enforce={self.enforce})"

    async def open(self, budget: Budget | None = None, *, release: bool = False) -> None:
        """Make the run's spend row (the limits of ``budget`` replace the stored ones).

        ``release=True`` drops reservations left by calls that never ended (a resumed
        run whose calls are all made by this process).
        """
        await self.store.spend_open(
            self.run_id,
            budget.max_tokens if budget is not None else None,
            budget.max_cost if budget is not None else None,
        )
        if release:
            await self.store.spend_release_all(self.run_id)

    async def reserve(self, tokens: int, cost: float) -> None:
        """Hold back ``tokens`` and ``cost`` for one request, or raise BudgetExceeded.

        When what was spent leaves room for the request but calls in flight hold it back,
        this waits (polling every ``poll`` s, at most ``patience`` s) for them to settle:
        a reservation is usually far above what a call uses. BudgetExceeded means the
        request cannot fit in what is left even if every reservation came back unused.
        """
        if not self.enforce:
            return
        deadline = time.monotonic() + self.patience
        while True:
            refused = await self.store.spend_reserve(self.run_id, tokens, cost)
            if refused is None:
                return
            exhausted = _exhausted(refused, tokens, cost, reserved=False)
            if exhausted is None and time.monotonic() >= deadline:
                exhausted = _exhausted(refused, tokens, cost, reserved=True)
            if exhausted is not None:
                raise BudgetExceeded(f"run {self.run_id}: {exhausted}")
            await asyncio.sleep(self.poll)

    async def settle(self, tokens: int, cost: float, used: Tally) -> None:
        """Give back a reservation of ``tokens`` and ``cost``; add what was ``used``."""
        if not self.enforce:
            tokens, cost = 0, 0.0  # nothing was held back
        await self.store.spend_settle(
            self.run_id, tokens, cost, used.requests, used.prompt_tokens, used.cached_tokens,
            used.completion_tokens, used.cost_usd,
        )

    async def spent(self) -> SpendState | None:
        """The run's spend row."""
        return await self.store.spend(self.run_id)


def _exhausted(spend: SpendState, tokens: int, cost: float, *, reserved: bool) -> str | None:
    """Why the request cannot fit (counting reservations or not), or None when it can."""
    held_tokens = spend.reserved_tokens if reserved else 0
    held_cost = spend.reserved_cost if reserved else 0.0
    if spend.max_tokens is not None and (
        spend.total_tokens + held_tokens + tokens > spend.max_tokens
    ):
        return (f"token budget exceeded: the next call may use up to {tokens} tokens; "
                f"{spend.total_tokens} used and {spend.reserved_tokens} reserved "
                f"of {spend.max_tokens}")
    if spend.max_cost is not None and (
        spend.cost_usd + held_cost + cost > spend.max_cost + 1e-12
    ):
        return (f"cost budget exceeded: the next call may cost up to ${cost:.6f}; "
                f"${spend.cost_usd:.6f} spent and ${spend.reserved_cost:.6f} reserved "
                f"of ${spend.max_cost:.6f}")
    return None


@dataclass(frozen=True)
class RunLimits:
    """The limits a run starts with, recorded in its meta (``limits``) for every process.

    Workers that join later and ``resume`` read them back with :meth:`from_meta`.
    """

    rpm: float | None = None
    tpm: float | None = None
    key: str | None = None
    """The rate limit's key (:func:`limit_key`); None: each process derives its own."""
    budget_tokens: int | None = None
    budget_usd: float | None = None
    request_burst: float | None = None
    """Requests that may go back to back (None: the limiter's default)."""

    def __post_init__(self) -> None:
        for name in ("rpm", "tpm", "budget_tokens", "budget_usd"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise UsageError(f"{name} must be > 0, got {value}")
        if self.request_burst is not None and not self.request_burst >= 1:
            raise UsageError(f"request_burst must be >= 1, got {self.request_burst}")

    @property
    def rated(self) -> bool:
        """True when a request or token rate is set."""
        return self.rpm is not None or self.tpm is not None

    @property
    def budgeted(self) -> bool:
        """True when a token or money budget is set."""
        return self.budget_tokens is not None or self.budget_usd is not None

    def budget(self) -> Budget | None:
        """The :class:`~planrun.Budget`, or None without one."""

        if not self.budgeted:
            return None
        return Budget(max_tokens=self.budget_tokens, max_cost=self.budget_usd)

    def to_meta(self) -> dict[str, Any]:
        """JSON-ready form for the run's meta (None values left out)."""
        return {k: v for k, v in self.__dict__.items() if v is not None}

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> RunLimits:
        """The limits recorded in a run's meta (none when it recorded none)."""
        raw = meta.get("limits") or {}
        return cls(
            rpm=_number(raw.get("rpm")), tpm=_number(raw.get("tpm")),
            key=raw.get("key") or None,
            budget_tokens=None if raw.get("budget_tokens") is None
            else int(raw["budget_tokens"]),
            budget_usd=_number(raw.get("budget_usd")),
            request_burst=_number(raw.get("request_burst")),
        )


def _number(value: Any) -> float | None:
    return None if value is None else float(value)
