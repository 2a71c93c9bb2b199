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

from typing import TYPE_CHECKING

from planrun.core import Task, UsageError
from planrun.core.scheduling import Approval

if TYPE_CHECKING:
    from planrun.stores.base import Store

__all__ = ["Approval", "approve_task", "reject_task"]


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
