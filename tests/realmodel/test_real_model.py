"""What planrun guarantees with a model that writes its own answers (a 135M model whose
plans are poor): clean outcomes, repairs bounded, usage counted, recordings that replay."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, field_validator

from planrun import App, InvalidPlan, Plan, Registry, Status, aplan_and_run
from planrun.core import PROBLEM_CODES
from planrun.dev import fixtures
from planrun.dev.eval import EVALS_DIR, aevaluate, load_goals
from planrun.model import Model, ModelWorker, Usage, adecompose

pytestmark = pytest.mark.realmodel

GOALS = load_goals("examples")


async def _decompose_all(model: Model, goals: list[object]) -> list[tuple[object, Usage]]:
    outcomes: list[tuple[object, Usage]] = []
    async with model:
        for goal in goals:
            meter = Usage()
            try:
                outcome: object = await adecompose(
                    goal.goal, goal.registry, model, min_tasks=1, max_tasks=4,  # type: ignore[attr-defined]
                    repair_attempts=1, meter=meter)
            except InvalidPlan as exc:
                outcome = exc
            outcomes.append((outcome, meter))
    return outcomes


def test_decompose_ends_in_a_plan_or_its_problems_never_a_transport_error(
        real_model: Model) -> None:
    goals = [GOALS[0], GOALS[3], GOALS[4]]  # brief, a short brief, a release
    outcomes = asyncio.run(_decompose_all(real_model, goals))  # type: ignore[arg-type]
    for (outcome, meter), goal in zip(outcomes, goals, strict=True):
        answered = [r for r in meter.records if r.error in (None, "OutputTruncated")]
        refused = [r for r in meter.records if r not in answered]
        requests = len(answered)
        assert 1 <= requests <= 2  # the first try and at most one repair
        # The server refuses json_schema (a 500) once; the Model falls back to JSON mode
        # for the plan schema from then on. Every request is counted, the refused one too.
        assert len(refused) <= 1 and all(r.error for r in refused)
        assert meter.total.prompt_tokens > 0 and meter.total.completion_tokens > 0
        if isinstance(outcome, Plan):
            assert outcome.goal == goal.goal  # the user's goal, never the model's wording
            Plan.parse(outcome.to_document(), goal.registry, min_tasks=1, max_tasks=4)
        else:
            assert isinstance(outcome, InvalidPlan)
            assert outcome.problems and {p.code for p in outcome.problems} <= set(PROBLEM_CODES)
            assert len(outcome.raw_outputs) == requests


class Shout(BaseModel):
    """A result model the grammar cannot enforce: a word of at least 500 characters."""

    word: str

    @field_validator("word")
    @classmethod
    def long_enough(cls, value: str) -> str:
        if len(value) < 500:
            raise ValueError("must be at least 500 characters long")
        return value


def test_a_model_worker_whose_answer_fails_its_result_model_is_re_asked(
        real_model: Model, tmp_path: Path) -> None:
    registry = Registry()
    registry.register("shout", ModelWorker("shout", result=Shout, prompts=_prompts(tmp_path),
                                           reask=1, max_tokens=48),
                      description="Shout one word.")
    cassette = tmp_path / "reask.json"

    async def go() -> object:
        async with real_model:
            with fixtures.record(cassette, made="recorded"):
                return await aplan_and_run(
                    {"goal": "shout", "tasks": [{"kind": "shout", "payload": {},
                                                 "depends_on": []}]},
                    App(registry), model=real_model)

    report = asyncio.run(go())
    (task,) = report.tasks  # type: ignore[attr-defined]
    assert task.status == Status.DEAD
    assert "does not match Shout after 2 attempt(s)" in (task.error or "")
    asked = [i.request.body for i in fixtures.Cassette.load(cassette).interactions
             if i.response.status == 200]
    assert len(asked) == 2  # the answer, then one re-ask showing it its errors
    (reask,) = [body for body in asked if len(body["messages"]) > 2]
    assert "at least 500 characters" in reask["messages"][-1]["content"]
    assert reask["messages"][-2]["role"] == "assistant"


def _prompts(folder: Path) -> object:
    from planrun.model import PromptLibrary

    (folder / "shout.md").write_text("Answer with JSON: one word, in the field \"word\".\n")
    return PromptLibrary(folder)


class Word(BaseModel):
    word: str


def test_a_server_refusing_json_schema_gets_json_mode_and_a_valid_reply(
        real_model: Model) -> None:
    async def go() -> object:
        async with real_model:
            return await real_model.complete("Give one English word.", result_model=Word,
                                             max_tokens=32)

    reply = asyncio.run(go())
    assert reply.fell_back and reply.mode == "json_mode"  # type: ignore[attr-defined]
    assert isinstance(reply.parsed, Word)  # type: ignore[attr-defined]
    assert reply.usage.completion_tokens > 0  # type: ignore[attr-defined]


def test_demo_live_runs_end_to_end(real_model_url: str) -> None:
    env = {**os.environ, "OPENAI_BASE_URL": real_model_url, "OPENAI_API_KEY": "sk-local",
           "PLANRUN_COMPAT": "1", "PLANRUN_TIMEOUT": "120"}
    done = subprocess.run([sys.executable, "-m", "planrun.cli", "demo", "release", "--live",
                           "--model", "smollm2"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert "internal error" not in done.stderr
    assert "usage: " in done.stdout and "audit: " in done.stdout


def test_an_eval_recorded_from_the_real_model_replays_offline(
        real_model: Model, tmp_path: Path) -> None:
    cassette, out = tmp_path / "eval.json", tmp_path / "out.jsonl"
    goals = tmp_path / "goals.jsonl"
    goals.write_text("".join(line + "\n" for line in
                             (EVALS_DIR / "examples.jsonl").read_text().splitlines()[3:5]))

    # JSON mode from the start: which concurrent request meets the server's refusal of
    # json_schema first would otherwise decide what gets recorded.
    model = Model(real_model.model, api_key="sk-local", base_url=real_model.base_url,
                  compat=True, structured="json_object", timeout=120)

    async def go() -> object:
        async with model:
            return await aevaluate(goals, {"default": None}, model=model,
                                   record=cassette, out=out, max_tasks=4, repair_attempts=1,
                                   concurrency=2)

    live = asyncio.run(go())
    assert len(out.read_text().splitlines()) == 2
    assert live.summaries()["default"]["errors"] == 0  # type: ignore[attr-defined]
    recorded = fixtures.Cassette.load(cassette)
    assert recorded.to_document()["about"]["made"] == "recorded"
    replay_model = recorded.model()  # compat and JSON mode, read off the recording
    assert replay_model.compat and replay_model.structured == "json_object"

    async def again() -> object:
        async with replay_model:
            return await aevaluate(goals, {"default": None}, model=replay_model,
                                   replay=cassette, max_tasks=4, repair_attempts=1)

    replayed = asyncio.run(again())
    assert replayed.to_dict() == live.to_dict()  # type: ignore[attr-defined]
    assert json.loads(cassette.read_text())["interactions"]
