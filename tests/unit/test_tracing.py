"""OpenTelemetry: the span tree of a run, GenAI attributes, metrics, no secret anywhere."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import FAKE_KEY, fake_model
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

from planrun._facade import App, plan_and_run
from planrun.core._errors import PermanentError, TransientError
from planrun.core._ledger import Event
from planrun.core._registry import KindSpec, Registry, TaskContext
from planrun.core._task import Status, Task, transition
from planrun.core.scheduling import RetryPolicy
from planrun.dev.testing import ChatRequest, FakeOpenAI, Scripted
from planrun.model._prompts import PromptLibrary
from planrun.model._usage import Price, PriceTable
from planrun.model._workers import ModelWorker
from planrun.obs import tracing


class Otel:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.reader = InMemoryMetricReader()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def metric(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        points: list[Any] = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        points.extend(metric.data.data_points)
        return points


@pytest.fixture
def otel() -> Iterator[Otel]:
    sink = Otel()
    tracing.instrument(tracer_provider=sink.tracer_provider, meter_provider=sink.meter_provider)
    yield sink
    tracing.uninstrument()


class Echo(BaseModel):
    text: str


def app(tmp_path: Any) -> App:
    (tmp_path / "echo.md").write_text("Repeat this: $text\n")
    calls = {"flaky": 0}

    async def flaky(payload: Any, ctx: TaskContext) -> str:
        calls["flaky"] += 1
        if calls["flaky"] == 1:
            raise TransientError("upstream hiccup")
        return "steady"

    async def doomed(payload: Any, ctx: TaskContext) -> str:
        raise PermanentError("cannot be done")

    async def after(payload: Any, ctx: TaskContext) -> str:
        return "never"

    registry = Registry([
        KindSpec("flaky", "Fails once, then works", handler=flaky),
        KindSpec("doomed", "Always fails", handler=doomed),
        KindSpec("after", "Needs the doomed one", handler=after),
    ])
    registry.register("echo", ModelWorker("echo", result=Echo, prompts=PromptLibrary(tmp_path)),
                      description="Echo text")
    return App(registry)


GOOD = {"goal": "trace me", "tasks": [
    {"kind": "echo", "payload": {"text": "hello"}, "depends_on": []},
    {"kind": "flaky", "payload": {}, "depends_on": []},
    {"kind": "doomed", "payload": {}, "depends_on": []},
    {"kind": "after", "payload": {}, "depends_on": [2]},
]}
UNKNOWN = {**GOOD, "tasks": [{**GOOD["tasks"][0], "kind": "echoo"}, *GOOD["tasks"][1:]]}
"""A first plan only the model can repair (which kind was meant is a guess)."""
SELF = {**GOOD, "tasks": [GOOD["tasks"][0], {**GOOD["tasks"][1], "depends_on": [1]},
                          *GOOD["tasks"][2:]]}
"""A first plan the decomposer's code repairs finish."""


def answers(fake: FakeOpenAI, first: dict[str, Any] = UNKNOWN) -> None:
    plans = [first, GOOD]
    fake.answers["plan"] = lambda req: plans.pop(0) if len(plans) > 1 else plans[0]
    fake.answers["echo"] = lambda req: {"text": req.prompt.split(": ", 1)[1].strip()}


def run(tmp_path: Any, **options: Any) -> Any:
    return plan_and_run("trace me", app(tmp_path), model=fake_model(), min_tasks=1,
                        retry=RetryPolicy(attempts=3, base=0.01, cap=0.01, jitter=0.0), **options)


