"""Plan parsing, validation (every problem, every code), order, conversion and schema."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel, Field, field_validator

from planrun.core._errors import InvalidPlan, UsageError
from planrun.core._plan import (
    PROBLEM_CODES,
    Plan,
    PlanTask,
    Problem,
    plan_schema,
    validate_plan,
)
from planrun.core._registry import KindSpec, Registry
from planrun.core._task import Task

KINDS = ["fetch", "summarise", "translate"]


def codes(problems: list[Problem]) -> list[tuple[str, int | None]]:
    return [(p.code, p.task) for p in problems]


def task(kind: str = "fetch", deps: list[Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "payload": {}, "depends_on": deps or [], **extra}


def doc(*tasks: dict[str, Any], goal: str = "g") -> dict[str, Any]:
    return {"goal": goal, "tasks": list(tasks)}


# ------------------------------------------------------------------------------ Problem


def test_problem_codes_are_exactly_the_design_table() -> None:
    assert set(PROBLEM_CODES) == {
        "not_json",
        "schema",
        "unknown_kind",
        "invalid_payload",
        "self_dependency",
        "forward_dependency",
        "unknown_dependency",
        "cycle",
        "too_few_tasks",
        "too_many_tasks",
        "missing_input",
        "no_deliverable",
        "dead_end",
        "duplicate_task",
        "too_many_of_kind",
        "truncated",
    }
    assert len(PROBLEM_CODES) == 16


def test_problem_str_and_dict() -> None:
    p = Problem("forward_dependency", 2, "task 2 depends on task 4")
    assert str(p) == "task 2: forward_dependency: task 2 depends on task 4"
    assert str(Problem("not_json", None, "no JSON")) == "not_json: no JSON"
    assert p.to_dict() == {
        "code": "forward_dependency",
        "task": 2,
        "message": "task 2 depends on task 4",
    }


# ------------------------------------------------------------------------- valid plans


def test_valid_plan_parses_into_plan() -> None:
    plan = Plan.parse(doc(task("fetch"), task("summarise", [0]), goal="read it"), KINDS)
    assert plan.goal == "read it"
    assert plan.tasks == (
        PlanTask("fetch", {}, ()),
        PlanTask("summarise", {}, (0,)),
    )
    assert validate_plan(doc(task("fetch"), task("summarise", [0])), KINDS) == []


def test_bare_list_and_defaults() -> None:
    plan = Plan.parse([{"kind": "fetch"}, {"kind": "translate", "depends_on": [0]}], KINDS)
    assert plan.goal == ""
    assert plan.tasks[0].payload == {} and plan.tasks[0].depends_on == ()
    assert plan.tasks[1].depends_on == (0,)


def test_duplicate_dependencies_are_collapsed() -> None:
    plan = Plan.parse([task(), task(), task("fetch", [1, 0, 1])], KINDS)
    assert plan.tasks[2].depends_on == (1, 0)


def test_plan_copies_payload_from_input() -> None:
    payload: dict[str, Any] = {"url": "x", "nested": {"a": 1}}
    raw = [{"kind": "fetch", "payload": payload}]
    plan = Plan.parse(raw, KINDS)
    payload["nested"]["a"] = 2
    assert plan.tasks[0].payload == {"url": "x", "nested": {"a": 1}}


# ----------------------------------------------------------------------- each problem


def test_not_json() -> None:
    problems = validate_plan("I could not make a plan, sorry.", KINDS)
    assert codes(problems) == [("not_json", None)]
    assert '"tasks"' in problems[0].message  # tells the model the expected shape


@pytest.mark.parametrize(
    "raw", ["", "   ", "null", "42", '"a string"', "{broken", b"", b"\xff\xfe"]
)
def test_not_json_variants(raw: str | bytes) -> None:
    assert codes(validate_plan(raw, KINDS)) == [("not_json", None)]


def test_forward_dependency_message_is_exact() -> None:
    raw = doc(task(), task(), task("fetch", [4]), task(), task())
    problems = validate_plan(raw, KINDS)
    assert codes(problems) == [("forward_dependency", 2)]
    assert str(problems[0]) == (
        "task 2: forward_dependency: task 2 depends on task 4, which comes later; "
        "depend only on earlier tasks (0..1)"
    )


def test_forward_dependency_of_first_and_second_task() -> None:
    problems = validate_plan(doc(task("fetch", [1]), task("fetch", [2]), task()), KINDS)
    assert codes(problems) == [("forward_dependency", 0), ("forward_dependency", 1)]
    assert "first task" in problems[0].message
    assert "(0)" in problems[1].message


def test_self_dependency() -> None:
    problems = validate_plan(doc(task(), task("fetch", [1])), KINDS)
    assert codes(problems) == [("self_dependency", 1)]
    assert "itself" in problems[0].message


@pytest.mark.parametrize(
    ("dep", "needle"), [(7, "the plan has 2 tasks (0..1)"), (-1, "start at 0")]
)
def test_unknown_dependency_index(dep: int, needle: str) -> None:
    problems = validate_plan(doc(task(), task("fetch", [dep])), KINDS)
    assert codes(problems) == [("unknown_dependency", 1)]
    assert needle in problems[0].message


def test_unknown_kind_suggests_close_match_and_lists_kinds() -> None:
    problems = validate_plan(doc(task("fetch"), task("summarize", [0])), KINDS)
    assert codes(problems) == [("unknown_kind", 1)]
    msg = problems[0].message
    assert "did you mean 'summarise'?" in msg
    for kind in KINDS:
        assert repr(kind) in msg


def test_unknown_kind_without_close_match_has_no_suggestion() -> None:
    (problem,) = validate_plan([task("launch_rocket")], KINDS)
    assert problem.code == "unknown_kind"
    assert "did you mean" not in problem.message
    assert "'fetch'" in problem.message


def test_unknown_kind_suggestion_ignores_case_and_separators() -> None:
    (problem,) = validate_plan([task("object detection")], ["Object Detection", "Translation"])
    assert "did you mean 'Object Detection'?" in problem.message


def test_unknown_kind_with_empty_registry() -> None:
    (problem,) = validate_plan([task("fetch")], [])
    assert problem.code == "unknown_kind"
    assert "no kinds are registered" in problem.message


def test_too_few_and_too_many_tasks() -> None:
    assert codes(validate_plan(doc(), KINDS)) == [("too_few_tasks", None)]
    assert codes(validate_plan([], KINDS, min_tasks=0)) == []
    assert codes(validate_plan(doc(task()), KINDS, min_tasks=2)) == [("too_few_tasks", None)]
    problems = validate_plan([task()] * 4, KINDS, max_tasks=3)
    assert codes(problems) == [("too_many_tasks", None)]
    assert "4 tasks" in problems[0].message and "at most 3" in problems[0].message
    assert validate_plan([task()] * 3, KINDS, max_tasks=3) == []


@pytest.mark.parametrize(
    ("bounds", "kinds"),
    [
        ({"min_tasks": -1}, KINDS),
        ({"min_tasks": 5, "max_tasks": 4}, KINDS),
        ({"max_tasks": 0}, KINDS),
        ({"max_tasks": True}, KINDS),
        ({}, "fetch"),
    ],
)
def test_caller_mistakes_raise_usage_error(bounds: dict[str, Any], kinds: Any) -> None:
    with pytest.raises(UsageError):
        validate_plan([task()], kinds, **bounds)


@pytest.mark.parametrize(
    ("raw", "expected", "needle"),
    [
        ({"goal": "g"}, [("schema", None)], "no 'tasks' list"),
        ({"kind": "fetch"}, [("schema", None)], "single task"),
        ({"tasks": "fetch"}, [("schema", None)], "'tasks' must be a list"),
        ({"goal": 3, "tasks": [task()]}, [("schema", None)], "'goal' must be a string"),
        (42, [("schema", None)], "got integer 42"),
        (None, [("schema", None)], "got null"),
        ([task(), "fetch"], [("schema", 1)], "a task must be an object"),
        ([{"payload": {}}], [("schema", 0)], "missing 'kind'"),
        ([{"kind": 3}], [("schema", 0)], "'kind' must be a string"),
        ([{"kind": "fetch", "payload": "x"}], [("schema", 0)], "'payload' must be an object"),
        ([{"kind": "fetch", "payload": None}], [("schema", 0)], "got null"),
        ([task(), {"kind": "fetch", "depends_on": 0}], [("schema", 1)], "write [0]"),
        ([task(), {"kind": "fetch", "depends_on": "0"}], [("schema", 1)], "write [0]"),
        ([task(), task("fetch", [True])], [("schema", 1)], "boolean true"),
        ([task(), task("fetch", [0.0])], [("schema", 1)], "number 0.0"),
        ([task(), task("fetch", [None])], [("schema", 1)], "depends_on[0]"),
        ([task(), task("fetch", [[0]])], [("schema", 1)], "array"),
        ([task(id=5)], [("schema", 0)], "'id' must be a non-empty string"),
        ([task(id="")], [("schema", 0)], "'id' must be a non-empty string"),
        ([task(id="a"), task(id="a")], [("schema", 1)], "already used by task 0"),
        ([{"kind": "fetch", "dependencies": [0]}], [("schema", 0)], "did you mean 'depends_on'"),
    ],
)
def test_schema_problems(raw: Any, expected: list[tuple[str, int | None]], needle: str) -> None:
    problems = validate_plan(raw, KINDS)
    assert codes(problems) == expected
    assert needle in problems[0].message


# ---------------------------------------------------------------------- ids and cycles


def test_id_dependencies_may_point_forward() -> None:
    raw = [task("summarise", ["src"], id="sum"), task("fetch", id="src")]
    plan = Plan.parse(raw, KINDS)
    assert plan.tasks[0].depends_on == (1,)
    assert plan.topological_order() == [1, 0]


def test_mixed_index_and_id_dependencies() -> None:
    plan = Plan.parse([task(id="a"), task(), task("fetch", ["a", 1])], KINDS)
    assert plan.tasks[2].depends_on == (0, 1)


def test_id_self_and_unknown_dependency() -> None:
    raw = [task(id="a"), task("fetch", ["b", "nope", "1"], id="b")]
    problems = validate_plan(raw, KINDS)
    assert codes(problems) == [
        ("self_dependency", 1),
        ("unknown_dependency", 1),
        ("unknown_dependency", 1),
    ]
    assert "'nope'" in problems[1].message and "known ids: 'a', 'b'" in problems[1].message
    assert "write 1 unquoted" in problems[2].message


def test_cycle_through_ids_names_every_task_in_it() -> None:
    raw = [
        task(id="a", deps=["c"]),
        task(id="b", deps=["a"]),
        task(id="c", deps=["b"]),
        task(id="d"),
    ]
    problems = validate_plan(raw, KINDS)
    assert codes(problems) == [("cycle", 0)]
    msg = problems[0].message
    for label in ("task 0 ('a')", "task 1 ('b')", "task 2 ('c')"):
        assert label in msg
    assert "task 3" not in msg
    with pytest.raises(InvalidPlan) as info:
        Plan.parse(raw, KINDS)
    assert [p.code for p in info.value.problems] == ["cycle"]


def test_two_separate_cycles_are_both_reported() -> None:
    raw = [
        task(id="a", deps=["b"]),
        task(id="b", deps=["a"]),
        task(id="c", deps=["e"]),
        task(id="d", deps=["c"]),
        task(id="e", deps=["d"]),
    ]
    problems = validate_plan(raw, KINDS)
    assert sorted(codes(problems)) == [("cycle", 0), ("cycle", 2)]


def test_forward_index_edges_do_not_also_count_as_cycles() -> None:
    problems = validate_plan([task("fetch", [1]), task("fetch", [0])], KINDS)
    assert codes(problems) == [("forward_dependency", 0)]


# -------------------------------------------------------------------- many problems


def test_every_problem_is_reported_at_once_in_task_order() -> None:
    class Summary(BaseModel):
        text: str

    kinds = {"fetch": None, "summarise": Summary}
    raw = doc(
        task("fetch"),
        task("summarize", [0]),
        {"kind": "summarise", "payload": {"text": 1}, "depends_on": [2, 9]},
        task("fetch", [3, 0.5]),
        {"depends_on": [0]},
    )
    problems = validate_plan(raw, kinds, max_tasks=4)
    assert codes(problems) == [
        ("too_many_tasks", None),
        ("unknown_kind", 1),
        ("invalid_payload", 2),
        ("self_dependency", 2),
        ("unknown_dependency", 2),
        ("schema", 3),
        ("self_dependency", 3),
        ("schema", 4),
    ]
    with pytest.raises(InvalidPlan) as info:
        Plan.parse(raw, kinds, max_tasks=4)
    assert info.value.problems == problems
    assert "8 problem(s)" in str(info.value)
    assert info.value.raw_outputs == []  # not text


# ------------------------------------------------------------------------- raw text


GOOD = {"goal": "g", "tasks": [task("fetch"), task("summarise", [0])]}


@pytest.mark.parametrize(
    "text",
    [
        json.dumps(GOOD),
        "  \n" + json.dumps(GOOD, indent=2) + "\n",
        "Here is the plan:\n```json\n" + json.dumps(GOOD, indent=2) + "\n```\nGood luck!",
        "Plan:\n```\n" + json.dumps(GOOD) + "\n```",
        "Sure. " + json.dumps(GOOD) + " Let me know if you need changes.",
        "Sure. " + json.dumps(GOOD["tasks"]) + " (bare list)",
        "I considered [1, 2] but here it is: " + json.dumps(GOOD),
        "```json\n{not json}\n```\nactually: " + json.dumps(GOOD),
    ],
)
def test_plan_found_in_model_text(text: str) -> None:
    assert validate_plan(text, KINDS) == []
    assert validate_plan(text.encode(), KINDS) == []
    assert len(Plan.parse(text, KINDS).tasks) == 2


def test_utf8_bom_is_accepted() -> None:
    assert validate_plan(b"\xef\xbb\xbf" + json.dumps(GOOD).encode(), KINDS) == []


def test_invalid_plan_from_text_keeps_the_raw_output() -> None:
    text = "Here:\n```json\n" + json.dumps([task("nope")]) + "\n```"
    with pytest.raises(InvalidPlan) as info:
        Plan.parse(text, KINDS)
    assert info.value.raw_outputs == [text]
    assert [p.code for p in info.value.problems] == ["unknown_kind"]


def test_first_embedded_json_is_used_when_none_looks_like_a_plan() -> None:
    problems = validate_plan('see {"a": 1} and [2]', KINDS)
    assert codes(problems) == [("schema", None)]
    assert "no 'tasks' list" in problems[0].message


# ----------------------------------------------------------------------- garbage


class _Weird:
    pass


GARBAGE: list[Any] = [
    None,
    0,
    -1,
    1.5,
    float("nan"),
    True,
    "",
    "[",
    "{" * 5000,
    "[" * 100_000,
    "```",
    "```json\n```",
    b"",
    bytearray(b"[{}]"),
    b"\x00\x01",
    [],
    {},
    (),
    [None],
    [[]],
    [{}],
    [1, "x", None, 2.5, True],
    {"tasks": None},
    {"tasks": {}},
    {"tasks": [{"kind": None, "payload": None, "depends_on": None, "id": None}]},
    {"tasks": [{"kind": ["fetch"], "payload": [1], "depends_on": {"0": 1}, "id": [1]}]},
    {"tasks": [{1: 2, None: 3, "kind": "fetch"}]},
    {"tasks": [{"kind": "fetch", "depends_on": [10**100, -(10**100), "", float("inf")]}]},
    {"tasks": [task(id="x", deps=["x", "x", 0, 0])]},
    {"goal": None, "tasks": [task()] * 3},
    {"goal": {"nested": []}, "tasks": "x", "extra": 1},
    _Weird(),
    {1, 2},
    {"tasks": [_Weird()]},
    {"tasks": [{"kind": "fetch", "payload": {"obj": _Weird()}}]},
]


@pytest.mark.parametrize("raw", GARBAGE, ids=lambda v: type(v).__name__)
def test_garbage_never_crashes(raw: Any) -> None:
    problems = validate_plan(raw, KINDS)
    assert all(isinstance(p, Problem) and p.code in PROBLEM_CODES for p in problems)
    if problems:
        with pytest.raises(InvalidPlan) as info:
            Plan.parse(raw, KINDS)
        assert info.value.problems == problems
    else:
        Plan.parse(raw, KINDS)


def test_garbage_with_payload_models_never_crashes() -> None:
    class Strict(BaseModel):
        n: int

        @field_validator("n")
        @classmethod
        def boom(cls, v: int) -> int:
            if v == 13:
                raise RuntimeError("unlucky")
            return v

    kinds = {"fetch": Strict}
    for payload in [{"n": 13}, {"n": []}, {1: 2}, {"n": float("nan")}, {"n": "1" * 5000}]:
        problems = validate_plan([{"kind": "fetch", "payload": payload}], kinds)
        assert codes(problems) == [("invalid_payload", 0)]
    (problem,) = validate_plan([{"kind": "fetch", "payload": {"n": 13}}], kinds)
    assert "RuntimeError: unlucky" in problem.message


# ---------------------------------------------------------------------- payload models


class Source(BaseModel):
    url: str
    weight: float = 1.0


class Brief(BaseModel):
    title: str
    words: int = Field(gt=0)
    sources: list[Source] = []


def test_payload_model_accepts_valid_payload() -> None:
    kinds = {"fetch": None, "write_brief": Brief}
    raw = [
        task(),
        {"kind": "write_brief", "payload": {"title": "t", "words": 3}, "depends_on": [0]},
    ]
    plan = Plan.parse(raw, kinds)
    assert plan.tasks[1].payload == {"title": "t", "words": 3}


def test_invalid_payload_lists_pydantic_loc_and_msg() -> None:
    kinds = {"write_brief": Brief}
    payload = {"words": 0, "sources": [{"weight": "heavy"}]}
    (problem,) = validate_plan([{"kind": "write_brief", "payload": payload}], kinds)
    assert (problem.code, problem.task) == ("invalid_payload", 0)
    msg = problem.message
    assert "title: Field required" in msg
    assert "words: Input should be greater than 0" in msg
    assert "sources.0.url: Field required" in msg
    assert "sources.0.weight:" in msg
    assert "payload fields: title, words, sources (optional)" in msg
    assert "https://" not in msg  # concise: no pydantic URLs


def test_payload_checked_through_a_registry() -> None:
    registry = Registry([KindSpec("write_brief", payload_model=Brief), KindSpec("fetch")])
    assert codes(validate_plan([{"kind": "write_brief"}], registry)) == [("invalid_payload", 0)]
    assert validate_plan([{"kind": "fetch", "payload": {"anything": [1]}}], registry) == []


def test_payload_not_checked_for_unknown_kind_or_bad_shape() -> None:
    kinds = {"write_brief": Brief}
    assert codes(validate_plan([{"kind": "write_brif", "payload": {}}], kinds)) == [
        ("unknown_kind", 0)
    ]
    assert codes(validate_plan([{"kind": "write_brief", "payload": []}], kinds)) == [("schema", 0)]


# --------------------------------------------------------------------- order, conversion


def test_topological_order_and_levels() -> None:
    plan = Plan.parse([task(), task(), task("fetch", [0]), task("fetch", [2, 1])], KINDS)
    assert plan.topological_order() == [0, 1, 2, 3]
    assert plan.levels() == [[0, 1], [2], [3]]


def test_topological_order_breaks_ties_by_index() -> None:
    raw = [
        task(id="late", deps=["root"]),
        task(id="other"),
        task(id="root"),
        task(id="leaf", deps=["late", "other"]),
    ]
    plan = Plan.parse(raw, KINDS)
    assert plan.topological_order() == [1, 2, 0, 3]
    assert plan.levels() == [[1, 2], [0], [3]]


def test_topological_order_refuses_a_hand_built_cycle() -> None:
    plan = Plan("g", (PlanTask("fetch", {}, (1,)), PlanTask("fetch", {}, (0,))))
    with pytest.raises(InvalidPlan) as info:
        plan.topological_order()
    assert info.value.problems[0].code == "cycle"


def test_to_tasks_ids_and_dependencies() -> None:
    plan = Plan.parse(
        [task("fetch", payload={"u": 1}), task("summarise", [0], id="sum"), task("fetch", ["sum"])],
        KINDS,
    )
    tasks = plan.to_tasks()
    assert [t.id for t in tasks] == ["t0", "sum", "t2"]
    assert [t.depends_on for t in tasks] == [(), ("t0",), ("sum",)]
    assert [t.kind for t in tasks] == ["fetch", "summarise", "fetch"]
    assert tasks[0].payload == {"u": 1}
    assert [t.id for t in plan.to_tasks("step-")] == ["step-0", "sum", "step-2"]
    assert all(t.max_attempts == 5 for t in plan.to_tasks(max_attempts=5))
    with pytest.raises(UsageError):
        plan.to_tasks(status="running")
    with pytest.raises(UsageError):
        plan.to_tasks(colour="red")


def test_to_tasks_generated_ids_never_collide_with_explicit_ones() -> None:
    plan = Plan.parse([task(id="t1"), task()], KINDS)
    ids = [t.id for t in plan.to_tasks()]
    assert ids[0] == "t1" and ids[1] != "t1" and len(set(ids)) == 2


def test_from_tasks_round_trip() -> None:
    records = [Task(id="a", kind="fetch"), Task(id="b", kind="summarise", depends_on=("a",))]
    plan = Plan.from_tasks(records, goal="g")
    assert plan.tasks[1].depends_on == (0,)
    assert [(t.id, t.depends_on) for t in plan.to_tasks()] == [("a", ()), ("b", ("a",))]
    with pytest.raises(UsageError):
        Plan.from_tasks([Task(id="a", kind="fetch", depends_on=("zz",))])
    with pytest.raises(UsageError):
        Plan.from_tasks([Task(id="a", kind="fetch"), Task(id="a", kind="fetch")])


def test_to_document_is_the_design_shape_and_round_trips() -> None:
    raw = {"goal": "g", "tasks": [task("fetch", payload={"u": [1]}), task("summarise", [0])]}
    plan = Plan.parse(raw, KINDS)
    assert plan.to_document() == raw
    assert Plan.parse(json.dumps(plan.to_document()), KINDS) == plan


def test_to_document_puts_forward_id_dependencies_in_order() -> None:
    plan = Plan.parse([task("summarise", ["src"], id="sum"), task("fetch", id="src")], KINDS)
    document = plan.to_document()
    assert document["tasks"] == [
        {"id": "src", "kind": "fetch", "payload": {}, "depends_on": []},
        {"id": "sum", "kind": "summarise", "payload": {}, "depends_on": [0]},
    ]
    again = Plan.parse(document, KINDS)
    assert {t.id: t.depends_on for t in again.tasks} == {"src": (), "sum": (0,)}


# ------------------------------------------------------------------------- schema


def _validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_schema_accepts_good_and_rejects_bad_documents() -> None:
    kinds = {"fetch": None, "write_brief": Brief}
    schema = plan_schema(kinds, min_tasks=1, max_tasks=3)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["tasks"]["minItems"] == 1
    assert schema["properties"]["tasks"]["maxItems"] == 3
    enum = [
        v["properties"]["kind"]["enum"] for v in schema["properties"]["tasks"]["items"]["anyOf"]
    ]
    assert enum == [["fetch"], ["write_brief"]]
    v = _validator(schema)
    good = {
        "goal": "g",
        "tasks": [
            {"kind": "fetch", "payload": {"any": 1}, "depends_on": []},
            {
                "kind": "write_brief",
                "payload": {"title": "t", "words": 2, "sources": [{"url": "u"}]},
                "depends_on": [0],
            },
        ],
    }
    assert list(v.iter_errors(good)) == []
    assert validate_plan(good, kinds) == []

    def bad(mutate: Any) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(json.dumps(good))
        mutate(document)
        return document

    bad_docs = [
        bad(lambda d: d["tasks"][0].update(kind="launch")),
        bad(lambda d: d["tasks"][1]["payload"].pop("title")),
        bad(lambda d: d["tasks"][1]["payload"]["sources"][0].pop("url")),
        bad(lambda d: d["tasks"][1]["payload"].update(words=0)),
        bad(lambda d: d["tasks"][0].update(extra=1)),
        bad(lambda d: d["tasks"][0].pop("depends_on")),
        bad(lambda d: d["tasks"][1].update(depends_on=[-1])),
        bad(lambda d: d["tasks"][1].update(depends_on=["a"])),
        bad(lambda d: d["tasks"].extend([d["tasks"][0]] * 2)),
        bad(lambda d: d.update(tasks=[])),
        bad(lambda d: d.pop("goal")),
        bad(lambda d: d.update(note="x")),
    ]
    for document in bad_docs:
        assert list(v.iter_errors(document)), document


def test_schema_hoists_pydantic_defs_and_renames_clashes() -> None:
    class Item(BaseModel):
        x: int

    class Basket(BaseModel):
        items: list[Item]

    def other_item_model() -> type[BaseModel]:
        class Item(BaseModel):  # same name, other fields
            y: str

        class Order(BaseModel):
            items: list[Item]
            extra: Item | None = None

        return Order

    kinds = {"basket": Basket, "order": other_item_model(), "basket_too": Basket}
    schema = plan_schema(kinds)
    text = json.dumps(schema)
    variants = schema["properties"]["tasks"]["items"]["anyOf"]
    assert all("$defs" not in v["properties"]["payload"] for v in variants)
    assert len(schema["$defs"]) == 2  # one Item per distinct model, shared ones once
    refs = {part.split('"')[0] for part in text.split('"$ref": "#/$defs/')[1:]}
    assert refs == set(schema["$defs"])
    v = _validator(schema)

    def one(kind: str, payload: Any) -> dict[str, Any]:
        return {"goal": "", "tasks": [{"kind": kind, "payload": payload, "depends_on": []}]}

    assert not list(v.iter_errors(one("basket", {"items": [{"x": 1}]})))
    assert not list(v.iter_errors(one("basket_too", {"items": [{"x": 1}]})))
    assert not list(v.iter_errors(one("order", {"items": [{"y": "a"}], "extra": {"y": "b"}})))
    assert list(v.iter_errors(one("basket", {"items": [{"y": "a"}]})))
    assert list(v.iter_errors(one("order", {"items": [{"x": 1}]})))
    assert list(v.iter_errors(one("order", {"items": [], "extra": {"x": 1}})))


def test_schema_of_registry_with_descriptions_and_of_no_kinds() -> None:
    registry = Registry([KindSpec("fetch", description="Fetch a page")])
    schema = plan_schema(registry)
    variant = schema["properties"]["tasks"]["items"]["anyOf"][0]
    assert variant["description"] == "Fetch a page"
    assert variant["properties"]["payload"] == {"type": "object"}
    empty = plan_schema([], min_tasks=0)
    v = _validator(empty)
    assert not list(v.iter_errors({"goal": "", "tasks": []}))
    assert list(v.iter_errors({"goal": "", "tasks": [task()]}))


def test_schema_and_validator_agree_on_kinds_and_bounds() -> None:
    v = _validator(plan_schema(KINDS, max_tasks=2))
    for raw in (doc(task()), doc(task("nope")), doc(task(), task(), task()), doc()):
        assert (not list(v.iter_errors(raw))) == (validate_plan(raw, KINDS, max_tasks=2) == [])
