"""Crash and resume for real: a 500-task run killed with SIGKILL at ten points.

Each point kills a real process (SQLite file, PostgreSQL schema); the next process resumes
the run from the store and is killed at the next point; a last one finishes it. The audit
then reads the stored ledger: every task completed exactly once, nothing missing, no order
violation, every effect recorded once, and the effect target saw each key (a repeated
delivery, if any, carries the same key).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from pgtest import fresh_schema

from planrun.ledger import analyze
from planrun.stores import open_store
from planrun.task import Status

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


def run_job(url: str, run_id: str, mode: str, point: str, outbox: Path) -> int:
    proc = subprocess.run(
        [sys.executable, str(JOB), url, run_id, mode, point, str(outbox)],
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


def test_killed_at_ten_points_then_resumed_everything_exactly_once(
    store_url: str, tmp_path: Path
) -> None:
    outbox = tmp_path / "outbox.jsonl"
    run_id = "crash-" + uuid.uuid4().hex[:8]
    codes = [run_job(store_url, run_id, "start", POINTS[0], outbox)]
    codes += [run_job(store_url, run_id, "resume", p, outbox) for p in POINTS[1:]]
    assert codes.count(-9) >= 9, codes  # the points were really reached
    if codes[-1] != 0:
        assert run_job(store_url, run_id, "resume", "none:0", outbox) == 0

    state = asyncio.run(load(store_url, run_id))
    tasks, events = state.tasks, state.events  # type: ignore[attr-defined]
    assert len(tasks) == 500
    assert Counter(t.status for t in tasks) == {Status.COMPLETED: 500}
    audit = analyze(tasks, events)
    assert audit.order_violations == 0 and audit.duplicates == 0 and audit.missing == []
    completions = Counter(e.task for e in events if e.event == "completed")
    assert set(completions.values()) == {1}
    # Effects: one record per send task, applied; one 'effect' event each.
    sends = {t.id for t in tasks if t.kind == "send"}
    effects = state.effects  # type: ignore[attr-defined]
    assert set(effects) == sends and {r.state for r in effects.values()} == {"applied"}
    assert audit.duplicate_effects == 0
    assert Counter(e.task for e in events if e.event == "effect") == Counter(sends)
    delivered = [json.loads(line) for line in outbox.read_text().splitlines()]
    keys = {d["key"] for d in delivered}
    assert keys == {f"{run_id}:{t}" for t in sends}
    # Repeat deliveries carry the same key: only effects caught between applying and
    # recording by a kill are delivered again, and the target dedups them by key.
    repeats = Counter(d["key"] for d in delivered)
    assert sum(n - 1 for n in repeats.values()) < len(keys)
    # the crashed attempts were reclaimed, never counted as failures of the task
    assert any(e.event == "reclaimed" for e in events)
