"""Simulation of plans that grow at run time: the spawned tasks run in virtual time under
the same rules, so the makespan of a fan-out can be estimated before a real run."""

from __future__ import annotations

import pytest

from planrun.core._errors import UsageError
from planrun.core._task import Status
from planrun.dev.sim import Scenario, simulate


def test_the_builtin_fan_out_runs_its_spawned_tasks_in_virtual_time() -> None:
    result = simulate(Scenario.load("fanout"))
    run = result.run
    assert run.ok and len(run.tasks) == 42
    # fetch 5 s, then 40 tasks of 2 s on 2 x 4 slots (5 rounds), then the summary 3 s
    assert result.makespan == pytest.approx(5 + 5 * 2 + 3)
    summary = run.tasks["summary"]
    assert len(summary.depends_on) == 41 and run.audit.clean
    assert min(t.started_at or 0 for t in run.tasks.values() if t.parent == "fetch") == 5.0


def test_a_nested_fan_out_is_joined_at_every_depth() -> None:
    scenario = Scenario.from_dict({
        "workers": [{"name": "w", "capacity": 10}],
        "tasks": [{"id": "root", "kind": "split", "estimate": 1,
                   "spawn": [{"kind": "split", "count": 2, "estimate": 2,
                              "spawn": [{"kind": "leaf", "count": 3, "estimate": 4}]}]},
                  {"id": "end", "kind": "merge", "estimate": 1, "joins": ["root"]}],
    })
    result = simulate(scenario)
    assert result.run.ok and len(result.run.tasks) == 2 + 2 + 6
    assert result.makespan == pytest.approx(1 + 2 + 4 + 1)  # every level in parallel
    assert result.run.tasks["root/1/2"].status is Status.COMPLETED


def test_more_workers_shorten_a_fan_out() -> None:
    wide = Scenario.load("fanout")
    narrow = Scenario(workers=[{"name": "w1", "capacity": 1}], tasks=wide.tasks)
    assert simulate(narrow).makespan == pytest.approx(5 + 40 * 2 + 3)
    assert simulate(wide).makespan < simulate(narrow).makespan


@pytest.mark.parametrize("spawn, message", [
    ({"kind": "x"}, "'spawn' must be a list"),
    ([{"count": 2}], "needs a 'kind'"),
    ([{"kind": "x", "count": -1}], "'count' must be an integer >= 0"),
    ([{"kind": "x", "estimate": "soon"}], "'estimate' must be a finite number"),
])
def test_a_bad_spawn_plan_is_refused_naming_the_field(spawn: object, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        Scenario.from_dict({"workers": [{"name": "w"}],
                            "tasks": [{"kind": "k", "spawn": spawn}]})


def test_joins_must_name_other_tasks() -> None:
    with pytest.raises(UsageError, match="'joins' must list other tasks"):
        Scenario.from_dict({"workers": [{"name": "w"}],
                            "tasks": [{"kind": "k", "joins": ["nowhere"]}]})
