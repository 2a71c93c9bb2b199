"""A run's Batch API jobs, recorded in its ledger before they are submitted.

The model layer's :class:`~planrun.model.Batcher` writes through this journal: each call
put in a batch is a ``batched`` event of its task (``detail``: the batch's key and the
call's ``custom_id``), written to the store before the batch is submitted, then the API's
batch id once it is known. A resumed run reads them back (:meth:`LedgerJournal.recorded`)
and waits for those batches instead of submitting their calls again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from planrun.core import EventName

if TYPE_CHECKING:
    from planrun.core.scheduling import Scheduler
    from planrun.runtime._run_log import RunLog
    from planrun.runtime._run_writes import RunWrites

__all__ = ["LedgerJournal", "Recorded"]

Recorded = tuple[str, "str | None", dict[str, str], float]
"""A recorded batch: its key, the API's id (None if never recorded), its lines still
waiting (``custom_id`` -> task id) and when it was recorded (epoch seconds)."""


class LedgerJournal:
    """The :class:`~planrun.model.BatchJournal` of a supervised run: its ``core``'s
    records, its ``log`` and the ``writes`` that take the log to its store (see
    :meth:`planrun.runtime.Supervisor.batch_journal`)."""

    def __init__(self, core: Scheduler, log: RunLog, writes: RunWrites) -> None:
        self._core, self._log, self._writes = core, log, writes

    async def submitting(self, key: str, lines: Mapping[str, str], at: float) -> None:
        """One ``batched`` event per task, written to the store now (before submission)."""
        tasks, log = self._core.tasks, self._log
        for cid, task_id in lines.items():
            task = tasks.get(task_id)
            if task is not None:
                log.log(task, EventName.BATCHED, {"batch": key, "line": cid, "at": at})
        await self._writes.flush()

    async def submitted(self, key: str, batch_id: str, lines: Mapping[str, str]) -> None:
        """The API's id of ``key``, on the event of its first task (written with the next
        batch of changes: without it a resume finds the batch by its key)."""
        tasks = self._core.tasks
        task = next((tasks[t] for t in lines.values() if t in tasks), None)
        if task is not None:
            self._log.log(task, EventName.BATCHED, {"batch": key, "id": batch_id})
            self._writes.to_store()

    def recorded(self) -> tuple[list[Recorded], int]:
        """The batches the run recorded whose lines' tasks are not finished, and how many
        batches it recorded in all."""
        keys: dict[str, tuple[list[str | None], dict[str, str], list[float]]] = {}
        for event in self._log.ledger.view():
            if event.event != EventName.BATCHED:
                continue
            detail: Mapping[str, Any] = event.detail or {}
            key = str(detail.get("batch"))
            ids, lines, at = keys.setdefault(key, ([None], {}, [0.0]))
            if detail.get("id"):
                ids[0] = str(detail["id"])
            if detail.get("line"):
                lines[str(detail["line"])] = event.task
                at[0] = max(at[0], float(detail.get("at") or 0.0))
        tasks = self._core.tasks
        found: list[Recorded] = []
        for key, (ids, lines, at) in keys.items():
            left = {cid: t for cid, t in lines.items()
                    if t in tasks and not tasks[t].finished}
            if left:
                found.append((key, ids[0], left, at[0]))
        return found, len(keys)
