"""Resume right after a crash: a 100-task run killed with SIGKILL ten times, 1.2-1.8 s
apart, with ``planrun resume`` started after each kill, finishes every task once and
applies every effect once.

The owner named in the run is a process of this host that no longer exists, so each
resume takes the run over at once instead of waiting out the dead owner's lease.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from planrun.core import EventName, Status, analyze
from planrun.stores import RunState, open_store

HERE = Path(__file__).parent
TASKS, KILLS = 150, 10  # enough work left at the tenth kill (about 15 s in)


def _planrun(*argv: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "planrun.cli", *argv],
                            env={**os.environ, "PYTHONPATH": str(HERE), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run_id(path: Path, proc: subprocess.Popen[str]) -> str:
    """The run's id, once the first process has created it."""
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if path.exists():
            with sqlite3.connect(path, timeout=30) as conn:
                try:
                    row = conn.execute("SELECT id FROM planrun_runs").fetchone()
                except sqlite3.OperationalError:  # the schema is not there yet
                    row = None
            if row:
                return str(row[0])
        time.sleep(0.05)
    raise AssertionError(f"the run never appeared: {proc.communicate()[1][-2000:]}")


def test_ten_kills_each_followed_by_a_resume_finish_every_task_and_effect_once(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    target = tmp_path / "target.db"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"goal": "steps", "tasks": [
        {"kind": "step", "payload": {"n": i}, "depends_on": [i - 10] if i >= 10 else []}
        for i in range(TASKS)]}))
    env = {"KILL_APP_TARGET": str(target)}
    rng = random.Random(7)

    proc = _planrun("run", str(plan), "--app", "kill_app:app", "--db", db, "--quiet", env=env)
    run_id = _run_id(tmp_path / "runs.db", proc)
    for kill in range(KILLS):
        time.sleep(rng.uniform(1.2, 1.8))
        assert proc.poll() is None, (kill, proc.communicate()[1][-2000:])
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        # Resumed at once, though the dead process's 30 s lease has not run out.
        proc = _planrun("resume", run_id, "--db", db, "--no-wait", "--quiet", env=env)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]

    async def stored(run: str) -> RunState:
        store = open_store(db)
        await store.open()
        try:
            return await store.load(run)
        finally:
            await store.close()

    state = asyncio.run(stored(run_id))
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
