"""What a model's calls count against: the budget's reservations, the rate limiter, the meter."""

from __future__ import annotations

import inspect
import math
from typing import Any

import openai

from planrun.core import RateLimited, WorkerError
from planrun.model._errors import OutputTruncated
from planrun.model._limiter import ProviderLimits
from planrun.model._limits import Limiter
from planrun.model._reply import _Reply
from planrun.model._request import _Call
from planrun.model._usage import Reservation, UsageRecord

__all__ = ["Accounting"]


class _PromptScale:
    """What the provider counts of a prompt, learnt from the replies' ``prompt_tokens``.

    :func:`estimate_tokens` is deliberately high (a character count), which is right for a
    budget but leaves part of a token limit unused; the limiter takes the estimate times
    the ratio of reported to estimated prompt tokens over recent calls (an exponentially
    weighted sum, so a new kind of prompt moves it within a few calls). Until a reply has
    reported usage the ratio is 1; it never goes below :attr:`FLOOR`.
    """

    FLOOR = 0.25
    DECAY = 0.9

    def __init__(self) -> None:
        self.reported = 0.0
        self.estimated = 0.0

    def scaled(self, estimate: int) -> int:
        if self.estimated <= 0:
            return estimate
        return math.ceil(estimate * max(self.FLOOR, self.reported / self.estimated))

    def learn(self, estimate: int, reported: int) -> None:
        if reported > 0 and estimate > 0:
            self.reported = self.reported * self.DECAY + reported
            self.estimated = self.estimated * self.DECAY + estimate


async def _settled(outcome: Any) -> None:
    """Await what a limiter's ``reconcile``/``penalize``/``observe`` returned, when it is
    awaitable."""
    if inspect.isawaitable(outcome):
        await outcome


class Accounting:
    """What a model's calls count against, and what they spent.

    The budget (the call's meter) reserves the high estimate of a request and settles on
    its usage; the limiter takes what the provider counts: the prompt's tokens (the
    estimate, scaled by what replies reported of earlier prompts) plus the output bound,
    whatever the reply uses. :meth:`record` is the one place a reply's usage goes to the
    meter (tokens, price, the error of a cut-short reply).

    Args:
        model: the model name usage is recorded under when a reply names none.
        limiter: awaited before every live request, or None.
    """

    def __init__(self, model: str, limiter: Limiter | None) -> None:
        self.model = model
        self.limiter = limiter
        self._prompt_scale = _PromptScale()

    async def reserve(self, call: _Call, prompt_estimate: int, price: float | None = None,
                      tier: str = "default") -> Reservation:
        """The budget's reservation of one request of ``call``, priced at ``tier`` (and
        ``price``: a Batch API line's fraction)."""
        return await call.meter.areserve(self.model, prompt_estimate, call.max_tokens,
                                         price=price, tier=tier)

    async def acquire(self, prompt_estimate: int, bound: int) -> int:
        """Wait for the limiter to let a request go; what it counted of it."""
        counted = self._prompt_scale.scaled(prompt_estimate) + bound
        if self.limiter is not None:
            await self.limiter.acquire(counted)
        return counted

    async def answered(self, prompt_estimate: int, reply: _Reply) -> None:
        """Learn from a live reply: the prompt tokens it reported, the provider's limits."""
        self._prompt_scale.learn(prompt_estimate, reply.prompt_tokens)
        await self.observe(reply.limits)

    async def refused(self, counted: int, exc: BaseException) -> None:
        """A live request failed: the limiter gets back what it counted, and hears the
        provider's limits from an error response's headers."""
        if self.limiter is not None:
            await _settled(self.limiter.reconcile(counted, 0))
        response = getattr(exc, "response", None)
        if isinstance(exc, openai.APIStatusError) and response is not None:
            await self.observe(ProviderLimits.from_headers(response.headers))

    async def penalize(self, error: WorkerError, base: float) -> None:
        """A live request was rate limited: the limiter waits ``Retry-After`` (or
        ``base``) before the next."""
        if isinstance(error, RateLimited) and self.limiter is not None:
            await _settled(self.limiter.penalize(error.retry_after or base))

    async def observe(self, limits: ProviderLimits | None) -> None:
        """Hand the provider's ``x-ratelimit-*`` view to the limiter, when both exist."""
        observe = getattr(self.limiter, "observe", None)
        if limits is not None and observe is not None:
            await _settled(observe(limits))

    def record(self, call: _Call, reply: _Reply, price: float | None = None,
               tier: str | None = None) -> UsageRecord:
        """The reply's usage, recorded on the call's meter, priced at the tier that served
        it (``tier`` for a Batch API line, else as the answer names it)."""
        truncated = reply.finish_reason == "length" and not reply.refusal
        return call.meter.record(
            reply.model or self.model,
            price=price,
            tier=tier or reply.service_tier,
            latency_s=reply.latency_s,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            cached_tokens=reply.cached_tokens,
            reasoning_tokens=reply.reasoning_tokens,
            prompt_hash=call.prompt_hash,
            request_id=reply.request_id,
            error=OutputTruncated.__name__ if truncated else None,
        )

    def record_error(self, call: _Call, error: BaseException,
                     tier: str = "default") -> UsageRecord:
        """A failed request (sent at ``tier``), recorded on the call's meter."""
        return call.meter.record(self.model, prompt_hash=call.prompt_hash,
                                 error=type(error).__name__, tier=tier)
