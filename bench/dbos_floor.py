"""DBOS's own floor on this machine: a no-op workflow through a queue, with no planrun.

    python bench/dbos_floor.py              # PostgreSQL: 200 in a row, 1,000 at once
    python bench/dbos_floor.py --quick      # 50 in a row, 200 at once

One process launches DBOS on a schema of its own, with one queue polled every millisecond
(32 at once); it enqueues a no-op workflow and waits for it to succeed (looking every
millisecond), one after another (the latency of one task through the engine), then
enqueues many at once and waits for all (its throughput). What planrun's DBOS driver adds
comes on top of these (``bench/on_dbos.py``).
"""

from __future__ import annotations

import argparse
import os
import time
import uuid

import psycopg

PG = os.environ.get("PLANRUN_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    chain, many = (50, 200) if args.quick else (200, 1000)
    from dbos import DBOS

    schema = f"floor_{uuid.uuid4().hex[:8]}"
    DBOS(config={"name": "planrun-floor", "system_database_url": PG,
                 "dbos_system_schema": schema, "log_level": "WARNING"})

    @DBOS.workflow()
    def noop(i: int) -> int:
        return i

    DBOS.launch()
    DBOS.register_queue("floor", worker_concurrency=32, polling_interval_sec=0.001)
    time.sleep(1.5)  # DBOS serves a queue registered after launch at its next look
    queue = DBOS.retrieve_queue("floor")
    try:
        def wait(ids: list[str]) -> None:
            """Until every workflow of ``ids`` succeeded, looking every millisecond (a
            handle's ``get_result`` looks once a second)."""
            left = set(ids)
            while left:
                done = DBOS.list_workflows(workflow_ids=list(left), status=["SUCCESS"],
                                           load_input=False, load_output=False)
                left -= {w.workflow_id for w in done}
                if left:
                    time.sleep(0.001)

        wait([queue.enqueue(noop, -1).workflow_id])  # warm up
        started = time.perf_counter()
        for i in range(chain):
            wait([queue.enqueue(noop, i).workflow_id])
        per_task = (time.perf_counter() - started) / chain
        started = time.perf_counter()
        wait([queue.enqueue(noop, i).workflow_id for i in range(many)])
        rate = many / (time.perf_counter() - started)
    finally:
        DBOS.destroy()
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    print(f"DBOS alone on {PG.split('@')[-1]}: {per_task * 1000:.1f} ms per task one after "
          f"another ({chain}); {rate:.0f} tasks/s with {many} enqueued at once, 32 at a time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
