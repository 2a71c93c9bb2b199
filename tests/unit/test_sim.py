"""Simulation reproduces the supervisor-worker article's numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planrun.core._errors import UsageError
from planrun.core._task import Status
from planrun.dev.sim import Scenario, simulate

ARTICLE = [10, 2, 2, 10, 2, 2, 10, 2, 2]


@pytest.mark.parametrize(
    ("strategy", "makespan"),
    [("round_robin", 30.0), ("least_loaded", 16.0), ("balanced", 14.0)],
)
def test_article_makespans(strategy: str, makespan: float) -> None:
    result = simulate(Scenario.from_durations(ARTICLE, 3), strategy)
    assert result.makespan == makespan
    assert result.run.audit.clean


def test_round_robin_pins_the_long_tasks_on_one_worker() -> None:
    result = simulate(Scenario.from_durations(ARTICLE, 3), "round_robin")
    assert {k: v["busy_s"] for k, v in result.per_worker.items()} == {
        "w1": 30.0, "w2": 6.0, "w3": 6.0
    }


def test_balanced_reaches_the_optimum_split() -> None:
    result = simulate(Scenario.from_durations(ARTICLE, 3), "balanced")
    assert all(v["busy_s"] == 14.0 for v in result.per_worker.values())


@pytest.mark.parametrize(("strategy", "mean"), [("round_robin", 10.0), ("capability", 4.0)])
def test_capability_example_mean_time_per_summarisation(strategy: str, mean: float) -> None:
    result = simulate(Scenario.load("capability"), strategy)
    assert result.mean_task_s == mean


def test_scenario_file_with_dependencies_failures_and_speeds(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({
        "strategy": "capability",
        "workers": [{"name": "fast", "skills": {"a": 2.0}}, {"name": "slow", "kinds": ["a"]}],
        "tasks": [
            {"id": "x", "kind": "a", "estimate": 4, "fail": {"fast": 1}},
            {"id": "y", "kind": "a", "estimate": 4, "depends_on": ["x"]},
        ],
        "options": {"max_attempts": 3},
    }))
    result = simulate(Scenario.load(path))
    run = result.run
    assert run.tasks["x"].status is Status.COMPLETED and run.tasks["x"].attempts == 2
    # x fails on fast (2 s), fails over to slow (4 s), then y runs on fast (2 s)
    assert run.tasks["x"].result == {"worker": "slow"}
    assert run.tasks["y"].result == {"worker": "fast"}
    assert run.tasks["y"].started_at >= run.tasks["x"].finished_at  # type: ignore[operator]


def test_hanging_worker_in_a_scenario_is_reclaimed() -> None:
    scenario = Scenario.from_dict({
        "strategy": "round_robin",
        "workers": [{"name": "w1", "kinds": ["a"]}, {"name": "w2", "kinds": ["a"]}],
        "tasks": [{"id": "t", "kind": "a", "estimate": 1, "hang": {"w1": 1}}],
        "options": {"stale_after": 30},
    })
    result = simulate(scenario)
    assert result.makespan == pytest.approx(31.0)  # silent until the lease ends at 30, then 1 s
    assert result.run.tasks["t"].reclaims == 1


@pytest.mark.parametrize(
    "bad",
    [[], {"workers": []}, {"workers": [{"name": "w"}], "tasks": [{}]},
     {"workers": [{}], "tasks": [{"kind": "a"}]}],
)
def test_malformed_scenarios_are_usage_errors(bad: object) -> None:
    with pytest.raises(UsageError):
        Scenario.from_dict(bad)  # type: ignore[arg-type]


def test_missing_scenario_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read"):
        Scenario.load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UsageError, match="not JSON"):
        Scenario.load(tmp_path / "bad.json")


def test_approvals_are_scripted_delays_in_virtual_time() -> None:
    scenario = Scenario.from_dict({
        "workers": [{"name": "w1", "kinds": ["work", "send"], "capacity": 2}],
        "tasks": [
            {"id": "a", "kind": "work", "estimate": 10},
            {"id": "send", "kind": "send", "estimate": 2, "depends_on": ["a"],
             "approval": {"before": "effect", "after": 300}},
            {"id": "pay", "kind": "work", "estimate": 5, "depends_on": ["a"],
             "approval": {"after": 60, "reject": True}},
            {"id": "after", "kind": "work", "estimate": 1, "depends_on": ["send"]},
            {"id": "lost", "kind": "work", "estimate": 1, "depends_on": ["pay"]},
        ],
    })
    result = simulate(scenario)
    assert result.makespan == 10 + 2 + 300 + 1  # the reply's approval took 300 s
    tasks = result.run.tasks
    assert tasks["pay"].status is Status.DEAD and tasks["pay"].cause == "rejected"
    assert tasks["pay"].started_at is None  # rejected before it started
    assert tasks["lost"].status is Status.CANCELLED
    assert tasks["after"].started_at == 312.0


def test_a_malformed_scripted_approval_is_refused() -> None:
    base = {"workers": [{"name": "w1"}], "tasks": [{"kind": "k", "approval": {"after": -1}}]}
    with pytest.raises(UsageError, match="approval 'after' must be a number >= 0"):
        Scenario.from_dict(base)
    base["tasks"] = [{"kind": "k", "approval": {"before": "later"}}]
    with pytest.raises(UsageError, match="approval 'before'"):
        Scenario.from_dict(base)


def test_reading_a_scenario_compares_each_dependency_a_bounded_number_of_times() -> None:
    """A dependency named by id is looked up, not searched for: reading a scenario file
    costs time linear in its size, so capacity planning for 50,000 tasks stays as cheap per
    task as for 5,000 (``python bench/simulate.py`` measures the time)."""
    compared = 0

    class Counted(str):
        __hash__ = str.__hash__

        def __eq__(self, other: object) -> bool:
            nonlocal compared
            compared += 1
            return str.__eq__(self, other)

    n = 2_000
    tasks = [{"id": f"task-{i}", "kind": "work",
              **({"depends_on": [Counted(f"task-{i - 1}")]} if i else {})} for i in range(n)]
    Scenario.from_dict({"workers": [{"name": "w"}], "tasks": tasks})
    assert 0 < compared <= 4 * n  # a list search would compare some n * n / 2 times
