"""The validator on generated plans, usual and hostile: it never fails with anything but
its problems, and a plan it accepts survives a round trip through its document, its task
records and pickling unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import pickle
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, model_validator

from planrun.core import _plan as plan_module
from planrun.core._plan import Plan, PlanTask, Problem, validate_plan
from planrun.core._registry import KindSpec, Registry

SETTINGS = settings(max_examples=400, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class Fetch(BaseModel):
    url: str


class Count(BaseModel):
    model_config = {"extra": "forbid"}
    n: int = 0


class Stamped(BaseModel):
    """A model whose validator writes into the payload it is given (what it checked is
    what the plan must hold)."""

    seen: bool = False

    @model_validator(mode="before")
    @classmethod
    def stamp(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data["seen"] = True
        return data


REGISTRY = Registry([KindSpec("fetch", payload_model=Fetch), KindSpec("count", payload_model=Count),
                     KindSpec("stamped", payload_model=Stamped), KindSpec("plain"),
                     KindSpec("also_plain"), KindSpec("odd\udc80")])
KINDS = ["fetch", "count", "stamped", "plain", "also_plain", "odd\udc80", "Plain", "nope"]


def both(raw: Any, kinds: Any = REGISTRY, min_tasks: int = 1,
         max_tasks: int = 50) -> tuple[list[Problem], Plan | None]:
    """Validate ``raw``; a plan it accepts must read back the same from its document."""
    problems, plan = plan_module._check(raw, kinds, min_tasks, max_tasks)
    assert (plan is None) == bool(problems)
    if plan is not None:
        document = plan.to_document()  # its task list nests no deeper than a list given
        again = plan_module._check(document["tasks"], kinds, min_tasks, max_tasks)[1]
        assert again is not None
        same_plan(plan, Plan(document["goal"], again.tasks))
    return problems, plan


def same_plan(one: Plan, other: Plan) -> None:
    assert one.goal == other.goal
    assert one.to_document() == other.to_document()
    assert one.task_ids() == other.task_ids()
    assert one.task_ids("x_") == other.task_ids("x_")
    assert one.to_tasks() == other.to_tasks()
    assert one.to_tasks(max_attempts=5, estimate_s=2.0) == other.to_tasks(
        max_attempts=5, estimate_s=2.0)
    assert one == other and repr(one) == repr(other)
    assert [vars(t) for t in one.tasks] == [vars(t) for t in other.tasks]
    assert one.topological_order() == other.topological_order()
    assert pickle.loads(pickle.dumps(one)) == other


# ----------------------------------------------------------------------- generated input

scalars: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 12),
    st.integers(),
    st.text(max_size=5),
    st.floats(),  # nan and infinities too: strict JSON cannot carry them
    st.sampled_from(["\ud800", "é", "x\udfff", 1.5, ()]),
    st.sampled_from([5000, 400]).map(lambda digits: 10**digits),  # too long for JSON readers
)
values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=4), inner, max_size=3)
        | st.dictionaries(st.integers(0, 3) | st.sampled_from(["\udc00", "k"]), inner,
                          max_size=2)
    ),
    max_leaves=8,
)
plain_payloads = st.dictionaries(
    st.sampled_from(["url", "n", "seen", "text", "x"]),
    st.integers(-2, 5) | st.text(max_size=4) | st.booleans() | st.none(),
    max_size=3,
)


@st.composite
def nested(draw: st.DrawFn) -> Any:
    """A payload nesting near the bound of 64 levels (either side of it)."""
    depth = draw(st.integers(55, 66))
    value: Any = draw(scalars)
    for level in range(depth):
        value = {"d": value} if level % 2 else [value]
    return {"deep": value}


@st.composite
def tasks(draw: st.DrawFn, i: int, n: int, with_ids: bool, careless: bool) -> Any:
    """Task ``i`` of ``n``: usually a good one; if ``careless``, each part of it is now and
    then wrong."""

    def wrong() -> bool:
        return careless and draw(st.integers(0, 7)) == 0

    task: dict[Any, Any] = {}
    for key in draw(st.permutations(["kind", "payload", "depends_on"])):
        if key == "kind":
            task["kind"] = draw(st.sampled_from(KINDS) | scalars) if wrong() \
                else draw(st.sampled_from(KINDS[:5]))
        elif key == "payload":
            if draw(st.integers(0, 5)) == 0:
                continue  # no payload: an empty one
            task["payload"] = draw(values | nested()) if wrong() else draw(plain_payloads)
        elif key == "depends_on":
            if draw(st.integers(0, 5)) == 0:
                continue  # no dependencies
            if not wrong():
                task["depends_on"] = draw(st.lists(st.integers(0, i - 1), max_size=3)) \
                    if i else []
            else:
                task["depends_on"] = draw(
                    st.lists(st.integers(-2, n + 1) | st.sampled_from(["a", "b", "t0", "1"])
                             | scalars, max_size=3)
                    | scalars
                )
    if with_ids and draw(st.booleans()):
        task["id"] = draw(st.sampled_from(["a", "b", "c", "t1", "t0_1", "\ud800"]) | scalars) \
            if wrong() else f"n{i}"
    if wrong():
        task[draw(st.sampled_from(["deps", "Kind", "extra", 3, ("k",)]))] = 1
    if wrong() and wrong():
        return draw(scalars | st.lists(scalars, max_size=2))
    return task


@st.composite
def plans(draw: st.DrawFn) -> Any:
    n = draw(st.integers(0, 9))
    with_ids, careless = draw(st.booleans()), draw(st.booleans())
    entries = [draw(tasks(i, n, with_ids, careless)) for i in range(n)]
    shape = draw(st.sampled_from(["list", "list", "doc", "doc", "tuple", "odd doc"]))
    if shape == "list":
        return entries
    if shape == "tuple":
        return tuple(entries)
    doc: dict[Any, Any] = {"tasks": entries}
    if draw(st.booleans()):
        doc["goal"] = draw(st.text(max_size=6) | st.sampled_from(["\udcff", 3, None])) \
            if careless else draw(st.text(max_size=6))
    if shape == "odd doc":
        doc[draw(st.sampled_from(["notes", "Goal", 1]))] = draw(scalars)
    return doc


# --------------------------------------------------------------------------------- tests


@SETTINGS
@given(plans(), st.integers(0, 2), st.just(50) | st.integers(1, 12))
def test_any_input_gets_problems_or_a_plan_that_reads_back(raw: Any, min_tasks: int,
                                                            max_tasks: int) -> None:
    both(raw, REGISTRY, min_tasks, max(max_tasks, min_tasks, 1))


@SETTINGS
@given(plans())
def test_the_same_plan_as_model_text(raw: Any) -> None:
    try:
        text = json.dumps(raw, allow_nan=False)
    except (TypeError, ValueError):
        return
    both(text, REGISTRY, 0)
    both(text.encode("utf-8", "surrogatepass"), REGISTRY, 0)


@SETTINGS
@given(plans())
def test_kinds_given_by_name(raw: Any) -> None:
    both(raw, ["plain", "fetch", "count"], 0)
    both(raw, {"plain": None, "count": Count}, 0)


@st.composite
def good_plans(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 12))
    out = []
    for i in range(n):
        task: dict[str, Any] = {"kind": draw(st.sampled_from(["plain", "also_plain"])),
                                "payload": draw(plain_payloads),
                                "depends_on": draw(st.lists(st.integers(0, i - 1), max_size=3))
                                if i else []}
        out.append(task)
    return out


@SETTINGS
@given(good_plans())
def test_a_usual_plan_is_valid_from_a_list_a_document_or_text(
    entries: list[dict[str, Any]],
) -> None:
    plans = []
    for raw in (entries, {"goal": "g", "tasks": entries}, json.dumps(entries)):
        problems, plan = both(raw)
        assert problems == [] and plan is not None
        plans.append(plan)
    assert plans[0].tasks == plans[1].tasks == plans[2].tasks


def test_a_payload_at_the_depth_bound() -> None:
    def deep(levels: int) -> Any:
        value: Any = 1
        for _ in range(levels):
            value = [value]
        return value

    # the list is level 1, a task 2, its payload 3: the payload may hold 61 more levels
    inside = [{"kind": "plain", "payload": {"x": deep(61)}}]
    assert validate_plan(inside, REGISTRY) == []
    over = [{"kind": "plain", "payload": {"x": deep(62)}}]
    assert [p.code for p in validate_plan(over, REGISTRY)] == ["schema"]
    for levels in (60, 61, 62):  # one level less in a plan document
        both({"tasks": [{"kind": "plain", "payload": {"x": deep(levels)}}]}, REGISTRY)
        both([{"kind": "plain", "payload": {"x": deep(levels)}}], REGISTRY)


def test_the_plan_holds_copies_and_what_its_models_checked() -> None:
    payload = {"url": "u", "inner": {"a": [1]}}
    raw = [{"kind": "stamped", "depends_on": []},
           {"kind": "plain", "payload": payload, "depends_on": [0]}]
    plan = Plan.parse(raw, REGISTRY)
    payload["inner"]["a"].append(2)
    raw[0]["payload"] = {"late": True}
    assert plan.tasks[0].payload == {"seen": True}  # the validator's write is kept
    assert plan.tasks[1].payload == {"url": "u", "inner": {"a": [1]}}
    records = plan.to_tasks()
    assert records[1].payload == plan.tasks[1].payload
    assert records[1].payload is not plan.tasks[1].payload
    assert records[1].payload["inner"] is not plan.tasks[1].payload["inner"]
    assert plan.to_tasks()[0].payload is not records[0].payload


def test_a_plan_is_an_ordinary_frozen_dataclass() -> None:
    raw = [{"kind": "plain", "payload": {}, "depends_on": []},
           {"kind": "plain", "payload": {"a": 1}, "depends_on": [0], "id": "b"}]
    plan = Plan.parse(raw, REGISTRY)
    assert pickle.loads(pickle.dumps(plan)) == plan
    assert copy.deepcopy(plan) == plan and copy.copy(plan) == plan
    assert dataclasses.replace(plan, goal="g") == Plan("g", plan.tasks)
    assert dataclasses.asdict(plan)["tasks"][1] == {"kind": "plain", "payload": {"a": 1},
                                                   "depends_on": (0,), "id": "b"}
    with pytest.raises(AttributeError):
        plan.nope  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(TypeError):  # a payload dict is unhashable, as in any plan
        hash(plan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.tasks = ()  # type: ignore[misc]
    assert all(type(t) is PlanTask for t in plan.tasks)
    assert plan.levels() == [[0], [1]]


def test_a_plan_with_no_tasks() -> None:
    for raw in ([], {"goal": "g", "tasks": []}):
        _, plan = both(raw, REGISTRY, 0)
        assert plan is not None and plan.tasks == () and plan.to_tasks() == []


class Sub(dict):  # type: ignore[type-arg]
    pass


DEFECTS: dict[str, Any] = {
    "forward": ("depends_on", lambda i, n: [n - 1 if i < n - 1 else i + 1]),
    "self": ("depends_on", lambda i, n: [i]),
    "negative": ("depends_on", lambda i, n: [-1]),
    "bool": ("depends_on", lambda i, n: [True]),
    "text index": ("depends_on", lambda i, n: ["0"]),
    "float index": ("depends_on", lambda i, n: [0.0]),
    "huge index": ("depends_on", lambda i, n: [10**400]),
    "unknown id": ("depends_on", lambda i, n: ["zz"]),
    "not a list": ("depends_on", lambda i, n: 0),
    "tuple deps": ("depends_on", lambda i, n: ()),
    "empty id": ("id", lambda i, n: ""),
    "number id": ("id", lambda i, n: 3),
    "null id": ("id", lambda i, n: None),
    "surrogate id": ("id", lambda i, n: "\udc00"),
    "duplicate id": ("id", lambda i, n: "same"),
    "nan": ("payload", lambda i, n: {"x": math.nan}),
    "infinity": ("payload", lambda i, n: {"x": [math.inf]}),
    "huge int": ("payload", lambda i, n: {"x": 10**5000}),
    "a set": ("payload", lambda i, n: {"x": {1}}),
    "a tuple": ("payload", lambda i, n: {"x": (1, [2])}),
    "int key": ("payload", lambda i, n: {"x": {1: 1}}),
    "surrogate key": ("payload", lambda i, n: {"\udc00": 1}),
    "surrogate text": ("payload", lambda i, n: {"x": ["\ud800"]}),
    "dict subclass": ("payload", lambda i, n: Sub(x=1)),
    "nested subclass": ("payload", lambda i, n: {"x": Sub({2: 1})}),
    "object": ("payload", lambda i, n: {"x": object()}),
    "payload list": ("payload", lambda i, n: [1]),
    "payload null": ("payload", lambda i, n: None),
    "unknown kind": ("kind", lambda i, n: "plian"),
    "kind case": ("kind", lambda i, n: "Plain"),
    "kind number": ("kind", lambda i, n: 7),
    "surrogate kind": ("kind", lambda i, n: "odd\udc80"),
    "modelled kind": ("kind", lambda i, n: "fetch"),
    "strict kind": ("kind", lambda i, n: "count"),
    "extra field": ("deps", lambda i, n: [0]),
    "int field": (1, lambda i, n: 1),
}


@SETTINGS
@given(good_plans(), st.data())
def test_a_plan_with_one_defect(
    entries: list[dict[str, Any]], data: st.DataObject
) -> None:
    defect = data.draw(st.sampled_from(sorted(DEFECTS)), label="defect")
    i = data.draw(st.integers(0, len(entries) - 1), label="task")
    field, make = DEFECTS[defect]
    n = len(entries)
    entries[i][field] = make(i, n)
    if defect == "duplicate id" and n > 1:
        entries[(i + 1) % n]["id"] = "same"
    if data.draw(st.booleans(), label="drop"):
        entries[i].pop(data.draw(st.sampled_from(["kind", "payload", "depends_on"])), None)
    both(entries)
    both({"goal": "g", "tasks": entries})
    both(entries, min_tasks=n + 1)
    both(entries, max_tasks=max(n - 1, 1))
    try:
        text = json.dumps({"goal": "g", "tasks": entries}, allow_nan=False)
    except (TypeError, ValueError):
        return
    both(text)


@SETTINGS
@given(good_plans(), st.sampled_from(["\udc00", 3, None, ["g"], "é"]), st.booleans())
def test_the_goal_and_the_document(
    entries: list[dict[str, Any]], goal: Any, extra: bool
) -> None:
    doc: dict[Any, Any] = {"goal": goal, "tasks": entries}
    if extra:
        doc["notes"] = "x"
    both(doc)
    both({"tasks": entries, 0: 1})
    both({"tasks": tuple(entries)})
    both(Sub(tasks=entries))


def test_ids_that_clash_with_the_default_ones() -> None:
    raw = [{"kind": "plain", "id": "t1"}, {"kind": "plain", "depends_on": [0]},
           {"kind": "plain", "id": "t1_1"}, {"kind": "also_plain", "depends_on": [1, 0, 1]}]
    _, plan = both(raw)
    assert plan is not None
    assert plan.task_ids() == ["t1", "t1_2", "t1_1", "t3"]
    assert plan.to_tasks()[3].depends_on == ("t1_2", "t1")


def test_a_plan_copies_every_level_of_a_payload_and_shares_only_immutables() -> None:
    """The plan's copy of a payload is as deep as ``copy.deepcopy``'s: lists in tuples in
    dicts are new objects; a value strict JSON cannot hold (refused by the plan) is still
    copied, not shared, while the plan is read."""
    shared: list[Any] = [{"k": ["v"]}]
    payload = {"rows": shared, "pair": (1, ["x"]), "n": 1.5, "flag": None, "text": "t"}
    raw = [{"kind": "plain", "payload": payload, "depends_on": []}]
    plan = Plan.parse(raw, REGISTRY)
    copied = plan.tasks[0].payload
    assert copied == copy.deepcopy(payload)
    assert copied["rows"] is not shared and copied["rows"][0]["k"] is not shared[0]["k"]
    assert copied["pair"][1] is not payload["pair"][1]  # type: ignore[index]
    shared[0]["k"].append("later")
    assert plan.to_tasks()[0].payload["rows"] == [{"k": ["v"]}]
    odd = {"when": {1, 2}}  # a set: not JSON (the plan is refused), copied all the same
    assert plan_module._copy_payload(odd) == odd
    assert plan_module._copy_payload(odd)["when"] is not odd["when"]
