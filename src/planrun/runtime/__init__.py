"""The runtime: drivers that feed the scheduling core what happened and carry out what it
decided.

The in-process :class:`Supervisor` (asyncio tasks, batched store writes), running one
attempt, attempts carried by worker processes on DBOS (:class:`DBOSAttempts` in the process
running the plan, :class:`DBOSWorker` in each worker process), run ownership
(:func:`hold_run`), approvals given from outside a run, and clocks.
Nothing here decides what the core decides.
"""

from planrun.runtime._batch_journal import LedgerJournal
from planrun.runtime._clock import Clock, RealClock, VirtualClock, run_blocking
from planrun.runtime._dbos_attempts import DBOSAttempts
from planrun.runtime._dbos_wire import dbos_settings
from planrun.runtime._dbos_worker import DBOSWorker, import_dbos, register_workflows
from planrun.runtime._decisions import approve_task, reject_task
from planrun.runtime._heap import frozen_heap
from planrun.runtime._ownership import WaitHook, hold_run
from planrun.runtime._supervisor import STALE_AFTER_S, EffectFn, Replanner, Supervisor
from planrun.runtime._usage_journal import UsageJournal

__all__ = [
    "STALE_AFTER_S",
    "Clock",
    "DBOSAttempts",
    "DBOSWorker",
    "EffectFn",
    "LedgerJournal",
    "RealClock",
    "Replanner",
    "Supervisor",
    "UsageJournal",
    "VirtualClock",
    "WaitHook",
    "approve_task",
    "dbos_settings",
    "frozen_heap",
    "hold_run",
    "import_dbos",
    "register_workflows",
    "reject_task",
    "run_blocking",
]
