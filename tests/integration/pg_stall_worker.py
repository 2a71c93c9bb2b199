"""A supervisor's writer that stops itself (SIGSTOP) inside a PostgreSQL store transaction.

Run by ``test_pg_faults.py``::

    python pg_stall_worker.py DB_URL RUN_ID TASK_ID SEQ APP_NAME IDLE_TIMEOUT

It writes the completion of TASK_ID with ``write_batch``, its event numbered SEQ by the
caller as a supervisor numbers its ledger, and stops itself right after the transaction's
last statement (the one moving the run's ``seq_base`` past SEQ), before the commit: what a
GC pause, a stalled VM or ``kill -STOP`` does to a writer at the worst moment. Its session
then holds the task's row, the event's seq and the run's row. It prints ``holding`` just
before it stops. Continued (SIGCONT), it finishes the call, the store running it again if
the server cut the session off meanwhile (after IDLE_TIMEOUT seconds), and prints
``applied``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import psycopg

from planrun.core._task import Status, transition
from planrun.stores.postgres import PostgresStore


async def main(url: str, run_id: str, task_id: str, seq: int, name: str, idle: float) -> None:
    store = PostgresStore(url, application_name=name, min_size=1, max_size=1,
                          idle_in_transaction_timeout=idle, lock_timeout=1.0)
    await store.open()
    original = psycopg.AsyncCursor.execute
    stopped = False

    async def execute(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        nonlocal stopped
        result = await original(self, query, params, **kwargs)
        if not stopped and "UPDATE planrun_runs SET seq_base" in str(query):
            stopped = True
            print("holding", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)  # inside the transaction, before COMMIT
        return result

    psycopg.AsyncCursor.execute = execute  # type: ignore[method-assign]
    try:
        [task] = await store.load_some(run_id, [task_id])
        running = transition(transition(task, Status.ASSIGNED, assigned_to=name, token=1),
                             Status.RUNNING, started_at=2.0)
        done = transition(running, Status.COMPLETED, result={"by": name}, attempts=1,
                          finished_at=2.0)
        await store.write_batch(run_id, [done], [(seq, 2.0, task_id, "completed", name, 1,
                                                  None)])
        print("applied", flush=True)
    finally:
        await store.close()


if __name__ == "__main__":
    url, run_id, task_id, seq, name, idle = sys.argv[1:7]
    asyncio.run(main(url, run_id, task_id, int(seq), name, float(idle)))
