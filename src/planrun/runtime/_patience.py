"""Riding out a store that is briefly away: one loop for every driver's store calls."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from planrun.core.scheduling import store_wait

__all__ = ["patiently"]

T = TypeVar("T")


async def patiently(
    call: Callable[[], Awaitable[T]], *, patience: float, now: Callable[[], float],
    retry_if: Callable[[Exception], bool] = lambda exc: True,
    failed: Callable[[int, Exception], None] | None = None,
) -> T:
    """``await call()``, again after each failure that ``retry_if`` accepts, waiting as the
    core's :func:`~planrun.core.scheduling.store_wait` says, until ``patience`` seconds (by
    ``now``) have passed; then the failure is raised. ``failed(tries, exc)`` hears of each
    failure that will be retried."""
    until, tries = now() + patience, 0
    while True:
        try:
            return await call()
        except Exception as exc:
            tries += 1
            wait = store_wait(tries, now(), until) if retry_if(exc) else None
            if wait is None:
                raise
            if failed is not None:
                failed(tries, exc)
            await asyncio.sleep(wait)
