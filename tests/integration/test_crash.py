"""Crash and resume for real: a 500-task run killed with SIGKILL at ten points.

Each point kills a real process (SQLite file, PostgreSQL schema); the next process resumes
the run from the store and is killed at the next point; a last one finishes it. Every task
has an effect whose target is a table keyed by the effect key (a SQLite file of its own, or
a table in the run's PostgreSQL schema). The audit then reads the stored ledger: every task
completed exactly once, nothing missing, no order violation, every effect recorded once, no
task dead or cancelled, no restart counted as a reclaim; and the target table holds exactly
one row per task (a repeated delivery, if any, carries the same key and changes nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
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

JOB = Path(__file__).with_name("crash_job.py")

POINTS = [
    "event:assigned:40",     # work handed out, nothing started
    "event:failed:1",        # a transient failure with its backoff deadline
    "before_write:3",        # a batch about to be written
    "event:started:120",     # tasks in flight under the supervisor
    "event:completed:60",    # a worker's result in memory, not yet committed
    "event:retry:1",         # a retry coming due
    "after_write:4",         # a batch written, the next not yet
    "event:reclaimed:3",     # while reclaiming the previous crash's work
    "effect_applied:5",      # an effect reached its target, not yet recorded
    "event:effect:8",        # effects recorded
]


def run_job(url: str, run_id: str, mode: str, point: str, target: str) -> int:
    proc = subprocess.run(
        [sys.executable, str(JOB), url, run_id, mode, point, target],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode in (0, -9), proc.stderr[-2000:]
    return proc.returncode


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'crash.db'}"
        return
    yield from fresh_schema("planrun_crash")


async def load(url: str, run_id: str) -> object:
    store = open_store(url)
    await store.open()
    try:
        return await store.load(run_id)
    finally:
        await store.close()


def target_rows(target: str) -> tuple[list[tuple[str, str]], list[str]]:
    """The target table's rows (key, task) and the log of every delivery's key."""
    if target.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(target.removeprefix("sqlite:///"))) as conn:
            rows = conn.execute("SELECT key, task FROM delivered").fetchall()
            log = [k for (k,) in conn.execute("SELECT key FROM deliveries ORDER BY id")]
        return rows, log
    import psycopg

    with psycopg.connect(target) as conn:
        rows = conn.execute("SELECT key, task FROM delivered").fetchall()
        log = [k for (k,) in conn.execute("SELECT key FROM deliveries ORDER BY id")]
    return [(k, t) for k, t in rows], log


def test_killed_at_ten_points_then_resumed_everything_exactly_once(
    store_url: str, tmp_path: Path
) -> None:
    # The target: a SQLite file apart from the store's, or a table in the PG test schema.
    target = (f"sqlite:///{tmp_path / 'target.db'}" if store_url.startswith("sqlite")
              else store_url)
    run_id = "crash-" + uuid.uuid4().hex[:8]
    codes = [run_job(store_url, run_id, "start", POINTS[0], target)]
    codes += [run_job(store_url, run_id, "resume", p, target) for p in POINTS[1:]]
    assert codes.count(-9) >= 9, codes  # the points were really reached
    if codes[-1] != 0:
        assert run_job(store_url, run_id, "resume", "none:0", target) == 0

    state = asyncio.run(load(store_url, run_id))
    tasks, events = state.tasks, state.events  # type: ignore[attr-defined]
    assert len(tasks) == 500
    assert Counter(t.status for t in tasks) == {Status.COMPLETED: 500}
    assert not any(e.event in ("dead", "cancelled") for e in events)
    audit = analyze(tasks, events)
    assert audit.order_violations == 0 and audit.duplicates == 0 and audit.missing == []
    completions = Counter(e.task for e in events if e.event == "completed")
    assert len(completions) == 500 and set(completions.values()) == {1}
    # Restarts put in-flight work back without counting it: the job runs with
    # max_reclaims=0, so one counted reclaim would have made a task dead.
    assert any(e.event == "reclaimed" for e in events)  # the kills caught work in flight
    assert all(t.reclaims == 0 for t in tasks)
    # Effects: one record per task, applied; one 'effect' event each.
    ids = {t.id for t in tasks}
    effects = state.effects  # type: ignore[attr-defined]
    assert set(effects) == ids and {r.state for r in effects.values()} == {"applied"}
    assert audit.duplicate_effects == 0
    effect_events = Counter(e.task for e in events if e.event == "effect")
    assert len(effect_events) == 500 and set(effect_events.values()) == {1}
    # The target table: exactly one row per task, keyed by the effect key.
    rows, deliveries = target_rows(target)
    assert len(rows) == 500
    assert dict(rows) == {f"{run_id}:{t}": t for t in ids}
    # Repeat deliveries carry the same key and hit the unique key: only effects caught
    # between applying and recording by a kill are delivered again.
    repeats = len(deliveries) - len(set(deliveries))
    assert set(deliveries) == {k for k, _ in rows}
    assert repeats < 50  # a few, caught by a kill between applying and recording
    print(f"\n{store_url.split(':')[0]}: exit codes {codes}; 500 completions, "
          f"{len(effect_events)} effects, {len(rows)} target rows, {repeats} repeated "
          f"deliveries refused by the unique key, "
          f"{sum(1 for e in events if e.event == 'reclaimed')} restarts' reclaims")
