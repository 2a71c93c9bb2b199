"""TestModel: an app written here (three model-backed kinds with contracts) planned, run,
recorded and replayed with no key and no server, in Python and on every verb that calls a
model. The model is real (the openai SDK over HTTP on 127.0.0.1); nothing is mocked."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from planrun import App, plan_and_run, validate_plan
from planrun.cli import main
from planrun.testing import TestModel, replay

APP_MODULE = '''
"""Three model-backed kinds with contracts: gather -> weigh -> memo (which delivers)."""
from pathlib import Path

from pydantic import BaseModel, Field

from planrun import App, Registry
from planrun.model import ModelWorker, PromptLibrary

PROMPTS = PromptLibrary(Path(__file__).with_name("first_prompts"))


class Topic(BaseModel):
    topic: str = Field(min_length=3, description="what to gather facts on")
    depth: int = Field(ge=1, le=3)


class Notes(BaseModel):
    facts: list[str] = Field(min_length=2)


class Question(BaseModel):
    question: str


class Analysis(BaseModel):
    answer: str
    confidence: float = Field(ge=0, le=1)


class Audience(BaseModel):
    audience: str = Field(max_length=40)


class Memo(BaseModel):
    title: str
    body: str


registry = Registry()
registry.register("gather", ModelWorker("gather", result=Notes, prompts=PROMPTS),
                  payload=Topic, description="Gather facts on one topic.")
registry.register("weigh", ModelWorker("weigh", result=Analysis, prompts=PROMPTS),
                  payload=Question, needs=["gather"], description="Weigh the facts.")
registry.register("memo", ModelWorker("memo", result=Memo, prompts=PROMPTS),
                  payload=Audience, inputs=[Analysis], delivers=True, max_count=1,
                  description="Write the memo from the analyses.")
app = App(registry)
'''
PROMPTS = {
    "gather.md": "Gather facts about $topic (depth $depth).\n",
    "weigh.md": "Answer $question from these notes:\n$inputs\n",
    "memo.md": "Write a memo for $audience from:\n$inputs\n",
}
GOAL = "compare two databases for the data team"


@pytest.fixture
def first_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[App]:
    """The newcomer's app, as ``first_app.py`` in the current folder (``--app first_app:app``)."""
    (tmp_path / "first_app.py").write_text(textwrap.dedent(APP_MODULE), encoding="utf-8")
    prompts = tmp_path / "first_prompts"
    prompts.mkdir()
    for name, text in PROMPTS.items():
        (prompts / name).write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("first_app", None)
    import first_app

    yield first_app.app
    sys.modules.pop("first_app", None)


def test_a_goal_is_planned_over_the_apps_kinds_as_its_contracts_say(first_app: App) -> None:
    model = TestModel(first_app)
    report = plan_and_run(GOAL, first_app, model=model)
    assert report.ok, report.summary()
    tasks = report.plan.to_document()["tasks"]
    kinds = [t["kind"] for t in tasks]
    assert sorted(set(kinds)) == ["gather", "memo", "weigh"] and 3 <= len(tasks) <= 8
    assert validate_plan(report.plan.to_document(), first_app.registry) == []
    for task in tasks:  # wired as the contracts say
        deps = {tasks[d]["kind"] for d in task["depends_on"]}
        if task["kind"] == "weigh":
            assert "gather" in deps
        if task["kind"] == "memo":
            assert "weigh" in deps  # memo reads an Analysis, which weigh produces
    gather = next(t for t in tasks if t["kind"] == "gather")
    assert gather["payload"] == {"topic": GOAL, "depth": 1}  # strings from the goal
    memo = next(t for t in tasks if t["kind"] == "memo")
    assert memo["payload"]["audience"] == GOAL[:40]  # and within the schema's bounds
    results = report.results()
    assert all(len(r["facts"]) >= 2 for t, r in results.items() if t.startswith("t")
               and "facts" in r)
    # Every call went over HTTP to the model's own server: usage counted, at no cost.
    total = report.usage.total if report.usage else None
    assert total is not None and total.requests == len(model.requests) == 1 + len(tasks)
    assert total.total_tokens > 0 and total.cost_usd == 0.0
    assert {r.schema_name for r in model.requests} == {"plan", "gather", "weigh", "memo"}


def test_it_is_deterministic_for_a_goal_and_keeps_the_bounds(first_app: App) -> None:
    from planrun import decompose

    first = decompose(GOAL, first_app.registry, TestModel(first_app))
    again = decompose(GOAL, first_app.registry, TestModel(first_app))
    assert first.to_document() == again.to_document()
    other = decompose("another goal", first_app.registry, TestModel(first_app))
    assert other.to_document() != first.to_document()
    for low, high in ((5, 8), (8, 8), (3, 3)):
        plan = decompose(GOAL, first_app.registry, TestModel(first_app), min_tasks=low,
                         max_tasks=high)
        assert low <= len(plan.tasks) <= high
        assert validate_plan(plan.to_document(), first_app.registry, min_tasks=low,
                             max_tasks=high) == []


