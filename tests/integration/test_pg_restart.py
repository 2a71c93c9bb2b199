"""The PostgreSQL server restarted in the middle of a run on DBOS, for real.

The test starts a cluster of its own (``initdb`` and ``pg_ctl``, as the ``postgres`` user
when the tests run as root), runs 300 tasks supervised in this process with their attempts
done by two worker processes through DBOS queues on it, and once 50 have completed stops
the server (``pg_ctl stop -m immediate``: every session cut, no checkpoint, crash recovery
at the next start) and starts it again two seconds later. The run finishes: every task
completed once, every effect recorded once, the audit clean, the workers still serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dbos_support import run_on_dbos, spawn_worker, stop_workers
from dist_app import registry

from planrun.core import Status, Task
from planrun.stores import open_store

LEASE = 30.0  # longer than the restart: no attempt is reclaimed for it


class Cluster:
    """A PostgreSQL cluster in a temporary directory, on a free loopback port."""

    def __init__(self) -> None:
        self.bin = self._bindir()
        self.dir = Path(tempfile.mkdtemp(prefix="planrun-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.dir, "postgres", "postgres")

    @staticmethod
    def _bindir() -> Path:
        found = shutil.which("pg_ctl")
        if found is None:
            candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
            found = str(candidates[-1]) if candidates else None
        if found is None:
            _missing("pg_ctl is not installed: no PostgreSQL cluster of the test's own")
        return Path(str(found)).resolve().parent

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run([*self.as_user, str(self.bin / tool), *args],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)}: {done.stderr.strip()[-2000:]}")

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
                  "--no-sync", "-E", "UTF8")

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "-o",
                  f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                  "-c fsync=off -c max_connections=200", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def remove(self) -> None:
        with contextlib.suppress(RuntimeError):  # already stopped
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


def _missing(reason: str) -> None:
    if os.environ.get("PLANRUN_REQUIRE_PG"):
        pytest.fail(reason)
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    own = Cluster()
    try:
        own.init()
        own.start()
        yield own
    finally:
        own.remove()


async def completed(store: Any, run_id: str) -> int:
    try:
        return sum(t.status is Status.COMPLETED for t in (await store.load_tasks(run_id)).tasks)
    except Exception:
        return 0  # the server is down, or not yet there


def test_a_run_on_dbos_finishes_when_its_postgresql_server_restarts_midway(
    cluster: Cluster,
) -> None:
    url = cluster.url
    run_id = f"restart-{uuid.uuid4().hex[:8]}"
    sent: Counter[str] = Counter()
    marks: dict[str, float] = {}
    workers = [spawn_worker(url, f"w{i}", lease=LEASE, env={"DIST_APP_WORK_S": "0.05"})
               for i in range(2)]

    async def restart_after(count: int, run: asyncio.Future[Any]) -> None:
        watch = open_store(url)
        await watch.open()
        try:
            while await completed(watch, run_id) < count:
                assert not run.done(), "the run ended before the restart"
                await asyncio.sleep(0.1)
        finally:
            await watch.close()
        marks["down"] = time.time()
        await asyncio.to_thread(cluster.stop, "immediate")
        await asyncio.sleep(2.0)
        await asyncio.to_thread(cluster.start)
        marks["up"] = time.time()

    async def go() -> Any:
        run = asyncio.ensure_future(run_on_dbos(
            registry, (Task(id=f"T-{i:04d}", kind="triage", payload={"ticket": f"T-{i:04d}"})
                       for i in range(300)),
            url, lease=LEASE, run_id=run_id,
            effects={"triage": lambda t, key: sent.update([key])}))
        await restart_after(50, run)
        return await asyncio.wait_for(run, 240)

    try:
        result = asyncio.run(go())
    finally:
        stop_workers(workers)
    assert result.ok and result.audit.clean, result.audit
    assert {t.status for t in result.tasks.values()} == {Status.COMPLETED}
    done = [e for e in result.events if e.event == "completed"]
    assert len(done) == 300 and len({e.task for e in done}) == 300
    assert result.audit.duplicate_effects == 0
    effects = Counter(e.task for e in result.events if e.event == "effect")
    assert len(effects) == 300 and set(effects.values()) == {1}
    assert set(sent) == {f"{run_id}:{t}" for t in result.tasks}
    assert sum(e.at < marks["down"] for e in done) >= 50
    assert any(e.at >= marks["up"] for e in done)  # the run went on after the restart
    print(f"\nrestart: server down {marks['up'] - marks['down']:.1f} s; "
          f"{sum(e.at >= marks['up'] for e in done)} of 300 completed after it")
