"""Eight worker processes, 2,000 tickets, one PostgreSQL database, and real faults.

While the run goes on, two workers are killed with SIGKILL and a third is frozen with
SIGSTOP for more than twice its lease, then let go with SIGCONT. The run must still end
with exactly 2,000 completions and 2,000 replies; what the frozen worker finishes after it
wakes was reclaimed meanwhile, so the database refuses it; and a frozen process (whose
connection may sit inside a transaction) must not hold the others up: the five workers
left keep at least half the rate they had before the freeze.

The figures (rates, refusals, duration) are printed with ``-s``.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dist_app import registry
from pgtest import fresh_schema

from planrun.core._errors import StoreError
from planrun.core._task import Status, Task
from planrun.runtime._distributed import Coordinator
from planrun.stores import open_store

HERE = Path(__file__).resolve().parent
TASKS = 2000
LEASE = 3.0          # every worker's lease, and the coordinator's stale_after
FROZEN_FOR = 2 * LEASE + 1.0
WORK_S = "0.2"       # pretend work per ticket: the run lasts long enough to measure


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from fresh_schema("planrun_wfault")


def spawn(url: str, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "planrun.cli", "worker", "--db", url, "--app", "dist_app:app",
         "--name", name, "--concurrency", "4", "--mode", "push", "--lease", str(LEASE),
         "--idle-exit", "120"],
        env={**os.environ, "PYTHONPATH": str(HERE), "DIST_APP_WORK_S": WORK_S},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


async def progress(store: Any, run_id: str, worker: str) -> tuple[int, int]:
    """Tasks completed, and tasks ``worker`` is running."""
    try:
        state = await store.load_tasks(run_id)
    except StoreError:  # the coordinator has not created the run yet
        return 0, 0
    return (sum(t.status is Status.COMPLETED for t in state.tasks),
            sum(t.status is Status.RUNNING and t.assigned_to == worker for t in state.tasks))


def rate(events: list[Any], workers: set[str], start: float, end: float) -> float:
    n = sum(1 for e in events if e.event == "completed" and e.worker in workers
            and start <= e.at < end)
    return n / (end - start)


def test_two_workers_killed_one_frozen_past_its_lease_2000_exactly(pg_url: str) -> None:
    sent: Counter[str] = Counter()
    names = [f"w{i}" for i in range(8)]
    killed, frozen = {"w0", "w1"}, "w2"
    others = set(names) - killed - {frozen}
    marks: dict[str, float] = {}
    workers = {n: spawn(pg_url, n) for n in names}

    async def faults(store: Any, run_id: str, run: asyncio.Future[Any]) -> None:
        async def until(count: int, not_before: float = 0.0) -> None:
            """Until ``count`` completions and the worker to freeze is running something."""
            while not run.done():
                if time.time() >= not_before:
                    done, running = await progress(store, run_id, frozen)
                    if done >= count and running:
                        return
                await asyncio.sleep(0.1)
            raise AssertionError(f"the run ended before {count} completions")

        await until(TASKS * 15 // 100)
        marks["killed"] = time.time()
        for n in killed:
            workers[n].send_signal(signal.SIGKILL)
        # the kills' leases run out and their tasks go to the others before the freeze
        await until(TASKS * 30 // 100, not_before=marks["killed"] + LEASE + 2.0)
        marks["frozen"] = time.time()
        workers[frozen].send_signal(signal.SIGSTOP)
        await asyncio.sleep(FROZEN_FOR)
        marks["thawed"] = time.time()
        workers[frozen].send_signal(signal.SIGCONT)

    async def go() -> Any:
        store = open_store(pg_url)
        await store.open()
        probe = open_store(pg_url)
        await probe.open()
        try:
            coordinator = Coordinator(registry, store, poll=0.1, stale_after=LEASE,
                                      effects={"triage": lambda t, key: sent.update([key])})
            run = asyncio.ensure_future(coordinator.arun(
                Task(id=f"T-{i:04d}", kind="triage", payload={"ticket": f"T-{i:04d}"})
                for i in range(TASKS)))
            injector = asyncio.ensure_future(faults(probe, coordinator.run_id, run))
            result = await asyncio.wait_for(run, 240)
            await injector
            return result
        finally:
            await probe.close()
            await store.close()

    started = time.time()
    try:
        result = asyncio.run(go())
    finally:
        for w in workers.values():
            if w.poll() is None:
                w.send_signal(signal.SIGCONT)
                w.send_signal(signal.SIGTERM)
        outputs = {n: w.communicate(timeout=60) for n, w in workers.items()}
    took = time.time() - started

    # Exactly 2,000: every ticket completed once, every reply sent once, nothing lost.
    assert result.ok and result.audit.clean, result.audit
    assert {t.status for t in result.tasks.values()} == {Status.COMPLETED}
    completed = [e for e in result.events if e.event == "completed"]
    assert len(completed) == TASKS and len({e.task for e in completed}) == TASKS
    assert len(sent) == TASKS and set(sent.values()) == {1}
    assert not any(e.event in ("dead", "cancelled") for e in result.events)

    for n in set(names) - killed:  # faults are logged in a line, never as a traceback
        err = outputs[n][1]
        assert "Task exception was never retrieved" not in err and "Traceback" not in err, err

    # The killed workers' tasks were reclaimed and finished by others.
    reclaimed = Counter(e.worker for e in result.events if e.event == "reclaimed")
    assert all(reclaimed[n] >= 1 for n in killed), reclaimed
    assert all(workers[n].returncode == -signal.SIGKILL for n in killed)

    # The frozen worker's tasks were reclaimed while it slept; what it finished after it
    # woke carried the old fencing token and the database refused it.
    assert reclaimed[frozen] >= 1, reclaimed
    assert workers[frozen].returncode == 0, outputs[frozen][1][-2000:]
    summary = re.search(rf"worker {frozen}: (\d+) completed, (\d+) refused", outputs[frozen][1])
    assert summary, outputs[frozen][1][-2000:]
    # Refused by the database (a stale token), or, when its first write after waking
    # failed, dropped by the worker itself (past its lease it never retries a result).
    refused = int(summary.group(2))
    dropped = outputs[frozen][1].count("dropping the result of")
    assert refused + dropped >= 1, outputs[frozen][1][-2000:]
    taken_back = {e.task for e in result.events if e.event == "reclaimed" and e.worker == frozen}
    held = {(e.task, e.attempt) for e in result.events  # the attempts it held when frozen
            if e.event == "started" and e.worker == frozen and e.task in taken_back}
    assert held and not any((e.task, e.attempt) in held for e in completed)

    # The five others keep at least half their pace while one process is frozen.
    before = rate(result.events, others, marks["killed"] + LEASE + 1.0, marks["frozen"])
    during = rate(result.events, others, marks["frozen"], marks["thawed"])
    print(f"\n{TASKS} tasks in {took:.1f} s; others' rate before the freeze {before:.1f}/s, "
          f"during {during:.1f}/s; frozen worker: {refused} late results refused, "
          f"{dropped} dropped; "
          f"reclaimed per worker {dict(reclaimed)}")
    assert before > 0
    assert during >= 0.5 * before, (before, during)
