"""Routing: which worker gets a ready task.

A strategy sees the task and the workers able to do its kind (in registration order) and
picks one. It never runs anything. The four strategies of the supervisor-worker pattern:

``round_robin``
    the next capable worker in turn, whatever its load;
``least_loaded``
    the capable worker with the least queued work (estimated seconds not yet finished);
``capability``
    the capable worker with the highest skill for the kind (ties: least loaded);
``balanced``
    the capable worker that would finish the task earliest (queued work plus this task's
    estimate at that worker's speed); the supervisor also orders ready tasks longest
    critical path first under this strategy.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from planrun.core._errors import UsageError
from planrun.core._registry import WorkerSpec
from planrun.core._task import Task

__all__ = ["STRATEGIES", "Router", "WorkerState", "get_router"]


@dataclass(eq=False)
class WorkerState:
    """The supervisor's live view of one worker."""

    spec: WorkerSpec
    queue: deque[str] = field(default_factory=deque)
    """Task ids assigned to this worker and not started, oldest first."""
    active: int = 0
    """Tasks running now."""
    load_s: float = 0.0
    """Estimated seconds of assigned and running work."""
    done: int = 0
    busy_s: float = 0.0
    name: str = field(init=False)
    """The worker's name (its spec's; a spec that replaces it keeps the name)."""

    def __post_init__(self) -> None:
        self.name = self.spec.name

    def cost(self, task: Task) -> float:
        """Estimated seconds this worker needs for ``task``."""
        skills = self.spec.skills  # WorkerSpec.skill, in line: routing asks this a lot
        if skills is None:
            return task.estimate_s
        skill = skills.get(task.kind)  # a kind it does not do (any more): as if at speed 1
        return task.estimate_s / float(skill) if skill else task.estimate_s


class Router(Protocol):
    """Picks a worker among capable candidates (never empty)."""

    orders_by_critical_path: bool

    def pick(self, task: Task, candidates: Sequence[WorkerState]) -> WorkerState:
        """Return one of ``candidates``."""
        ...


class RoundRobin:
    """The next capable worker in turn."""

    orders_by_critical_path = False

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, task: Task, candidates: Sequence[WorkerState]) -> WorkerState:
        chosen = candidates[self._turn % len(candidates)]
        self._turn += 1
        return chosen


class LeastLoaded:
    """The capable worker with the least estimated queued work."""

    orders_by_critical_path = False

    def pick(self, task: Task, candidates: Sequence[WorkerState]) -> WorkerState:
        return min(candidates, key=lambda w: w.load_s)


class Capability:
    """The most skilled capable worker; ties go to the least loaded."""

    orders_by_critical_path = False

    def pick(self, task: Task, candidates: Sequence[WorkerState]) -> WorkerState:
        return min(candidates, key=lambda w: (-w.spec.skill(task.kind), w.load_s))


class Balanced:
    """The capable worker with the earliest estimated finish for this task."""

    orders_by_critical_path = True

    def pick(self, task: Task, candidates: Sequence[WorkerState]) -> WorkerState:
        return min(candidates, key=lambda w: w.load_s + w.cost(task))


STRATEGIES = ("round_robin", "least_loaded", "capability", "balanced")


def get_router(strategy: str | Router) -> Router:
    """Return a router for a strategy name, or the router object itself."""
    if not isinstance(strategy, str):
        return strategy
    routers: dict[str, type[Router]] = {
        "round_robin": RoundRobin,
        "least_loaded": LeastLoaded,
        "capability": Capability,
        "balanced": Balanced,
    }
    if strategy not in routers:
        raise UsageError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    return routers[strategy]()
