"""TaskBench samples become planrun plans that validate against their tool graphs."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest

from planrun.core._errors import UsageError
from planrun.core._plan import Plan, validate_plan
from planrun.dev.taskbench import (
    DATASETS,
    iter_plans,
    iter_samples,
    load_tool_graph,
    sample_to_plan,
    tool_graph_links,
)

# dataset: (tools, samples, task links, samples whose node order needed fixing)
EXPECTED = {
    "data_huggingface": (23, 47, 88, 17),
    "data_multimedia": (40, 51, 91, 16),
    "data_dailylifeapis": (40, 39, 68, 22),
    "restbench_tmdb": (46, 100, 126, 0),
}


TASKBENCH = Path(__file__).resolve().parents[1] / "data" / "taskbench"
"""The TaskBench files the tests read: copies kept with the tests (see its README)."""


@pytest.fixture(scope="module")
def taskbench() -> Path:
    assert (TASKBENCH / "data_huggingface" / "tool_desc.json").is_file(), TASKBENCH
    return TASKBENCH


def _sample(folder: Path, sample_id: str) -> dict[str, Any]:
    return next(s for s in iter_samples(folder) if str(s["id"]) == sample_id)


def test_expected_covers_every_dataset() -> None:
    assert set(EXPECTED) == set(DATASETS)


@pytest.mark.parametrize("dataset", DATASETS)
def test_every_plan_validates_against_its_tool_graph(taskbench: Path, dataset: str) -> None:
    tools, samples, links, reordered = EXPECTED[dataset]
    folder = taskbench / dataset
    registry = load_tool_graph(folder)
    assert len(registry) == tools
    raw_samples = {str(s["id"]): s for s in iter_samples(folder)}
    plans = list(iter_plans(folder))
    assert len(plans) == samples == len(raw_samples)
    counts: collections.Counter[str] = collections.Counter()
    for sample_id, document in plans:
        problems = validate_plan(document, registry)
        assert problems == [], (dataset, sample_id, problems)
        counts["valid"] += 1
        plan = Plan.parse(document, registry)
        sample = raw_samples[sample_id]
        nodes = sample["task_nodes"]
        assert plan.goal == sample["user_request"]
        assert sorted(t.kind for t in plan.tasks) == sorted(n["task"] for n in nodes)
        assert plan.topological_order() == list(range(len(plan.tasks)))
        edges = {(plan.tasks[d].kind, t.kind) for t in plan.tasks for d in t.depends_on}
        assert edges == {(link["source"], link["target"]) for link in sample["task_links"]}
        counts["edges"] += sum(len(t.depends_on) for t in plan.tasks)
        if [t.kind for t in plan.tasks] != [n["task"] for n in nodes]:
            counts["reordered"] += 1
    assert (counts["valid"], counts["edges"], counts["reordered"]) == (samples, links, reordered)


def test_registry_describes_each_tool(taskbench: Path) -> None:
    registry = load_tool_graph(taskbench / "data_huggingface")
    assert registry["Translation"].description.startswith("Translation is the task")
    assert registry["Translation"].payload_model is None
    dl = load_tool_graph(taskbench / "data_dailylifeapis")
    assert "get_weather" in dl and dl["get_weather"].description


def test_node_order_and_references_are_renumbered(taskbench: Path) -> None:
    document = sample_to_plan(_sample(taskbench / "data_multimedia", "16097613"))
    assert document["tasks"] == [
        {"kind": "Video-to-Audio", "payload": {"arguments": ["example.mp4"]}, "depends_on": []},
        {
            "kind": "Audio Noise Reduction",
            "payload": {"arguments": ["<node-0>"]},
            "depends_on": [0],
        },
        {
            "kind": "Audio Effects",
            "payload": {"arguments": ["<node-1>", "reverb"]},
            "depends_on": [1],
        },
    ]


def test_out_of_range_reference_is_left_verbatim(taskbench: Path) -> None:
    document = sample_to_plan(_sample(taskbench / "data_multimedia", "46051366"))
    arguments = [a for t in document["tasks"] for a in t["payload"]["arguments"]]
    assert "<node-5>" in arguments


def test_dailylife_arguments_are_kept_verbatim(taskbench: Path) -> None:
    document = sample_to_plan(_sample(taskbench / "data_dailylifeapis", "16887732"))
    sms = next(t for t in document["tasks"] if t["kind"] == "send_sms")
    assert {"name": "content", "from": "get_weather"} in sms["payload"]["arguments"]


def test_tmdb_repeated_tool_is_chained_in_data_order(taskbench: Path) -> None:
    document = sample_to_plan(_sample(taskbench / "restbench_tmdb", "78"))
    assert document["tasks"] == [
        {"kind": "SearchMovie", "payload": {}, "depends_on": []},
        {"kind": "SearchMovie", "payload": {}, "depends_on": [0]},
    ]


def test_tool_graph_links(taskbench: Path) -> None:
    links = tool_graph_links(taskbench / "data_multimedia")
    assert ("Video-to-Audio", "Audio Noise Reduction") in links
    assert all(isinstance(s, str) and isinstance(t, str) for s, t in links)


@pytest.mark.parametrize("dataset", DATASETS)
def test_a_corrupted_plan_does_not_validate(taskbench: Path, dataset: str) -> None:
    folder = taskbench / dataset
    registry = load_tool_graph(folder)
    sample_id, document = next((i, d) for i, d in iter_plans(folder) if len(d["tasks"]) >= 2)
    good_kind = document["tasks"][1]["kind"]
    document["tasks"][1]["kind"] = "Not A Real Tool"
    problems = validate_plan(document, registry)
    assert [(p.code, p.task) for p in problems] == [("unknown_kind", 1)], sample_id
    assert repr(good_kind) in problems[0].message  # the known tools are listed

    document["tasks"][1]["kind"] = good_kind[:-1] + "#"  # a typo
    (problem,) = validate_plan(document, registry)
    assert f"did you mean {good_kind!r}?" in problem.message

    document["tasks"][1]["kind"] = good_kind
    document["tasks"][0]["depends_on"] = [1]
    problems = validate_plan(document, registry)
    assert ("forward_dependency", 0) in [(p.code, p.task) for p in problems]


# ------------------------------------------------------------- synthetic samples (no data)


def test_synthetic_sample_is_put_in_topological_order() -> None:
    sample = {
        "id": "x",
        "user_request": "do it",
        "task_nodes": [
            {"task": "C", "arguments": ["<node-1>"]},
            {"task": "B", "arguments": ["<node-2>", "<node-9>"]},
            {"task": "A", "arguments": ["in.txt"], "output": ["ignored"]},
        ],
        "task_links": [{"source": "A", "target": "B"}, {"source": "B", "target": "C"}],
    }
    document = sample_to_plan(sample)
    assert document == {
        "goal": "do it",
        "tasks": [
            {"kind": "A", "payload": {"arguments": ["in.txt"]}, "depends_on": []},
            {"kind": "B", "payload": {"arguments": ["<node-0>", "<node-9>"]}, "depends_on": [0]},
            {"kind": "C", "payload": {"arguments": ["<node-1>"]}, "depends_on": [1]},
        ],
    }
    assert validate_plan(document, ["A", "B", "C"]) == []


def test_synthetic_cycle_and_self_loop_are_left_for_validation_to_report() -> None:
    cyclic = {
        "task_nodes": [{"task": "A"}, {"task": "B"}],
        "task_links": [{"source": "A", "target": "B"}, {"source": "B", "target": "A"}],
    }
    problems = validate_plan(sample_to_plan(cyclic), ["A", "B"])
    assert [(p.code, p.task) for p in problems] == [("forward_dependency", 0)]
    self_loop = {"task_nodes": [{"task": "A"}], "task_links": [{"source": "A", "target": "A"}]}
    problems = validate_plan(sample_to_plan(self_loop), ["A"])
    assert [(p.code, p.task) for p in problems] == [("self_dependency", 0)]


def test_missing_or_broken_folder_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"tool_desc|graph_desc"):
        load_tool_graph(tmp_path)
    with pytest.raises(UsageError, match=r"data\.json"):
        list(iter_plans(tmp_path))
    (tmp_path / "data.json").write_text(json.dumps({"id": 1, "task_nodes": []}) + "\n\n{oops\n")
    plans = iter_plans(tmp_path)
    assert next(plans) == ("1", {"goal": "", "tasks": []})
    with pytest.raises(UsageError, match=r"data.json:3"):
        next(plans)
