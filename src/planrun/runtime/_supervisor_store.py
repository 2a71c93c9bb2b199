"""The in-process driver's writes: the run to its store in batches behind the run."""

from __future__ import annotations

import asyncio

from planrun.core import (
    StoreError,
)
from planrun.runtime._patience import patiently
from planrun.runtime._supervisor_state import (
    GATHER_MAX_S,
    GATHER_S,
    WRITE_STALL_S,
    _SupervisorState,
)


class _SupervisorStore(_SupervisorState):
    """The in-process driver's writes: the run to its store in batches behind the run."""

    async def _open_run(self, now: float) -> None:
        if self.store is None:
            return
        from planrun.stores.base import RunInfo

        self._dirty = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._gathering: asyncio.Future[None] | None = None
        self._flush_now = False
        if self._resumed:
            await self.store.set_run_status(self.run_id, "running")
        else:
            await self.store.create_run(RunInfo(self.run_id, now, "running", self.goal, self.meta))
            await self.store.add_tasks(self.run_id, list(self.core.tasks.values()),
                                       list(self.ledger.events))
        self._flushed = len(self.ledger)
        self._flusher = asyncio.ensure_future(self._flush_forever())
        self._flusher.add_done_callback(lambda _: self._wake_up())

    async def _close_run(self, status: str) -> None:
        if self.store is None:
            return
        if self._flusher is not None and self._dirty is not None:
            # Never cancel a write in flight: a cancelled batch may or may not have been
            # committed. Ask the flusher to drain and finish instead.
            self._closing = True
            self._end_gathering(flush=True)
            self._dirty.set()
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self._flush()
        await self.store.set_run_status(self.run_id, status)

    async def _flush_forever(self) -> None:
        assert self._dirty is not None
        while True:
            await self._dirty.wait()
            await self._gather()
            self._dirty.clear()
            await self._flush()
            if self._closing and self._flushed == len(self.ledger):
                return

    async def _gather(self) -> None:
        """Let the next batch wait for more changes while they keep coming (attempts run),
        so a task changed several times in it has its row written once: :data:`GATHER_S`
        at a time, :data:`GATHER_MAX_S` at most. Closing the run, a waiting row (a person
        reads it from the store) or a store that refuses writes ends the wait at once.

        The store stays a log written behind the run: a crash keeps the batches committed
        before it, and a resume puts back what was assigned or running. An effect does not
        wait: :meth:`_apply_effect` flushes its task's completion itself.
        """
        loop = asyncio.get_running_loop()
        until = loop.time() + GATHER_MAX_S
        seen = -1
        ledger = self.ledger
        while seen != len(ledger) and not self._flush_now and not self._store_down:
            now = loop.time()
            if now >= until:
                break
            seen = len(ledger)
            self._gathering = woken = loop.create_future()
            timer = loop.call_later(min(GATHER_S, until - now), self._end_gathering)
            try:
                await woken
            finally:
                timer.cancel()
                self._gathering = None
        self._flush_now = False

    def _end_gathering(self, flush: bool = False) -> None:
        """Wake :meth:`_gather` (``flush``: and write the batch now)."""
        if flush:
            self._flush_now = True
        woken = self._gathering
        if woken is not None and not woken.done():
            woken.set_result(None)

    async def _flush(self) -> None:
        """Write what changed, batch by batch; ride out a store that is briefly down.

        While writes fail no new attempt starts (their results could not be recorded);
        a write that has not returned after :data:`WRITE_STALL_S` counts as failing (a
        server that is gone makes a call wait for a connection before it fails). Work
        resumes as soon as a write succeeds.
        """
        if self.store is None or self._flush_lock is None:
            return
        async with self._flush_lock:
            while self._flushed < len(self.ledger):
                await patiently(self._write_next, patience=self.store_patience,
                                now=self.clock.now,
                                retry_if=lambda exc: isinstance(exc, StoreError))
                if self._store_down:
                    self._store_down = False
                    self.core.pause(False)
                    self._wake_up()

    async def _write_next(self) -> None:
        """Write the next batch: the entries so far, with each task's record as it is now
        (every change comes with its event, so the two agree). A failed write changes
        nothing: the next try cuts its batch from the same place."""
        assert self.store is not None
        end = len(self.ledger)
        events = self.ledger.rows(self._flushed, end, self._apart)
        tasks = self.core.tasks
        rows = [tasks[t] for t in dict.fromkeys([e[2] for e in events]) if t in tasks]
        stalled = asyncio.get_running_loop().call_later(WRITE_STALL_S, self._stalled)
        try:
            await self.store.write_batch(self.run_id, rows, events)
        except Exception:  # an UnstorableValue is raised at once (not a StoreError)
            self._write_failed()
            raise
        finally:
            stalled.cancel()
        self._flushed = end

    def _write_failed(self) -> None:
        """While writes fail no new attempt starts (their results could not be recorded)."""
        self._store_down = True
        self.core.pause(True)

    def _to_store(self) -> None:
        """Wake the flusher when the ledger holds changes the store has not (the core notes
        its common changes straight into the ledger: nobody else tells the flusher)."""
        if self._dirty is not None and self._flushed < len(self.ledger):
            self._dirty.set()

    def _stalled(self) -> None:
        """A write is taking too long to be a healthy store: start nothing until it ends."""
        self._store_down = True
        self.core.pause(True)
