"""A fan-out run killed with SIGKILL while it grows, then resumed: nothing half-added,
nothing added twice.

Each point kills a real process (SQLite file, PostgreSQL schema): with a spawner's
completion and part of its addition in memory but not committed, right after it, before
and after a batch write. The stored run, once finished by resumes, has every spawned task
exactly once, every completion once, and the join waited for all of them.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from pgtest import fresh_schema

from planrun.core._ledger import analyze
from planrun.core._task import Status
from planrun.stores import open_store

JOB = Path(__file__).with_name("spawn_crash_job.py")
FETCHES, FAN = 20, 10

POINTS = [
    "event:created:26",   # the third addition half handed to the batch (created events)
    "event:completed:4",  # a spawner's completion in memory, its addition not yet
    "event:joined:3",     # the join widened in memory, not committed
    "before_write:2",     # a batch holding completions and additions about to be written
    "after_write:3",      # a batch written, the next not yet
    "event:created:40",
]


def run_job(url: str, run_id: str, mode: str, point: str) -> int:
    proc = subprocess.run([sys.executable, str(JOB), url, run_id, mode, point],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, -9), proc.stderr[-2000:]
    return proc.returncode


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'spawn-crash.db'}"
        return
    yield from fresh_schema("planrun_spawn_crash")


async def load(url: str, run_id: str) -> object:
    store = open_store(url)
    await store.open()
    try:
        return await store.load(run_id)
    finally:
        await store.close()


def test_a_growing_run_killed_and_resumed_adds_each_task_once(store_url: str) -> None:
    run_id = "spawn-" + uuid.uuid4().hex[:8]
    codes = [run_job(store_url, run_id, "start", POINTS[0])]
    codes += [run_job(store_url, run_id, "resume", p) for p in POINTS[1:]]
    assert codes.count(-9) >= 4, codes  # the points were really reached
    if codes[-1] != 0:
        assert run_job(store_url, run_id, "resume", "none:0") == 0

    state = asyncio.run(load(store_url, run_id))
    tasks, events = state.tasks, state.events  # type: ignore[attr-defined]
    by_id = {t.id: t for t in tasks}
    expected = {f"f{i}/{j}" for i in range(FETCHES) for j in range(FAN)}
    assert {t.id for t in tasks if t.parent} == expected
    assert len(tasks) == FETCHES + FETCHES * FAN + 1
    assert Counter(t.status for t in tasks) == {Status.COMPLETED: len(tasks)}
    assert Counter(e.task for e in events if e.event == "created") == Counter(list(by_id))
    assert set(Counter(e.task for e in events if e.event == "completed").values()) == {1}
    for i in range(FETCHES):  # each spawner's completion is stored with its whole addition
        done = next(e.seq for e in events if e.task == f"f{i}" and e.event == "completed")
        made = [e.seq for e in events if e.event == "created" and e.task.startswith(f"f{i}/")]
        assert len(made) == FAN and all(seq > done for seq in made)
    assert set(by_id["sum"].depends_on) == {f"f{i}" for i in range(FETCHES)} | expected
    assert by_id["sum"].result == FETCHES + FETCHES * FAN
    audit = analyze(tasks, events)
    assert audit.order_violations == 0 and audit.duplicates == 0 and audit.missing == []
