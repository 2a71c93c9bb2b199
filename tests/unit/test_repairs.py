"""Code repairs: each rule fixes its problem code where the registry settles the fix, and
leaves every ambiguous plan (two producers, no reader, a cycle, a missing task, an unknown
kind, an invalid payload) to the model; the validator itself stays strict."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import BaseModel

from planrun import Registry, validate_plan
from planrun.core import PROBLEM_CODES, RULES, Plan, Repair, repair_plan


class Topic(BaseModel):
    topic: str


class Findings(BaseModel):
    text: str


class Analysis(BaseModel):
    text: str


def brief() -> Registry:
    """research -> analyse -> write_brief, as the brief example declares it."""
    reg = Registry()
    reg.register("research", lambda p, c: {}, payload=Topic, result=Findings, unique=True)
    reg.register("analyse", lambda p, c: {}, result=Analysis, inputs=Findings, unique=True)
    reg.register("write_brief", lambda p, c: {}, inputs=Analysis, delivers=True, max_count=1)
    return reg


def by_kind() -> Registry:
    """The same pipeline declared by kind (``needs``) rather than by result model."""
    reg = Registry()
    reg.register("fetch", lambda p, c: {}, unique=True)
    reg.register("sort", lambda p, c: {}, needs=["fetch"])
    reg.register("report", lambda p, c: {}, needs=["sort"], delivers=True)
    return reg


def task(kind: str, deps: list[Any] | None = None, **payload: Any) -> dict[str, Any]:
    return {"kind": kind, "payload": payload, "depends_on": deps or []}


def r(topic: str, deps: list[Any] | None = None) -> dict[str, Any]:
    return task("research", deps, topic=topic)


def doc(*tasks: dict[str, Any]) -> dict[str, Any]:
    return {"goal": "g", "tasks": list(tasks)}


def edges(plan: Plan) -> list[tuple[str, list[str]]]:
    return [(t.kind, [plan.tasks[d].kind for d in t.depends_on]) for t in plan.tasks]


def rules(repairs: tuple[Repair, ...]) -> list[tuple[str, str]]:
    return [(x.rule or "", x.code) for x in repairs]


def test_every_rule_is_named_once_and_fixes_a_designed_problem_code() -> None:
    assert len({rule.name for rule in RULES}) == len(RULES)
    assert {rule.code for rule in RULES} <= set(PROBLEM_CODES)
    assert [rule.code for rule in RULES] == [
        "self_dependency", "unknown_dependency", "forward_dependency", "duplicate_task",
        "missing_input", "dead_end"]


def test_a_valid_plan_comes_back_unrepaired() -> None:
    out = repair_plan(doc(r("a"), task("analyse", [0]), task("write_brief", [1])), brief())
    assert out.plan is not None and out.repairs == () and out.plan.repairs == ()
    assert "repairs" not in out.plan.to_document()


def test_the_issue_plan_self_dependency_and_missing_input_are_settled_by_code() -> None:
    """analyse depends on itself, write_brief on research: one producer of each input."""
    raw = json.dumps(doc(r("a"), task("analyse", [1]), task("write_brief", [0])))
    out = repair_plan(raw, brief())
    assert out.plan is not None, out.problems
    assert rules(out.plan.repairs) == [("drop_self_dependency", "self_dependency"),
                                       ("add_needed_input", "missing_input"),
                                       ("add_needed_input", "missing_input")]
    assert edges(out.plan) == [("research", []), ("analyse", ["research"]),
                               ("write_brief", ["research", "analyse"])]
    assert all(x.by == "code" for x in out.plan.repairs)
    assert out.plan.to_document()["repairs"][0] == {
        "by": "code", "code": "self_dependency", "rule": "drop_self_dependency", "task": 1,
        "detail": "dropped task 1's dependency on itself", "attempt": 1, "final_task": 1}


@pytest.mark.parametrize("dangling", [7, -1, "nowhere"])
def test_a_dependency_on_a_task_that_does_not_exist_is_dropped(dangling: Any) -> None:
    plan = doc(r("a"), task("analyse", [0, dangling]), task("write_brief", [1]))
    out = repair_plan(plan, brief())
    assert out.plan is not None
    assert rules(out.repairs) == [("drop_unknown_dependency", "unknown_dependency")]
    assert edges(out.plan)[1] == ("analyse", ["research"])


def test_forward_references_are_put_in_order_every_edge_kept() -> None:
    plan = doc(task("write_brief", [2]), r("a"), task("analyse", [1, 3]), r("b"))
    before = copy.deepcopy(plan)
    assert "forward_dependency" in {p.code for p in validate_plan(plan, brief())}
    out = repair_plan(plan, brief())
    assert out.plan is not None
    assert rules(out.repairs) == [("put_in_dependency_order", "forward_dependency")]
    assert [t.kind for t in out.plan.tasks] == ["research", "research", "analyse",
                                                "write_brief"]
    assert [t.payload for t in out.plan.tasks[:2]] == [{"topic": "a"}, {"topic": "b"}]
    assert edges(out.plan) == [("research", []), ("research", []),
                               ("analyse", ["research", "research"]),
                               ("write_brief", ["analyse"])]
    assert "0->3" in out.repairs[0].detail
    # The validator stays strict, and the caller's plan is not touched.
    assert plan == before
    assert [p.code for p in validate_plan(plan, brief())] == ["forward_dependency",
                                                             "forward_dependency"]


def test_a_cycle_is_refused_not_reordered() -> None:
    by_index = doc(r("a"), task("analyse", [0, 2]), task("write_brief", [1]),
                   )
    by_index["tasks"][0]["depends_on"] = [1]  # research <-> analyse
    out = repair_plan(by_index, brief())
    assert out.plan is None and out.repairs == ()
    assert "forward_dependency" in {p.code for p in out.problems}
    by_id = doc({"id": "a", **r("a", ["b"])}, {"id": "b", **task("analyse", ["a"])},
                task("write_brief", ["b"]))
    out = repair_plan(by_id, brief())
    assert out.plan is None and out.repairs == ()
    assert [p.code for p in out.problems] == ["cycle"]


def test_missing_input_by_kind_gets_its_one_producer() -> None:
    out = repair_plan(doc(task("fetch"), task("sort"), task("report", [1])), by_kind())
    assert out.plan is not None
    assert edges(out.plan) == [("fetch", []), ("sort", ["fetch"]), ("report", ["sort"])]


def test_a_producer_that_comes_later_is_linked_then_ordered() -> None:
    out = repair_plan(doc(task("sort"), task("report", [0]), task("fetch")), by_kind())
    assert out.plan is not None
    assert rules(out.repairs) == [("add_needed_input", "missing_input"),
                                  ("put_in_dependency_order", "forward_dependency")]
    assert edges(out.plan) == [("fetch", []), ("sort", ["fetch"]), ("report", ["sort"])]
    # the edge was added to sort, task 0 of the reply and task 1 of the accepted plan
    link, order = out.repairs
    assert (link.task, link.final_task) == (0, 1)
    assert order.final_task is None and "final_task" not in order.to_dict()
    assert link.to_dict()["final_task"] == 1


def test_two_producers_are_a_choice_left_to_the_model() -> None:
    plan = doc(r("a"), r("b"), task("analyse", [0, 1], q=1), task("analyse", q=2),
               task("write_brief", [2, 3]))
    out = repair_plan(plan, brief())
    assert out.plan is None and out.repairs == ()
    assert [(p.code, p.task) for p in out.problems] == [("missing_input", 3)]


def test_research_nothing_reads_goes_to_the_one_analysis_that_can() -> None:
    # Both research tasks are dead ends and one analysis reads findings: each has one
    # reader, so each is linked to it (which also gives the analysis its input).
    out = repair_plan(doc(r("a"), r("b"), task("analyse"), task("write_brief", [2])), brief())
    assert out.plan is not None
    assert rules(out.repairs) == [("link_dead_end", "dead_end")] * 2
    assert edges(out.plan)[2] == ("analyse", ["research", "research"])


def test_no_producer_is_a_missing_task_left_to_the_model() -> None:
    out = repair_plan(doc(task("analyse"), task("write_brief", [0])), brief())
    assert out.plan is None and out.repairs == ()
    assert [p.code for p in out.problems] == ["missing_input"]


def test_an_edge_that_would_close_a_cycle_is_never_added() -> None:
    # sort needs the one fetch, but that fetch waits for sort: adding it would be a cycle.
    reg = Registry()
    reg.register("fetch", lambda p, c: {})
    reg.register("sort", lambda p, c: {}, needs=["fetch"], delivers=True)
    out = repair_plan(doc(task("sort"), task("fetch", [0])), reg)
    assert out.plan is None and out.repairs == ()
    assert [p.code for p in out.problems] == ["missing_input", "dead_end"]


def test_a_dead_end_is_linked_to_the_one_task_that_reads_its_result() -> None:
    plan = doc(r("a"), r("b"), task("analyse", [0]), task("write_brief", [2]))
    assert [p.code for p in validate_plan(plan, brief())] == ["dead_end"]
    out = repair_plan(plan, brief())
    assert out.plan is not None
    assert rules(out.repairs) == [("link_dead_end", "dead_end")]
    assert edges(out.plan)[2] == ("analyse", ["research", "research"])


def test_a_dead_end_with_two_readers_or_none_is_left_to_the_model() -> None:
    two = doc(r("a"), r("b"), task("analyse", [0]), task("analyse", [0], q=2),
              task("write_brief", [2, 3]))
    out = repair_plan(two, brief())
    assert out.plan is None and [p.code for p in out.problems] == ["dead_end"]
    reg = Registry()
    reg.register("note", lambda p, c: {})
    reg.register("ship", lambda p, c: {}, delivers=True)
    out = repair_plan(doc(task("note"), task("ship")), reg)  # nothing reads a note
    assert out.plan is None and [p.code for p in out.problems] == ["dead_end"]


def test_exact_duplicates_are_merged_and_their_edges_redirected() -> None:
    plan = doc(r("a"), task("fetch_more"), r("a", [1]), task("analyse", [0, 2]),
               task("write_brief", [3]))
    reg = brief()
    reg.register("fetch_more", lambda p, c: {}, result=Findings)
    out = repair_plan(plan, reg)
    assert out.plan is not None, out.problems
    assert rules(out.repairs) == [("merge_duplicate", "duplicate_task"),
                                  ("put_in_dependency_order", "forward_dependency")]
    assert [t.kind for t in out.plan.tasks] == ["fetch_more", "research", "analyse",
                                                "write_brief"]
    # the copy's dependency joined the kept task (then ordered), and analyse waits for it once
    kept = next(t for t in out.plan.tasks if t.kind == "research")
    assert [out.plan.tasks[d].kind for d in kept.depends_on] == ["fetch_more"]
    assert edges(out.plan)[2] == ("analyse", ["research"])
    # the merge concerns the copy (reply task 2); in the accepted plan, the research it
    # went into
    merge = out.repairs[0]
    assert merge.task == 2 and out.plan.tasks[merge.final_task or 0].kind == "research"
    assert merge.final_task == 1


def test_linked_duplicates_are_left_to_the_model() -> None:
    plan = doc(r("a"), task("analyse", [0]), r("a", [1]), task("write_brief", [1]))
    out = repair_plan(plan, brief())
    assert out.plan is None
    assert "duplicate_task" in {p.code for p in out.problems}


@pytest.mark.parametrize(("plan", "code"), [
    (doc(r("a"), task("analyse", [0, 1]), task("verify", [1])), "unknown_kind"),
    (doc(task("research", [], subject="a"), task("analyse", [0, 1]), task("write_brief", [1])),
     "invalid_payload"),
    (doc(r("a"), task("analyse", [0])), "no_deliverable"),
    (doc(r("a"), {"kind": "analyse", "depends_on": 0}, task("write_brief", [1])), "schema"),
    (doc(*[r(str(i)) for i in range(9)], task("analyse", [0]), task("write_brief", [9])),
     "too_many_tasks"),
])
def test_a_problem_beyond_the_rules_leaves_the_whole_plan_to_the_model(
        plan: dict[str, Any], code: str) -> None:
    out = repair_plan(plan, brief(), max_tasks=8)
    assert out.plan is None and out.repairs == ()
    assert code in {p.code for p in out.problems}


def test_text_that_is_not_a_plan_is_left_alone() -> None:
    out = repair_plan("Sure! First research, then analyse.", brief())
    assert out.plan is None and out.repairs == ()
    assert [p.code for p in out.problems] == ["not_json"]


# ---- properties -----------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

KIND_NAMES = ["research", "analyse", "write_brief", "invented"]


@st.composite
def wired_plans(draw: st.DrawFn) -> dict[str, Any]:
    """Plans over the brief's kinds with any wiring: self, dangling, forward, cyclic edges,
    duplicates, extra tasks, now and then a missing task or an invented kind."""
    kinds = ["research", "analyse", "write_brief"]
    kinds += draw(st.lists(st.sampled_from(["research", "analyse"]), max_size=3))
    if draw(st.integers(0, 9)) == 0:
        kinds[draw(st.integers(0, len(kinds) - 1))] = draw(st.sampled_from(KIND_NAMES))
    kinds = draw(st.permutations(kinds))
    n = len(kinds)
    tasks = []
    for kind in kinds:
        payload = {"topic": draw(st.sampled_from(["a", "b"]))} if kind == "research" else {}
        deps = draw(st.lists(st.integers(-1, n), max_size=2))
        tasks.append(task(kind, deps, **payload))
    return doc(*tasks)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wired_plans())
def test_a_repaired_plan_is_one_the_strict_validator_accepts_and_nothing_is_invented(
        plan: dict[str, Any]) -> None:
    before = copy.deepcopy(plan)
    out = repair_plan(plan, brief(), max_tasks=8)
    assert plan == before  # the reply is never edited in place
    if out.plan is None:
        assert out.problems  # what is left for the model is said
        return
    assert validate_plan(out.plan.to_document(), brief(), max_tasks=8) == []
    # Code only wires: every task it returns was in the reply (duplicates merged), with
    # its kind and payload as the model wrote them.
    given_tasks = {(t["kind"], json.dumps(t["payload"], sort_keys=True)) for t in plan["tasks"]}
    kept = [(t.kind, json.dumps(t.payload, sort_keys=True)) for t in out.plan.tasks]
    assert set(kept) == given_tasks
    merged = sum(1 for r in out.repairs if r.code == "duplicate_task")
    assert len(kept) == len(plan["tasks"]) - merged
    assert out.plan.repairs == out.repairs
    # each fix of one task names that task in the accepted plan; the reorder names none
    for fix in out.repairs:
        assert (fix.final_task is None) == (fix.rule == "put_in_dependency_order")
        assert fix.final_task is None or 0 <= fix.final_task < len(out.plan.tasks)
        if fix.rule in ("drop_self_dependency", "drop_unknown_dependency", "add_needed_input"):
            assert fix.final_task is not None
    if not validate_plan(plan, brief(), max_tasks=8):
        assert out.repairs == ()
