"""Property tests of plan validation with hypothesis."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planrun.core._errors import InvalidPlan
from planrun.core._plan import PROBLEM_CODES, Plan, Problem, validate_plan

KINDS = ["fetch", "summarise", "translate"]
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 12),
    st.text(max_size=6),
    st.floats(allow_nan=False, allow_infinity=False),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)

task_ish = st.dictionaries(
    st.sampled_from(["kind", "payload", "depends_on", "id", "deps"]),
    json_values,
    max_size=5,
) | st.fixed_dictionaries(
    {
        "kind": st.sampled_from([*KINDS, "sumarise", "nope"]) | json_scalars,
        "payload": st.dictionaries(st.text(max_size=4), json_scalars, max_size=3) | json_values,
        "depends_on": st.lists(
            st.integers(-2, 12) | st.sampled_from(["a", "b", "c", "zz"]) | json_scalars, max_size=4
        ),
    },
    optional={"id": st.sampled_from(["a", "b", "c", ""]) | json_scalars},
)
plan_ish = (
    st.lists(task_ish, max_size=8)
    | st.fixed_dictionaries(
        {"tasks": st.lists(task_ish, max_size=8) | json_values},
        optional={"goal": st.text(max_size=10) | json_scalars},
    )
    | json_values
)


def _check_outcome(raw: Any) -> list[Problem]:
    problems = validate_plan(raw, KINDS)
    assert all(p.code in PROBLEM_CODES for p in problems)
    assert all(p.task is None or isinstance(p.task, int) for p in problems)
    assert all(isinstance(p.message, str) and p.message for p in problems)
    try:
        plan = Plan.parse(raw, KINDS)
    except InvalidPlan as exc:
        assert exc.problems, "InvalidPlan must carry at least one problem"
        assert exc.problems == problems
    else:
        assert problems == []
        assert sorted(plan.topological_order()) == list(range(len(plan.tasks)))
    return problems


@SETTINGS
@given(plan_ish)
def test_any_plan_ish_document_validates_or_raises_invalid_plan(raw: Any) -> None:
    problems = _check_outcome(raw)
    if isinstance(raw, dict | list):
        # the same document as model text, bare or in a fence, gives the same verdict
        text = json.dumps(raw)
        assert validate_plan(text, KINDS) == problems
        fenced = f"Here is the plan:\n```json\n{json.dumps(raw, indent=2)}\n```\nDone."
        assert validate_plan(fenced, KINDS) == problems


@SETTINGS
@given(st.text(max_size=200) | st.binary(max_size=200))
def test_any_text_or_bytes_validates_or_raises_invalid_plan(raw: str | bytes) -> None:
    _check_outcome(raw)


@st.composite
def dags(draw: st.DrawFn, max_tasks: int = 15) -> list[dict[str, Any]]:
    """Plans whose dependencies all point at earlier tasks (written in topological order)."""
    n = draw(st.integers(1, max_tasks))
    tasks = []
    for i in range(n):
        deps = draw(st.lists(st.integers(0, i - 1), unique=True, max_size=i)) if i else []
        kind = draw(st.sampled_from(KINDS))
        tasks.append({"kind": kind, "payload": {"i": i}, "depends_on": deps})
    return tasks


@SETTINGS
@given(dags())
def test_dags_in_topological_order_always_validate(tasks: list[dict[str, Any]]) -> None:
    assert validate_plan({"goal": "g", "tasks": tasks}, KINDS) == []
    plan = Plan.parse(tasks, KINDS)
    assert plan.topological_order() == list(range(len(tasks)))
    assert plan.to_document()["tasks"] == tasks
    records = plan.to_tasks()
    for i, record in enumerate(records):
        assert record.depends_on == tuple(f"t{d}" for d in tasks[i]["depends_on"])
    position = {i: k for k, wave in enumerate(plan.levels()) for i in wave}
    for i, t in enumerate(tasks):
        assert all(position[d] < position[i] for d in t["depends_on"])


@SETTINGS
@given(dags(), st.randoms(use_true_random=False))
def test_dags_named_by_ids_in_any_order_validate_and_sort(
    tasks: list[dict[str, Any]], rnd: Any
) -> None:
    named = [
        {**t, "id": f"n{i}", "depends_on": [f"n{d}" for d in t["depends_on"]]}
        for i, t in enumerate(tasks)
    ]
    rnd.shuffle(named)
    plan = Plan.parse(named, KINDS)
    order = plan.topological_order()
    seen: set[int] = set()
    for i in order:
        assert set(plan.tasks[i].depends_on) <= seen
        seen.add(i)
    again = Plan.parse(plan.to_document(), KINDS)  # index form, written in order
    assert again.topological_order() == list(range(len(tasks)))


@SETTINGS
@given(dags(), st.data())
def test_a_back_edge_is_always_a_forward_or_self_dependency(
    tasks: list[dict[str, Any]], data: st.DataObject
) -> None:
    n = len(tasks)
    i = data.draw(st.integers(0, n - 1), label="task")
    j = data.draw(st.integers(i, n - 1), label="dependency")
    assume(j not in tasks[i]["depends_on"])
    tasks[i]["depends_on"].append(j)
    problems = validate_plan(tasks, KINDS)
    expected = "self_dependency" if j == i else "forward_dependency"
    assert [(p.code, p.task) for p in problems] == [(expected, i)]
