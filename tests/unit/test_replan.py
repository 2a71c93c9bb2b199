"""Replanning through the decomposer: the fragment is validated and repaired like a plan,
metered, and refused when it stays invalid."""

from __future__ import annotations

from typing import Any

from conftest import fake_model
from pydantic import BaseModel

from planrun.core._errors import PermanentError
from planrun.core._registry import KindSpec, Registry, TaskContext
from planrun.core._task import Status, Task
from planrun.dev.testing import ChatRequest, FakeOpenAI
from planrun.model._decompose import replanner
from planrun.model._usage import Usage
from planrun.runtime._clock import VirtualClock
from planrun.runtime._supervisor import Supervisor


class Source(BaseModel):
    source: str


async def research(payload: Source, ctx: TaskContext) -> str:
    if payload.source == "archive":
        raise PermanentError("the archive is gone")
    return f"findings from {payload.source}"


async def report(payload: Any, ctx: TaskContext) -> int:
    return len(ctx.inputs)


REGISTRY = Registry([KindSpec("research", "Research one source", Source, handler=research),
                     KindSpec("report", "Write the report", handler=report)])

FRAGMENT = {"goal": "replacement", "tasks": [
    {"kind": "research", "payload": {"source": "mirror"}, "depends_on": []},
    {"kind": "report", "payload": {}, "depends_on": [0]},
]}
INVALID = {"goal": "replacement", "tasks": [
    {"kind": "research", "payload": {"subject": "mirror"}, "depends_on": [1]},
    {"kind": "report", "payload": {}, "depends_on": []},
]}


def run(answers: Any, meter: Usage | None = None) -> Any:
    clock = VirtualClock()
    model = fake_model()
    sup = Supervisor(REGISTRY, clock=clock, on_dead="replan", seed=0,
                     replanner=replanner("a brief", REGISTRY, model, repair_attempts=1,
                                         meter=meter))
    sup.add_tasks([Task("scope", "research", {"source": "notes"}),
                   Task("dig", "research", {"source": "archive"}, depends_on=("scope",)),
                   Task("report", "report", depends_on=("dig",))])
    return clock.run(sup.arun())


def replies(*values: Any) -> Any:
    queue = list(values)

    def answer(req: ChatRequest) -> Any:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return answer


def test_the_decomposer_replans_with_the_failure_and_the_results(
        fake_openai: FakeOpenAI) -> None:
    fake_openai.answers["plan"] = FRAGMENT
    meter = Usage()
    result = run(None, meter)
    assert result.tasks["dig/0"].status is Status.COMPLETED
    assert result.tasks["dig/0"].depends_on == ("scope",)
    assert result.tasks["dig/1"].result == 1
    [request] = fake_openai.requests
    assert "the archive is gone" in request.prompt and "findings from notes" in request.prompt
    assert "report" in request.prompt  # the cancelled dependent it replaces
    assert meter.total.requests == 1  # charged to the run's meter (and so its budget)


def test_a_fragment_invalid_twice_is_refused_with_its_problems(
        fake_openai: FakeOpenAI) -> None:
    fake_openai.answers["plan"] = replies(INVALID, INVALID)
    result = run(None)
    assert len(fake_openai.requests) == 2  # the first answer and one repair
    assert "invalid_payload" in fake_openai.requests[1].last_user
    [event] = [e for e in result.events if e.event == "replan_failed"]
    assert "InvalidPlan" in event.detail["error"] and "invalid_payload" in event.detail["error"]
    assert set(result.tasks) == {"scope", "dig", "report"}
    assert result.tasks["report"].status is Status.CANCELLED


def test_a_fragment_repaired_once_runs(fake_openai: FakeOpenAI) -> None:
    fake_openai.answers["plan"] = replies(INVALID, FRAGMENT)
    result = run(None)
    assert len(fake_openai.requests) == 2
    assert result.tasks["dig/1"].status is Status.COMPLETED
    assert [e.event for e in result.events if e.task == "dig"][-1] == "replanned"


WIRED_WRONG = {"goal": "replacement", "tasks": [  # research waits for itself
    {"kind": "research", "payload": {"source": "mirror"}, "depends_on": [0]},
    {"kind": "report", "payload": {}, "depends_on": [0]},
]}


def test_a_replanner_with_repair_model_leaves_every_repair_to_the_model(
        fake_openai: FakeOpenAI) -> None:
    fake_openai.answers["plan"] = replies(WIRED_WRONG, FRAGMENT)
    run(None)
    assert len(fake_openai.requests) == 1  # code dropped the edge

    fake_openai.requests.clear()
    fake_openai.answers["plan"] = replies(WIRED_WRONG, FRAGMENT)
    clock = VirtualClock()
    sup = Supervisor(REGISTRY, clock=clock, on_dead="replan", seed=0,
                     replanner=replanner("a brief", REGISTRY, fake_model(), repair="model"))
    sup.add_tasks([Task("dig", "research", {"source": "archive"})])
    result = clock.run(sup.arun())
    assert len(fake_openai.requests) == 2
    assert "self_dependency" in fake_openai.requests[1].last_user
    assert result.tasks["dig/1"].status is Status.COMPLETED
