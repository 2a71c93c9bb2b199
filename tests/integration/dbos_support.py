"""Runs on DBOS for the tests: worker processes started as ``planrun worker``, and the
process running the plan (a supervisor whose attempts go to DBOS queues) in the test."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from planrun import App, Registry
from planrun.core import RunResult, Task
from planrun.runtime import DBOSAttempts, EffectFn, Supervisor
from planrun.stores import open_store

HERE = Path(__file__).resolve().parent
SRC = str(HERE.parents[1] / "src")


class Spawned(subprocess.Popen[str]):
    """A process whose output goes to files, read by :meth:`communicate` once it exits: a
    pipe nobody drains fills up with a long outage's log lines and stops every thread of
    the process that logs."""

    def __init__(self, argv: list[str], env: Mapping[str, str] | None = None) -> None:
        self._out = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed by communicate)
        self._err = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self._outputs: tuple[str, str] | None = None
        super().__init__(argv, env=env, stdout=self._out, stderr=self._err, text=True)

    def first_line(self, timeout: float = 60.0) -> str:
        """The first line the process wrote to stderr (its banner), once it is there."""
        return self.output_once(lambda text: "\n" in text, timeout).split("\n", 1)[0]

    def output_once(self, ready: Callable[[str], bool], timeout: float = 60.0, *,
                    stdout: bool = False) -> str:
        """What the process wrote to stderr (or stdout) so far, once ``ready`` says it is
        enough or the process has exited."""
        f = self._out if stdout else self._err
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(f.fileno(), closefd=False) as view:
                os.lseek(view.fileno(), 0, os.SEEK_SET)
                text = view.read()
            if ready(text) or self.poll() is not None:
                return text
            time.sleep(0.05)
        raise TimeoutError("the process did not write what was awaited")

    def communicate(self, input: str | None = None,
                    timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        if self._outputs is None:
            outputs = []
            for f in (self._out, self._err):
                f.seek(0)
                outputs.append(f.read())
                f.close()
            self._outputs = outputs[0], outputs[1]
        return self._outputs


def spawn_worker(url: str, name: str, *, app: str = "dist_app:app", concurrency: int = 4,
                 lease: float = 30.0, idle_exit: float = 120.0, extra: Sequence[str] = (),
                 env: Mapping[str, str] | None = None) -> Spawned:
    """``planrun worker`` in a process of its own, its output kept."""
    return Spawned(
        [sys.executable, "-m", "planrun.cli", "worker", "--db", url, "--app", app,
         "--name", name, "--concurrency", str(concurrency), "--lease", str(lease),
         "--idle-exit", str(idle_exit), *extra],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), SRC]), **(env or {})})


async def run_on_dbos(registry: Registry, tasks: Iterable[Task], url: str, *,
                      lease: float = 30.0, in_flight: int = 32, app_name: str = "dist_app:app",
                      effects: Mapping[str, EffectFn] | None = None, run_id: str | None = None,
                      started: asyncio.Event | None = None, **options: Any) -> RunResult:
    """Run ``tasks`` supervised here, their attempts done by worker processes."""
    store = open_store(url)
    await store.open()
    attempts = DBOSAttempts(url, store, app_name=app_name, in_flight=in_flight, lease_s=lease)
    try:
        app = attempts.app(App(registry, effects=dict(effects or {})))
        sup = Supervisor(app.registry, app.worker_specs(), store=store, effects=app.effects,
                         stale_after=lease, run_id=run_id, **options)
        sup.add_tasks(list(tasks))
        if started is not None:
            started.set()
        return await sup.arun()
    finally:
        await attempts.aclose()
        await store.close()


def holders(url: str, run_id: str, *, taken: bool = False) -> dict[tuple[str, int], str]:
    """(task, token) -> the worker process DBOS gave that attempt to ("" while it waits on
    its queue; with ``taken``, only the attempts a process took)."""
    from dbos import DBOSClient

    from planrun.runtime._dbos_wire import dbos_schema, dbos_url

    client = DBOSClient(system_database_url=dbos_url(url), dbos_system_schema=dbos_schema(url))
    try:
        held = {}
        for status in client.list_workflows(workflow_id_prefix=f"{run_id}:",
                                            load_input=False, load_output=False):
            _, task, token = status.workflow_id.rsplit(":", 2)
            if status.executor_id or not taken:
                held[task, int(token)] = str(status.executor_id or "")
        return held
    finally:
        client.destroy()


def stop_workers(workers: Iterable[subprocess.Popen[str]]) -> list[str]:
    """SIGTERM each worker process; check each exited cleanly and logged no traceback
    (a fault is logged in lines); their stderr."""
    workers = list(workers)
    for w in workers:
        if w.poll() is None:
            w.terminate()
    errs = [w.communicate(timeout=60)[1] for w in workers]
    assert all(w.returncode == 0 for w in workers), [e[-1500:] for e in errs]
    for err in errs:
        assert "never retrieved" not in err and "Traceback" not in err, err[-3000:]
    return errs
