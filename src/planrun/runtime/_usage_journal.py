"""What each task spent, in the run's ledger: a ``usage`` event per model request.

The run's usage meter (:class:`~planrun.model.Usage`) tells every request it records; an
answered one also teaches the run's tiers how long a call of its kind takes at the tier
that served it (:meth:`~planrun.core.scheduling.Scheduler.answered`). A request made for a
task (its record carries the key ``task:<id>``, as a model worker's does) becomes a
``usage`` event of that task, written to the store with the run's next batch of changes. A
stored run then keeps what each task cost, at which tier and when it was spent, which the
run viewer shows; a request for no task (the decomposer's) stays in the meter only.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

from planrun.core import EventName

if TYPE_CHECKING:
    from planrun.core.scheduling import Scheduler
    from planrun.runtime._run_log import RunLog

__all__ = ["UsageJournal", "usage_detail"]

TASK_KEY = "task:"
"""The key prefix a model worker's records name their task with."""


def usage_detail(record: Any) -> dict[str, Any]:
    """The ``usage`` event's detail of a :class:`~planrun.model.UsageRecord`."""
    detail: dict[str, Any] = {
        "model": record.model, "prompt_tokens": record.prompt_tokens,
        "cached_tokens": record.cached_tokens, "completion_tokens": record.completion_tokens,
        "cost_usd": record.cost_usd, "tier": record.tier}
    if record.latency_s is not None:
        detail["latency_s"] = round(record.latency_s, 6)
    if record.error:
        detail["error"] = record.error
    return detail


class UsageJournal:
    """Writes the usage records of a supervised run's tasks (its ``core``'s) into its
    ``log``; made on the loop the run goes on (a record added on another thread is handed
    to it). See :meth:`planrun.runtime.Supervisor.usage_journal`."""

    def __init__(self, core: Scheduler, log: RunLog) -> None:
        self._core, self._run_log = core, log
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()

    def recorded(self, record: Any) -> None:
        """A listener for :meth:`planrun.model.Usage.listen`."""
        task_id = next((k[len(TASK_KEY):] for k in record.keys if k.startswith(TASK_KEY)),
                       None)
        if task_id is None:
            return
        if threading.get_ident() == self._thread:
            self._log(task_id, usage_detail(record))
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._log, task_id, usage_detail(record))

    def _log(self, task_id: str, detail: dict[str, Any]) -> None:
        core = self._core
        task = core.tasks.get(task_id)
        if task is not None:
            self._run_log.log(task, EventName.USAGE, detail)
            if "latency_s" in detail:
                core.timing.answered(task.kind, detail["tier"], detail["latency_s"])
