"""A 12-second PostgreSQL outage, for real: every connection goes through a loopback proxy
that, for 12 s, cuts the open connections and turns new ones away.

A run on DBOS (with worker processes) and the in-process supervisor ride it out
with the same ``store_patience`` (default 120 s): the run finishes afterwards, every task
completed once, every effect recorded once (its target, deduplicating by the effect key,
may see a key twice when the outage cut the recording of a delivery), the audit clean.
The supervisor starts no new attempt while its writes fail.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from dbos_support import run_on_dbos, spawn_worker, stop_workers
from dist_app import registry
from pgtest import PG_URL, fresh_schema
from tcpproxy import TcpProxy

from planrun import Registry, TaskContext
from planrun.core import KindSpec, Task
from planrun.core._task import Status
from planrun.runtime import Supervisor
from planrun.stores import open_store

OUTAGE_S = 12.0
LEASE = 30.0  # the workers' lease and the run's stale_after: longer than the outage


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from fresh_schema("planrun_outage")


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    with TcpProxy.for_url(PG_URL) as p:
        yield p


async def completed(store: Any, run_id: str) -> int:
    try:
        return sum(t.status is Status.COMPLETED for t in (await store.load_tasks(run_id)).tasks)
    except Exception:
        return 0


async def outage_after(direct: Any, run_id: str, proxy: TcpProxy, count: int,
                       run: asyncio.Future[Any], marks: dict[str, float]) -> None:
    """Once ``count`` tasks completed (read past the proxy), hold the outage for 12 s."""
    while await completed(direct, run_id) < count:
        assert not run.done(), "the run ended before the outage"
        await asyncio.sleep(0.1)
    marks["down"] = time.time()
    proxy.down()
    await asyncio.sleep(OUTAGE_S)
    proxy.up()
    marks["up"] = time.time()


def check_run(result: Any, n: int, sent: Counter[str], marks: dict[str, float],
              proxy: TcpProxy) -> list[Any]:
    assert proxy.cut >= 1 and proxy.refused >= 1, (proxy.cut, proxy.refused)
    assert result.ok and result.audit.clean, result.audit
    assert {t.status for t in result.tasks.values()} == {Status.COMPLETED}
    done = [e for e in result.events if e.event == "completed"]
    assert len(done) == n and len({e.task for e in done}) == n
    # Each effect recorded once; its target saw every key, a key again only when the
    # outage cut the recording of a delivery (the same key: the target dedups by it).
    assert result.audit.duplicate_effects == 0
    effects = Counter(e.task for e in result.events if e.event == "effect")
    assert len(effects) == n and set(effects.values()) == {1}
    assert set(sent) == {f"{result.run_id}:{t}" for t in result.tasks}
    assert any(e.at >= marks["up"] for e in done)  # the run went on after the outage
    assert sum(e.at < marks["down"] for e in done) >= 1
    return done


def no_lost_exceptions(caplog: pytest.LogCaptureFixture) -> None:
    gc.collect()  # a task whose exception nobody retrieved is reported when collected
    lost = [r for r in caplog.records if "never retrieved" in r.getMessage()]
    assert lost == [], lost[0].getMessage()


def test_a_run_on_dbos_and_its_worker_processes_ride_out_a_12_s_outage(
    pg_url: str, proxy: TcpProxy, caplog: pytest.LogCaptureFixture
) -> None:
    """The process running the plan, its DBOS client and two worker processes all reach
    the database through the proxy: the outage cuts them all."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    url = proxy.url_for(pg_url)
    sent: Counter[str] = Counter()
    marks: dict[str, float] = {}
    run_id = f"outage-{uuid.uuid4().hex[:8]}"
    workers = [spawn_worker(url, f"w{i}", lease=LEASE, env={"DIST_APP_WORK_S": "0.05"})
               for i in range(2)]

    async def go() -> Any:
        direct = open_store(pg_url)
        await direct.open()
        try:
            run = asyncio.ensure_future(run_on_dbos(
                registry, (Task(id=f"T-{i:04d}", kind="triage", payload={"ticket": f"T-{i:04d}"})
                           for i in range(300)),
                url, lease=LEASE, run_id=run_id,
                effects={"triage": lambda t, key: sent.update([key])}))
            await outage_after(direct, run_id, proxy, 50, run, marks)
            return await asyncio.wait_for(run, 180)
        finally:
            await direct.close()

    try:
        result = asyncio.run(go())
    finally:
        stop_workers(workers)
    check_run(result, 300, sent, marks, proxy)
    no_lost_exceptions(caplog)
    print(f"\non DBOS: outage {marks['up'] - marks['down']:.1f} s, {proxy.cut} "
          f"connections cut, {proxy.refused} refused; 300 completed once each")


def test_the_supervisor_rides_out_a_12_s_outage_and_starts_nothing_meanwhile(
    pg_url: str, proxy: TcpProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="asyncio")
    url = proxy.url_for(pg_url)
    sent: Counter[str] = Counter()
    marks: dict[str, float] = {}
    starts: list[float] = []

    async def work(payload: Any, ctx: TaskContext) -> int:
        starts.append(time.time())
        await asyncio.sleep(0.1)
        return int(payload["n"])

    async def go() -> Any:
        store = open_store(url)
        await store.open()
        direct = open_store(pg_url)
        await direct.open()
        try:
            sup = Supervisor(Registry([KindSpec("k", handler=work)]), store=store,
                             effects={"k": lambda t, key: sent.update([key])})
            assert sup.store_patience == 120.0
            sup.add_tasks(Task(id=f"t{i}", kind="k", payload={"n": i}) for i in range(300))
            run = asyncio.ensure_future(sup.arun())
            await outage_after(direct, sup.run_id, proxy, 50, run, marks)
            return await asyncio.wait_for(run, 120)
        finally:
            await direct.close()
            await store.close()

    result = asyncio.run(go())
    check_run(result, 300, sent, marks, proxy)
    no_lost_exceptions(caplog)
    # Attempts started during the outage: only those started before the supervisor saw
    # its writes fail or stall (WRITE_STALL_S after a write began); none after that.
    early = [s for s in starts if marks["down"] <= s < marks["down"] + 2.0]
    later = [s for s in starts if marks["down"] + 2.0 <= s < marks["up"]]
    print(f"\nsupervisor: outage {marks['up'] - marks['down']:.1f} s, {proxy.cut} "
          f"connections cut, {proxy.refused} refused; handler starts in its first 2 s "
          f"{len(early)}, in the {marks['up'] - marks['down'] - 2.0:.0f} s after {len(later)}, "
          f"of {len(starts)}")
    assert len(starts) == 300  # nothing ran twice: no result was thrown away
    assert later == []
    assert len(early) < 100  # the 8 in flight, and what started before a write stalled
