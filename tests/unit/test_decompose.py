"""The decomposer: strict plan schema, bounded repair loop, evidence on failure."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import fake_model
from pydantic import BaseModel

from planrun.core._errors import InvalidPlan, PermanentError, UsageError
from planrun.core._registry import KindSpec, Registry
from planrun.dev.testing import ChatRequest, FakeOpenAI, Scripted
from planrun.model._decompose import adecompose, decompose
from planrun.model._usage import Usage
from planrun.runtime._clock import VirtualClock


class Topic(BaseModel):
    topic: str


REGISTRY = Registry([
    KindSpec("research", "Collect findings on one topic", Topic),
    KindSpec("analyse", "Analyse findings"),
    KindSpec("write_brief", "Write the brief"),
])

GOOD = {
    "goal": "brief",
    "tasks": [
        {"kind": "research", "payload": {"topic": "Adyen"}, "depends_on": []},
        {"kind": "research", "payload": {"topic": "Stripe"}, "depends_on": []},
        {"kind": "analyse", "payload": {}, "depends_on": [0, 1]},
        {"kind": "write_brief", "payload": {}, "depends_on": [2]},
    ],
}


def with_tasks(*edits: tuple[int, dict[str, Any]]) -> dict[str, Any]:
    doc = json.loads(json.dumps(GOOD))
    for index, change in edits:
        doc["tasks"][index].update(change)
    return doc


BAD: dict[str, Any] = {
    "unknown_kind": with_tasks((2, {"kind": "verify_sources"})),
    "forward_dependency": with_tasks((0, {"depends_on": [3]})),
    "cycle": {"goal": "g", "tasks": [
        {"id": "a", "kind": "research", "payload": {"topic": "x"}, "depends_on": ["c"]},
        {"id": "b", "kind": "analyse", "payload": {}, "depends_on": ["a"]},
        {"id": "c", "kind": "write_brief", "payload": {}, "depends_on": ["b"]},
    ]},
    "not_json": "Sure! Here is a plan: first research, then analyse, then write.",
    "invalid_payload": with_tasks((0, {"payload": {"subject": "Adyen"}})),
    "too_few_tasks": {"goal": "g", "tasks": GOOD["tasks"][:1]},
}


def replies(*values: Any) -> Any:
    queue = list(values)

    def answer(req: ChatRequest) -> Any:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return answer


def run(coro: Any) -> Any:
    return VirtualClock().run(coro)


def test_valid_plan_in_one_call(fake_openai: FakeOpenAI) -> None:
    fake_openai.answers["plan"] = GOOD
    plan = run(adecompose("a brief on payments", REGISTRY, fake_model()))
    assert [t.kind for t in plan.tasks] == ["research", "research", "analyse", "write_brief"]
    assert len(fake_openai.requests) == 1
    request = fake_openai.requests[0]
    # The prompt lists the kinds with descriptions and states the rules.
    for needle in ("research", "Collect findings on one topic", "3", "8", "earlier"):
        assert needle in request.prompt
    # The response format is the registry's plan schema, strict: no other kind can be named.
    fmt = request.body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    kinds = {
        v["properties"]["kind"]["enum"][0]
        for v in fmt["json_schema"]["schema"]["properties"]["tasks"]["items"]["anyOf"]
    }
    assert kinds == {"research", "analyse", "write_brief"}


@pytest.mark.parametrize("code", sorted(BAD))
def test_each_problem_is_repaired_by_a_second_response(
    fake_openai: FakeOpenAI, code: str
) -> None:
    fake_openai.answers["plan"] = replies(BAD[code], GOOD)
    plan = run(adecompose("a brief", REGISTRY, fake_model()))
    assert len(plan.tasks) == 4
    assert len(fake_openai.requests) == 2
    repair = fake_openai.requests[1]
    roles = [m["role"] for m in repair.messages]
    assert roles == ["user", "assistant", "user"]
    assert code in repair.last_user  # the problem list names the code
    assert repair.messages[0] == fake_openai.requests[0].messages[0]  # the original request


@pytest.mark.parametrize("code", sorted(BAD))
def test_each_problem_raises_invalid_plan_when_the_repair_fails_too(
    fake_openai: FakeOpenAI, code: str
) -> None:
    fake_openai.answers["plan"] = replies(BAD[code])
    with pytest.raises(InvalidPlan) as err:
        run(adecompose("a brief", REGISTRY, fake_model(), repair_attempts=1))
    assert code in {p.code for p in err.value.problems}
    assert len(err.value.raw_outputs) == 2 and len(err.value.attempts) == 2
    assert len(fake_openai.requests) == 2


def test_conversation_never_grows_beyond_request_plus_last_attempt(
    fake_openai: FakeOpenAI,
) -> None:
    first, second = BAD["unknown_kind"], BAD["forward_dependency"]
    fake_openai.answers["plan"] = replies(first, second, BAD["not_json"])
    with pytest.raises(InvalidPlan) as err:
        run(adecompose("a brief", REGISTRY, fake_model(), repair_attempts=2))
    third = fake_openai.requests[2]
    assert [m["role"] for m in third.messages] == ["user", "assistant", "user"]
    assert json.loads(third.messages[1]["content"]) == second  # the last attempt only
    assert "forward_dependency" in third.last_user and "unknown_kind" not in third.last_user
    assert [p.code for p in err.value.problems] == ["not_json"]
    assert "after 3 attempt(s)" in str(err.value)


def test_transport_errors_are_retried_not_pasted_into_the_conversation(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.script = [Scripted(500, "upstream exploded")]
    fake_openai.answers["plan"] = GOOD
    run(adecompose("a brief", REGISTRY, fake_model()))
    assert len(fake_openai.requests) == 2
    assert fake_openai.requests[0].messages == fake_openai.requests[1].messages
    assert "exploded" not in json.dumps(fake_openai.requests[1].messages)


def test_permanent_transport_error_propagates(fake_openai: FakeOpenAI) -> None:
    fake_openai.script = [Scripted(400, "bad request")]
    with pytest.raises(PermanentError):
        run(adecompose("a brief", REGISTRY, fake_model()))
    assert len(fake_openai.requests) == 1


def test_usage_of_every_attempt_is_metered_under_decompose(fake_openai: FakeOpenAI) -> None:
    fake_openai.answers["plan"] = replies(BAD["cycle"], GOOD)
    meter = Usage()
    run(adecompose("a brief", REGISTRY, fake_model(), meter=meter))
    assert meter.total.requests == 2
    assert meter["decompose"].total_tokens == meter.total.total_tokens > 0


def test_bad_arguments(fake_openai: FakeOpenAI) -> None:
    with pytest.raises(UsageError, match="non-empty"):
        run(adecompose("  ", REGISTRY, fake_model()))
    with pytest.raises(UsageError, match="repair_attempts"):
        run(adecompose("g", REGISTRY, fake_model(), repair_attempts=-1))


def test_sync_decompose(fake_openai: FakeOpenAI) -> None:
    fake_openai.answers["plan"] = GOOD
    assert len(decompose("a brief", REGISTRY, fake_model()).tasks) == 4


def test_the_goal_is_the_users_whatever_the_model_writes(fake_openai: FakeOpenAI) -> None:
    fake_openai.answers["plan"] = {**GOOD, "goal": "What to carry out"}
    plan = run(adecompose("  a brief on payments ", REGISTRY, fake_model()))
    assert plan.goal == "a brief on payments"
    request = fake_openai.requests[0]
    schema = request.body["response_format"]["json_schema"]["schema"]
    assert "goal" not in schema["properties"]  # the model is not asked for it
    assert '"goal"' not in request.prompt.split("## Answer")[-1]


def test_a_run_from_a_goal_carries_the_users_goal_everywhere(
    fake_openai: FakeOpenAI, tmp_path: Any,
) -> None:
    import asyncio

    from planrun import App, aplan_and_run
    from planrun.stores import open_store

    fake_openai.answers["plan"] = {**GOOD, "goal": "The plan, with no prose."}
    registry = Registry([KindSpec(s.name, s.description, s.payload_model,
                                  handler=lambda p, c: {"ok": True}) for s in REGISTRY])
    db = f"sqlite:///{tmp_path / 'runs.db'}"

    async def go() -> Any:
        report = await aplan_and_run("a brief on payments", App(registry), model=fake_model(),
                                     store=db)
        store = open_store(db)
        await store.open()
        try:
            return report, (await store.load(report.run_id)).run
        finally:
            await store.close()

    report, stored = asyncio.run(go())
    assert report.goal == report.plan.goal == stored.goal == "a brief on payments"
    assert stored.meta["plan"]["goal"] == "a brief on payments"


# ---- code repairs before model repairs --------------------------------------------------------


class Findings(BaseModel):
    text: str


class Analysis(BaseModel):
    text: str


def contracted() -> Registry:
    """The brief's kinds with their contracts: analyse reads findings, the brief analyses."""
    reg = Registry()
    reg.register("research", lambda p, c: {}, payload=Topic, result=Findings, unique=True,
                 description="Collect findings on one topic")
    reg.register("analyse", lambda p, c: {}, result=Analysis, inputs=Findings)
    reg.register("write_brief", lambda p, c: {}, inputs=Analysis, delivers=True, max_count=1)
    return reg


