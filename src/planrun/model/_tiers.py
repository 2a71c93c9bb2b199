"""The tier a call goes at, on the wire: what the model client sends and what the provider
answers about it.

Which tier a call gets is the scheduling core's decision
(:func:`planrun.core.scheduling.choose_tier`); it reaches the client as the attempt's
:class:`~planrun.core.scheduling.TierChoice` (``ctx.tier``). The client sends it as the
request's ``service_tier`` and reads the tier that served the answer from the answer's
``service_tier``. Two answers are about the tier itself, and neither is a rate limit:

- flex has no capacity now (a 429 whose code is ``resource_unavailable``): not billed, and
  the shared rate limiter is not slowed; the call is tried on flex again while the task's
  slack allows (:attr:`TierChoice.flex_retry_s`), else sent at the default tier at once
  (:class:`FlexRefused`);
- the provider rejects the tier (a 400 naming ``service_tier``): that tier is not sent again
  for the rest of the run (this :class:`~planrun.Model`), with one warning line naming the
  model and the tier, and the call goes at the default tier (:class:`Tiers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import openai

from planrun.core import PermanentError, TransientError

if TYPE_CHECKING:
    from planrun.core import TaskContext
    from planrun.core.scheduling import RetryPolicy, TierChoice

__all__ = ["FLEX_REFUSED_CODE", "FLEX_TIMEOUT_S", "FlexRefused", "TierRejected", "Tiers",
           "heartbeats", "send_at_tier", "tier_refusal"]

T = TypeVar("T")

log = logging.getLogger("planrun.model")

FLEX_TIMEOUT_S = 900.0
"""A flex request may take this long (the provider's advice) whatever the model's timeout."""
HEARTBEAT_S = 2.0
"""While a flex request is out, its task's lease is renewed this often (a flex answer may
take longer than a lease)."""

FLEX_REFUSED_CODE = "resource_unavailable"
"""The error code of flex's 429 when it lacks capacity (a rate limit's is
``rate_limit_exceeded``)."""


class FlexRefused(TransientError):
    """Flex had no capacity for the call (429 ``resource_unavailable``): not billed, and no
    rate limit; try flex again later or send the call at the default tier."""


class TierRejected(PermanentError):
    """The provider rejected the request's ``service_tier`` (a 400 naming it)."""


def tier_refusal(exc: BaseException) -> FlexRefused | TierRejected | None:
    """The planrun error for a provider's answer about the tier itself, or None for any
    other error (a rate limit's 429 included)."""
    if not isinstance(exc, openai.APIStatusError):
        return None
    body: Mapping[str, Any] = exc.body if isinstance(exc.body, Mapping) else {}
    inner = body.get("error")
    error: Mapping[str, Any] = inner if isinstance(inner, Mapping) else body
    code = getattr(exc, "code", None) or error.get("code")
    message = str(error.get("message") or exc.message)
    if exc.status_code == 429 and code == FLEX_REFUSED_CODE:
        return FlexRefused(f"flex processing had no capacity for the call: {message}")
    param = str(getattr(exc, "param", None) or error.get("param") or "")
    if exc.status_code == 400 and ("service_tier" in param or "service_tier" in message):
        return TierRejected(f"the model API rejected the service tier: {message}")
    return None


class Tiers:
    """A model's tiers on the wire: which the provider rejected (sent no more)."""

    def __init__(self) -> None:
        self._rejected: set[str] = set()
        self._lock = threading.Lock()

    def wire(self, tier: str) -> str | None:
        """What to send as ``service_tier`` for ``tier``: the tier itself; ``default`` once
        the provider rejected it; nothing once it rejected ``default`` too."""
        with self._lock:
            if tier in self._rejected:
                tier = "default"
            return None if tier in self._rejected else tier

    def reject(self, tier: str, model: str, base_url: str) -> None:
        """The provider at ``base_url`` rejected ``tier`` for ``model``: one warning line
        (the first time), and the tier is not sent again."""
        with self._lock:
            if tier in self._rejected:
                return
            self._rejected.add(tier)
        log.warning("the model API at %s rejected service_tier %r for model %r; its calls go "
                    "at the default tier for the rest of the run", base_url, tier, model)


async def send_at_tier(choice: TierChoice, params: Mapping[str, Any],
                       send: Callable[[dict[str, Any], str], Awaitable[T]], tiers: Tiers,
                       retry: RetryPolicy, rng: random.Random, *, model: str,
                       base_url: str) -> T:
    """``send(params, tier)`` with ``service_tier`` set to the tier ``choice`` names (a
    ``batch`` choice where no batch is at hand goes at the default tier).

    Flex refused for want of capacity (:class:`FlexRefused`) is sent at flex again after
    ``retry``'s backoff while ``choice.flex_retry_s`` lasts, then at the default tier at
    once; a tier the provider rejects (:class:`TierRejected`) is dropped for good
    (:meth:`Tiers.reject`) and the call sent again without it."""
    tier = "default" if choice.tier == "batch" else choice.tier
    loop = asyncio.get_running_loop()
    flex_until, refusals = loop.time() + choice.flex_retry_s, 0
    while True:
        wire = tiers.wire(tier)
        sent = {**params, "service_tier": wire} if wire else dict(params)
        try:
            return await send(sent, wire or "default")
        except FlexRefused as refused:
            refusals += 1
            wait = retry.delay(refusals, None, rng)
            if loop.time() + wait > flex_until:
                log.info("%s; sent at the default tier (no slack left to wait)", refused)
                tier = "default"
            else:
                await asyncio.sleep(wait)
        except TierRejected:
            if wire is None:
                raise
            tiers.reject(wire, model, base_url)


@contextlib.asynccontextmanager
async def heartbeats(task: TaskContext | None, every: float = HEARTBEAT_S,
                     ) -> AsyncIterator[None]:
    """Renew ``task``'s lease every ``every`` seconds while the block runs (nothing for
    None): a flex answer may take longer than the lease."""
    if task is None:
        yield
        return

    async def beat() -> None:
        while True:
            await asyncio.sleep(every)
            task.heartbeat()

    beating = asyncio.ensure_future(beat())
    try:
        yield
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
