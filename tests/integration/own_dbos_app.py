"""An application that runs DBOS itself, with a workflow of its own, and also serves
planrun's attempts (run by ``test_dbos.py``)::

    python own_dbos_app.py DB_URL

It configures DBOS with its own settings merged with :func:`planrun.runtime.dbos_settings`,
registers planrun's workflow beside its own before ``DBOS.launch()``, then serves the
``triage`` queue of ``dist_app`` with ``DBOSWorker(..., launch=False)`` until SIGTERM.
Once serving it runs its own workflow and prints ``own workflow: <output>`` and ``ready``.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from dbos import DBOS
from dist_app import registry

from planrun.runtime import DBOSWorker, dbos_settings, register_workflows
from planrun.stores import open_store

APP = "dist_app:app"  # the name the process running the plan gives


@DBOS.workflow()
async def own_workflow(n: int) -> int:
    """The application's own durable work."""
    return n * 2


async def main(url: str) -> None:
    DBOS(config={"executor_id": "embedded", "log_level": "WARNING",
                 **dbos_settings(url, APP)})
    register_workflows()
    DBOS.launch()
    store = open_store(url)
    await store.open()
    worker = DBOSWorker(registry, store, url, name="embedded", app_name=APP, launch=False)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stop)
    serving = asyncio.ensure_future(worker.arun())
    try:
        await worker.ready.wait()
        print(f"own workflow: {await own_workflow(21)}", flush=True)
        print("ready", flush=True)
        await serving
    finally:
        await store.close()
        DBOS.destroy()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
