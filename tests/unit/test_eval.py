"""planrun eval: goal sets, scores, the shipped recordings, a stale prompt, the CLI."""

from __future__ import annotations

import json
import shutil
import socket
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from planrun.cli import main
from planrun.core._errors import UsageError
from planrun.core._plan import Plan
from planrun.dev.eval import EVALS_DIR, Scores, evaluate, load_goals, score_plan, shipped
from planrun.dev.fixtures import Cassette, FixtureMiss
from planrun.dev.taskbench import iter_samples, load_tool_graph, sample_to_plan

REPO = Path(__file__).resolve().parents[2]
HF = REPO / "tests" / "data" / "taskbench" / "data_huggingface"
VERSIONS = {"default": None, "strict": "strict"}


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every attempt to open a socket connection is noted and refused."""
    attempts: list[Any] = []

    def refuse(self: socket.socket, address: Any) -> None:
        attempts.append(address)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


def test_taskbench_f1_on_a_known_case_by_hand() -> None:
    sample = next(s for s in iter_samples(HF) if str(s["id"]) == "30123865")
    gold = sample_to_plan(sample)
    kinds = [t["kind"] for t in gold["tasks"]]
    assert len(kinds) == 4 and len(set(kinds)) == 4  # a chain of four different tools
    a, b, c, d = kinds
    edges = {(kinds[j], kinds[i]) for i, t in enumerate(gold["tasks"]) for j in t["depends_on"]}
    assert edges == {(a, b), (b, c), (c, d)}
    # The prediction keeps a, b, c, drops d, adds a second b, and links a->b, a->c, b->b.
    predicted = {"goal": "g", "tasks": [
        {"kind": a, "payload": {}, "depends_on": []},
        {"kind": b, "payload": {}, "depends_on": [0]},
        {"kind": c, "payload": {}, "depends_on": [0]},
        {"kind": b, "payload": {}, "depends_on": [1]},
    ]}
    nodes, links = score_plan(predicted, gold)
    # nodes: 3 of 4 predicted are right (a, b, c; the second b is extra); 3 of 4 gold found
    assert nodes == Scores(precision=3 / 4, recall=3 / 4, f1=3 / 4)
    # links: predicted a->b, a->c, b->b; gold a->b, b->c, c->d: one hit
    assert links is not None
    assert (links.precision, links.recall) == (1 / 3, 1 / 3)
    assert links.f1 == pytest.approx(1 / 3)
    registry = load_tool_graph(HF)
    plan = Plan.parse(gold, registry, min_tasks=1, max_tasks=10)
    assert score_plan(plan, gold) == (Scores(1.0, 1.0, 1.0), Scores(1.0, 1.0, 1.0))
    assert score_plan(None, gold) == (Scores(0.0, 0.0, 0.0), Scores(0.0, 0.0, 0.0))
    single = {"tasks": [{"kind": a, "depends_on": []}]}
    assert score_plan(single, single)[1] is None  # no links on either side: not scored


def test_scores_of_multisets() -> None:
    assert Scores.of(Counter(), Counter()) is None
    assert Scores.of(Counter({"x": 2}), Counter({"x": 1})) == Scores(0.5, 1.0, 2 / 3)
    assert Scores.of(Counter(), Counter({"x": 1})) == Scores(0.0, 0.0, 0.0)


def test_shipped_goal_sets_load_and_their_references_validate() -> None:
    for name in ("examples", "taskbench"):
        goals_file, cassette = shipped(name)
        assert cassette.is_file()
        goals = load_goals(goals_file)
        assert len(goals) >= 6
        for goal in goals:
            assert goal.reference is not None
            Plan.parse(goal.reference, goal.registry, min_tasks=1, max_tasks=10)
    taskbench = load_goals("taskbench")
    samples = {f"hf-{s['id']}": s for s in iter_samples(HF)}
    for goal in taskbench:
        assert goal.goal == samples[goal.id]["user_request"]
        expected = sample_to_plan(samples[goal.id])
        assert [t["kind"] for t in goal.reference["tasks"]] == [  # type: ignore[index]
            t["kind"] for t in expected["tasks"]]


def outcomes_by_id(report: Any, version: str) -> dict[str, Any]:
    return {o.id: o for o in report[version].outcomes}


def test_the_shipped_examples_replay_and_measure_both_versions(no_network: list[Any]) -> None:
    report = evaluate("examples", VERSIONS, replay="examples")
    assert not no_network
    goals = load_goals("examples")
    default, strict = report["default"].summary(), report["strict"].summary()
    # The recording's planner (tools/standin.py eval_planner): under the shipped prompt
    # every second goal's first plan points forward, and the first plan of goal 3 leaves
    # out the task that delivers the brief; each is repaired once. Under strict none.
    forward = {g.id for i, g in enumerate(goals) if i % 2 == 0}
    undelivered = {g.id for i, g in enumerate(goals) if i % 4 == 3}
    repaired = forward | undelivered
    by_default = outcomes_by_id(report, "default")
    assert {i for i, o in by_default.items() if o.repairs} == repaired
    assert all(o.problems == [["forward_dependency"]] for i, o in by_default.items()
               if i in forward)
    assert all(o.problems == [["no_deliverable"]] for i, o in by_default.items()
               if i in undelivered)
    # The headline is the accepted plan (shape and contracts); a plan that leaves out its
    # deliverable has a valid shape but breaks a contract: well-shaped, not accepted.
    assert default["first_try_shape_rate"] == pytest.approx(1 - len(forward) / len(goals),
                                                             abs=1e-4)
    assert default["first_try_accepted_rate"] == pytest.approx(
        1 - len(repaired) / len(goals), abs=1e-4)
    assert default["shape_rate"] == strict["shape_rate"] == 1.0
    assert default["accepted_rate"] == strict["accepted_rate"] == 1.0
    assert default["mean_repairs"] == pytest.approx(len(repaired) / len(goals), abs=1e-4)
    # The forward dependencies point from the first task to the last: a cycle, which code
    # never breaks (which edge goes is a choice), so every repair here is the model's.
    assert default["code_repairs"] == strict["code_repairs"] == 0
    calls = len(goals) + len(repaired)
    assert default["model_calls_per_accepted"] == round(calls / len(goals), 2)
    assert default["tokens_per_accepted"] == round(default["tokens"] / len(goals), 2)
    assert strict["model_calls_per_accepted"] == 1.0
    assert default["problem_codes"] == {"forward_dependency": len(forward)}
    assert default["contract_codes"] == {"no_deliverable": len(undelivered)}
    assert strict["first_try_shape_rate"] == 1.0 and strict["problem_codes"] == {}
    assert strict["first_try_accepted_rate"] == 1.0 and strict["contract_codes"] == {}
    for goal_id in undelivered:
        outcome = by_default[goal_id]
        assert outcome.first_try_shaped and not outcome.first_try and outcome.accepted
        assert outcome.to_dict()["outcome"] == "repaired" and outcome.to_dict()["accepted"]
    assert default["tokens"] > strict["tokens"] > 0  # repairs cost tokens
    assert default["node_f1"] == 1.0 and default["link_f1"] < 1.0
    for outcome in by_default.values():
        goal = next(g for g in goals if g.id == outcome.id)
        assert outcome.size == len(goal.reference["tasks"])  # type: ignore[index]
        assert outcome.links == score_plan(outcome.plan, goal.reference)[1]  # type: ignore[arg-type]
    changed = {row["id"]: row for row in report.compare("default", "strict")}
    plan_moved = {g.id for i, g in enumerate(goals) if i % 3 in (1, 2) and
                  any(t["depends_on"] for t in g.reference["tasks"])}  # type: ignore[index]
    assert set(changed) == repaired | plan_moved
    for goal_id in repaired:
        assert changed[goal_id]["default"] == "repaired"
        assert changed[goal_id]["strict"] == "first_try"
    table = report.table()
    assert table.splitlines()[2].startswith("accepted plan (shape and contracts)")
    assert "problem forward_dependency" in table
    assert [line.split() for line in table.splitlines()
            if line.startswith("contract ")] == [["contract", "no_deliverable", "1", "0"]]
    assert [line.split()[-2:] for line in table.splitlines()
            if line.startswith("accepted from the first reply")] == [["33%", "100%"]]


def test_a_prompt_edited_since_the_recording_is_a_fixture_miss(
    tmp_path: Path, no_network: list[Any]
) -> None:
    folder = tmp_path / "edited"
    shutil.copytree(EVALS_DIR / "prompts" / "strict", folder)
    template = folder / "decompose.md"
    template.write_text(template.read_text(encoding="utf-8").replace(
        "Prefer independence.", "Prefer few dependencies."), encoding="utf-8")
    with pytest.raises(FixtureMiss, match=r"decompose changed(.|\n)*re-record"):
        evaluate("examples", {"edited": folder}, replay="examples")
    assert not no_network  # the miss went nowhere


def test_a_prompt_file_stands_for_its_library(tmp_path: Path) -> None:
    file = tmp_path / "mine.md"
    shutil.copyfile(EVALS_DIR / "prompts" / "strict" / "decompose.md", file)
    report = evaluate("examples", {"file": file}, replay="examples")
    assert report["file"].summary()["first_try_accepted_rate"] == 1.0


def test_bad_goal_files_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "goals.jsonl"
    path.write_text('{"goal": "a", "registry": "planrun.examples.brief:app"}\nnot json\n')
    with pytest.raises(UsageError, match=r"goals.jsonl:2: not JSON"):
        load_goals(path)
    path.write_text('{"goal": "a"}\n')
    with pytest.raises(UsageError, match=r":1: no \"registry\" and no --app"):
        load_goals(path)
    assert load_goals(path, registry="planrun.examples.brief:app")[0].id == "goal-1"
    path.write_text('{"id": "x", "goal": "a"}\n{"id": "x", "goal": "b"}\n')
    with pytest.raises(UsageError, match="used twice"):
        load_goals(path, registry="planrun.examples.brief:app")
    with pytest.raises(UsageError, match="no shipped goal set 'nope'"):
        load_goals("nope")


def test_cli_eval_json_and_compare(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["eval", "taskbench", "--replay", "taskbench", "--prompts", "default",
                 "--prompts", "strict", "--json", "--compare", "default", "strict"])
    out = capsys.readouterr().out
    assert code == 0
    data = json.loads(out)
    assert set(data["versions"]) == {"default", "strict"}
    default = data["versions"]["default"]
    assert {"accepted_rate", "first_try_accepted_rate", "model_calls_per_accepted",
            "tokens_per_accepted", "code_repairs", "shape_rate", "mean_repairs",
            "problem_codes", "mean_tasks", "tokens", "cost_usd", "node_f1",
            "link_f1"} <= set(default)
    assert len(default["outcomes"]) == 8
    assert default["problem_codes"]  # the shipped prompt's first plans have problems
    # TaskBench's tools declare no contracts: an accepted plan is one of a valid shape.
    assert default["contract_codes"] == {} and default["accepted_rate"] == 1.0
    ids = {row["id"] for row in data["changed"]}
    flipped = {o["id"] for o in default["outcomes"] if o["outcome"] == "repaired"}
    assert flipped and flipped <= ids


def test_cli_eval_table_and_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "examples", "--replay", "examples", "--prompts", "default",
                 "--prompts", "strict", "--compare", "default", "strict"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["default", "strict"]
    assert "changed from default to strict:" in out
    assert main(["eval", "examples", "--replay", "examples", "--compare", "a", "b"]) == 2
    assert "--compare names" in capsys.readouterr().err
    assert main(["eval", "nope.jsonl", "--replay", "examples"]) == 2
    assert main(["eval", "examples", "--prompts", "x=/does/not/exist", "--replay",
                 "examples"]) == 2
    assert main(["eval", "examples", "--min-tasks", "0"]) == 2


def test_the_cassette_recorded_from_the_real_small_model_replays_offline(
        no_network: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    path = EVALS_DIR / "cassettes" / "examples_smollm2.json"
    about = json.loads(path.read_text(encoding="utf-8"))["about"]
    assert about["made"] == "recorded" and "SmolLM2-135M-Instruct" in about["note"]
    # Recorded with compat (the server reads max_tokens): the replay model sends it too.
    assert Cassette.load(path).model().compat
    report = evaluate("examples", VERSIONS, replay=path)
    again = evaluate("examples", VERSIONS, replay=path)
    assert not no_network
    assert report.to_dict() == again.to_dict()
    for version in VERSIONS:
        summary = report[version].summary()
        assert summary["goals"] == 6 and summary["errors"] == 0
        assert summary["shape_rate"] >= summary["first_try_shape_rate"]
        assert summary["accepted_rate"] >= summary["first_try_accepted_rate"]
        assert all(o.attempts <= 3 for o in report[version].outcomes)  # 2 repairs at most
    assert main(["eval", "examples", "--replay", "examples_smollm2", "--prompts", "default",
                 "--prompts", "strict", "--no-progress"]) == 0
    assert "contract no_deliverable" in capsys.readouterr().out


def test_code_repairs_before_and_after_on_the_real_small_models_recording(
        no_network: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    """Replayed, no network: the model's own plans for brief-ev-charging under the strict
    prompt are wired wrong (an analysis that waits for itself, a brief on the research);
    the code repairs finish its first one, so the goal ends with an accepted plan after
    one model call instead of none after three. The requests sent are the recorded ones."""
    before = evaluate("examples", VERSIONS, replay="examples_smollm2", repair="model")
    after = evaluate("examples", VERSIONS, replay="examples_smollm2")
    assert not no_network
    for version in VERSIONS:
        assert before[version].summary()["accepted_rate"] == 0.0
        assert before[version].summary()["model_calls_per_accepted"] is None
        assert before[version].summary()["code_repairs"] == 0
    strict_before = outcomes_by_id(before, "strict")["brief-ev-charging"]
    strict_after = outcomes_by_id(after, "strict")["brief-ev-charging"]
    assert strict_before.outcome() == "invalid" and strict_before.attempts == 3
    assert strict_after.outcome() == "first_try" and strict_after.attempts == 1
    assert strict_after.code_repairs == ("self_dependency", "missing_input", "missing_input")
    assert strict_after.plan is not None
    assert [t["kind"] for t in strict_after.plan["tasks"]] == ["research", "analyse",
                                                               "write_brief"]
    summary = after["strict"].summary()
    assert summary["accepted_rate"] == round(1 / 6, 4)
    assert summary["model_calls_per_accepted"] == sum(o.attempts for o in after["strict"].outcomes)
    assert summary["tokens"] < before["strict"].summary()["tokens"]
    assert summary["code_repair_codes"] == {"missing_input": 2, "self_dependency": 1}
    # The CLI's switch gives the figures without code repairs.
    assert main(["eval", "examples", "--replay", "examples_smollm2", "--prompts", "strict",
                 "--no-code-repair", "--json", "--no-progress"]) == 0
    data = json.loads(capsys.readouterr().out)["versions"]["strict"]
    assert data["accepted_rate"] == 0.0 and data["code_repairs"] == 0


def test_code_repairs_cut_model_calls_on_the_taskbench_recording(no_network: list[Any]) -> None:
    before = evaluate("taskbench", {"default": None}, replay="taskbench", repair="model")
    after = evaluate("taskbench", {"default": None}, replay="taskbench")
    b, a = before["default"].summary(), after["default"].summary()
    assert b["accepted_rate"] == a["accepted_rate"] == 1.0
    assert a["code_repairs"] > 0 and b["code_repairs"] == 0
    assert a["model_calls_per_accepted"] < b["model_calls_per_accepted"]
    assert a["tokens_per_accepted"] < b["tokens_per_accepted"]
    fixed = {o.id for o in after["default"].outcomes if o.code_repairs}
    assert fixed and all(o.outcome() == "first_try" for o in after["default"].outcomes
                         if o.id in fixed)
    assert all(o.outcome() == "repaired" for o in before["default"].outcomes if o.id in fixed)
