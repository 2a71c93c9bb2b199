"""A run with approval gates on a SQLite file, started or resumed in its own process.

    python approval_job.py URL RUN_ID run|resume OUTBOX

Task ``reply`` needs approval before its effect (a line appended to OUTBOX, keyed by the
task); ``pay`` needs approval before it starts. The process prints ``done`` and the final
statuses as JSON when the run ends.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from planrun import Approval, Registry, TaskContext
from planrun.core import KindSpec, Task
from planrun.runtime import Supervisor
from planrun.stores import open_store


async def work(payload: Any, ctx: TaskContext) -> str:
    return f"done {ctx.task_id}"


async def main(url: str, run_id: str, mode: str, outbox: Path) -> None:
    def send(task: Task, key: str) -> None:
        with outbox.open("a", encoding="utf-8") as fh:
            fh.write(f"{task.id} {key}\n")

    store = open_store(url)
    await store.open()
    registry = Registry([KindSpec("reply", handler=work), KindSpec("pay", handler=work),
                         KindSpec("k", handler=work)])
    sup = Supervisor(registry, store=store, run_id=run_id, effects={"reply": send},
                     approvals={"reply": Approval("effect"), "pay": "start"},
                     approval_poll=0.1)
    try:
        if mode == "run":
            sup.add_tasks([Task(id="a", kind="k"), Task(id="reply", kind="reply",
                                                        depends_on=("a",)),
                           Task(id="pay", kind="pay", depends_on=("a",)),
                           Task(id="after", kind="k", depends_on=("pay",))])
            result = await sup.arun()
        else:
            result = await sup.aresume()
    finally:
        await store.close()
    print("done", json.dumps({t: r.status.value for t, r in result.tasks.items()}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])))
