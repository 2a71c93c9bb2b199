"""The limits every process of a run shares: what the model layer asks of a store.

:class:`~planrun.model.SharedRateLimiter` and :class:`~planrun.model.SharedBudget` decide
when a request may go and what it may spend; the rows they decide over (one rate limiter
per limit key, one spend row per run) live in the run's database, so every process draws
on the same ones. :class:`SharedLimits` is what they need of that database: a few short,
atomic calls. The SQL stores implement it; the model layer imports no store.

It sits in the core, beside the task record, because both layers read it: a module of the
model package would import the model layer (and, through it, the runtime and the stores)
into every store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["LimiterState", "SharedLimits", "SpendState"]


@dataclass(frozen=True)
class LimiterState:
    """A shared rate limiter's row, as :meth:`SharedLimits.limiter_state` returns it."""

    key: str
    rpm: float | None
    tpm: float | None
    request_burst: float
    token_burst: float
    acquired: int
    """Requests let through since the row was made."""
    penalties: int
    """429 answers reported (each paused every caller)."""
    paused_for: float
    """Seconds the pause after a 429 still lasts (0: not paused)."""
    recent_rpm: float
    """Requests let through in the last minute (a sliding-window estimate)."""
    tokens_available: float | None
    """Tokens the token bucket holds now (negative while a large request is paid back)."""
    learned: bool = False
    """True when the rates are the ones the provider's ``x-ratelimit-*`` headers reported."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class SpendState:
    """What a run has spent and may still spend, as :meth:`SharedLimits.spend` returns it."""

    run_id: str
    max_tokens: int | None
    max_cost: float | None
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_usd: float
    reserved_tokens: int
    reserved_cost: float

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens spent."""
        return self.prompt_tokens + self.completion_tokens

    @property
    def tokens_left(self) -> int | None:
        """Tokens the budget still allows (None: no token limit)."""
        if self.max_tokens is None:
            return None
        return max(0, self.max_tokens - self.total_tokens)

    @property
    def cost_left(self) -> float | None:
        """USD the budget still allows (None: no money limit)."""
        if self.max_cost is None:
            return None
        return max(0.0, self.max_cost - self.cost_usd)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**self.__dict__, "total_tokens": self.total_tokens,
                "tokens_left": self.tokens_left, "cost_left": self.cost_left}


@runtime_checkable
class SharedLimits(Protocol):
    """The rate limiters' and the budgets' rows, each call one short atomic write or read.

    Every failure is a :class:`~planrun.StoreError`.
    """

    async def limiter_configure(
        self, key: str, rpm: float | None, tpm: float | None, request_burst: float,
        token_burst: float, *, learned: bool = False,
    ) -> None:
        """Create the limiter row of ``key``, or set its rates (what it spent is kept).

        ``learned=True``: the rates are the provider's (from its headers) and replace any.
        Otherwise they are configured ones, which replace configured rates but never rates
        the provider reported.
        """
        ...

    async def limiter_take(self, key: str, tokens: float) -> float:
        """Take one request and ``tokens`` now if the buckets allow it and no pause holds:
        return 0. Otherwise take nothing and return the seconds to wait before trying again.
        """
        ...

    async def limiter_give(self, key: str, tokens: float) -> None:
        """Give ``tokens`` back to the token bucket (negative: take more)."""
        ...

    async def limiter_defer(self, key: str, requests: float | None,
                            tokens: float | None) -> None:
        """Make each bucket full again no sooner than ``requests`` / ``tokens`` seconds from
        now (None: leave it): the provider said less remains than the bucket holds."""
        ...

    async def limiter_pause(self, key: str, seconds: float) -> None:
        """Nobody takes anything from ``key`` for ``seconds`` (the server answered 429)."""
        ...

    async def limiter_state(self, key: str) -> LimiterState | None:
        """The limiter row of ``key`` (None when there is none)."""
        ...

    async def spend_open(self, run_id: str, max_tokens: int | None,
                         max_cost: float | None) -> None:
        """Create the spend row of a run (a limit given replaces the stored one)."""
        ...

    async def spend_reserve(self, run_id: str, tokens: int, cost: float) -> SpendState | None:
        """Hold back ``tokens`` and ``cost`` if spent + reserved + them fits the budget:
        return None. Otherwise reserve nothing and return the spend row that refused."""
        ...

    async def spend_settle(
        self, run_id: str, reserved_tokens: int, reserved_cost: float, requests: int,
        prompt_tokens: int, cached_tokens: int, completion_tokens: int, cost_usd: float,
    ) -> None:
        """Give a reservation back and add what the request really used."""
        ...

    async def spend_release_all(self, run_id: str) -> None:
        """Drop every reservation of a run (none of its calls is in flight)."""
        ...

    async def spend(self, run_id: str) -> SpendState | None:
        """The spend row of a run (None when it has none)."""
        ...
