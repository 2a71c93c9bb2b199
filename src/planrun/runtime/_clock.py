"""Clocks: real time, and virtual time that runs the same code without waiting.

The supervisor reads time only through a :class:`Clock`. :class:`RealClock` is wall time.
:class:`VirtualClock` runs coroutines on an event loop whose time jumps forward whenever
every coroutine is waiting for a timer, so ``asyncio.sleep(60)`` (and every timeout,
backoff and lease built on the loop's timers, including tenacity's sleeps) takes no real
time while keeping its order and its arithmetic exact. Simulation and tests use it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import selectors
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar, runtime_checkable

from planrun.core import UsageError

__all__ = ["Clock", "RealClock", "VirtualClock", "run_blocking", "run_virtual"]

T = TypeVar("T")


@runtime_checkable
class Clock(Protocol):
    """Where the supervisor gets the time."""

    def now(self) -> float:
        """Seconds, comparable between calls of the same clock."""
        ...

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine to completion under this clock (the sync entry point)."""
        ...

    def check_loop(self) -> None:
        """Raise :class:`UsageError` when the running loop does not keep this clock's time."""
        ...


class RealClock:
    """Wall-clock time (``time.time``) on an ordinary asyncio loop."""

    def now(self) -> float:
        """Seconds since the epoch."""
        return time.time()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """``asyncio.run`` the coroutine."""
        return asyncio.run(coro)

    def check_loop(self) -> None:
        """Any loop keeps real time."""


class _VirtualSelector(selectors.BaseSelector):
    """Polls real I/O without blocking; a wait for a timer advances virtual time instead."""

    def __init__(self, loop: _VirtualLoop, inner: selectors.BaseSelector) -> None:
        self._loop = loop
        self._inner = inner

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None or self._loop.threads_in_flight:
            # Only real I/O or a worker thread can wake the loop now; a thread's work takes
            # no virtual time, so virtual timers wait for it instead of firing early.
            return self._inner.select(None)
        self._loop.advance(timeout)
        return []

    def close(self) -> None:
        self._inner.close()

    def get_map(self) -> Any:
        return self._inner.get_map()


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float) -> None:
        self._virtual_now = start
        super().__init__(_VirtualSelector(self, selectors.DefaultSelector()))

    def time(self) -> float:
        return self._virtual_now

    threads_in_flight = 0

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Any, *args: Any
    ) -> asyncio.Future[Any]:
        future = super().run_in_executor(executor, func, *args)
        self.threads_in_flight += 1
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, _: object) -> None:
        self.threads_in_flight -= 1

    def advance(self, seconds: float) -> None:
        self._virtual_now += max(0.0, seconds)


class VirtualClock:
    """Virtual time: runs coroutines on a loop that skips idle waits.

    Example::

        clock = VirtualClock()
        clock.run(asyncio.sleep(3600))   # returns at once
        assert clock.now() == 3600.0
    """

    def __init__(self, start: float = 0.0) -> None:
        self._start = start
        self._loop: _VirtualLoop | None = None

    def now(self) -> float:
        """Virtual seconds; ``start`` before the first run."""
        return self._loop.time() if self._loop is not None else self._start

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on a fresh virtual loop that continues from this clock's time."""
        loop = _VirtualLoop(self.now())
        self._loop = loop
        try:
            return loop.run_until_complete(coro)
        finally:
            self._start = loop.time()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            self._loop = None

    def check_loop(self) -> None:
        """Refuse to run outside this clock's virtual loop."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is None or running is not self._loop:
            raise UsageError(
                "a VirtualClock's run must be driven by clock.run(...) (or Supervisor.run)"
            )


def run_blocking(clock: Clock, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``make()`` to completion under ``clock`` from synchronous code.

    Outside an event loop this is ``clock.run``. Inside one (a Jupyter cell, an async
    framework's sync callback) the coroutine runs on a private thread with a loop of its
    own, and this call blocks until it ends: the sync API works in a notebook instead of
    failing on "this event loop is already running".
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        running = False
    else:
        running = True
    if not running:  # outside the except block, so an error carries no "no running loop"
        return clock.run(make())
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="planrun-sync") as pool:
        return pool.submit(lambda: clock.run(make())).result()


def run_virtual(coro: Coroutine[Any, Any, T], start: float = 0.0) -> T:
    """Run ``coro`` under a fresh :class:`VirtualClock` and return its result."""
    return VirtualClock(start).run(coro)
