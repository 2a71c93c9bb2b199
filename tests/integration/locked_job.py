"""A 400-task supervised run on a SQLite file, for ``test_store_outage.py``.

    python locked_job.py DB_PATH

While another process holds the file's write lock, every write of this one fails
(``database is locked`` after a 0.5 s busy timeout). Prints one JSON line: whether the
run is ok and the wall-clock time each handler started.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from planrun import Registry, TaskContext
from planrun.core import KindSpec, Task
from planrun.runtime import Supervisor
from planrun.stores.sqlite import SQLiteStore

TASKS = 400


async def main(path: str) -> dict[str, Any]:
    starts: list[float] = []

    async def work(payload: Any, ctx: TaskContext) -> int:
        starts.append(time.time())
        await asyncio.sleep(0.1)
        return int(payload["n"])

    store = SQLiteStore(path, busy_timeout=0.5)
    await store.open()
    try:
        sup = Supervisor(Registry([KindSpec("k", handler=work)]), store=store, run_id="locked",
                         effects={"k": lambda task, key: None})
        sup.add_tasks(Task(id=f"t{i}", kind="k", payload={"n": i}) for i in range(TASKS))
        result = await sup.arun()
    finally:
        await store.close()
    return {"ok": result.ok, "clean": result.audit.clean, "starts": starts}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
