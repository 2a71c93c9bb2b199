"""plan_and_run: the one call, its report, its budget and its secrets."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import pytest
from conftest import FAKE_KEY, fake_model
from pydantic import BaseModel

from planrun._facade import App, RunReport, aplan_and_run, load_app, plan_and_run
from planrun.core._errors import ConfigError, InvalidPlan, PermanentError, UsageError
from planrun.core._registry import Registry, TaskContext
from planrun.dev.testing import FakeOpenAI, Scripted
from planrun.model._prompts import PromptLibrary
from planrun.model._usage import Budget, Price, PriceTable, Usage
from planrun.model._workers import ModelWorker
from planrun.runtime._clock import VirtualClock


def plain_registry() -> Registry:
    registry = Registry()

    @registry.kind("double", description="Double a number")
    async def double(payload: Any, ctx: TaskContext) -> int:
        return int(payload["n"]) * 2

    @registry.kind("total")
    def total(payload: Any, ctx: TaskContext) -> int:  # a sync function works the same
        return sum(ctx.inputs.values())

    return registry


PLAN = {"goal": "sum doubles", "tasks": [
    {"kind": "double", "payload": {"n": 1}, "depends_on": []},
    {"kind": "double", "payload": {"n": 2}, "depends_on": []},
    {"kind": "total", "payload": {}, "depends_on": [0, 1]},
]}


def test_ready_plan_with_function_workers_needs_no_model() -> None:
    report = plan_and_run(PLAN, plain_registry())
    assert report.ok
    assert report.results() == {"t0": 2, "t1": 4, "t2": 6}
    assert report.counts["completed"] == 3
    assert report.usage is not None and report.usage.total.requests == 0
    data = report.to_dict()
    assert data["plan"]["tasks"][2]["depends_on"] == [0, 1]
    assert data["audit"] == {"order_violations": 0, "duplicates": 0, "missing": [],
                             "duplicate_effects": 0, "missing_effects": []}
    assert "completed 3" in report.summary() and "audit: clean" in report.summary()


def test_invalid_ready_plan_dispatches_nothing() -> None:
    bad = {"tasks": [{"kind": "triple", "payload": {}, "depends_on": [5]}]}
    with pytest.raises(InvalidPlan) as err:
        plan_and_run(bad, plain_registry())
    assert {p.code for p in err.value.problems} == {"unknown_kind", "unknown_dependency"}


def test_goal_without_a_key_fails_before_any_task(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        plan_and_run("do something", plain_registry())


class Echo(BaseModel):
    text: str


def model_registry(tmp_path: Any) -> Registry:
    (tmp_path / "echo.md").write_text("Repeat this: $text\n")
    registry = Registry()
    registry.register("echo", ModelWorker("echo", result=Echo, prompts=PromptLibrary(tmp_path)),
                      description="Echo text")
    return registry


def echo_plan(n: int) -> dict[str, Any]:
    return {"goal": "echo", "tasks": [
        {"kind": "echo", "payload": {"text": f"hello {i}"}, "depends_on": []} for i in range(n)
    ]}


def test_usage_and_cost_totals_are_exact(fake_openai: FakeOpenAI, tmp_path: Any) -> None:
    fake_openai.answers["echo"] = lambda req: {"text": req.prompt.split(": ", 1)[1].strip()}
    prices = PriceTable({"gpt-4o-mini": Price(input=0.15, cached_input=0.075, output=0.60)})
    report = plan_and_run(echo_plan(5), App(model_registry(tmp_path), concurrency=2),
                          model=fake_model(), prices=prices)
    assert report.ok
    sent = [json.loads(json.dumps(fake_openai.completion(r, "x")["usage"]))
            for r in fake_openai.requests]
    prompt = sum(u["prompt_tokens"] for u in sent)
    completion = sum(u["completion_tokens"] for u in sent)
    assert report.usage is not None
    total = report.usage.total
    assert (total.requests, total.prompt_tokens, total.completion_tokens) == (5, prompt, completion)
    assert total.cost_usd == pytest.approx((prompt * 0.15 + completion * 0.60) / 1e6)
    assert sum(t.tokens for t in report.tasks) == total.total_tokens
    assert {t.result["text"] for t in report.tasks} == {f"hello {i}" for i in range(5)}


def test_budget_exhaustion_mid_run(fake_openai: FakeOpenAI, tmp_path: Any) -> None:
    fake_openai.answers["echo"] = {"text": "hi"}
    app = App(model_registry(tmp_path), concurrency=1)
    report = plan_and_run(echo_plan(10), app, model=fake_model(max_tokens=50),
                          budget=Budget(max_tokens=150))
    assert report.budget_exhausted
    completed = report.counts["completed"]
    assert 0 < completed < 10
    assert report.counts["cancelled"] == 10 - completed
    assert {t.cause for t in report.tasks if t.status == "cancelled"} == {"budget"}
    assert len(fake_openai.requests) == completed  # no call started past the budget
    assert report.usage is not None and report.usage.total.total_tokens <= 150
    assert "budget exhausted" in report.summary()


def test_permanent_model_error_is_dead_after_one_call(
    fake_openai: FakeOpenAI, tmp_path: Any
) -> None:
    fake_openai.script = [Scripted(401, "Incorrect API key provided: sk-proj-****Nm6Mq5")]
    report = plan_and_run(echo_plan(1), model_registry(tmp_path), model=fake_model())
    task = report.tasks[0]
    assert task.status == "dead" and task.attempts == 1
    assert len(fake_openai.requests) == 1


def test_transient_model_errors_retry_under_one_policy(
    fake_openai: FakeOpenAI, tmp_path: Any
) -> None:
    fake_openai.script = [Scripted(503, "overloaded"), Scripted(429, "slow down",
                                                              headers={"retry-after": "7"})]
    fake_openai.answers["echo"] = {"text": "x"}
    clock = VirtualClock()
    report = plan_and_run(echo_plan(1), model_registry(tmp_path), model=fake_model(),
                          clock=clock)
    assert report.ok and report.tasks[0].attempts == 1  # retried inside the model call
    assert len(fake_openai.requests) == 3
    assert clock.now() >= 7.0  # Retry-After honoured (virtual time)


def test_no_api_key_in_logs_reports_or_errors(
    fake_openai: FakeOpenAI, tmp_path: Any, caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    fake_openai.script = [Scripted(500, "boom"), Scripted(401, f"bad key {FAKE_KEY}")]
    fake_openai.answers["echo"] = {"text": "x"}
    model = fake_model()
    report = plan_and_run(echo_plan(3), App(model_registry(tmp_path), concurrency=1),
                          model=model, clock=VirtualClock())
    print(report.summary())
    texts = [caplog.text, capsys.readouterr().out, json.dumps(report.to_dict(), default=str),
             repr(model), repr(report.usage)]
    texts += [t.error or "" for t in report.tasks]
    assert any("401" in (t.error or "") or "Authentication" in (t.error or "")
               for t in report.tasks)
    for text in texts:
        assert FAKE_KEY not in text
        assert FAKE_KEY[:20] not in text
    # the key did go out, where it belongs: the Authorization header
    assert fake_openai.headers[0]["authorization"] == f"Bearer {FAKE_KEY}"
    with pytest.raises(PermanentError) as err:
        raise PermanentError(texts[-1])
    assert FAKE_KEY not in str(err.value)


async def test_async_plan_and_run(tmp_path: Any) -> None:
    report = await aplan_and_run(PLAN, plain_registry())
    assert isinstance(report, RunReport) and report.ok


def test_load_app_resolves_module_attribute() -> None:
    app = load_app("planrun.examples.release:app")
    assert app.registry.names == ["migrate_db", "deploy_app", "smoke_test"]
    for bad in ("nomodule", "no_such_module_xyz:app", "planrun.examples.release:nothing"):
        with pytest.raises(UsageError, match=r"module|attribute|import|not a planrun"):
            load_app(bad)


def test_shared_usage_meter_is_used_when_given(tmp_path: Any) -> None:
    meter = Usage()
    report = plan_and_run(PLAN, plain_registry(), usage=meter)
    assert report.usage is meter


def test_the_task_reports_are_built_when_read_from_what_the_run_ended_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = "hunter2-but-longer"
    registry = plain_registry()

    @registry.kind("leak")
    def leak(payload: Any, ctx: TaskContext) -> None:
        raise PermanentError(f"refused with {secret}")

    monkeypatch.setenv("OPENAI_API_KEY", secret)  # a secret redact() knows while it is set
    meter = Usage()
    plan = {"goal": "g", "tasks": [*PLAN["tasks"], {"kind": "leak", "payload": {}}]}
    report = plan_and_run(plan, App(registry), usage=meter)
    monkeypatch.delenv("OPENAI_API_KEY")
    meter.record("gpt-4o-mini", prompt_tokens=10, keys=["task:t0"])  # after the run
    assert "tasks" not in vars(report)  # not built yet (its repr does not build them)
    assert repr(report) == (f"RunReport(run_id={report.run_id!r}, goal='g', "
                            "counts={'completed': 3, 'dead': 1}, ok=False, "
                            f"duration_s={report.duration_s:.3f}, tasks=4)")
    assert "tasks" not in vars(report)
    built = report.tasks
    assert report.tasks is built
    by_id = {t.id: t for t in built}
    assert [t.id for t in built] == list(report.result.tasks)
    assert by_id["t3"].status == "dead" and by_id["t3"].error is not None
    assert secret not in by_id["t3"].error and "[redacted]" in by_id["t3"].error
    assert by_id["t0"].tokens == 0  # what the meter held when the run ended
    for task in report.result.tasks.values():
        mine = by_id[task.id]
        assert (mine.kind, mine.status, mine.attempts, mine.result, mine.cause) == (
            task.kind, task.status.value, task.attempts, task.result, task.cause)
        assert (mine.started_at, mine.finished_at) == (task.started_at, task.finished_at)
        assert type(mine.status) is str
    assert report.results() == {"t0": 2, "t1": 4, "t2": 6}
    assert [f.name for f in dataclasses.fields(report)][3] == "tasks"
    again = dataclasses.replace(report, goal="other")
    assert again.tasks == built and again.goal == "other"
    assert report.to_dict()["tasks"][3]["error"] == by_id["t3"].error
    assert not hasattr(report, "nope")


def test_a_report_made_directly_holds_the_tasks_it_is_given() -> None:
    report = plan_and_run(PLAN, plain_registry())
    fields = {f.name: getattr(report, f.name) for f in dataclasses.fields(report)}
    made = RunReport(**{**fields, "tasks": report.tasks[:1]})
    assert made.tasks == report.tasks[:1] and made.results() == {"t0": 2}
