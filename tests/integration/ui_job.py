"""A run for the run viewer's tests, in a process of its own, over a store URL.

    python ui_job.py URL RUN_ID

Task ``pay`` needs a person's approval before it starts; ``fan`` spawns two tasks that
``sum`` joins; ``leaky`` fails for good with a key-like string in its error. The process
prints ``done`` and the final statuses as JSON when the run ends.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from planrun import Approval
from planrun.core import KindSpec, PermanentError, Registry, Task, TaskContext
from planrun.runtime import Supervisor
from planrun.stores import open_store

LEAKED = "sk-proj-uitestLEAKED0123456789abcdef"
"""A string shaped like an OpenAI key, in ``leaky``'s error: the viewer never shows it."""


async def work(payload: Any, ctx: TaskContext) -> dict[str, str]:
    return {"done": ctx.task_id}


async def fan(payload: Any, ctx: TaskContext) -> str:
    for n in range(2):
        ctx.spawn("k", {"part": n})
    return "fanned out"


async def leaky(payload: Any, ctx: TaskContext) -> None:
    raise PermanentError(f"the upstream answered 401 for key {LEAKED}")


async def main(url: str, run_id: str) -> None:
    store = open_store(url)
    await store.open()
    registry = Registry([KindSpec("k", handler=work), KindSpec("pay", handler=work),
                         KindSpec("fan", handler=fan), KindSpec("leaky", handler=leaky)])
    sup = Supervisor(registry, store=store, run_id=run_id, approvals={"pay": Approval("start")},
                     approval_poll=0.1, goal="pay the invoice once a person says so")
    sup.add_tasks([Task(id="a", kind="k"), Task(id="pay", kind="pay", depends_on=("a",)),
                   Task(id="after", kind="k", depends_on=("pay",)),
                   Task(id="fan", kind="fan", depends_on=("a",)),
                   Task(id="sum", kind="k", depends_on=("fan",), joins=("fan",)),
                   Task(id="leaky", kind="leaky")])
    try:
        result = await sup.arun()
    finally:
        await store.close()
    print("done", json.dumps({t: r.status.value for t, r in result.tasks.items()}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