def by_name(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def test_span_tree_of_a_run_with_a_retry_a_death_and_a_repair(
    otel: Otel, fake_openai: FakeOpenAI, tmp_path: Any
) -> None:
    answers(fake_openai)
    report = run(tmp_path)
    assert report.counts["completed"] == 2 and report.counts["dead"] == 1
    spans = otel.finished()
    [root] = [s for s in spans if s.parent is None]
    assert root.name == f"run {report.run_id}"
    assert root.attributes["planrun.run.id"] == report.run_id
    assert root.attributes["planrun.run.tasks.cancelled"] == 1
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    children = {s.context.span_id: s for s in spans}

    [decompose] = by_name(spans, "decompose")
    assert decompose.parent.span_id == root.context.span_id
    assert decompose.attributes["planrun.decompose.repairs"] == 1
    assert decompose.attributes["planrun.decompose.attempts"] == 2
    assert decompose.attributes["planrun.decompose.code_repairs"] == 0
    assert decompose.attributes["planrun.plan.tasks"] == 4
    problems = [e for e in decompose.events if e.name == "plan.problem"]
    assert [e.attributes["planrun.problem.code"] for e in problems] == ["unknown_kind"]
    chats = by_name(spans, "chat gpt-4o-mini")
    assert sum(c.parent.span_id == decompose.context.span_id for c in chats) == 2

    flaky = sorted(by_name(spans, "task flaky"), key=lambda s: s.start_time or 0)
    assert [s.attributes["planrun.task.attempt"] for s in flaky] == [1, 2]
    assert [s.attributes["planrun.task.status"] for s in flaky] == ["failed", "completed"]
    assert flaky[0].attributes["error.type"] == "TransientError"
    assert flaky[0].attributes["planrun.error.class"] == "transient"
    assert flaky[0].end_time <= flaky[1].start_time  # the backoff lies between them
    [doomed] = by_name(spans, "task doomed")
    assert doomed.attributes["planrun.task.status"] == "dead"
    assert doomed.attributes["error.type"] == "PermanentError"
    assert doomed.attributes["planrun.error.class"] == "permanent"
    assert doomed.status.status_code.name == "ERROR"
    assert not by_name(spans, "task after")  # cancelled: never attempted
    cancelled = [e for e in root.events if e.name == "task cancelled"]
    assert [e.attributes["planrun.task.id"] for e in cancelled] == ["t3"]
    for attempt in [*flaky, doomed]:
        assert attempt.parent.span_id == root.context.span_id
        assert attempt.attributes["planrun.worker"] == "worker"

    [echo] = by_name(spans, "task echo")
    [echo_chat] = [c for c in chats if c.parent.span_id == echo.context.span_id]
    assert echo_chat.start_time >= echo.start_time and echo_chat.end_time <= echo.end_time
    assert children[echo.parent.span_id] is root


def test_code_repairs_are_counted_on_the_decompose_span_without_a_model_repair(
    otel: Otel, fake_openai: FakeOpenAI, tmp_path: Any
) -> None:
    answers(fake_openai, first=SELF)
    run(tmp_path)
    [decompose] = by_name(otel.finished(), "decompose")
    assert decompose.attributes["planrun.decompose.attempts"] == 1
    assert decompose.attributes["planrun.decompose.repairs"] == 0
    assert decompose.attributes["planrun.decompose.code_repairs"] == 1
    [fixed] = [e for e in decompose.events if e.name == "plan.repaired"]
    assert dict(fixed.attributes or {}) == {"planrun.problem.code": "self_dependency",
                                           "planrun.repair.rule": "drop_self_dependency",
                                           "planrun.problem.task": 1}
    assert [r.schema_name for r in fake_openai.requests].count("plan") == 1


def test_model_call_spans_follow_the_genai_conventions(
    otel: Otel, fake_openai: FakeOpenAI, tmp_path: Any
) -> None:
    answers(fake_openai)
    prices = PriceTable({"gpt-4o-mini": Price(input=0.15, cached_input=0.075, output=0.60)})
    report = run(tmp_path, prices=prices)
    chats = by_name(otel.finished(), "chat gpt-4o-mini")
    assert len(chats) == len(fake_openai.requests) == 3
    sent = [fake_openai.completion(r, "x") for r in fake_openai.requests]
    for span, reply in zip(sorted(chats, key=lambda s: s.start_time or 0), sent, strict=True):
        a = span.attributes
        assert span.kind.name == "CLIENT"
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == "openai"
        assert a["gen_ai.request.model"] == "gpt-4o-mini"
        assert a["gen_ai.response.model"] == "gpt-4o-mini-2024-07-18"
        assert a["gen_ai.usage.input_tokens"] == reply["usage"]["prompt_tokens"]
        assert a["gen_ai.usage.output_tokens"] == reply["usage"]["completion_tokens"]
        assert tuple(a["gen_ai.response.finish_reasons"]) == ("stop",)
        assert str(a["gen_ai.response.id"]).startswith("req_")
        assert a["server.address"] == "api.openai.test" and a["server.port"] == 443
        assert "gen_ai.input.messages" not in a and "gen_ai.output.messages" not in a
    tokens = otel.metric("gen_ai.client.token.usage")
    by_type = {p.attributes["gen_ai.token.type"]: p.sum for p in tokens}
    assert report.usage is not None
    assert by_type == {"input": report.usage.total.prompt_tokens,
                       "output": report.usage.total.completion_tokens}
    [cost] = otel.metric("planrun.cost")
    assert cost.value == pytest.approx(report.usage.total.cost_usd)


def test_task_metrics_count_by_status_while_the_run_goes_on(
    otel: Otel, fake_openai: FakeOpenAI, tmp_path: Any
) -> None:
    answers(fake_openai)
    latest: dict[str, str] = {}
    checked: list[str] = []

    def progress(event: Event, task: Task) -> None:
        latest[task.id] = task.status.value
        counts = {p.attributes["planrun.task.status"]: p.value
                  for p in otel.metric("planrun.tasks") if p.value}
        assert counts == dict(Counter(latest.values()))  # the ledger's own tally
        active = {p.attributes["planrun.worker"]: p.value
                  for p in otel.metric("planrun.worker.active")}
        assert active.get("worker", 0) == list(latest.values()).count("running")
        ages = [p.value for p in otel.metric("planrun.tasks.oldest_unfinished_age")]
        assert len(ages) == (1 if any(s not in ("completed", "dead", "cancelled")
                                      for s in latest.values()) else 0)
        checked.append(event.event)

    run(tmp_path, progress=progress)
    assert {"created", "started", "failed", "retry", "completed", "dead"} <= set(checked)
    # The run is over: nothing left to observe.
    assert not otel.metric("planrun.tasks.oldest_unfinished_age")
    assert not otel.metric("planrun.tasks")
    assert all(p.value == 0 for p in otel.metric("planrun.worker.active"))


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def now(self) -> float:
        return self.t


def test_oldest_unfinished_age_follows_the_clock(otel: Otel) -> None:
    clock = FakeClock()
    observer = tracing.RunTracer("r1", clock=clock)  # type: ignore[arg-type]
    observer.start()
    a = Task("a", "k", created_at=100.0)
    b = Task("b", "k", created_at=105.0)
    observer.on_event(Event(0, 100.0, "a", "created"), a)
    observer.on_event(Event(1, 105.0, "b", "created"), b)
    clock.t = 112.0
    assert observer.oldest_unfinished_age() == pytest.approx(12.0)
    [point] = otel.metric("planrun.tasks.oldest_unfinished_age")
    assert point.value == pytest.approx(12.0) and point.attributes == {"planrun.run.id": "r1"}
    observer.on_event(Event(2, 112.0, "a", "cancelled"), transition(a, Status.CANCELLED))
    assert observer.oldest_unfinished_age() == pytest.approx(7.0)
    observer.finish("finished")
    assert observer.oldest_unfinished_age() is None


def every_attribute(spans: list[ReadableSpan]) -> str:
    values: list[Any] = []
    for span in spans:
        values.append(span.name)
        values.extend((span.attributes or {}).values())
        values.append(span.status.description)
        for event in span.events:
            values.extend((event.attributes or {}).values())
    return json.dumps(values, default=str)


def test_no_secret_in_any_attribute_even_with_content_captured(
    otel: Otel, fake_openai: FakeOpenAI, tmp_path: Any
) -> None:
    tracing.instrument(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider,
                       capture_content=True)
    plans = [UNKNOWN, GOOD]
    fake_openai.answers["plan"] = lambda req: plans.pop(0) if len(plans) > 1 else plans[0]
    fake_openai.answers["echo"] = {"text": f"the key is {FAKE_KEY}"}
    registry = app(tmp_path).registry
    doc = {"goal": f"leak {FAKE_KEY}", "tasks": [
        {"kind": "echo", "payload": {"text": f"my key is {FAKE_KEY}"}, "depends_on": []}]}
    plan_and_run(doc, registry, model=fake_model())
    fake_openai.script = [Scripted(401, f"Incorrect API key provided: {FAKE_KEY}")]
    plan_and_run(doc, registry, model=fake_model())
    with pytest.raises(RuntimeError), tracing.traced_run("boom"):
        raise RuntimeError(f"failed with {FAKE_KEY}")
    spans = otel.finished()
    [boom] = by_name(spans, "run boom")
    assert boom.attributes["error.type"] == "RuntimeError"
    inputs = [s.attributes.get("gen_ai.input.messages") for s in spans if s.name.startswith("chat")]
    assert all(inputs) and "my key is [redacted]" in str(inputs[0])  # captured, redacted
    outputs = [s.attributes.get("gen_ai.output.messages") for s in spans
               if s.name.startswith("chat") and s.attributes.get("gen_ai.output.messages")]
    assert outputs and "the key is [redacted]" in str(outputs[0])
    failed = [s for s in spans if s.name.startswith("chat") and "error.type" in s.attributes]
    assert failed and failed[0].attributes["error.type"] == "PermanentError"
    text = every_attribute(spans)
    assert FAKE_KEY not in text and FAKE_KEY[8:30] not in text


def stored_meta(store: str, run_id: str) -> Any:
    import asyncio

    from planrun.stores import open_store

    async def meta() -> Any:
        opened = open_store(store)
        await opened.open()
        try:
            return (await opened.load_tasks(run_id)).run.meta
        finally:
            await opened.close()

    return asyncio.run(meta())


def test_nothing_is_traced_without_a_provider(fake_openai: FakeOpenAI, tmp_path: Any) -> None:
    tracing.uninstrument()
    assert not tracing.enabled()
    assert tracing.trace_meta() == {}
    with tracing.model_call("gpt-4o-mini", []) as call:
        assert call is tracing._NULL_CALL
    with tracing.traced_run("r") as traced:
        assert traced is None
    answers(fake_openai)
    store = f"sqlite:///{tmp_path}/runs.db"
    report = run(tmp_path, store=store)
    assert report.counts["completed"] == 2
    assert "trace" not in stored_meta(store, report.run_id)


def test_nothing_is_traced_without_the_extra(
    otel: Otel, fake_openai: FakeOpenAI, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracing, "AVAILABLE", False)  # as if opentelemetry were not installed
    assert not tracing.enabled()
    answers(fake_openai)
    report = run(tmp_path)
    assert report.counts["completed"] == 2
    assert otel.finished() == [] and not otel.metric("gen_ai.client.token.usage")


def test_the_run_meta_holds_the_trace_context(
    otel: Otel, fake_openai: FakeOpenAI, tmp_path: Any
) -> None:
    answers(fake_openai)
    store = f"sqlite:///{tmp_path}/runs.db"
    report = run(tmp_path, store=store)
    stored = stored_meta(store, report.run_id)
    [root] = [s for s in otel.finished() if s.parent is None]
    traceparent = stored["trace"]["traceparent"]
    assert traceparent.startswith(f"00-{root.context.trace_id:032x}-{root.context.span_id:016x}-")


def test_decompose_problems_become_events(otel: Otel, fake_openai: FakeOpenAI) -> None:
    from planrun.core._errors import InvalidPlan
    from planrun.model._decompose import decompose

    registry = Registry([KindSpec("a", "A"), KindSpec("b", "B")])
    bad = {"goal": "g", "tasks": [{"kind": "a", "payload": {}, "depends_on": [1]},
                                   {"kind": "b", "payload": {}, "depends_on": [0]}]}

    def answer(req: ChatRequest) -> Any:
        return bad

    fake_openai.answers["plan"] = answer
    with pytest.raises(InvalidPlan):
        decompose("g", registry, fake_model(), min_tasks=1, repair_attempts=1)
    [span] = by_name(otel.finished(), "decompose")
    assert span.attributes["planrun.plan.valid"] is False
    assert span.attributes["planrun.decompose.repairs"] == 1
    invalid = [e for e in span.events if e.name == "plan.invalid"]
    assert [e.attributes["planrun.decompose.attempt"] for e in invalid] == [1, 2]
    assert span.attributes["error.type"] == "InvalidPlan"
