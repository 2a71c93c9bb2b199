"""A run's budget and the sums usage is counted in.

Plain values, shared by the meter (:class:`~planrun.model.Usage`) and the budget shared across
processes (:class:`~planrun.model.SharedBudget`).
"""

from __future__ import annotations

from dataclasses import dataclass

from planrun.core import UsageError

__all__ = ["Budget", "Tally"]


@dataclass(frozen=True)
class Tally:
    """Sums over some records: the run, or one key."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens (cached tokens are part of the prompt)."""
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Tally) -> Tally:
        return Tally(
            self.requests + other.requests,
            self.prompt_tokens + other.prompt_tokens,
            self.cached_tokens + other.cached_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cost_usd + other.cost_usd,
        )


@dataclass(frozen=True)
class Budget:
    """Limits for one run: total tokens and/or total USD. ``None`` means no limit."""

    max_tokens: int | None = None
    max_cost: float | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 0:
            raise UsageError(f"Budget.max_tokens must be >= 0, got {self.max_tokens}")
        if self.max_cost is not None and self.max_cost < 0:
            raise UsageError(f"Budget.max_cost must be >= 0, got {self.max_cost}")
