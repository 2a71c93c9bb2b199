"""ModelWorker: its bounded re-ask of a reply that fails the result model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import fake_model
from pydantic import BaseModel, Field

from planrun._facade import App, RunReport, plan_and_run
from planrun.core._errors import UsageError
from planrun.core._registry import Registry
from planrun.dev.testing import ChatRequest, FakeOpenAI
from planrun.model._prompts import PromptLibrary
from planrun.model._usage import Budget, Usage
from planrun.model._workers import ModelWorker, reask_message


class Topic(BaseModel):
    topic: str


class Keywords(BaseModel):
    """At least two keywords."""

    words: list[str] = Field(min_length=2)


def _library(tmp_path: Path) -> PromptLibrary:
    (tmp_path / "keywords.md").write_text("Give keywords for: $topic\n")
    return PromptLibrary(tmp_path)


def _app(tmp_path: Path, **options: Any) -> App:
    registry = Registry()
    registry.register("keywords", ModelWorker("keywords", result=Keywords,
                                              prompts=_library(tmp_path), **options),
                      payload=Topic, description="Keywords of a topic")
    return App(registry)


PLAN = {"goal": "keywords", "tasks": [{"kind": "keywords", "payload": {"topic": "tea"},
                                       "depends_on": []}]}


def _run(app: App, **options: Any) -> RunReport:
    return plan_and_run(PLAN, app, model=fake_model(), **options)


def test_a_failing_reply_is_reasked_once_with_its_errors(
    fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    fake_openai.answers["keywords"] = (
        lambda req: {"words": ["tea"]} if req.repairs == 0 else {"words": ["tea", "leaf"]})
    usage = Usage()
    report = _run(_app(tmp_path), usage=usage)
    (task,) = report.tasks
    assert task.status == "completed" and task.result == {"words": ["tea", "leaf"]}
    first, second = fake_openai.requests
    assert second.messages[:-2] == first.messages
    assert second.messages[-2] == {"role": "assistant", "content": '{"words": ["tea"]}'}
    assert "words: List should have at least 2 items" in second.last_user
    assert usage.total.requests == 2  # the re-ask is metered like any call
    assert report.usage is not None and report.usage.by_key()["task:t0"].requests == 2
    idempotency = [h.get("idempotency-key") for h in fake_openai.headers]
    assert idempotency[0] and idempotency[1] == f"{idempotency[0]}:reask-1"


def test_after_the_last_reask_the_task_is_dead_with_the_last_errors(
    fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    seen: list[ChatRequest] = []

    def always_short(req: ChatRequest) -> dict[str, Any]:
        seen.append(req)
        return {"words": [f"w{len(seen)}"]}

    fake_openai.answers["keywords"] = always_short
    (task,) = _run(_app(tmp_path, reask=2)).tasks
    assert task.status == "dead" and task.attempts == 1
    assert len(seen) == 3
    assert task.error is not None and "after 3 attempt(s)" in task.error
    assert "words: List should have at least 2 items" in task.error
    assert seen[2].messages[-2]["content"] == '{"words": ["w2"]}'  # only the last answer shown


def test_reask_zero_fails_at_once(fake_openai: FakeOpenAI, tmp_path: Path) -> None:
    fake_openai.answers["keywords"] = {"words": ["one"]}
    (task,) = _run(_app(tmp_path, reask=0)).tasks
    assert task.status == "dead" and len(fake_openai.requests) == 1


def test_a_reask_is_budgeted(fake_openai: FakeOpenAI, tmp_path: Path) -> None:
    fake_openai.answers["keywords"] = {"words": ["one"]}
    model = fake_model(max_tokens=40)
    usage = Usage(budget=Budget(max_tokens=160))  # one request fits; a second does not
    report = plan_and_run(PLAN, _app(tmp_path, reask=5), model=model, usage=usage)
    (task,) = report.tasks
    assert len(fake_openai.requests) == 1  # the budget stopped the re-ask before it was sent
    assert task.status == "cancelled" and task.cause == "budget"
    assert 0 < usage.total.total_tokens <= 160


def test_reask_must_be_a_non_negative_int(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="reask"):
        ModelWorker("keywords", result=Keywords, prompts=_library(tmp_path), reask=-1)
    assert "Validation errors" in reask_message("- x: bad")
