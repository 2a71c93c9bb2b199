"""The names worker processes had before DBOS keep working for a release, with a warning;
without the ``[dbos]`` extra, the verbs that need it say so in one line."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from dbos_support import SRC

from planrun import Coordinator, KindSpec, Registry, Task, TaskContext, WorkerProcess
from planrun.core import UsageError
from planrun.stores import open_store


async def echo(payload: dict[str, int], ctx: TaskContext) -> int:
    return payload["n"] * 2


REGISTRY = Registry([KindSpec("echo", handler=echo)])


def test_coordinator_and_worker_process_warn_and_run_on_dbos(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"

    async def go() -> object:
        stores = [open_store(url), open_store(url)]
        for s in stores:
            await s.open()
        try:
            with pytest.warns(DeprecationWarning, match="DBOSWorker"):
                worker = WorkerProcess(REGISTRY, stores[1], name="old", capacity=2, lease_s=5)
            serving = asyncio.ensure_future(worker.arun())
            await worker.ready.wait()
            with pytest.warns(DeprecationWarning, match="DBOSAttempts"):
                coordinator = Coordinator(REGISTRY, stores[0], stale_after=5)
            result = await coordinator.arun(
                Task(id=f"t{i}", kind="echo", payload={"n": i}) for i in range(5))
            worker.stop()
            await serving
            return result
        finally:
            for s in stores:
                await s.close()

    result = asyncio.run(asyncio.wait_for(go(), 60))
    assert result.ok and {t.id: t.result for t in result.tasks.values()} == {  # type: ignore[attr-defined]
        f"t{i}": 2 * i for i in range(5)}


def test_peer_mode_is_refused_by_the_old_names() -> None:
    store = open_store("memory://")
    with pytest.warns(DeprecationWarning), pytest.raises(UsageError, match="peer"):
        WorkerProcess(REGISTRY, store, url="sqlite:///x.db", mode="peer")


def test_without_the_dbos_extra_the_worker_verb_says_how_to_install_it(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['dbos'] = None; from planrun.cli import main; "
            f"sys.exit(main(['worker', '--db', 'sqlite:///{tmp_path}/w.db', "
            "'--app', 'planrun.examples.tickets:make_app']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and 'pip install "planrun[dbos]"' in done.stderr
    assert not (tmp_path / "w.db.dbos").exists()
