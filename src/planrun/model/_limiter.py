"""One client-side rate limiter for every caller of an API in the process.

Forty workers sharing an API that allows ten requests a second get a quarter of a request
each; if each retried on its own they would spend their time being throttled (429s, retry
storms, wasted budget). A :class:`RateLimiter` makes them queue instead: callers are served
first come, first served, and each request waits for its slot *before* it is sent.

Two token buckets, each optional:

* requests per minute — ``request_burst`` requests may go back to back (default 1: requests
  are evenly spaced, so no one-second window holds more than the rate allows);
* tokens per minute — a request takes what the provider counts for it: its prompt's
  estimated tokens plus its output bound (``max_completion_tokens``), which the provider
  holds whatever the reply uses. A request that failed before the provider counted it
  gives its tokens back (:meth:`RateLimiter.reconcile`).

A request larger than a bucket waits until the bucket is full and then borrows, so it still
goes, and later callers wait until the debt is paid back.

:meth:`RateLimiter.penalize` is called when the server answers 429: the whole limiter pauses
for ``retry_after`` seconds, since the server's limit is shared by every caller.

:meth:`RateLimiter.observe` learns from the provider: every response carries
``x-ratelimit-limit-*`` and ``x-ratelimit-remaining-*`` headers (:class:`ProviderLimits`).
The limit replaces the configured rate (a limit set too high or too low is corrected by
the first response), and a bucket never holds more than the provider says remains (another
client spending on the same key, or an estimate below the provider's count, makes the
next callers wait instead of meeting a 429).

Time is ``asyncio.get_running_loop().time()`` and waiting is ``asyncio.sleep``, so the same
limiter runs instantly under :class:`planrun.runtime.VirtualClock`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass

from planrun.core import UsageError

__all__ = ["ProviderLimits", "RateLimiter", "behind", "token_capacity"]

_TOLERANCE_S = 1e-9
"""A wait shorter than this is no wait: float error must not leave a caller spinning on
sleeps too short to move the clock."""


@dataclass
class _Bucket:
    """A token bucket kept as the time it is full again (GCRA), so waits are exact times."""

    rate: float
    """Units refilled per second."""
    capacity: float
    full_at: float = float("-inf")

    def ready_at(self, cost: float) -> float:
        """When ``cost`` may be taken (a cost above capacity needs a full bucket)."""
        need = min(cost, self.capacity)
        return self.full_at - (self.capacity - need) / self.rate

    def take(self, now: float, cost: float) -> None:
        self.full_at = max(self.full_at, now) + cost / self.rate

    def give(self, now: float, amount: float) -> None:
        """Return ``amount`` units (negative: take more), never beyond a full bucket."""
        self.full_at = max(now, max(self.full_at, now) - amount / self.rate)

    def level(self, now: float) -> float:
        """Units available at ``now`` (negative while a large request is being paid back)."""
        return self.capacity - max(0.0, self.full_at - now) * self.rate


@dataclass(frozen=True)
class ProviderLimits:
    """What one response's ``x-ratelimit-*`` headers say of the key's limits.

    ``*_limit`` are per minute; ``*_remaining`` is what the provider would still accept when
    it counted the request; ``*_reset`` the seconds until its bucket is full again. Any of
    them may be missing. ``age`` is how long ago the provider counted: it counts a request
    on arrival and answers after generating the reply, so the view is as old as the
    request's time in flight, and a bucket is corrected as of then, not as of the answer.
    """

    requests_limit: float | None = None
    requests_remaining: float | None = None
    requests_reset: float | None = None
    tokens_limit: float | None = None
    tokens_remaining: float | None = None
    tokens_reset: float | None = None
    age: float = 0.0

    @classmethod
    def from_headers(cls, headers: Mapping[str, str], *,
                     age: float = 0.0) -> ProviderLimits | None:
        """The headers' view, or None when a response carries no ``x-ratelimit-*`` header."""
        lowered = {k.lower(): v for k, v in headers.items()}
        values: dict[str, float | None] = {}
        for unit in ("requests", "tokens"):
            values[f"{unit}_limit"] = _number(lowered.get(f"x-ratelimit-limit-{unit}"))
            values[f"{unit}_remaining"] = _number(lowered.get(f"x-ratelimit-remaining-{unit}"))
            values[f"{unit}_reset"] = duration_seconds(lowered.get(f"x-ratelimit-reset-{unit}"))
        if all(v is None for v in values.values()):
            return None
        return cls(**values, age=max(0.0, age))


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value >= 0 else None


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def duration_seconds(text: str | None) -> float | None:
    """``6m0s``, ``1.5s``, ``20ms``, ``1h2m`` (the reset headers' form) in seconds."""
    if not text:
        return None
    text = text.strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return _number(text)  # a bare number of seconds
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


def token_capacity(tokens_per_minute: float | None, burst: float | None) -> float:
    """The tokens a bucket holds: ``burst`` when given, else one second's worth (at least
    1), so a limit the provider reports later gets the same shape as a configured one."""
    if burst is not None:
        return float(burst)
    return max(1.0, (tokens_per_minute or 60.0) / 60)


def behind(capacity: float, rate: float, remaining: float | None, age: float = 0.0) -> float | None:
    """Seconds from now until a bucket of ``capacity``, refilled at ``rate`` per second, is
    full again if it held the provider's ``remaining`` ``age`` seconds ago: the bucket's
    "full again" time is pushed at least this far (None: the provider leaves it alone)."""
    if remaining is None or remaining >= capacity:
        return None
    wait = (capacity - remaining) / rate - age
    return wait if wait > 0 else None


