"""Ctrl-C at the command line: the run stops at once, says so in one line, and resumes.

Each case starts ``planrun run`` in a subprocess, waits until every handler is running
(each writes a marker file), sends SIGINT and waits with a generous guard: the handlers
would run for two minutes, so a run that waits for them fails the guard.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planrun.cli import main

SYNC_APP = """
import os, time
from pathlib import Path
from planrun import Registry

def slow(payload, ctx):
    Path(os.environ["MARKS"], ctx.task_id).write_text("started")
    time.sleep(float(os.environ.get("SLOW", "120")))
    return {"ok": True}

app = Registry()
app.register("slow", slow)
"""

ASYNC_APP = """
import asyncio, os
from pathlib import Path
from planrun import Registry
from planrun._facade import App
from planrun.core import WorkerSpec

async def slow(payload, ctx):
    Path(os.environ["MARKS"], ctx.task_id).write_text("started")
    await asyncio.sleep(float(os.environ.get("SLOW", "120")))
    return {"ok": True}

registry = Registry()
registry.register("slow", slow)
app = App(registry, [WorkerSpec(f"w{i}", {"slow": 1.0}, 4) for i in range(16)])
"""

GUARD_S = 30.0
"""Far below the handlers' two minutes; a hang guard, not a speed measure."""


def start(tmp_path: Path, source: str, tasks: int) -> tuple[subprocess.Popen[str], Path, str]:
    (tmp_path / "slowapp.py").write_text(source)
    plan = {"goal": "g", "tasks": [{"kind": "slow", "payload": {}, "depends_on": []}] * tasks}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    marks = tmp_path / "marks"
    marks.mkdir()
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    env = {**os.environ, "MARKS": str(marks)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "planrun", "run", "plan.json", "--app", "slowapp:app",
         "--quiet", "--db", db],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 120
    while len(list(marks.iterdir())) < tasks:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the run never started every task: {out} {err}")
        time.sleep(0.1)
    return proc, marks, db


def interrupt(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("Ctrl-C did not stop the run: it waited for the handlers")
    assert proc.returncode == 130, err
    return err


def test_ctrl_c_abandons_sync_handlers_and_leaves_the_run_resumable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    proc, marks, db = start(tmp_path, SYNC_APP, 3)
    err = interrupt(proc)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("planrun: interrupted; run "), err
    run_id = lines[0].split("run ", 1)[1].split()[0]
    assert f"planrun resume {run_id} --db {db}" in lines[0]

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MARKS", str(marks))
    monkeypatch.setenv("SLOW", "0")
    assert main(["resume", run_id, "--db", db, "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["counts"]["completed"] == 3


def test_ctrl_c_cancels_async_attempts_without_noise(tmp_path: Path) -> None:
    proc, _, _ = start(tmp_path, ASYNC_APP, 64)
    err = interrupt(proc)
    assert "Task was destroyed" not in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