def test_any_other_structured_request_gets_a_valid_instance_of_its_schema() -> None:
    from pydantic import BaseModel, Field

    class Reading(BaseModel):
        when: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
        level: int = Field(gt=10, multiple_of=5)
        tags: list[str] = Field(min_length=3, max_length=3)
        ratio: float = Field(lt=0)

    async def ask() -> Any:
        model = TestModel()
        try:
            return await model.complete([{"role": "user", "content": "hi"}],
                                        result_model=Reading)
        finally:
            await model.aclose()

    reply = asyncio.run(ask())
    assert isinstance(reply.parsed, Reading) and reply.parsed.level == 15
    assert len(set(reply.parsed.tags)) == 3


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return code, out


def test_plan_run_record_and_replay_at_the_command_line(
        first_app: App, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    app = "first_app:app"
    _, out = _cli(capsys, "plan", GOAL, "--app", app, "--model", "test", "--json")
    planned = json.loads(out)
    assert planned.pop("repairs") == []  # the test model's plan is valid as it comes
    _, out = _cli(capsys, "run", GOAL, "--app", app, "--model", "test", "--record",
                  "mine.json", "--json")
    recorded = json.loads(out)
    assert recorded["ok"] and recorded["plan"] == planned
    assert recorded["usage"]["cost_usd"] == 0.0 and recorded["usage"]["requests"] == 4
    # The replay needs neither the test model nor its server: the cassette answers.
    with replay(tmp_path / "mine.json") as cassette:
        assert cassette.model().model == "test"
    _, out = _cli(capsys, "run", GOAL, "--app", app, "--replay", "mine.json", "--json")
    replayed = json.loads(out)
    assert replayed["ok"] and replayed["plan"] == planned
    assert {t["id"]: t["result"] for t in replayed["tasks"]} == {
        t["id"]: t["result"] for t in recorded["tasks"]}
    _, out = _cli(capsys, "fixtures", "show", "mine.json")
    assert "models: test x4" in out and "made: synthesized" in out
    assert "planrun's test model" in out


def test_resume_carries_on_with_the_test_model(
        first_app: App, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from planrun.core import Task
    from planrun.stores import RunInfo, open_store

    db = f"sqlite:///{tmp_path / 'runs.db'}"
    plan = json.loads(_cli(capsys, "plan", GOAL, "--app", "first_app:app", "--model",
                           "test", "--json")[1])

    async def stored_but_never_run() -> None:  # what a crash before the first task leaves
        store = open_store(db)
        await store.open()
        await store.create_run(RunInfo("r1", 1.0, "running", GOAL,
                                       {"app": "first_app:app", "plan": plan}))
        tasks = [Task(f"t{i}", t["kind"], t["payload"],
                      depends_on=tuple(f"t{d}" for d in t["depends_on"]))
                 for i, t in enumerate(plan["tasks"])]
        await store.add_tasks("r1", tasks, [])
        await store.close()

    asyncio.run(stored_but_never_run())
    _, out = _cli(capsys, "resume", "r1", "--db", db, "--model", "test", "--json")
    resumed = json.loads(out)
    assert resumed["ok"] and resumed["counts"]["completed"] == len(plan["tasks"])


def test_eval_measures_prompts_with_the_test_model(
        first_app: App, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    goals = tmp_path / "goals.jsonl"
    goals.write_text("".join(json.dumps({"id": f"g{i}", "goal": goal}) + "\n"
                             for i, goal in enumerate((GOAL, "another goal"))))
    _, out = _cli(capsys, "eval", str(goals), "--app", "first_app:app", "--model", "test",
                  "--prompts", "default", "--json", "--no-progress")
    version = json.loads(out)["versions"]["default"]
    assert (version["goals"], version["first_try_accepted_rate"]) == (2, 1.0)
    assert (version["mean_repairs"], version["code_repairs"], version["errors"]) == (0, 0, 0)
    assert version["tokens"] > 0 and version["cost_usd"] == 0.0


@pytest.mark.parametrize("verb", ["plan", "run", "resume", "worker", "eval"])
def test_every_verb_that_calls_a_model_offers_the_test_model(
        verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([verb, "--help"]) == 0
    assert "'test': the offline test model" in " ".join(capsys.readouterr().out.split())


def test_fixtures_check_re_renders_a_recording_of_your_app_and_names_what_changed(
        first_app: App, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Your own cassette, checked: its requests rendered again from the current prompts and
    schemas; an edited prompt fails the check (exit 1) naming the first changed request."""
    _cli(capsys, "run", GOAL, "--app", "first_app:app", "--model", "test", "--record",
         "mine.json", "--quiet")
    _, out = _cli(capsys, "fixtures", "check", "mine.json", "--app", "first_app:app")
    assert out == "fresh: 1 cassette\n"
    recorded = json.loads((tmp_path / "mine.json").read_text())["interactions"]
    weigh = next(i for i, x in enumerate(recorded) if x["request"]["prompt"]["name"] == "weigh")
    (tmp_path / "first_prompts" / "weigh.md").write_text(
        "Answer $question, citing the notes:\n$inputs\n", encoding="utf-8")
    sys.modules.pop("first_app")  # a new process: the app's prompt library reads the edit
    code = main(["fixtures", "check", "mine.json", "--app", "first_app:app"])
    out, err = capsys.readouterr()
    assert code == 1
    first = out.splitlines()[1]
    assert first.startswith(f"  mine.json #{weigh}: changed: the rendered prompt of weigh changed")
    assert "+Answer compare two databases for the data team, citing the notes:" in out
    assert "re-record: planrun run" in out and "--model test --record mine.json" in out
    assert err == "stale: 1 finding(s) in 1 of 1 cassette(s)\n"
    # Replaying it fails the same way: the check said so first.
    assert main(["run", GOAL, "--app", "first_app:app", "--replay", "mine.json"]) == 2
    assert "the rendered prompt of weigh changed" in capsys.readouterr().err


def test_worker_processes_answer_with_the_test_model(
        first_app: App, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--workers external: a planrun worker with --model test does every attempt (DBOS on
    SQLite, real processes); the coordinator needs no model for a plan file."""
    import os
    import subprocess

    plan = json.loads(_cli(capsys, "plan", GOAL, "--app", "first_app:app", "--model", "test",
                           "--json")[1])
    plan.pop("repairs")
    (tmp_path / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), str(Path(__file__).resolve().parents[2] / "src")])}
    cli = [sys.executable, "-m", "planrun.cli"]
    worker = subprocess.Popen(
        [*cli, "worker", "--db", db, "--app", "first_app:app", "--model", "test",
         "--idle-exit", "60"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        run = subprocess.run(
            [*cli, "run", "plan.json", "--app", "first_app:app", "--db", db, "--workers",
             "external", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=120)
    finally:
        worker.terminate()  # SIGTERM: the worker stops and says what it did
        _, worker_err = worker.communicate(timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    assert report["ok"] and report["counts"]["completed"] == len(plan["tasks"])
    memo = next(t for t in report["tasks"] if t["kind"] == "memo")
    assert memo["result"] == {"title": "test", "body": "test"}
    assert f"{len(plan['tasks'])} completed, 0 failed" in worker_err, worker_err[-2000:]


@pytest.mark.parametrize(("structured", "api"), [("json_object", "chat"),
                                                 ("strict", "responses"),
                                                 ("json_object", "responses")])
def test_the_plan_is_the_same_whichever_way_structure_is_asked(
        first_app: App, structured: str, api: str) -> None:
    from planrun import decompose

    plain = decompose(GOAL, first_app.registry, TestModel(first_app), min_tasks=5)
    other = decompose(GOAL, first_app.registry,
                      TestModel(first_app, structured=structured, api=api), min_tasks=5)
    assert other.to_document() == plain.to_document()


def test_a_kind_that_can_lead_to_no_deliverable_is_left_out_with_what_it_needed() -> None:
    """``review`` needs the deliverable (so nothing it makes leads to one) and needs a
    ``note`` of its own: neither may stay behind as a dead end."""
    from pydantic import BaseModel

    from planrun import Registry
    from planrun.dev.testmodel import build_plan

    class Text(BaseModel):
        text: str

    def handler(payload: Any, ctx: Any) -> str:
        return "ok"

    registry = Registry()
    registry.register("fact", handler, payload=Text)
    registry.register("report", handler, payload=Text, needs=["fact"], delivers=True,
                      max_count=1)
    registry.register("review", handler, payload=Text, needs=["report", "note"])
    registry.register("note", handler, payload=Text, unique=True)
    for low in (1, 3, 5):
        plan = build_plan(registry, "a goal", min_tasks=low, max_tasks=8)
        assert validate_plan(plan, registry, min_tasks=low, max_tasks=8) == [], plan
        assert "review" not in {t["kind"] for t in plan["tasks"]}
