"""Contracts between kinds: each code caught on a hand-written plan, every problem at once,
derived from result models where a kind reads typed inputs, held for spawned tasks, stated
in the decomposer's prompt and (where JSON Schema can say it) in the plan schema."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel

from planrun import InvalidPlan, Plan, Registry, SpawnLimits, UsageError, validate_plan
from planrun.core import CONTRACT_CODES, KindSpec, Task, plan_schema
from planrun.core.scheduling import expand
from planrun.examples import brief
from planrun.examples.answers import BRIEF_PLAN, PIX_FIRST_PLAN, PIX_PLAN
from planrun.model._prompts import describe_kinds


class Notes(BaseModel):
    text: str


class Summary(BaseModel):
    text: str


def registry() -> Registry:
    reg = Registry()
    reg.register("gather", lambda p, c: {}, result=Notes, unique=True, max_count=3)
    reg.register("sort", lambda p, c: {}, needs=["gather"])
    reg.register("digest", lambda p, c: {}, inputs=Notes, result=Summary)
    reg.register("report", lambda p, c: {}, needs=[("sort", "digest")], delivers=True,
                 max_count=1)
    return reg


def task(kind: str, deps: list[int] | None = None, **payload: Any) -> dict[str, Any]:
    return {"kind": kind, "payload": payload, "depends_on": deps or []}


def codes(plan: list[dict[str, Any]], reg: Registry | None = None) -> list[tuple[str, Any]]:
    found = validate_plan({"goal": "g", "tasks": plan}, reg or registry(), min_tasks=0)
    return [(p.code, p.task) for p in found]


def test_the_codes_are_the_designs() -> None:
    assert CONTRACT_CODES == ("missing_input", "no_deliverable", "dead_end", "duplicate_task",
                              "too_many_of_kind")


def test_a_plan_that_keeps_every_contract_is_valid() -> None:
    assert codes([task("gather", q=1), task("gather", q=2), task("sort", [0]),
                  task("digest", [1]), task("report", [2, 3])]) == []


def test_missing_input_by_kind_and_by_result_model() -> None:
    found = codes([task("gather", q=1), task("sort"), task("digest"), task("report", [0, 1, 2])])
    assert ("missing_input", 1) in found and ("missing_input", 2) in found
    plan = {"goal": "g", "tasks": [task("gather", q=1), task("digest", [0]), task("report", [0])]}
    problems = validate_plan(plan, registry(), min_tasks=0)
    assert [(p.code, p.task) for p in problems] == [("dead_end", 1), ("missing_input", 2)]
    assert "'sort' or 'digest'" in problems[1].message


def test_inputs_are_derived_from_the_result_models() -> None:
    plan = {"goal": "g", "tasks": [task("sort"), task("digest", [0]), task("report", [1])]}
    problems = validate_plan(plan, registry(), min_tasks=0)
    digest = next(p for p in problems if p.task == 1)
    assert digest.code == "missing_input"
    assert "reads a Notes, which 'gather' produces" in digest.message


def test_no_deliverable_and_dead_end() -> None:
    assert codes([task("gather", q=1), task("sort", [0])]) == [("no_deliverable", None)]
    assert codes([task("gather", q=1), task("gather", q=2), task("sort", [0]),
                  task("report", [2])]) == [("dead_end", 1)]


def test_duplicate_task_and_too_many_of_kind() -> None:
    found = codes([task("gather", q=1), task("gather", q=1), task("gather", q=2),
                   task("gather", q=3), task("sort", [0, 1, 2, 3]), task("report", [4])])
    assert ("duplicate_task", 1) in found and ("too_many_of_kind", None) in found
    assert codes([task("gather", q=1), task("sort", [0]), task("report", [1]),
                  task("report", [1])]) == [("too_many_of_kind", None)]


class Query(BaseModel):
    q: int


def test_every_problem_at_once_with_a_payload_problem() -> None:
    reg = Registry([KindSpec(s.name, payload_model=Query if s.name == "gather" else None,
                             result_model=s.result_model, needs=s.needs, inputs=s.inputs,
                             delivers=s.delivers, max_count=s.max_count, unique=s.unique)
                    for s in registry()])
    found = codes([task("gather", q=1), task("gather", q=1), task("gather", q="many"),
                   task("sort"), task("report", [3])], reg)
    assert set(found) == {("duplicate_task", 1), ("invalid_payload", 2), ("dead_end", 0),
                          ("dead_end", 1), ("dead_end", 2), ("missing_input", 3)}


def test_a_broken_graph_is_reported_without_guessing_its_contracts() -> None:
    assert [c for c, _ in codes([task("sort", [1]), task("report", [0])])] == \
        ["forward_dependency"]


def test_a_contract_that_names_nothing_sensible_is_refused_when_declared() -> None:
    with pytest.raises(UsageError, match="each need is a kind name"):
        KindSpec("k", needs=(3,))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="max_count must be a whole number >= 1"):
        KindSpec("k", max_count=0)
    with pytest.raises(UsageError, match="inputs must be pydantic models"):
        KindSpec("k", inputs=(dict,))  # type: ignore[arg-type]


def test_the_shipped_brief_declares_its_contracts() -> None:
    reg = brief.make_app().registry
    assert Plan.parse(BRIEF_PLAN, reg, max_tasks=8).tasks
    with pytest.raises(InvalidPlan) as caught:
        Plan.parse(PIX_FIRST_PLAN, reg, max_tasks=8)
    assert {p.code for p in caught.value.problems} == {"duplicate_task", "no_deliverable"}
    assert Plan.parse(PIX_PLAN, reg, max_tasks=8).tasks


def test_the_prompt_states_the_contracts() -> None:
    text = describe_kinds(brief.make_app().registry)
    assert "Reads a Findings: depend on a `research` task." in text
    assert "Delivers the run's result" in text and "At most 1 per plan." in text
    assert "No two tasks of this kind with the same payload." in text


def test_the_schema_says_a_deliverable_is_needed_and_leaves_the_goal_to_the_user() -> None:
    schema = plan_schema(registry(), goal=False)
    assert "goal" not in schema["properties"] and schema["required"] == ["tasks"]
    validator = jsonschema.Draft202012Validator(schema)
    assert not validator.is_valid({"tasks": [task("gather", q=1)]})
    assert validator.is_valid({"tasks": [task("gather", q=1), task("sort", [0]),
                                          task("report", [1])]})
    assert "goal" in plan_schema(registry())["required"]


def _run(reg: Registry, *kinds: str) -> dict[str, Task]:
    tasks = [Task(f"t{i}", kind, payload={"q": i}, depends_on=(f"t{i - 1}",) if i else ())
             for i, kind in enumerate(kinds)]
    return {t.id: t for t in tasks}


def test_a_spawn_that_breaks_a_contract_is_refused_with_the_runs_tasks_as_context() -> None:
    from planrun import SpawnRequest

    reg = registry()
    run = _run(reg, "gather", "sort", "report")
    limits = SpawnLimits()
    # A second report would be the run's second: too_many_of_kind; a sort that waits for
    # nothing misses its input; a gather whose payload the run already has is a duplicate.
    with pytest.raises(InvalidPlan) as caught:
        expand(run["t0"], [SpawnRequest("report", {}, ("t1",)), SpawnRequest("sort", {}),
                           SpawnRequest("gather", {"q": 0})], run, reg, limits, 0.0)
    found = {(p.code, p.task) for p in caught.value.problems}
    assert ("too_many_of_kind", None) in found and ("missing_input", 1) in found
    assert ("duplicate_task", 2) in found
    # A gather nothing waits for is a dead end; one the report waits for through its join
    # of the spawner keeps every contract and is added.
    with pytest.raises(InvalidPlan, match="dead_end"):
        expand(run["t0"], [SpawnRequest("gather", {"q": 9})], run, reg, limits, 0.0)
    run["t2"] = run["t2"].evolve(depends_on=("t1", "t0"), joins=("t0",))
    added = expand(run["t0"], [SpawnRequest("gather", {"q": 9})], run, reg, limits, 0.0)
    assert [t.kind for t in added.tasks] == ["gather"]
    assert added.joiners and added.joiners[0].id == "t2"