# The plan: analyse depends on itself, write_brief on research. One task produces
# what each needs, so the compiler can finish it.
WIRED_WRONG = {"tasks": [
    {"kind": "research", "payload": {"topic": "Adyen"}, "depends_on": []},
    {"kind": "analyse", "payload": {}, "depends_on": [1]},
    {"kind": "write_brief", "payload": {}, "depends_on": [0]},
]}


def test_code_repairs_finish_a_plan_without_a_second_model_call(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.answers["plan"] = WIRED_WRONG
    plan = run(adecompose("a brief", contracted(), fake_model(), min_tasks=1))
    assert len(fake_openai.requests) == 1
    assert [(t.kind, t.depends_on) for t in plan.tasks] == [
        ("research", ()), ("analyse", (0,)), ("write_brief", (0, 1))]
    assert [(r.by, r.code, r.rule, r.attempt) for r in plan.repairs] == [
        ("code", "self_dependency", "drop_self_dependency", 1),
        ("code", "missing_input", "add_needed_input", 1),
        ("code", "missing_input", "add_needed_input", 1)]
    assert plan.to_document()["repairs"][0]["by"] == "code"


def test_repair_model_asks_the_model_for_every_repair(fake_openai: FakeOpenAI) -> None:
    good = {"tasks": [WIRED_WRONG["tasks"][0], {**WIRED_WRONG["tasks"][1], "depends_on": [0]},
                      {**WIRED_WRONG["tasks"][2], "depends_on": [1]}]}
    fake_openai.answers["plan"] = replies(WIRED_WRONG, good)
    plan = run(adecompose("a brief", contracted(), fake_model(), min_tasks=1, repair="model"))
    assert len(fake_openai.requests) == 2
    assert "self_dependency" in fake_openai.requests[1].last_user
    assert [(r.by, r.code, r.task, r.attempt) for r in plan.repairs] == [
        ("model", "self_dependency", 1, 2)]
    with pytest.raises(UsageError, match="repair"):
        run(adecompose("a brief", contracted(), fake_model(), repair="guess"))  # type: ignore[arg-type]


def test_what_needs_the_model_goes_to_it_as_without_code_repairs_then_code_finishes(
    fake_openai: FakeOpenAI,
) -> None:
    # An unknown kind (which was meant is a guess) beside a self dependency: the model is
    # shown its own answer and every problem; its next answer has a forward dependency
    # and no cycle, which code puts in order.
    first = {"tasks": [*WIRED_WRONG["tasks"][:2], {"kind": "brief", "payload": {},
                                                     "depends_on": [1]}]}
    second = {"tasks": [{"kind": "write_brief", "payload": {}, "depends_on": [2]},
                        {"kind": "research", "payload": {"topic": "Adyen"}, "depends_on": []},
                        {"kind": "analyse", "payload": {}, "depends_on": [1]}]}
    fake_openai.answers["plan"] = replies(first, second)
    plan = run(adecompose("a brief", contracted(), fake_model(), min_tasks=1))
    assert len(fake_openai.requests) == 2
    repair = fake_openai.requests[1]
    assert json.loads(repair.messages[1]["content"]) == first  # its answer, as it gave it
    assert "unknown_kind" in repair.last_user and "self_dependency" in repair.last_user
    assert [t.kind for t in plan.tasks] == ["research", "analyse", "write_brief"]
    assert [(r.by, r.code, r.attempt) for r in plan.repairs] == [
        ("model", "self_dependency", 2), ("model", "unknown_kind", 2),
        ("code", "forward_dependency", 2)]


def test_a_cycle_is_still_refused_and_sent_to_the_model(fake_openai: FakeOpenAI) -> None:
    fake_openai.answers["plan"] = replies(BAD["cycle"], GOOD)
    plan = run(adecompose("a brief", REGISTRY, fake_model()))
    assert len(fake_openai.requests) == 2 and "cycle" in fake_openai.requests[1].last_user
    assert [(r.by, r.code) for r in plan.repairs] == [("model", "cycle")]


def test_a_stored_run_keeps_the_repairs_of_its_plan(
    fake_openai: FakeOpenAI, tmp_path: Any,
) -> None:
    import asyncio

    from planrun import App, aplan_and_run
    from planrun.stores import open_store

    fake_openai.answers["plan"] = WIRED_WRONG
    db = f"sqlite:///{tmp_path / 'runs.db'}"

    async def go() -> Any:
        report = await aplan_and_run("a brief", App(contracted()), model=fake_model(),
                                     store=db, min_tasks=1)
        store = open_store(db)
        await store.open()
        try:
            return report, (await store.load(report.run_id)).run
        finally:
            await store.close()

    report, stored = asyncio.run(go())
    assert report.plan.repairs and len(fake_openai.requests) == 1
    assert [r["code"] for r in stored.meta["plan"]["repairs"]] == [
        "self_dependency", "missing_input", "missing_input"]


def test_a_run_with_repair_model_asks_the_model_for_every_repair_and_stores_it(
    fake_openai: FakeOpenAI, tmp_path: Any,
) -> None:
    import asyncio

    from planrun import App, aplan_and_run, plan_and_run
    from planrun.stores import open_store

    good = {"tasks": [WIRED_WRONG["tasks"][0], {**WIRED_WRONG["tasks"][1], "depends_on": [0]},
                      {**WIRED_WRONG["tasks"][2], "depends_on": [1]}]}
    db = f"sqlite:///{tmp_path / 'runs.db'}"

    async def meta(run_id: str) -> Any:
        store = open_store(db)
        await store.open()
        try:
            return (await store.load(run_id)).run.meta
        finally:
            await store.close()

    fake_openai.answers["plan"] = replies(WIRED_WRONG, good)
    report = plan_and_run("a brief", App(contracted()), model=fake_model(), min_tasks=1,
                          repair="model", store=db)
    assert len(fake_openai.requests) == 2
    assert [(r.by, r.code) for r in report.plan.repairs] == [("model", "self_dependency")]
    assert [e.detail["by"] for e in report.events if e.event == "repaired"] == ["model"]
    assert asyncio.run(meta(report.run_id))["repair"] == "model"  # for a resume's replans

    fake_openai.requests.clear()
    fake_openai.answers["plan"] = replies(WIRED_WRONG, good)
    report = plan_and_run("a brief", App(contracted()), model=fake_model(), min_tasks=1,
                          store=db)
    assert len(fake_openai.requests) == 1
    assert {r.by for r in report.plan.repairs} == {"code"}
    assert "repair" not in asyncio.run(meta(report.run_id))

    fake_openai.requests.clear()
    with pytest.raises(UsageError, match="repair must be one of"):
        asyncio.run(aplan_and_run("a brief", App(contracted()), model=fake_model(),
                                  repair="guess"))  # type: ignore[arg-type]
    assert fake_openai.requests == []
