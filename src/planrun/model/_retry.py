"""How a model call retries a transient error."""

from __future__ import annotations

import random
from dataclasses import dataclass

from planrun.errors import (
    UsageError,
)


@dataclass(frozen=True)
class RetryPolicy:
    """How transient errors are retried: ``attempts`` requests at most, exponential backoff.

    The n-th retry waits ``min(cap, base * 2**(n-1))``, of which the fraction ``jitter``
    is random (0: exact; 0.5: between half and all of it), and never less than the
    server's ``Retry-After``. A server asking for more than ``max_retry_after`` seconds
    ends the retries at once: the error (with its ``retry_after``) goes to the caller,
    whose scheduler is better placed to wait that long.
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


