"""A worker process that stops itself (SIGSTOP) inside a PostgreSQL store transaction.

Run by ``test_pg_faults.py``::

    python pg_stall_worker.py DB_URL RUN_ID TASK_ID TOKEN APP_NAME

It writes the completion of TASK_ID over TOKEN with ``write_fenced``, as a worker does,
and stops itself right after the transaction has inserted its event, before the commit:
what a GC pause, a stalled VM or ``kill -STOP`` does to a worker at the worst moment. It
prints ``holding`` just before it stops. Continued (SIGCONT), it finishes the call, the
store running it again if the server cut the session off meanwhile, and prints the outcome.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import psycopg

from planrun.core._ledger import Event
from planrun.core._task import Status, transition
from planrun.stores.postgres import PostgresStore


async def main(url: str, run_id: str, task_id: str, token: int, name: str) -> None:
    store = PostgresStore(url, application_name=name, min_size=1, max_size=1,
                          idle_in_transaction_timeout=1.0, lock_timeout=1.0)
    await store.open()
    original = psycopg.AsyncCursor.execute
    stopped = False

    async def execute(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        nonlocal stopped
        result = await original(self, query, params, **kwargs)
        if not stopped and "INSERT INTO planrun_events" in str(query):
            stopped = True
            print("holding", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)  # inside the transaction, before COMMIT
        return result

    psycopg.AsyncCursor.execute = execute  # type: ignore[method-assign]
    try:
        [task] = await store.load_some(run_id, [task_id])
        done = transition(task, Status.COMPLETED, result={"by": name}, attempts=1,
                          finished_at=2.0)
        ok = await store.write_fenced(run_id, done, Event(-1, 2.0, task_id, "completed", name,
                                                          token), token)
        print("applied" if ok else "refused", flush=True)
    finally:
        await store.close()


if __name__ == "__main__":
    url, run_id, task_id, token, name = sys.argv[1:6]
    asyncio.run(main(url, run_id, task_id, int(token), name))
