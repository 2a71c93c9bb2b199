"""A supervised run's writes: the run to its store in batches, behind the run."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from planrun.core import EventName, StoreError
from planrun.core.scheduling import Scheduler
from planrun.runtime._patience import patiently

if TYPE_CHECKING:
    from planrun.runtime._run_log import RunLog
    from planrun.stores.base import Store

__all__ = ["GATHER_MAX_S", "GATHER_S", "WRITE_STALL_S", "RunWrites"]

WRITE_STALL_S = 0.5
"""Seconds after which a store write still under way counts as failing: no new attempt
starts until a write succeeds."""

GATHER_S = 0.002
"""Seconds a batch of changes for the store waits for more while they keep coming (attempts
running): a task changed several times in one batch has its row written once."""

GATHER_MAX_S = 0.1
"""Seconds a batch gathers at most after its first wait, however fast changes come."""

_WAITING = EventName.WAITING


class RunWrites:
    """Writes a run to its store: the run opened, each change and its ledger event in
    batches cut from the ledger, the run closed with its status.

    The store stays a log written behind the run: a crash keeps the batches committed
    before it, and a resume puts back what was assigned or running. While writes fail no
    new attempt starts (the core is paused: their results could not be recorded); work
    resumes as soon as a write succeeds, and a store that stays down past ``patience``
    seconds ends the run (:meth:`check`).

    Args:
        store: the opened store, or None (a run kept in memory: every method does nothing).
        run_id: the run written.
        core: the scheduling core (its records are written; paused while writes fail).
        log: the run's ledger, where batches are cut from.
        now: the run's clock.
        patience: seconds a failing store is retried before the run stops.
        wake: wakes the supervisor's loop (a write ended, the store came back).
    """

    def __init__(self, store: Store | None, run_id: str, core: Scheduler, log: RunLog, *,
                 now: Callable[[], float], patience: float, wake: Callable[[], None]) -> None:
        self.store, self.run_id, self.patience = store, run_id, patience
        self._core, self._log, self._now, self._wake = core, log, now, wake
        self.down = False
        """Writes are failing (or one stalled): no new attempt starts."""
        self._flushed = 0
        """Ledger entries before this place are in the store."""
        self._apart: set[int] = set()
        """Seqs of events written to the store with a record of their own (an effect's),
        which no batch writes."""
        self._closing = False
        self._dirty: asyncio.Event | None = None
        self._flush_lock: asyncio.Lock | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._gathering: asyncio.Future[None] | None = None
        self._flush_now = False

    async def open(self, now: float, *, resumed: bool, goal: str, meta: dict[str, object],
                   ) -> None:
        """Record the run as running (a new one with its tasks so far) and start writing."""
        if self.store is None:
            return
        from planrun.stores.base import RunInfo

        self._dirty = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        ledger = self._log.ledger
        if resumed:
            await self.store.set_run_status(self.run_id, "running")
        else:
            await self.store.create_run(RunInfo(self.run_id, now, "running", goal, meta))
            await self.store.add_tasks(self.run_id, list(self._core.tasks.values()),
                                       list(ledger.events))
        self._flushed = len(ledger)
        self._flusher = asyncio.ensure_future(self._flush_forever())
        self._flusher.add_done_callback(lambda _: self._wake())

    async def close(self, status: str) -> None:
        """Write what is left, then the run's final ``status``."""
        if self.store is None:
            return
        if self._flusher is not None and self._dirty is not None:
            # Never cancel a write in flight: a cancelled batch may or may not have been
            # committed. Ask the flusher to drain and finish instead.
            self._closing = True
            self.end_gathering(flush=True)
            self._dirty.set()
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self.flush()
        await self.store.set_run_status(self.run_id, status)

    def check(self) -> None:
        """Raise the :class:`StoreError` of a store that stayed down past its patience."""
        if self._flusher is not None and self._flusher.done():
            self._flusher.result()

    def noted(self, event: str) -> None:
        """The ledger took ``event``: the next batch writes it (a waiting row at once: a
        person reads it from the store)."""
        if self._dirty is not None:
            self._dirty.set()
            if event == _WAITING:
                self.end_gathering(flush=True)

    def to_store(self) -> None:
        """Wake the flusher when the ledger holds changes the store has not (the core notes
        its common changes straight into the ledger: nobody else tells the flusher)."""
        if self._dirty is not None and self._flushed < len(self._log.ledger):
            self._dirty.set()

    def apart(self, seq: int) -> None:
        """The event ``seq`` is written with a record of its own (an effect's), not a batch."""
        if self.store is not None:
            self._apart.add(seq)

    async def _flush_forever(self) -> None:
        assert self._dirty is not None
        while True:
            await self._dirty.wait()
            await self._gather()
            self._dirty.clear()
            await self.flush()
            if self._closing and self._flushed == len(self._log.ledger):
                return

    async def _gather(self) -> None:
        """Let the next batch wait for more changes while they keep coming (attempts run),
        so a task changed several times in it has its row written once: :data:`GATHER_S`
        at a time, :data:`GATHER_MAX_S` at most. Closing the run, a waiting row (a person
        reads it from the store) or a store that refuses writes ends the wait at once.
        An effect does not wait: it flushes its task's completion itself.
        """
        loop = asyncio.get_running_loop()
        until = loop.time() + GATHER_MAX_S
        seen = -1
        ledger = self._log.ledger
        while seen != len(ledger) and not self._flush_now and not self.down:
            now = loop.time()
            if now >= until:
                break
            seen = len(ledger)
            self._gathering = woken = loop.create_future()
            timer = loop.call_later(min(GATHER_S, until - now), self.end_gathering)
            try:
                await woken
            finally:
                timer.cancel()
                self._gathering = None
        self._flush_now = False

    def end_gathering(self, flush: bool = False) -> None:
        """Wake :meth:`_gather` (``flush``: and write the batch now)."""
        if flush:
            self._flush_now = True
        woken = self._gathering
        if woken is not None and not woken.done():
            woken.set_result(None)

    async def flush(self) -> None:
        """Write what changed, batch by batch; ride out a store that is briefly down.

        A write that has not returned after :data:`WRITE_STALL_S` counts as failing (a
        server that is gone makes a call wait for a connection before it fails).
        """
        if self.store is None or self._flush_lock is None:
            return
        async with self._flush_lock:
            while self._flushed < len(self._log.ledger):
                await patiently(self._write_next, patience=self.patience, now=self._now,
                                retry_if=lambda exc: isinstance(exc, StoreError))
                if self.down:
                    self._pause(False)
                    self._wake()

    async def _write_next(self) -> None:
        """Write the next batch: the entries so far, with each task's record as it is now
        (every change comes with its event, so the two agree). A failed write changes
        nothing: the next try cuts its batch from the same place."""
        assert self.store is not None
        ledger = self._log.ledger
        end = len(ledger)
        events = ledger.rows(self._flushed, end, self._apart)
        tasks = self._core.tasks
        rows = [tasks[t] for t in dict.fromkeys([e[2] for e in events]) if t in tasks]
        stalled = asyncio.get_running_loop().call_later(WRITE_STALL_S, self._pause, True)
        try:
            await self.store.write_batch(self.run_id, rows, events)
        except Exception:  # an UnstorableValue is raised at once (not a StoreError)
            self._pause(True)
            raise
        finally:
            stalled.cancel()
        self._flushed = end

    def _pause(self, down: bool) -> None:
        """While writes fail (or one stalls) no new attempt starts."""
        self.down = down
        self._core.pause(down)
