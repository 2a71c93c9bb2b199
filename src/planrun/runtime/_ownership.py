"""One owner per run: hold a run's owner lease in the store while a driver carries it on.

    async with hold_run(store, run_id):      # RunInUse when a live process owns it
        result = await supervisor.aresume()

The lease lives on the run row (:meth:`planrun.stores.base.Store.acquire_run`): an owner
name and an expiry, renewed every third of its ``ttl`` while the block runs and released
when it ends, however it ends. A process that dies stops renewing, so its lease runs out
after at most ``ttl`` seconds and the run shows as ``interrupted``
(:func:`planrun.stores.base.shown_status`); another process may then resume it. While the
lease holds, a second owner waits for it to run out (``wait=True``, the default: a live
owner keeps renewing, so after one lease the wait ends in a one-line
:class:`~planrun.RunInUse` naming the owner) or is refused at once (``wait=False``).

An owner that is a process of this host that no longer exists (killed with SIGKILL, say) is
taken over at once: owner names are ``host:pid:start:random``, where ``start`` is the
process's start time, so a pid reused by another process is not mistaken for the owner
(:func:`planrun.stores.owner_gone` decides it, and the store takes the run over only if that
owner still holds it).

Lease times are wall-clock seconds (``time.time()``), the clock every process sharing the
store agrees on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable

from planrun.core import RunInUse, StoreError, UnknownRun, UsageError
from planrun.stores import owner_gone, owner_name
from planrun.stores.base import RunOwner, Store

__all__ = ["OWNER_TTL", "default_ttl", "hold_run"]

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


WaitHook = Callable[[RunOwner, float], None]
"""``hook(owner, seconds_left)``: called about once a second while a run's live owner is
waited for (the CLI shows a countdown with it)."""


@contextlib.asynccontextmanager
async def hold_run(
    store: Store,
    run_id: str,
    *,
    owner: str | None = None,
    ttl: float | None = None,
    new_run: bool = False,
    wait: bool = True,
    on_wait: WaitHook | None = None,
) -> AsyncIterator[str]:
    """Own ``run_id`` for the duration of the block; yield the owner name.

    Args:
        store: an open store.
        run_id: the run to own.
        owner: the owner's name (default :func:`planrun.stores.owner_name`).
        ttl: seconds the lease lasts unless renewed; renewed every ``ttl / 3``
            (default :func:`default_ttl`).
        new_run: the block itself creates the run (a fresh ``arun``): take the lease as
            soon as the run exists instead of before the block starts.
        wait: when another owner holds a live lease, wait until that lease (as first
            seen) runs out, trying again each second, instead of failing at once. An
            owner that is a gone process of this host is taken over at once either way.
        on_wait: called about once a second while waiting (see :data:`WaitHook`).

    Raises:
        RunInUse: (on entry) another live process holds the run (at once with
            ``wait=False``; after its lease, which it kept renewing, otherwise).
        UnknownRun: (on entry, unless ``new_run``) the store holds no such run.
    """
    ttl = default_ttl() if ttl is None else ttl
    if not ttl > 0:
        raise UsageError(f"an owner lease needs a positive ttl, not {ttl!r}")
    name = owner or owner_name()
    if not new_run:
        await _acquire(store, run_id, name, ttl, wait=wait, on_wait=on_wait)
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


async def _acquire(store: Store, run_id: str, name: str, ttl: float, *, wait: bool,
                   on_wait: WaitHook | None) -> None:
    """Take the lease: at once, from a gone owner of this host, or after a live owner's
    lease as first seen runs out (``wait``)."""
    deadline: float | None = None
    began = time.time()
    while True:
        try:
            await store.acquire_run(run_id, name, ttl, time.time())
            return
        except RunInUse as exc:
            if owner_gone(exc.owner):
                log.warning("run %s: its owner %s is a process of this host that no longer "
                            "exists; taking the run over", run_id, exc.owner)
                try:
                    await store.acquire_run(run_id, name, ttl, time.time(), take_from=exc.owner)
                    return
                except RunInUse as again:  # another process took it first
                    exc = again
            now = time.time()
            deadline = exc.until if deadline is None else deadline
            if not wait:
                raise exc from None
            if now > deadline:
                raise RunInUse(run_id, exc.owner, exc.until, now, waited=now - began) from None
            if on_wait is not None:
                on_wait(RunOwner(exc.owner, exc.until), deadline - now)
            await asyncio.sleep(min(1.0, max(deadline - now, 0.0) + 0.05))


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