class RateLimiter:
    """Requests-per-minute and tokens-per-minute limits shared by every caller.

    Example::

        limiter = RateLimiter(requests_per_minute=600, tokens_per_minute=200_000)
        model = Model(limiter=limiter)          # every attempt waits for its slot

    ``request_burst`` is how many requests may go at once after an idle spell (default 1);
    ``token_burst`` is how many tokens may (default: one second's worth, at least 1).
    Both limits are where the limiter starts: the provider's headers correct them
    (:meth:`observe`), and a limit the provider reports that was not configured is adopted.
    """

    def __init__(
        self,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        *,
        request_burst: float = 1.0,
        token_burst: float | None = None,
    ) -> None:
        check_rates("RateLimiter", requests_per_minute, tokens_per_minute, request_burst)
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self._requests = self._bucket(requests_per_minute, request_burst)
        self._tokens = self._bucket(tokens_per_minute,
                                    token_capacity(tokens_per_minute, token_burst))
        self._token_burst = token_burst
        self._paused_until = float("-inf")
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.waited = 0.0
        """Seconds callers spent waiting here, summed (a measure of throttling)."""
        self.acquired = 0
        """Requests let through so far."""

    @staticmethod
    def _bucket(per_minute: float | None, capacity: float) -> _Bucket | None:
        return None if per_minute is None else _Bucket(rate=per_minute / 60, capacity=capacity)

    def __repr__(self) -> str:
        return (
            f"RateLimiter(requests_per_minute={self.requests_per_minute}, "
            f"tokens_per_minute={self.tokens_per_minute})"
        )

    def _queue(self) -> asyncio.Lock:
        # An asyncio.Lock hands itself to waiters in FIFO order, which is the fairness we
        # want. It is bound to one loop, and loop times of two loops need not compare, so a
        # limiter reused on a new loop starts afresh there.
        loop = asyncio.get_running_loop()
        if self._lock is None or self._loop is not loop:
            self._lock, self._loop = asyncio.Lock(), loop
            self._paused_until = float("-inf")
            for bucket in (self._requests, self._tokens):
                if bucket is not None:
                    bucket.full_at = float("-inf")
        return self._lock

    def _wait_time(self, now: float, tokens: float) -> float:
        ready = self._paused_until
        for bucket, cost in ((self._requests, 1.0), (self._tokens, tokens)):
            if bucket is not None:
                ready = max(ready, bucket.ready_at(cost))
        wait = ready - now
        return wait if wait > _TOLERANCE_S else 0.0

    async def acquire(self, tokens_estimate: int = 0) -> None:
        """Wait for this caller's turn, then take one request and ``tokens_estimate`` tokens."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with self._queue():
            while (wait := self._wait_time(loop.time(), tokens_estimate)) > 0:
                await asyncio.sleep(wait)
            now = loop.time()
            if self._requests is not None:
                self._requests.take(now, 1.0)
            if self._tokens is not None:
                self._tokens.take(now, float(tokens_estimate))
            self.acquired += 1
        self.waited += loop.time() - start

    def reconcile(self, estimated: int, actual: int) -> None:
        """Correct a request's token estimate with the tokens it really used."""
        if self._tokens is not None:
            now = asyncio.get_running_loop().time()
            self._tokens.give(now, float(estimated - actual))

    def observe(self, limits: ProviderLimits) -> None:
        """Correct the buckets with what a response's ``x-ratelimit-*`` headers say."""
        self._queue()
        now = asyncio.get_running_loop().time()
        if limits.requests_limit:
            self.requests_per_minute = limits.requests_limit
            self._requests = _adopt(self._requests, limits.requests_limit,
                                    self._requests.capacity if self._requests else 1.0)
        if limits.tokens_limit:
            self.tokens_per_minute = limits.tokens_limit
            self._tokens = _adopt(self._tokens, limits.tokens_limit,
                                  token_capacity(limits.tokens_limit, self._token_burst))
        for bucket, remaining in ((self._requests, limits.requests_remaining),
                                  (self._tokens, limits.tokens_remaining)):
            if bucket is not None:
                wait = behind(bucket.capacity, bucket.rate, remaining, limits.age)
                if wait is not None:
                    bucket.full_at = max(bucket.full_at, now + wait)

    def available_tokens(self) -> float | None:
        """Tokens the token bucket holds now (None without a tokens-per-minute limit)."""
        if self._tokens is None:
            return None
        return self._tokens.level(asyncio.get_running_loop().time())

    def penalize(self, retry_after: float) -> None:
        """The server said 429: nobody sends anything for ``retry_after`` seconds."""
        if retry_after <= 0:
            return
        self._queue()  # binds this loop first, so the pause is not reset by the next acquire
        now = asyncio.get_running_loop().time()
        self._paused_until = max(self._paused_until, now + retry_after)


def _adopt(bucket: _Bucket | None, per_minute: float, capacity: float) -> _Bucket:
    """The bucket at the provider's rate and ``capacity`` (its state kept), or a new one."""
    if bucket is None:
        return _Bucket(rate=per_minute / 60, capacity=capacity)
    bucket.rate, bucket.capacity = per_minute / 60, capacity
    return bucket


def check_rates(owner: str, requests_per_minute: float | None,
                tokens_per_minute: float | None, request_burst: float) -> None:
    """Refuse rates that are not positive and a request burst below one (every limiter)."""
    for name, value in (
        ("requests_per_minute", requests_per_minute),
        ("tokens_per_minute", tokens_per_minute),
    ):
        if value is not None and not value > 0:
            raise UsageError(f"{owner}: {name} must be > 0, got {value}")
    if not request_burst >= 1:
        raise UsageError(f"{owner}: request_burst must be >= 1, got {request_burst}")
