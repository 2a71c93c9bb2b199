"""Deciding approval gates from any process: the run's driver carries the decision out.

A task that needs approval waits in status ``waiting``. :func:`approve_task` and
:func:`reject_task` write a person's decision on its stored row; the process running the
run reads it (it polls the store while a task waits) and the scheduling core makes the
change, with its ledger event (``approved``, or ``dead`` with cause ``rejected``). With no
process running the run, the decision waits in the row and is carried out by ``resume``.
From inside the running process, :meth:`planrun.runtime.Supervisor.approve` and
:meth:`planrun.runtime.Supervisor.reject` decide at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from planrun.core import StoreError, Task, UsageError
from planrun.core.scheduling import Approval, Scheduler

if TYPE_CHECKING:
    from planrun.stores.base import Store

__all__ = ["Approval", "DecisionPoll", "approve_task", "reject_task"]


class DecisionPoll:
    """A running supervisor's reads of the decisions another process wrote on the rows of
    its waiting tasks (``planrun approve``, :func:`approve_task`): every ``every`` seconds,
    and only while a task waits and the run has a store.

    Args:
        store: the run's store, or None (nothing to read).
        run_id: the run.
        core: the scheduling core (it knows what waits and takes the decisions).
        every: seconds between two reads.
        now: the run's clock.
    """

    def __init__(self, store: Store | None, run_id: str, core: Scheduler, *, every: float,
                 now: Callable[[], float]) -> None:
        if not every > 0:
            raise UsageError(f"approval_poll must be > 0, got {every}")
        self.store, self.run_id, self.every = store, run_id, every
        self._core, self._now = core, now
        self._next_at = 0.0

    def wake_at(self, now: float) -> float:
        """When the loop must wake for the next read (never, when nothing is to be read)."""
        if self.store is None or not self._core.awaiting:
            return float("inf")
        return max(now, self._next_at)

    async def poll(self, now: float) -> bool:
        """Read the waiting rows if a read is due; whether the core took a decision (a read
        that fails is tried at the next one: the writes have their own patience)."""
        core = self._core
        if self.store is None or not core.awaiting or now < self._next_at:
            return False
        self._next_at = now + self.every
        try:
            records = await self.store.load_some(self.run_id, sorted(core.awaiting))
        except StoreError:
            return False
        took = False
        for record in records:
            took = core.take_decision(record, self._now()) or took
        return took


async def approve_task(store: Store, run_id: str, task_id: str,
                       note: str | None = None) -> Task:
    """Approve the waiting task ``task_id`` of run ``run_id`` (an opened store).

    Returns the stored row, still ``waiting`` until the run's process carries it out.

    Raises:
        UsageError: no such task, not waiting, or already decided (approving twice).
        StoreError: the run is unknown or the store failed.
    """
    return await store.record_decision(run_id, task_id, True, note)


async def reject_task(store: Store, run_id: str, task_id: str, reason: str) -> Task:
    """Reject the waiting task ``task_id``: it becomes ``dead`` with cause ``rejected``
    and its dependents follow the run's ``on_dead`` policy.

    Raises:
        UsageError: an empty reason, no such task, not waiting, or already decided.
        StoreError: the run is unknown or the store failed.
    """
    if not reason or not reason.strip():
        raise UsageError("a rejection needs a reason (--reason)")
    return await store.record_decision(run_id, task_id, False, reason)
