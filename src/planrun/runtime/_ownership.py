"""One owner per run: hold a run's owner lease in the store while a driver carries it on.

    async with hold_run(store, run_id):      # RunInUse when a live process owns it
        result = await supervisor.aresume()

The lease lives on the run row (:meth:`planrun.stores.base.Store.acquire_run`): an owner
name and an expiry, renewed every third of its ``ttl`` while the block runs and released
when it ends, however it ends. A process that dies stops renewing, so its lease runs out
after at most ``ttl`` seconds and the run shows as ``interrupted``
(:func:`planrun.stores.base.shown_status`); another process may then resume it. While the
lease holds, a second resume is refused with a one-line :class:`~planrun.RunInUse`
naming the owner and when its lease ends.

Lease times are wall-clock seconds (``time.time()``), the clock every process sharing the
store agrees on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator

from planrun.core import RunInUse, StoreError, UnknownRun, UsageError
from planrun.stores.base import Store

__all__ = ["OWNER_TTL", "default_ttl", "hold_run", "owner_name"]

log = logging.getLogger("planrun.ownership")

OWNER_TTL = 30.0
"""Seconds an owner lease lasts unless renewed (it is renewed every third of that); the
``PLANRUN_OWNER_TTL`` environment variable overrides it for :func:`hold_run`'s default."""

ENV_TTL = "PLANRUN_OWNER_TTL"


def default_ttl() -> float:
    """``$PLANRUN_OWNER_TTL`` (seconds) when set, else :data:`OWNER_TTL`."""
    text = os.environ.get(ENV_TTL)
    if not text:
        return OWNER_TTL
    try:
        ttl = float(text)
    except ValueError:
        ttl = 0.0
    if not ttl > 0:
        raise UsageError(f"{ENV_TTL} must be a positive number of seconds, not {text!r}")
    return ttl


def owner_name() -> str:
    """A name for this process as a run's owner: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@contextlib.asynccontextmanager
async def hold_run(
    store: Store,
    run_id: str,
    *,
    owner: str | None = None,
    ttl: float | None = None,
    new_run: bool = False,
) -> AsyncIterator[str]:
    """Own ``run_id`` for the duration of the block; yield the owner name.

    Args:
        store: an open store.
        run_id: the run to own.
        owner: the owner's name (default :func:`owner_name`).
        ttl: seconds the lease lasts unless renewed; renewed every ``ttl / 3``
            (default :func:`default_ttl`).
        new_run: the block itself creates the run (a fresh ``arun``): take the lease as
            soon as the run exists instead of before the block starts.

    Raises:
        RunInUse: (on entry) another process holds a live lease on the run.
        UnknownRun: (on entry, unless ``new_run``) the store holds no such run.
    """
    ttl = default_ttl() if ttl is None else ttl
    if not ttl > 0:
        raise UsageError(f"an owner lease needs a positive ttl, not {ttl!r}")
    name = owner or owner_name()
    if not new_run:
        await store.acquire_run(run_id, name, ttl, time.time())
    keeper = asyncio.ensure_future(_keep(store, run_id, name, ttl, acquired=not new_run))
    try:
        yield name
    finally:
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
        try:
            await store.release_run(run_id, name)
        except UnknownRun:
            pass  # the block failed before it created the run
        except StoreError as exc:  # it runs out by itself within ttl
            log.warning("run %s: could not release its owner lease: %s", run_id, exc)


async def _keep(store: Store, run_id: str, name: str, ttl: float, acquired: bool) -> None:
    """Take (``new_run``) then renew the lease until cancelled."""
    interval = ttl / 3
    delay = interval if acquired else 0.0
    while True:
        await asyncio.sleep(delay)
        try:
            if not acquired:
                await store.acquire_run(run_id, name, ttl, time.time())
                acquired, delay = True, interval
            elif await store.renew_run(run_id, name, ttl, time.time()):
                delay = interval
            else:
                log.error("run %s: another process took its owner lease after it expired",
                          run_id)
                return
        except UnknownRun:  # not created yet
            delay = min(max(delay * 2, 0.01), interval)
        except RunInUse as exc:
            log.error("run %s: %s", run_id, exc)
            return
        except StoreError as exc:  # try again soon: the lease still has time left
            log.warning("run %s: could not renew its owner lease: %s", run_id, exc)
            delay = min(interval, 1.0)
