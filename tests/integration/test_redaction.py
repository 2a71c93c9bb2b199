"""No API key, and nothing shaped like one, in any text a failed task leaves behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from leaky_app import OTHER_KEY, app
from pgtest import fresh_schema

from planrun._facade import plan_and_run
from planrun.core._redact import redact, register_secret
from planrun.obs._console import report_table
from planrun.stores import open_store

HERE = Path(__file__).resolve().parent
ENV_KEY = "local-gateway-key-4f9d2c7a1b"
"""Not ``sk-`` shaped: only its being the configured key gets it redacted."""
PLAN = {"goal": "echo", "tasks": [{"kind": "echo", "payload": {}, "depends_on": []}]}


def _clean(text: str) -> None:
    assert ENV_KEY not in text
    assert OTHER_KEY not in text
    assert "sk-svcacct" not in text


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)


def test_redact_replaces_registered_env_and_key_shaped_secrets() -> None:
    register_secret("registered-secret-0001")
    text = redact(f"a {ENV_KEY} b {OTHER_KEY} c registered-secret-0001 d short")
    assert text == "a [redacted] b sk-[redacted] c [redacted] d short"
    register_secret("x")  # too short to register: "x" stays in every text
    assert redact("x marks the spot") == "x marks the spot"


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'runs.db'}"
    else:
        yield from fresh_schema()


def test_task_error_events_and_report_are_redacted(store_url: str) -> None:
    report = plan_and_run(PLAN, app, store=store_url)
    (task,) = report.tasks
    assert task.status == "dead" and task.error is not None
    assert "[redacted]" in task.error and "sk-[redacted]" in task.error
    assert "second line" in task.error  # redaction removes the secret, not the message
    _clean(task.error)
    _clean(json.dumps(report.to_dict()))
    _clean(report.summary())
    _clean(str(report_table(report)))
    stored_events = [e for e in report.events if e.event == "dead"]
    assert stored_events
    for event in report.events:
        _clean(json.dumps(event.to_dict()))
    if store_url != "memory://":
        _clean(_stored_text(store_url, report.run_id))


def _stored_text(url: str, run_id: str) -> str:
    import asyncio

    async def read() -> str:
        store = open_store(url)
        await store.open()
        try:
            state = await store.load(run_id)
            return json.dumps([t.error for t in state.tasks]) + json.dumps(
                [e.to_dict() for e in state.events])
        finally:
            await store.close()

    return asyncio.run(read())


@pytest.mark.parametrize("as_json", [True, False])
def test_cli_output_is_redacted(tmp_path: Path, as_json: bool) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    args = [sys.executable, "-m", "planrun.cli", "run", str(plan), "--app", "leaky_app:app",
            "--db", f"sqlite:///{tmp_path / 'runs.db'}", "--quiet", *(["--json"] * as_json)]
    env = {**os.environ, "PYTHONPATH": str(HERE), "OPENAI_API_KEY": ENV_KEY, "COLUMNS": "300"}
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1, done.stderr
    _clean(done.stdout + done.stderr)
    assert "redacted" in done.stdout
    if as_json:
        (task,) = json.loads(done.stdout)["tasks"]
        assert task["status"] == "dead" and "sk-[redacted]" in task["error"]
