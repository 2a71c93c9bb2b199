"""A run from a decomposed plan records the plan's repairs in its ledger, on every store.

The model (the fake endpoint) first answers a plan with an unknown kind, then the issue's
plan that code finishes (analyse depends on itself, write_brief on research): the run's
ledger holds one ``repaired`` event per repair of the accepted plan, in order, right after
the ``created`` events; the audit, ``planrun status``, the report and the JSON Lines export
read them; the store keeps them, and a resumed run neither loses nor repeats them.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import fake_model
from pgtest import fresh_schema
from pydantic import BaseModel

from planrun import App, Registry, aplan_and_run, aresume_run
from planrun.cli._main import main
from planrun.core import EventName, Ledger, UnknownRun, analyze, read_jsonl
from planrun.dev.testing import ChatRequest, FakeOpenAI
from planrun.stores import Store, open_store


class Topic(BaseModel):
    topic: str


class Findings(BaseModel):
    text: str


class Analysis(BaseModel):
    text: str


def contracted(brief: Any = None) -> App:
    """research -> analyse -> write_brief with their contracts; ``brief``: write_brief's
    handler (default: it answers at once)."""
    reg = Registry()
    reg.register("research", lambda p, c: {"text": p.topic}, payload=Topic, result=Findings,
                 unique=True)
    reg.register("analyse", lambda p, c: {"text": "a"}, result=Analysis, inputs=Findings)
    reg.register("write_brief", brief or (lambda p, c: {"brief": "b"}), inputs=Analysis,
                 delivers=True, max_count=1)
    return App(reg)


FIRST = {"tasks": [  # an unknown kind: which was meant is the model's to say
    {"kind": "research", "payload": {"topic": "Adyen"}, "depends_on": []},
    {"kind": "analyse", "payload": {}, "depends_on": [0]},
    {"kind": "brief", "payload": {}, "depends_on": [1]},
]}
SECOND = {"tasks": [  # wired wrong, but one producer of each input: code finishes it
    {"kind": "research", "payload": {"topic": "Adyen"}, "depends_on": []},
    {"kind": "analyse", "payload": {}, "depends_on": [1]},
    {"kind": "write_brief", "payload": {}, "depends_on": [0]},
]}


def answers(fake: FakeOpenAI) -> None:
    queue = [FIRST, SECOND]

    def answer(req: ChatRequest) -> Any:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    fake.answers["plan"] = answer


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'runs.db'}"
    else:
        yield from fresh_schema()


async def stored_events(db: str, run_id: str) -> Any:
    store: Store = open_store(db)
    await store.open()
    try:
        return await store.load(run_id)
    finally:
        await store.close()


def repaired(events: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(e.task, dict(e.detail)) for e in events if e.event == EventName.REPAIRED]


def test_the_ledger_of_a_run_holds_its_plans_repairs(
    fake_openai: FakeOpenAI, db: str, capsys: pytest.CaptureFixture[str],
) -> None:
    answers(fake_openai)

    async def go() -> Any:
        report = await aplan_and_run("a brief", contracted(), model=fake_model(), store=db,
                                     min_tasks=1)
        return report, await stored_events(db, report.run_id)

    report, state = asyncio.run(go())
    plan, ids = report.plan, [t.id for t in report.plan.to_tasks()]
    assert [(r.by, r.code) for r in plan.repairs] == [
        ("model", "unknown_kind"), ("code", "self_dependency"), ("code", "missing_input"),
        ("code", "missing_input")]
    # the model's repair is on the first task; each code repair on the task it fixed:
    # analyse (its own dependency dropped, then research linked), write_brief (analyse)
    expected = [(ids[0], plan.repairs[0].to_dict()), (ids[1], plan.repairs[1].to_dict()),
                (ids[1], plan.repairs[2].to_dict()), (ids[2], plan.repairs[3].to_dict())]
    assert expected[1][1] == {"by": "code", "code": "self_dependency",
                              "rule": "drop_self_dependency", "task": 1, "attempt": 2,
                              "detail": "dropped task 1's dependency on itself",
                              "final_task": 1}
    assert repaired(report.events) == expected
    assert repaired(state.events) == expected  # the store kept them, detail and all
    names = [e.event for e in state.events]
    assert names[:len(ids) + 4] == ["created"] * len(ids) + ["repaired"] * 4
    # they change no status and no finding
    assert report.ok and report.audit.clean
    assert analyze(state.tasks, state.events).clean
    # the report, the JSON Lines export and planrun status read them
    json.dumps(report.to_dict(), default=str)
    out = io.StringIO()
    Ledger(state.events).write_jsonl(out)
    out.seek(0)
    assert repaired(read_jsonl(out)) == expected
    capsys.readouterr()
    assert main(["status", report.run_id, "--db", db, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["counts"]["completed"] == len(ids)
    assert main(["status", report.run_id, "--db", db]) == 0
    assert "completed" in capsys.readouterr().out


def test_a_resumed_run_keeps_its_repairs_once(fake_openai: FakeOpenAI, db: str) -> None:
    answers(fake_openai)
    hold = asyncio.Event()

    async def stuck(payload: Any, ctx: Any) -> Any:
        await hold.wait()  # never set: the first process stops here
        return {"brief": "b"}

    async def go() -> Any:
        first = asyncio.ensure_future(aplan_and_run(
            "a brief", contracted(stuck), model=fake_model(), store=db, min_tasks=1,
            run_id="repaired-run"))
        for _ in range(500):  # until write_brief is running, then the process "dies"
            await asyncio.sleep(0.01)
            try:
                state = await stored_events(db, "repaired-run")
            except UnknownRun:
                continue  # not stored yet
            if any(t.kind == "write_brief" and t.status.value == "running"
                   for t in state.tasks):
                break
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        before = await stored_events(db, "repaired-run")
        report = await aresume_run("repaired-run", contracted(), db, model=fake_model())
        return before, report, await stored_events(db, "repaired-run")

    before, report, after = asyncio.run(go())
    assert {t.kind: t.status.value for t in before.tasks}["write_brief"] == "running"
    assert len(repaired(before.events)) == 4
    assert report.ok and report.audit.clean
    assert repaired(after.events) == repaired(before.events)
    assert len(fake_openai.requests) == 2  # the plan was not asked for again


# ---- repair="model" is kept by a resumed run's replans -----------------------------------------


class Source(BaseModel):
    source: str


READY_PLAN = {"goal": "a report", "tasks": [
    {"id": "scope", "kind": "research", "payload": {"source": "notes"}, "depends_on": []},
    {"id": "dig", "kind": "research", "payload": {"source": "archive"}, "depends_on": ["scope"]},
    {"id": "report", "kind": "report", "payload": {}, "depends_on": ["dig"]},
]}
FRAGMENT_WIRED_WRONG = {"tasks": [  # the replacement research waits for itself
    {"kind": "research", "payload": {"source": "mirror"}, "depends_on": [0]},
    {"kind": "report", "payload": {}, "depends_on": [0]},
]}
FRAGMENT = {"tasks": [
    {"kind": "research", "payload": {"source": "mirror"}, "depends_on": []},
    {"kind": "report", "payload": {}, "depends_on": [0]},
]}


def sources(archive: Any) -> App:
    """research (``archive``: what reading the archive does) and report."""
    from planrun.core import KindSpec

    async def research(payload: Source, ctx: Any) -> str:
        if payload.source == "archive":
            return str(await archive())
        return f"findings from {payload.source}"

    return App(Registry([KindSpec("research", "Research one source", Source, handler=research),
                         KindSpec("report", "Write the report",
                                  handler=lambda p, c: len(c.inputs))]))


def answer_fragments(fake: FakeOpenAI) -> None:
    """The model re-plans with the fragment wired wrong, then (asked to repair) right."""
    queue = [FRAGMENT_WIRED_WRONG, FRAGMENT]
    fake.answers["plan"] = lambda req: queue.pop(0) if len(queue) > 1 else queue[0]


async def gone() -> Any:
    """Reading the archive fails for good: its task dies and is re-planned."""
    from planrun.core import PermanentError

    raise PermanentError("the archive is gone")


@pytest.mark.parametrize(("repair", "requests"), [("model", 2), ("code", 1)])
def test_a_resumed_run_replans_with_the_repair_mode_it_was_started_with(
    fake_openai: FakeOpenAI, db: str, repair: str, requests: int,
) -> None:
    answer_fragments(fake_openai)

    async def stuck() -> Any:
        await asyncio.Event().wait()  # the first process stops here

    async def go() -> Any:
        first = asyncio.ensure_future(aplan_and_run(
            READY_PLAN, sources(stuck), model=fake_model(), store=db, run_id="replanned",
            on_dead="replan", repair=repair))
        await until_running(db, "replanned", "dig")
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        return await aresume_run("replanned", sources(gone), db, model=fake_model(),
                                 on_dead="replan")

    report = asyncio.run(go())
    assert report.counts["dead"] == 1 and report.counts["completed"] == 3  # dig replaced
    assert len(fake_openai.requests) == requests  # the replan's decomposition only
    if repair == "model":
        assert "self_dependency" in fake_openai.requests[1].last_user
    assert report.results()["dig/1"] == 1


async def until_running(db: str, run_id: str, task_id: str) -> None:
    for _ in range(500):
        await asyncio.sleep(0.01)
        try:
            state = await stored_events(db, run_id)
        except UnknownRun:
            continue  # not stored yet
        if any(t.id == task_id and t.status.value == "running" for t in state.tasks):
            return
    raise AssertionError(f"{task_id} never ran")


@pytest.mark.parametrize(("repair", "fixed_by"), [("code", "code"), ("model", "model")])
def test_the_repairs_of_a_replanned_fragment_are_in_the_ledger(
    fake_openai: FakeOpenAI, db: str, repair: str, fixed_by: str,
) -> None:
    answer_fragments(fake_openai)
    async def go() -> Any:
        report = await aplan_and_run(READY_PLAN, sources(gone), model=fake_model(), store=db,
                                     on_dead="replan", repair=repair)
        return report, await stored_events(db, report.run_id)

    report, state = asyncio.run(go())
    assert report.counts["completed"] == 3 and report.results()["dig/1"] == 1
    for events in (report.events, state.events):  # the run's, and the store's
        fixes = repaired(events)
        assert [(task, d["by"], d["code"]) for task, d in fixes] == [
            ("dig/0", fixed_by, "self_dependency")]  # the replacement research
        names = [(e.task, e.event) for e in events]
        # after the replan and the fragment's tasks, as a plan's repairs follow its tasks
        assert names.index(("dig/0", "repaired")) > names.index(("dig/1", "created")) > \
            names.index(("dig", "replanned"))
