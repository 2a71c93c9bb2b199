"""Routing strategies on their own."""

from __future__ import annotations

import pytest

from planrun.core._errors import UsageError
from planrun.core._registry import WorkerSpec
from planrun.core._routing import WorkerState, get_router
from planrun.core._task import Task


def workers() -> list[WorkerState]:
    return [
        WorkerState(WorkerSpec("gen", {"sum": 0.25, "other": 1.0}), load_s=0.0),
        WorkerState(WorkerSpec("spec", {"sum": 1.0}), load_s=8.0),
        WorkerState(WorkerSpec("mid", {"sum": 0.5}), load_s=2.0),
    ]


TASK = Task(id="t", kind="sum", estimate_s=4.0)


def test_round_robin_cycles_whatever_the_load() -> None:
    router, ws = get_router("round_robin"), workers()
    assert [router.pick(TASK, ws).name for _ in range(4)] == ["gen", "spec", "mid", "gen"]


def test_least_loaded_takes_the_least_queued_seconds() -> None:
    assert get_router("least_loaded").pick(TASK, workers()).name == "gen"


def test_capability_takes_the_most_skilled() -> None:
    assert get_router("capability").pick(TASK, workers()).name == "spec"


def test_balanced_takes_the_earliest_estimated_finish() -> None:
    # gen: 0 + 16 = 16, spec: 8 + 4 = 12, mid: 2 + 8 = 10
    assert get_router("balanced").pick(TASK, workers()).name == "mid"


def test_unknown_strategy() -> None:
    with pytest.raises(UsageError, match="round_robin, least_loaded, capability, balanced"):
        get_router("random")


def test_a_workers_cost_is_the_estimate_over_its_skill() -> None:
    fast = WorkerState(WorkerSpec("fast", {"k": 2.0, "slow": 0.5}))
    plain = WorkerState(WorkerSpec("plain"))
    task = Task("a", "k", estimate_s=3.0)
    assert fast.cost(task) == 1.5 and plain.cost(task) == 3.0
    assert fast.cost(Task("b", "slow", estimate_s=3.0)) == 6.0
    # A kind it does not list (a worker that came back with fewer kinds while a task of
    # that kind was in flight on it) is counted at speed 1, not divided by zero.
    assert fast.cost(Task("c", "other", estimate_s=3.0)) == 3.0
