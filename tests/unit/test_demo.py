"""`planrun demo`: the offline main job, from the shipped fixtures."""

from __future__ import annotations

import io
import json

import pytest
from conftest import FAKE_BASE_URL, FAKE_KEY
from rich.console import Console

from planrun.cli import main
from planrun.core._errors import UsageError
from planrun.dev.demo import cassette_path, run_demo
from planrun.dev.testing import FakeOpenAI
from planrun.examples import answers


def console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=120, force_terminal=False), buffer


def test_brief_demo_shows_goal_plan_progress_and_report() -> None:
    out, buffer = console()
    report = run_demo("brief", console=out)
    text = buffer.getvalue()
    assert report.ok and report.counts["completed"] == 6
    assert "produce a competitive brief on the European payments market" in text
    assert "validated after 2 model call(s), 1 repair(s)" in text
    assert "write_brief" in text and "after 3, 4" in text  # the tree shows dependencies
    assert "6/6 finished" in text  # the live progress line
    assert "audit: clean" in text and "usage: 8 requests" in text and "$" in text


def test_tickets_demo_sends_each_reply_once() -> None:
    out, buffer = console()
    report = run_demo("tickets", console=out)
    text = buffer.getvalue()
    assert report.counts["completed"] == 400 and report.audit.duplicate_effects == 0
    sent = int(text.split("replies sent: ")[1].split(" ")[0])
    flagged = int(text.split("flagged for a human: ")[1].split()[0].rstrip(","))
    assert sent + flagged == 200 and flagged > 0
    approved = int(text.split("sent after approval: ")[1].split()[0])
    assert approved > 0
    assert approved == sum(1 for e in report.events if e.event == "waiting")


def test_triage_demo_grows_from_one_task_and_holds_security_replies() -> None:
    out, buffer = console()
    report = run_demo("triage", console=out)
    text = buffer.getvalue()
    spawned = [t for t in report.result.tasks.values() if t.parent == "t0"]
    # one fetch task in the plan; 20 classify + 20 draft + 1 summary spawned by it
    assert len(report.tasks) == 42 and len(spawned) == 41
    assert report.ok and report.audit.clean and report.audit.duplicate_effects == 0
    assert "42/42 finished" in text
    sent = int(text.split("replies sent: ")[1].split(" ")[0])
    flagged = int(text.split("flagged for a human: ")[1].split()[0].rstrip(","))
    assert sent + flagged == 20
    approved = int(text.split("sent after approval: ")[1].split()[0])
    assert approved == sum(1 for e in report.events if e.event == "waiting") > 0


def test_demo_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "release"]) == 0
    assert "audit: clean" in capsys.readouterr().out
    assert main(["demo", "nope"]) == 2


def test_live_demo_without_a_key_names_the_variable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--live"]) == 2
    err = capsys.readouterr().err
    assert "OPENAI_API_KEY" in err and len(err.strip().splitlines()) == 1


def test_unknown_demo_and_missing_fixture() -> None:
    with pytest.raises(UsageError, match="unknown demo"):
        run_demo("nope")
    with pytest.raises(UsageError,
                       match=r"no cassette 'does-not-exist': not a file, and planrun ships"):
        cassette_path("does-not-exist")


def test_a_live_demo_names_the_code_repairs_of_its_plan(
    fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", FAKE_BASE_URL)
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    fake_openai.answers.update(answers.answers())
    tasks = json.loads(json.dumps(answers.BRIEF_PLAN["tasks"]))
    tasks[3]["depends_on"] = [0, 1, 3]  # an analysis that waits for itself
    fake_openai.answers["plan"] = {"tasks": tasks}
    out, buffer = console()
    report = run_demo("brief", console=out, live=True)
    assert report.ok
    assert "validated after 1 model call(s), 1 code repair(s)" in buffer.getvalue()
