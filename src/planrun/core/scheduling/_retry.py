"""One retry policy for every layer that retries: the scheduler and the model client."""

from __future__ import annotations

import random
from dataclasses import dataclass

from planrun.core._errors import UsageError

__all__ = ["STORE_PATIENCE", "RetryPolicy", "store_wait"]


@dataclass(frozen=True)
class RetryPolicy:
    """How transient errors are retried: ``attempts`` tries at most, exponential backoff.

    The n-th retry waits ``min(cap, base * 2**(n-1))``, of which the fraction ``jitter``
    is random (0: exact; 0.5: between half and all of it), and never less than the
    server's ``Retry-After``.

    ``max_retry_after`` is the longest ``Retry-After`` a layer waits out itself. The model
    client hands a longer one to its caller at once (the scheduler is better placed to wait);
    the scheduler clamps a longer one to it, so a server asking for an hour cannot park a task
    (and the run) for an hour. The openai SDK itself ignores values above 60 s.
    """

    attempts: int = 4
    base: float = 0.5
    cap: float = 30.0
    jitter: float = 0.5
    max_retry_after: float = 120.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise UsageError(f"RetryPolicy.attempts must be >= 1, got {self.attempts}")
        if not 0 <= self.jitter <= 1:
            raise UsageError(f"RetryPolicy.jitter must be in [0, 1], got {self.jitter}")
        if not (self.base >= 0 and self.cap >= 0 and self.max_retry_after >= 0):
            raise UsageError("RetryPolicy.base, cap and max_retry_after must be >= 0")

    @classmethod
    def of(cls, retry: int | RetryPolicy) -> RetryPolicy:
        """Normalise a number of attempts or a policy."""
        return retry if isinstance(retry, RetryPolicy) else cls(attempts=retry)

    def backoff(self, retry_number: int, rng: random.Random | None = None) -> float:
        """Wait before retry ``retry_number`` (1 for the first retry), with jitter."""
        full = min(self.cap, self.base * 2.0 ** (retry_number - 1))
        draw = rng.random() if rng is not None else random.random()
        return full * (1.0 - self.jitter * draw)

    def delay(
        self, retry_number: int, retry_after: float | None, rng: random.Random | None = None
    ) -> float:
        """The wait: backoff, but never shorter than ``retry_after``."""
        return max(self.backoff(retry_number, rng), retry_after or 0.0)

    def clamp(self, retry_after: float | None) -> float | None:
        """A server's ``Retry-After`` bounded by ``max_retry_after`` (None stays None)."""
        if retry_after is None:
            return None
        return min(max(0.0, float(retry_after)), self.max_retry_after)


SCHEDULER_RETRY = RetryPolicy(attempts=3, base=2.0, cap=60.0, jitter=0.25, max_retry_after=60.0)
"""The scheduler's default: 3 attempts, 2 s doubling to 60 s, up to 25 % less at random,
``Retry-After`` honoured up to 60 s."""


def as_policy(value: RetryPolicy | None, default: RetryPolicy) -> RetryPolicy:
    """What a caller passed as a retry policy, or ``default`` for None."""
    if value is None:
        return default
    if isinstance(value, RetryPolicy):
        return value
    raise UsageError(f"expected a planrun.RetryPolicy, got {type(value).__name__}")


STORE_PATIENCE = RetryPolicy(base=0.2, cap=5.0, jitter=0.0)
"""How a driver waits out a store that refuses its calls: 0.2 s doubling to 5 s between
tries, until the driver's ``store_patience`` (a time, not a count) runs out."""


def store_wait(tries: int, now: float, until: float) -> float | None:
    """After the ``tries``-th failed call to a store, the seconds to wait before the next,
    or None when the patience that ends at ``until`` has run out (raise the failure)."""
    if now >= until:
        return None
    return STORE_PATIENCE.backoff(tries)
