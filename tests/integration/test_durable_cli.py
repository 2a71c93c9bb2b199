"""The durable side of the command line: run --db, runs, status, resume, a database down."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pgtest import PG_URL, fresh_schema, require_pg

from planrun.cli import main
from planrun.core._registry import KindSpec, Registry, TaskContext
from planrun.core._task import Task
from planrun.runtime._supervisor import Supervisor
from planrun.stores import open_store

HERE = Path(__file__).resolve().parent


def plan_file(tmp_path: Path, n: int = 40) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"goal": "tickets", "tasks": [
        {"kind": "triage", "payload": {"ticket": f"T-{i}"}, "depends_on": []} for i in range(n)
    ]}))
    return path


def cli(*argv: str, env: dict[str, str] | None = None, timeout: float = 120) -> Any:
    return subprocess.run([sys.executable, "-m", "planrun.cli", *argv], capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(HERE), **(env or {})})


def test_run_runs_status_and_resume_after_a_kill(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    plan = plan_file(tmp_path)
    slow = {"DIST_APP_SLOW": ",".join(f"t{i}" for i in range(20, 40)), "DIST_APP_SLOW_S": "60",
            "PLANRUN_OWNER_TTL": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "planrun.cli", "run", str(plan), "--app", "dist_app:app",
         "--db", db, "--quiet"],
        env={**os.environ, "PYTHONPATH": str(HERE), **slow},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        # `runs` opens the new file while `run` creates it: both must get through.
        deadline = time.time() + 60
        run_id, listed = None, None
        while time.time() < deadline and proc.poll() is None:
            listed = cli("runs", "--db", db, "--json")
            runs = json.loads(listed.stdout) if listed.returncode == 0 and listed.stdout else []
            if runs and runs[0]["counts"]["completed"] >= 20:
                run_id = runs[0]["id"]
                break
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)  # the supervisor dies with 20 tasks in flight
        _, run_err = proc.communicate(timeout=30)
    assert run_id is not None, (run_err[-2000:], listed and listed.stderr[-2000:])

    deadline = time.time() + 20  # the dead supervisor's owner lease runs out
    while time.time() < deadline:
        snapshot = json.loads(cli("status", run_id, "--db", db, "--json").stdout)
        if snapshot["run_status"] == "interrupted":
            break
        time.sleep(0.2)
    assert snapshot["counts"]["completed"] >= 20 and snapshot["run_status"] == "interrupted"
    assert snapshot["recorded_status"] == "running"
    assert snapshot["oldest_unfinished_s"] is not None
    assert sum(snapshot["active_by_worker"].values()) > 0
    text = cli("status", run_id, "--db", db).stdout
    assert "tasks by status" in text and "oldest unfinished task" in text

    resumed = cli("resume", run_id, "--db", db, "--json")  # the app comes from the run
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    assert report["counts"]["completed"] == 40
    assert report["audit"]["duplicates"] == 0 and report["audit"]["missing"] == []
    watched = cli("status", run_id, "--db", db, "--watch", "--interval", "0.1")
    assert watched.returncode == 0 and "completed 40" in watched.stdout
    listed = cli("runs", "--db", db)
    assert run_id in listed.stdout and "finished" in listed.stdout


def test_postgres_down_at_start_is_one_line_with_the_password_masked(tmp_path: Path) -> None:
    url = "postgresql://planrun:s3cret-pass@127.0.0.1:1/nowhere"
    for argv in (["run", str(plan_file(tmp_path)), "--app", "dist_app:app", "--db", url],
                 ["runs", "--db", url], ["worker", "--db", url, "--app", "dist_app:app"]):
        proc = cli(*argv, timeout=60)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("planrun: error:")
        assert "127.0.0.1:1" in lines[0] and "s3cret-pass" not in proc.stderr
        assert "***" in lines[0]


def test_unknown_run_and_missing_db_are_clear(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'x.db'}"
    assert main(["status", "nope", "--db", db]) == 2  # a typo is not a new empty database
    assert "no database file" in capsys.readouterr().err
    assert not (tmp_path / "x.db").exists()

    async def create() -> None:
        store = open_store(db)
        await store.open()
        await store.close()

    asyncio.run(create())
    assert main(["status", "nope", "--db", db]) == 2
    assert "unknown run 'nope'" in capsys.readouterr().err
    assert main(["resume", "nope", "--db", db]) == 2
    assert main(["runs", "--db", "mysql://x"]) == 2
    err = capsys.readouterr().err
    assert "unknown run" in err and "mysql" in err


def test_database_restarted_mid_run_loses_no_task() -> None:
    require_pg()
    import psycopg

    app_name = f"planrun-restart-{os.getpid()}"
    # A schema of its own: the server's public schema may hold another version's tables.
    schema_url = next(schemas := fresh_schema("planrun_restart"))
    url = f"{schema_url}&application_name={app_name}"
    kicked = 0

    async def work(payload: Any, ctx: TaskContext) -> int:
        nonlocal kicked
        await asyncio.sleep(0.005)
        if ctx.task_id in ("t50", "t120") and kicked < 2:
            kicked += 1
            # Every connection of this run is cut, as a server restart would.
            with psycopg.connect(PG_URL, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE application_name = %s", (app_name,))
        return int(payload["n"])

    async def go() -> Any:
        store = open_store(url)
        await store.open()
        try:
            sup = Supervisor(Registry([KindSpec("k", handler=work)]), store=store,
                             store_patience=60)
            sup.add_tasks(Task(id=f"t{i}", kind="k", payload={"n": i}) for i in range(200))
            result = await sup.arun()
            return result, await store.load(sup.run_id)
        finally:
            await store.close()

    try:
        result, state = asyncio.run(go())
    finally:
        next(schemas, None)  # drops the schema
    assert kicked == 2
    assert result.ok
    assert sum(1 for t in state.tasks if t.status.value == "completed") == 200
    completed = [e for e in state.events if e.event == "completed"]
    assert len({e.task for e in completed}) == 200


def test_a_run_on_dbos_resumes_under_the_policies_it_started_with(tmp_path: Path) -> None:
    from planrun.core._task import Status, transition
    from planrun.stores import RunInfo

    db = f"sqlite:///{tmp_path / 'policy.db'}"
    meta = {"app": "dist_app:app", "workers": "external", "on_dead": "abort_run",
            "stale_after": 5.0, "retry_budget": 0}
    old = {"app": "dist_app:app", "coordinated": True, "mode": "push"}

    async def prepare() -> None:
        store = open_store(db)
        await store.open()
        for run_id, run_meta in (("run-policy", meta), ("run-old", old)):
            dead = transition(Task(id="a", kind="triage", payload={"ticket": "a"}),
                              Status.DEAD, error="boom")
            await store.create_run(RunInfo(run_id, time.time(), meta=run_meta))
            await store.add_tasks(run_id, [dead, Task(id="b", kind="triage")], [])
        await store.close()

    async def load(run_id: str) -> Any:
        store = open_store(db)
        await store.open()
        try:
            return await store.load(run_id)
        finally:
            await store.close()

    asyncio.run(prepare())
    # Under the default policy "b" would wait for a worker; under abort_run it is cancelled.
    resumed = cli("resume", "run-policy", "--db", db, timeout=60)
    assert resumed.returncode == 1, resumed.stderr
    b = next(t for t in asyncio.run(load("run-policy")).tasks if t.id == "b")
    assert b.status is Status.CANCELLED and b.cause == "abort: a died"
    # A run the earlier engine coordinated is refused in one line, and left as it was.
    refused = cli("resume", "run-old", "--db", db, timeout=60)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "before worker processes ran on DBOS" in refused.stderr
    b = next(t for t in asyncio.run(load("run-old")).tasks if t.id == "b")
    assert b.status is Status.PENDING


def test_run_records_its_retry_budget_for_resume(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'budget.db'}"
    plan = plan_file(tmp_path, n=3)
    done = cli("run", str(plan), "--app", "dist_app:app", "--db", db, "--quiet",
               "--retry-budget", "3")
    assert done.returncode == 0, done.stderr
    bad = cli("run", str(plan), "--app", "dist_app:app", "--retry-budget", "-1")
    assert bad.returncode == 2 and "must be >= 0" in bad.stderr

    async def meta() -> Any:
        store = open_store(db)
        await store.open()
        try:
            [run] = await store.list_runs()
            return (await store.load(run.id)).run.meta
        finally:
            await store.close()

    assert asyncio.run(meta())["retry_budget"] == 3


def wait_for_progress(db: str, proc: subprocess.Popen[str], done: int) -> dict[str, Any]:
    """Poll ``planrun runs --json`` until the one run has ``done`` completed tasks."""
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        listed = cli("runs", "--db", db, "--json")
        runs = json.loads(listed.stdout) if listed.returncode == 0 and listed.stdout else []
        if runs and runs[0]["counts"]["completed"] >= done:
            return dict(runs[0])
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"no progress: {proc.communicate()[1][-2000:]}")


def test_one_owner_a_killed_run_shows_interrupted_and_a_finished_one_says_so(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    ttl = {"PLANRUN_OWNER_TTL": "1.5"}
    slow = {"DIST_APP_SLOW": ",".join(f"t{i}" for i in range(10, 20)), "DIST_APP_SLOW_S": "60",
            **ttl}
    proc = subprocess.Popen(
        [sys.executable, "-m", "planrun.cli", "run", str(plan_file(tmp_path, 20)), "--app",
         "dist_app:app", "--db", db, "--quiet"],
        env={**os.environ, "PYTHONPATH": str(HERE), **slow},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        live = wait_for_progress(db, proc, 10)
        run_id = live["id"]
        assert live["status"] == "running" and live["owner"], live
        # A resume that will not wait while the owner lives is refused, in one line naming
        # the owner.
        second = cli("resume", run_id, "--db", db, "--no-wait", env=ttl)
        assert second.returncode == 2
        assert second.stderr.count("\n") == 1 and f"is owned by {live['owner']}" in second.stderr
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)

    time.sleep(2.0)  # the dead owner's lease runs out
    [dead] = json.loads(cli("runs", "--db", db, "--json").stdout)
    assert (dead["status"], dead["recorded_status"]) == ("interrupted", "running")
    assert f"{run_id}  interrupted" in cli("runs", "--db", db).stdout
    snapshot = json.loads(cli("status", run_id, "--db", db, "--json").stdout)
    assert snapshot["run_status"] == "interrupted"
    assert "[interrupted]" in cli("status", run_id, "--db", db).stdout

    resumed = cli("resume", run_id, "--db", db, "--quiet", env=ttl)
    assert resumed.returncode == 0, resumed.stderr
    [ended] = json.loads(cli("runs", "--db", db, "--json").stdout)
    assert (ended["status"], ended["owner"]) == ("finished", None)
    again = cli("resume", run_id, "--db", db)
    assert again.returncode == 0 and again.stderr == ""
    assert again.stdout == f"run {run_id} is already finished (completed 20); nothing to resume\n"


def test_ctrl_c_on_a_local_run_leaves_it_interrupted_not_failed(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    slow = {"DIST_APP_SLOW": "t9", "DIST_APP_SLOW_S": "60"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "planrun.cli", "run", str(plan_file(tmp_path, 10)), "--app",
         "dist_app:app", "--db", db, "--quiet"],
        env={**os.environ, "PYTHONPATH": str(HERE), **slow},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        run_id = wait_for_progress(db, proc, 9)["id"]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode == 130
    [stopped] = json.loads(cli("runs", "--db", db, "--json").stdout)
    assert (stopped["id"], stopped["status"], stopped["recorded_status"]) == (
        run_id, "interrupted", "interrupted")
