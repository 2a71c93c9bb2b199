"""The process carrying a run on DBOS is killed with SIGKILL; ``planrun resume`` from another
process carries the run on with the same worker processes, and every task is completed once
and every effect applied once.

The dead process's attempts out on the queues are left to their workers; the resumed run
reclaims what the dead one had in flight and puts those attempts out again under new
fencing tokens, so a late outcome of an old attempt is refused.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from dbos_support import SRC, spawn_worker
from pgtest import fresh_schema

from planrun.core import EventName, Status, analyze
from planrun.stores import RunState, open_store

HERE = Path(__file__).parent
TASKS = 60


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from fresh_schema("planrun_owner_kill")


def _planrun(*argv: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "planrun.cli", *argv],
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), SRC]),
                                 **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def _stored(url: str, run_id: str | None = None) -> RunState | str | None:
    store = open_store(url)
    await store.open()
    try:
        if run_id is None:
            runs = await store.list_runs()
            return runs[0].id if runs else None
        return await store.load(run_id)
    finally:
        await store.close()


def test_the_process_carrying_a_run_is_killed_and_another_resumes_it(
        pg_url: str, tmp_path: Path) -> None:
    target = tmp_path / "target.db"
    env = {"KILL_APP_TARGET": str(target)}
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"goal": "sixty steps", "tasks": [
        {"kind": "step", "payload": {"n": i}, "depends_on": [i - 6] if i >= 6 else []}
        for i in range(TASKS)]}))
    workers = [spawn_worker(pg_url, f"w{i}", app="kill_app:app", lease=3.0, env=env)
               for i in range(2)]
    try:
        owner = _planrun("run", str(plan), "--app", "kill_app:app", "--db", pg_url,
                         "--workers", "external", "--stale-after", "3", "--quiet", env=env)
        run_id = None
        deadline = time.time() + 90
        while time.time() < deadline:
            assert owner.poll() is None, owner.communicate()[1][-3000:]
            run_id = run_id or asyncio.run(_stored(pg_url))
            if run_id is not None:
                state = asyncio.run(_stored(pg_url, str(run_id)))
                assert isinstance(state, RunState)
                if sum(t.status is Status.COMPLETED for t in state.tasks) >= TASKS // 4:
                    break
            time.sleep(0.1)
        assert run_id is not None
        owner.send_signal(signal.SIGKILL)
        owner.communicate(timeout=30)
        assert owner.returncode == -signal.SIGKILL

        again = _planrun("resume", str(run_id), "--db", pg_url, "--no-wait", "--json", env=env)
        out, err = again.communicate(timeout=300)
        assert again.returncode == 0, err[-3000:]
        assert json.loads(out)["ok"] is True
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        outputs = [w.communicate(timeout=60) for w in workers]

    state = asyncio.run(_stored(pg_url, str(run_id)))
    assert isinstance(state, RunState)
    tasks, events = state.tasks, state.events
    assert len(tasks) == TASKS and {t.status for t in tasks} == {Status.COMPLETED}
    completed = Counter(e.task for e in events if e.event == EventName.COMPLETED)
    assert len(completed) == TASKS and set(completed.values()) == {1}
    effects = Counter(e.task for e in events if e.event == EventName.EFFECT)
    assert len(effects) == TASKS and set(effects.values()) == {1}
    audit = analyze(tasks, events, effect_kinds=["step"])
    assert audit.clean, audit
    with sqlite3.connect(target) as conn:
        delivered = {k for (k,) in conn.execute("SELECT key FROM delivered")}
    assert delivered == {f"{run_id}:{t.id}" for t in tasks}
    for _, err in outputs:  # the workers saw the owner go and come back without a traceback
        assert "Traceback" not in err, err[-3000:]
