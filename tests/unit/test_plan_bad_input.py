"""Bad plans are refused with problems: never misread, never a crash, never slow.

The large inputs below are the shapes of ``bench/validation.py``; here they check the
answer (and that validation does not recurse), never how long it takes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from planrun.core._errors import InvalidPlan
from planrun.core._plan import Plan, Problem, validate_plan

KINDS = ["noop", "work"]

NESTED_PLAN_IN_BROKEN_DOC = (
    '{"goal":"g","tasks":[{"kind":"noop","payload":{"n":1},"depends_on":[]},'
    '{"kind":"noop","payload":{"n":2,"tasks":[{"kind":"work","payload":{"n":99},'
    '"depends_on":[]}]},"depends_on":[0,]}]}'
)


def codes(problems: list[Problem]) -> list[tuple[str, int | None]]:
    return [(p.code, p.task) for p in problems]


def task(kind: str = "noop", deps: list[Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "payload": {}, "depends_on": deps or [], **extra}


def nested(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth):
        value = {"a": value}
    return value


# ------------------------------------------------------------- JSON found only at the top


def test_a_plan_nested_in_a_broken_document_is_not_taken_for_the_plan() -> None:
    problems = validate_plan(NESTED_PLAN_IN_BROKEN_DOC, KINDS)
    assert codes(problems) == [("not_json", None)]
    assert "not valid JSON" in problems[0].message and "line 1 column" in problems[0].message


@pytest.mark.parametrize(
    "text",
    [
        '{"goal": "g", "tasks": [{"kind": "noop", "payload": {"n": 1}',  # truncated
        '{"goal": "g", "tasks": [',
        '[{"kind": "noop", "payload": {}, "depends_on": []},',
    ],
)
def test_truncated_json_is_not_json_with_the_parser_message(text: str) -> None:
    problems = validate_plan(text, KINDS)
    assert codes(problems) == [("not_json", None)]
    assert "not valid JSON" in problems[0].message and "column" in problems[0].message
    assert "single task" not in problems[0].message


def test_prose_around_a_whole_plan_still_finds_it() -> None:
    plan = json.dumps({"goal": "g", "tasks": [task(), task(deps=[0])]})
    text = f"Here it is [see below] {{not json}}:\n{plan}\nHope that helps (really)."
    assert Plan.parse(text, KINDS).goal == "g"


def test_prose_with_a_broken_value_then_a_whole_one_takes_the_whole_one() -> None:
    good = json.dumps([task("work")])
    text = '{"tasks": [{"kind": "noop"} oops ]} and then ' + good
    assert [t.kind for t in Plan.parse(text, KINDS).tasks] == ["work"]


# ------------------------------------------------------------------- depth and strictness


@pytest.mark.parametrize("depth", [100, 500, 900, 5_000])
def test_deep_payloads_are_a_schema_problem(depth: int) -> None:
    raw = [{"kind": "noop", "payload": nested(depth), "depends_on": []}]
    problems = validate_plan(raw, KINDS)
    assert codes(problems) == [("schema", 0)]
    assert "levels deep" in problems[0].message
    with pytest.raises(InvalidPlan):
        Plan.parse(raw, KINDS)


@pytest.mark.parametrize("depth", [100, 900, 5_000, 100_000])
def test_deep_text_is_a_schema_problem(depth: int) -> None:
    text = '[{"kind": "noop", "payload": ' + '{"a": ' * depth + "1" + "}" * depth + "}]"
    problems = validate_plan(text, KINDS)
    assert [p.code for p in problems] == ["schema"]
    assert "levels deep" in problems[0].message


def test_depth_well_within_the_bound_is_fine() -> None:
    plan = Plan.parse([{"kind": "noop", "payload": nested(40), "depends_on": []}], KINDS)
    assert plan.tasks[0].payload == nested(40)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        (float("-inf"), "-inf"),
        ("bad \udc80 text", "lone surrogate"),
        ({1, 2}, "Python set"),
    ],
)
def test_values_strict_json_cannot_carry_are_refused(value: object, needle: str) -> None:
    raw = [task(), {"kind": "noop", "payload": {"x": [1, {"y": value}]}, "depends_on": []}]
    problems = validate_plan(raw, KINDS)
    assert codes(problems) == [("invalid_payload", 1)]
    assert needle in problems[0].message and "x[1].y" in problems[0].message


def test_nan_in_text_is_refused() -> None:
    text = '[{"kind": "noop", "payload": {"x": NaN}, "depends_on": []}]'
    assert codes(validate_plan(text, KINDS)) == [("invalid_payload", 0)]


def test_a_lone_surrogate_in_the_goal_is_a_schema_problem() -> None:
    problems = validate_plan({"goal": "g\ud800", "tasks": [task()]}, KINDS)
    assert codes(problems) == [("schema", None)]


@pytest.mark.parametrize("dep", [10**5000, -(10**5000), 2**70], ids=["huge", "-huge", "2**70"])
def test_huge_integers_in_depends_on_are_unknown_dependencies(dep: int) -> None:
    problems = validate_plan([task(), task(deps=[dep])], KINDS)
    assert ("unknown_dependency", 1) in codes(problems) or ("schema", 1) in codes(problems)
    assert all(len(p.message) < 1_000 for p in problems)


def test_a_huge_integer_as_depends_on_itself_is_described_briefly() -> None:
    problems = validate_plan([{"kind": "noop", "payload": {}, "depends_on": 10**5000}], KINDS)
    assert {p.code for p in problems} == {"schema"}
    assert all("digits" in p.message and len(p.message) < 300 for p in problems)


# ------------------------------------------------------------------------------- cycles


def two_task_cycles(n: int) -> list[dict[str, Any]]:
    tasks = []
    for k in range(n):
        tasks.append(task(id=f"a{k}", deps=[f"b{k}"]))
        tasks.append(task(id=f"b{k}", deps=[f"a{k}"]))
    return tasks


def test_thousands_of_cycles_are_reported_boundedly() -> None:
    problems = validate_plan(two_task_cycles(4_000), KINDS, max_tasks=10_000)
    assert {p.code for p in problems} == {"cycle"}
    summary, *cycles = problems
    assert [p.task for p in cycles] == list(range(0, 40, 2))
    assert summary.task is None
    assert "3980 more" in summary.message and "4000 in all" in summary.message


def test_all_to_all_is_one_cycle_problem() -> None:
    n = 200
    tasks = [task(id=f"t{i}", deps=[f"t{j}" for j in range(n) if j != i]) for i in range(n)]
    problems = validate_plan(tasks, KINDS, max_tasks=n)
    assert codes(problems) == [("cycle", 0)]


def test_a_long_chain_is_valid_and_ordered() -> None:
    n = 100_000
    tasks = [task(deps=[i - 1] if i else []) for i in range(n)]
    plan = Plan.parse(tasks, KINDS, max_tasks=n)
    assert plan.topological_order()[:3] == [0, 1, 2] and len(plan.tasks) == n


def test_a_long_id_cycle_is_found_without_recursion() -> None:
    n = 50_000
    tasks = [task(id=f"t{i}", deps=[f"t{(i + 1) % n}"]) for i in range(n)]
    problems = validate_plan(tasks, KINDS, max_tasks=n)
    assert codes(problems) == [("cycle", 0)]
    assert "tasks [0, 1, 2" in problems[0].message or "task 0" in problems[0].message


def test_large_prose_nested_arrays_find_nothing_quickly_and_correctly() -> None:
    body = ", ".join(str(i) for i in range(200_000))
    text = "Here is my answer: " + "[" * 50 + body + " oops" + "]" * 50 + " done."
    problems = validate_plan(text, KINDS)
    assert codes(problems) == [("not_json", None)]
