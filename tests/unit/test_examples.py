"""Each worked example end to end through plan_and_run, with the model mocked over HTTP."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from conftest import fake_model

from planrun._facade import App, plan_and_run
from planrun.core._registry import TaskContext
from planrun.dev.testing import FakeOpenAI, Scripted
from planrun.examples import answers, brief, release, tickets
from planrun.examples.ticket_data import LANGUAGES, generate_tickets, ground_truth
from planrun.runtime._clock import VirtualClock


@pytest.fixture
def fake(fake_openai: FakeOpenAI) -> FakeOpenAI:
    fake_openai.answers.update(answers.answers())
    return fake_openai


def test_ticket_triage_sends_each_reply_once_and_flags_humans(fake: FakeOpenAI) -> None:
    app, outbox, desk = tickets.make_app(workers=4, capacity=3)
    batch = generate_tickets(30, seed=0)
    report = plan_and_run(tickets.ticket_plan(batch, app.registry), app, model=fake_model())
    assert report.ok and report.counts["completed"] == 60
    assert len(fake.requests) == 60
    truth = ground_truth(30)
    humans = {tid for tid, (cat, urg) in truth.items() if cat == "security" or urg == "critical"}
    assert set(desk.flagged.values()) == humans
    assert len(outbox.sent) + len(desk.flagged) == 30 and outbox.attempts == len(outbox.sent)
    sent = {r["ticket_id"]: r for r in outbox.sent.values()}
    for ticket in batch:
        if ticket.id in sent:
            assert sent[ticket.id]["language"] == ticket.language
            assert sent[ticket.id]["category"] == truth[ticket.id][0]
    assert report.audit.duplicate_effects == 0
    assert [e.event for e in report.events].count("effect") == 30


def test_reclaimed_draft_finishing_twice_sends_once(fake: FakeOpenAI) -> None:
    app, outbox, desk = tickets.make_app(workers=2, capacity=1)
    inner = app.registry["draft_reply"].handler
    assert inner is not None

    async def slow_first_attempt(payload: Any, ctx: TaskContext) -> Any:
        if ctx.attempt == 1:
            await asyncio.sleep(120)  # silent past stale_after: reclaimed, but still alive
        return await inner(payload, ctx)

    spec = app.registry["draft_reply"]
    app.registry._kinds["draft_reply"] = dataclasses.replace(spec, handler=slow_first_attempt)
    batch = generate_tickets(1, seed=0)
    report = plan_and_run(tickets.ticket_plan(batch, app.registry), app, model=fake_model(),
                          clock=VirtualClock(), stale_after=60.0)
    draft = next(t for t in report.tasks if t.kind == "draft_reply")
    assert draft.status == "completed"
    kinds = [e.event for e in report.events if e.task == draft.id]
    assert kinds.count("reclaimed") == 1 and kinds.count("completed") == 1
    assert len(outbox.sent) + len(desk.flagged) == 1
    assert outbox.attempts <= 1 and kinds.count("effect") == 1


def test_competitive_brief_is_decomposed_repaired_and_run(fake: FakeOpenAI) -> None:
    report = plan_and_run(brief.GOAL, brief.make_app(), model=fake_model())
    assert report.ok
    plan_requests = [r for r in fake.requests if r.schema_name == "plan"]
    assert len(plan_requests) == 2  # one invalid plan, repaired once
    assert "unknown_kind" in plan_requests[1].last_user
    assert "forward_dependency" in plan_requests[1].last_user
    kinds = [t.kind for t in report.plan.tasks]
    assert kinds == ["research"] * 3 + ["analyse"] * 2 + ["write_brief"]
    final = report.results()["t5"]
    assert final["title"] and len(final["points"]) >= 3
    writer = next(r for r in fake.requests if r.schema_name == "write_brief")
    assert "Where is card acquiring losing share" in writer.prompt  # the analyses it used
    assert report.usage is not None and report.usage["decompose"].requests == 2


def test_release_runs_in_dependency_order(fake: FakeOpenAI) -> None:
    report = plan_and_run(release.RELEASE_PLAN, release.make_app(), model=fake_model(),
                          on_dead="abort_run")
    assert report.ok
    order = [r.schema_name for r in fake.requests]
    assert order == ["migrate_db", "deploy_app", "smoke_test"]
    workers = {e.task: e.worker for e in report.events if e.event == "completed"}
    assert workers == {"t0": "db-1", "t1": "deploy-1", "t2": "qa-1"}


def test_release_aborts_when_the_migration_is_rejected(fake: FakeOpenAI) -> None:
    fake.script = [Scripted(400, "Invalid value for 'database': unknown cluster")]
    report = plan_and_run(release.RELEASE_PLAN, release.make_app(), model=fake_model(),
                          on_dead="abort_run")
    statuses = {t.id: t.status for t in report.tasks}
    assert statuses == {"t0": "dead", "t1": "cancelled", "t2": "cancelled"}
    assert report.aborted_by == "t0" and len(fake.requests) == 1


def test_generator_is_realistic_and_reproducible() -> None:
    batch = generate_tickets(500, seed=3)
    assert batch == generate_tickets(500, seed=3) and batch != generate_tickets(500, seed=4)
    assert {t.language for t in batch} == set(LANGUAGES)
    categories = {c for c, _ in ground_truth(500, seed=3).values()}
    assert {"billing", "bug", "security"} <= categories
    assert len({t.id for t in batch}) == 500
    with pytest.raises(ValueError):
        generate_tickets(-1)


def test_default_app_objects_exist() -> None:
    for module in (tickets, brief, release):
        assert isinstance(module.app, App)


def test_replies_to_security_incidents_wait_for_approval(fake: FakeOpenAI) -> None:
    app, outbox, desk = tickets.make_app(workers=4, capacity=3, approve_security="auto")
    batch = generate_tickets(30, seed=0)
    report = plan_and_run(tickets.ticket_plan(batch, app.registry), app, model=fake_model(),
                          clock=VirtualClock())
    assert report.ok and report.audit.clean
    truth = ground_truth(30)
    security = {tid for tid, (cat, _) in truth.items() if cat == "security"}
    assert security  # the batch has some
    waited = {e.task for e in report.events if e.event == "waiting"}
    approved = {e.task for e in report.events if e.event == "approved"}
    drafts = {t.id: t for t in report.tasks if t.kind == "draft_reply"}
    assert waited == approved
    assert {drafts[t].result["ticket_id"] for t in waited} == security
    for task_id in waited:  # the effect came after the approval, once
        kinds = [e.event for e in report.events if e.task == task_id]
        assert kinds.index("approved") < kinds.index("effect") and kinds.count("effect") == 1
    sent = {r["ticket_id"] for r in outbox.sent.values()}
    assert security <= sent and not security & set(desk.flagged.values())


def test_the_chores_example_says_what_is_wrong_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from planrun.examples import chores

    assert chores.main(["--db", "nosuch://x", "--tasks", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("chores: error: unknown store scheme 'nosuch'") and err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_:
        chores.main(["--db", f"sqlite:///{tmp_path}/c.db", "--tasks", "0"])
    assert exit_.value.code == 2
    assert "must be a whole number >= 1" in capsys.readouterr().err
