"""Simulation: the real supervisor in virtual time, with workers that only pretend.

A scenario names workers (kinds, speeds, capacity) and tasks (kind, estimate, dependencies,
resources, failure plans). Each simulated worker takes ``estimate / speed`` virtual seconds
per task and then succeeds, or fails as its plan says. Nothing sleeps for real, so a
scenario of hours runs in milliseconds and the numbers are exact.

Scenario JSON::

    {"strategy": "balanced",
     "workers": [{"name": "w1", "skills": {"summarise": 1.0}, "capacity": 1},
                 {"name": "w2", "kinds": ["summarise"]}],
     "tasks": [{"id": "a", "kind": "summarise", "estimate": 4, "depends_on": [],
                "resources": [], "fail": {"w1": 1}, "fail_permanent": {}, "hang": {}}],
     "options": {"max_attempts": 3, "stale_after": 90, "on_dead": "cancel_dependents"}}

``fail`` / ``fail_permanent`` / ``hang``: per worker, how many times that worker fails the
task transiently, permanently, or goes silent on it (never answers, never heartbeats).
``depends_on`` holds task ids or indices of earlier tasks. ``approval`` makes a task wait
for a person, scripted: ``{"before": "start" | "effect", "after": 300, "reject": false}``
approves it (or rejects it) ``after`` virtual seconds of waiting, so the estimate of a run
includes the time its approvals take.

A plan that grows at run time says so per task: ``"spawn": [{"kind": "classify", "count":
200, "estimate": 3}]`` adds that many tasks when the task completes (each entry may hold its
own ``spawn``, for a deeper fan-out), and ``"joins": ["fetch"]`` makes a task wait for
everything a task spawned, at any depth. The spawned tasks run under the same rules
(validation, spawn limits, routing), so the makespan estimates a real run of that shape.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planrun.core import (
    KindSpec,
    PermanentError,
    Registry,
    RunResult,
    Status,
    Task,
    TaskContext,
    TransientError,
    UsageError,
    WorkerSpec,
)
from planrun.core.scheduling import Approval
from planrun.runtime import Supervisor, VirtualClock

__all__ = ["BUILTIN_SCENARIOS", "Scenario", "SimResult", "simulate"]


@dataclass(frozen=True)
class Scenario:
    """Workers and tasks for a simulated run."""

    workers: list[dict[str, Any]]
    tasks: list[dict[str, Any]]
    strategy: str = "balanced"
    options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scenario:
        """Build a scenario from its JSON form; a malformed one raises :class:`UsageError`
        naming the field that is wrong."""
        if not isinstance(data, Mapping):
            raise UsageError("a scenario is a JSON object with 'workers' and 'tasks'")
        workers, tasks = data.get("workers"), data.get("tasks")
        if not isinstance(workers, list) or not workers:
            raise UsageError("scenario: 'workers' must be a non-empty list")
        if not isinstance(tasks, list) or not tasks:
            raise UsageError("scenario: 'tasks' must be a non-empty list")
        names: set[str] = set()
        for i, w in enumerate(workers):
            _check_worker(i, w, names)
        ids = [_task_id(t, i) if isinstance(t, Mapping) else "" for i, t in enumerate(tasks)]
        known = frozenset(ids)
        for i, t in enumerate(tasks):
            _check_task(i, t, ids, known)
        if len(set(ids)) != len(ids):
            raise UsageError("scenario: task ids must be unique")
        options = data.get("options") or {}
        if not isinstance(options, Mapping):
            raise UsageError("scenario: 'options' must be an object")
        _check_options(options)
        from planrun.core import STRATEGIES

        strategy = data.get("strategy", "balanced")
        if strategy not in STRATEGIES:
            raise UsageError(f"scenario: 'strategy' must be one of {list(STRATEGIES)}, "
                             f"got {strategy!r}")
        return cls(list(workers), list(tasks), str(strategy), options)

    @classmethod
    def load(cls, path: str | Path) -> Scenario:
        """Read a scenario file (or a built-in scenario by name)."""
        if str(path) in BUILTIN_SCENARIOS:
            return cls.from_dict(BUILTIN_SCENARIOS[str(path)])
        if Path(path).is_dir():
            raise UsageError(f"scenario {path} is a directory, not a scenario file")
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise UsageError(f"cannot read scenario {path}: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise UsageError(f"scenario {path} is not UTF-8 text ({exc.reason} at byte "
                             f"{exc.start})") from exc
        except (ValueError, RecursionError) as exc:
            raise UsageError(f"scenario {path} is not JSON: {exc}") from exc
        return cls.from_dict(data)

    @classmethod
    def from_durations(cls, durations: Sequence[float], workers: int) -> Scenario:
        """Independent tasks of one kind with these durations, on ``workers`` equal workers."""
        if workers < 1:
            raise UsageError("--workers must be >= 1")
        if not durations:
            raise UsageError("--durations needs at least one number")
        return cls(
            workers=[{"name": f"w{i + 1}", "kinds": ["work"]} for i in range(workers)],
            tasks=[{"kind": "work", "estimate": float(d)} for d in durations],
        )


@dataclass(frozen=True)
class SimResult:
    """What a simulated run measured."""

    strategy: str
    makespan: float
    mean_task_s: float
    """Mean execution time of completed tasks (start to finish, queueing excluded)."""
    per_worker: Mapping[str, Mapping[str, float]]
    run: RunResult
    deadline_s: float | None = None
    """The window the run had to fit in (None: none was set)."""

    @property
    def fits(self) -> bool | None:
        """Every task finished within the deadline (None without a deadline)."""
        if self.deadline_s is None:
            return None
        return self.run.ok and not self.run.deadline_reached \
            and self.makespan <= self.deadline_s + 1e-9

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of ``planrun simulate --json``."""
        return {
            "makespan": self.makespan,
            "mean_task_s": self.mean_task_s,
            "strategy": self.strategy,
            "per_worker": {k: dict(v) for k, v in self.per_worker.items()},
            **({"deadline_s": self.deadline_s, "fits": self.fits,
                "cancelled": self.run.counts["cancelled"]}
               if self.deadline_s is not None else {}),
        }


class _SimWorker:
    """Handler of one simulated worker: waits its duration, then follows the failure plans."""

    def __init__(self, name: str, plans: Mapping[str, Mapping[str, dict[str, int]]],
                 spawns: Mapping[str, list[Mapping[str, Any]]] | None = None) -> None:
        self.name = name
        self.plans = plans
        """Task id -> its failure plans (only tasks that have any)."""
        self.left: dict[str, dict[str, int]] = {}
        """What is left of this worker's share of a task's plans, from its first attempt."""
        self.spawns = dict(spawns or {})

    async def __call__(self, payload: Any, ctx: TaskContext) -> dict[str, Any]:
        await asyncio.sleep(ctx.estimate_s / ctx.skill)
        left = self.left.get(ctx.task_id)
        if left is None:
            plans = self.plans.get(ctx.task_id, {})
            left = self.left[ctx.task_id] = {k: v.get(self.name, 0) for k, v in plans.items()}
        for what in ("hang", "fail_permanent", "fail"):
            if left.get(what, 0) > 0:
                left[what] -= 1
                if what == "hang":
                    await asyncio.Event().wait()  # silent: no result, no heartbeat
                if what == "fail_permanent":
                    raise PermanentError(f"{self.name} failed {ctx.task_id} (permanent)")
                raise TransientError(f"{self.name} failed {ctx.task_id}")
        plan = self.spawns.get(ctx.task_id) or (payload or {}).get("spawn") or []
        for entry in plan:
            nested = {"spawn": list(entry["spawn"])} if entry.get("spawn") else {}
            for _ in range(int(entry.get("count", 1))):
                ctx.spawn(str(entry["kind"]), nested,
                          estimate_s=float(entry.get("estimate", 1.0)))
        return {"worker": self.name}


def _spawn_kinds(plan: object) -> set[str]:
    kinds: set[str] = set()
    for entry in plan if isinstance(plan, list) else []:
        kinds.add(str(entry["kind"]))
        kinds |= _spawn_kinds(entry.get("spawn"))
    return kinds


def _check_spawn(i: int, plan: object) -> None:
    if not isinstance(plan, list):
        raise UsageError(f"scenario: task {i}: 'spawn' must be a list of "
                         "{\"kind\", \"count\", \"estimate\"} objects")
    for entry in plan:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("kind"), str):
            raise UsageError(f"scenario: task {i}: each 'spawn' entry needs a 'kind'")
        count, estimate = entry.get("count", 1), entry.get("estimate", 1.0)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise UsageError(f"scenario: task {i}: spawn 'count' must be an integer >= 0, "
                             f"got {count!r}")
        if not _is_number(estimate) or estimate < 0:
            raise UsageError(f"scenario: task {i}: spawn 'estimate' must be a finite number "
                             f">= 0, got {estimate!r}")
        if entry.get("spawn") is not None:
            _check_spawn(i, entry["spawn"])


class _ScriptedApprover:
    """A person, scripted: decides each waiting task ``after`` seconds of its wait."""

    def __init__(self, script: Mapping[str, Mapping[str, Any]]) -> None:
        self.script = script
        self.supervisor: Supervisor | None = None

    def __call__(self, event: Any, task: Task) -> None:
        if event.event != "waiting" or task.id not in self.script:
            return
        plan = self.script[task.id]
        # Decided later, outside the change being recorded now.
        asyncio.get_running_loop().call_later(float(plan.get("after", 0)), self._decide,
                                              task.id, bool(plan.get("reject", False)))

    def _decide(self, task_id: str, reject: bool) -> None:
        sup = self.supervisor
        if sup is None or task_id not in sup.waiting:
            return  # the run was stopped (a deadline, an abort) meanwhile
        if reject:
            sup.reject(task_id, "scripted rejection")
        else:
            sup.approve(task_id, "scripted approval")


def _task_id(spec: Mapping[str, Any], index: int) -> str:
    return str(spec.get("id", f"t{index}"))


_NUMBER_OPTIONS = ("max_attempts", "retry_budget", "timeout", "stale_after", "max_reclaims",
                   "deadline_s",
                   "stall_after")
_SUPERVISOR_OPTIONS = frozenset((*_NUMBER_OPTIONS, "on_dead", "goal"))
"""The supervisor's options a scenario file may set (the ones JSON can say)."""


def _check_options(options: Mapping[str, Any]) -> None:
    unknown = sorted(set(options) - _SUPERVISOR_OPTIONS)
    if unknown:
        raise UsageError(f"scenario: unknown option(s) {unknown}; known: "
                         f"{sorted(_SUPERVISOR_OPTIONS)}")
    for name in _NUMBER_OPTIONS:
        value = options.get(name)
        if value is not None and (not _is_number(value) or value < 0):
            raise UsageError(f"scenario: option {name!r} must be a finite number >= 0, "
                             f"got {value!r}")
    for name in ("on_dead", "goal"):
        if name in options and not isinstance(options[name], str):
            raise UsageError(f"scenario: option {name!r} must be a string")


def _is_number(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def _check_worker(i: int, w: object, names: set[str]) -> None:
    if not isinstance(w, Mapping) or not isinstance(w.get("name"), str) or not w["name"]:
        raise UsageError(f"scenario: worker {i} needs a 'name'")
    name = w["name"]
    if name in names:
        raise UsageError(f"scenario: worker name {name!r} appears twice")
    names.add(name)
    capacity = w.get("capacity", 1)
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise UsageError(f"scenario: worker {name!r}: 'capacity' must be an integer >= 1, "
                         f"got {capacity!r}")
    kinds = w.get("kinds")
    if kinds is not None and (not isinstance(kinds, list) or not kinds
                              or not all(isinstance(k, str) for k in kinds)):
        raise UsageError(f"scenario: worker {name!r}: 'kinds' must be a list of kind names")
    skills = w.get("skills")
    if skills is not None and (not isinstance(skills, Mapping) or not skills or not all(
            isinstance(k, str) and _is_number(v) and v > 0 for k, v in skills.items())):
        raise UsageError(f"scenario: worker {name!r}: 'skills' must map kind names to "
                         "numbers > 0")


def _check_task(i: int, t: object, ids: Sequence[str], known: frozenset[str]) -> None:
    """Check one task of a scenario file; ``known`` is ``ids`` as a set (a lookup per
    dependency, so a file of any size is read in time linear in its size)."""
    if not isinstance(t, Mapping) or not isinstance(t.get("kind"), str):
        raise UsageError(f"scenario: task {i} needs a 'kind'")
    estimate = t.get("estimate", 1.0)
    if not _is_number(estimate) or estimate < 0:
        raise UsageError(f"scenario: task {i}: 'estimate' must be a finite number >= 0, "
                         f"got {estimate!r}")
    if "id" in t and (not isinstance(t["id"], str) or not t["id"]):
        raise UsageError(f"scenario: task {i}: 'id' must be a non-empty string")
    deps = t.get("depends_on", [])
    if not isinstance(deps, list):
        raise UsageError(f"scenario: task {i}: 'depends_on' must be a list")
    for d in deps:
        found = (0 <= d < len(ids) if isinstance(d, int) and not isinstance(d, bool)
                 else isinstance(d, str) and d in known)
        if not found or (isinstance(d, int) and d == i) or d == ids[i]:
            raise UsageError(f"scenario: task {i} depends on {d!r}, which is no other task "
                             "(use task ids or indices)")
    joins = t.get("joins", [])
    if not isinstance(joins, list) or not all(
            (isinstance(d, str) and d in known) or (isinstance(d, int) and not isinstance(d, bool)
                                                 and 0 <= d < len(ids) and d != i)
            for d in joins):
        raise UsageError(f"scenario: task {i}: 'joins' must list other tasks (ids or indices)")
    if t.get("spawn") is not None:
        _check_spawn(i, t["spawn"])
    for key in ("resources",):
        value = t.get(key) or []
        if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
            raise UsageError(f"scenario: task {i}: {key!r} must be a list of names")
    for key in ("fail", "fail_permanent", "hang"):
        plan = t.get(key) or {}
        if not isinstance(plan, Mapping) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0
                for v in plan.values()):
            raise UsageError(f"scenario: task {i}: {key!r} must map worker names to counts")
    if not isinstance(t.get("payload") or {}, Mapping):
        raise UsageError(f"scenario: task {i}: 'payload' must be an object")
    if "approval" in t:
        _check_approval(i, t["approval"])


def _check_approval(i: int, approval: object) -> None:
    if not isinstance(approval, Mapping):
        raise UsageError(f"scenario: task {i}: 'approval' must be an object")
    unknown = sorted(set(approval) - {"before", "after", "reject"})
    if unknown:
        raise UsageError(f"scenario: task {i}: unknown approval field(s) {unknown}")
    if approval.get("before", "start") not in ("start", "effect"):
        raise UsageError(f"scenario: task {i}: approval 'before' must be 'start' or 'effect'")
    after = approval.get("after", 0)
    if not _is_number(after) or after < 0:
        raise UsageError(f"scenario: task {i}: approval 'after' must be a number >= 0, "
                         f"got {after!r}")
    if not isinstance(approval.get("reject", False), bool):
        raise UsageError(f"scenario: task {i}: approval 'reject' must be true or false")


def build(scenario: Scenario, strategy: str | None = None, seed: int = 0) -> Supervisor:
    """A supervisor on a virtual clock, loaded with the scenario's workers and tasks."""
    ids = [_task_id(t, i) for i, t in enumerate(scenario.tasks)]
    plans = {
        ids[i]: {k: dict(t.get(k) or {}) for k in ("fail", "fail_permanent", "hang")}
        for i, t in enumerate(scenario.tasks)
        if t.get("fail") or t.get("fail_permanent") or t.get("hang")
    }
    spawns = {ids[i]: list(t["spawn"]) for i, t in enumerate(scenario.tasks) if t.get("spawn")}
    kinds = sorted({str(t["kind"]) for t in scenario.tasks}
                   | {k for p in spawns.values() for k in _spawn_kinds(p)})
    registry = Registry(KindSpec(k) for k in kinds)
    workers = []
    for w in scenario.workers:
        skills = w.get("skills") or {k: 1.0 for k in (w.get("kinds") or kinds)}
        handler = _SimWorker(w["name"], plans, spawns)
        workers.append(
            WorkerSpec(
                w["name"],
                {str(k): float(v) for k, v in skills.items()},
                int(w.get("capacity", 1)),
                {k: handler for k in skills},
            )
        )
    options = dict(scenario.options)
    scripted = {ids[i]: dict(t["approval"]) for i, t in enumerate(scenario.tasks)
                if "approval" in t}
    sup = Supervisor(
        registry,
        workers,
        strategy=strategy or scenario.strategy,
        clock=VirtualClock(),
        seed=seed,
        task_approvals={tid: Approval(a.get("before", "start")) for tid, a in scripted.items()},
        on_event=_ScriptedApprover(scripted) if scripted else None,
        **options,
    )
    if scripted:
        assert isinstance(sup.on_event, _ScriptedApprover)
        sup.on_event.supervisor = sup
    tasks = []
    for i, t in enumerate(scenario.tasks):
        deps = tuple(ids[d] if isinstance(d, int) else str(d) for d in t.get("depends_on", []))
        joins = tuple(ids[d] if isinstance(d, int) else str(d) for d in t.get("joins", []))
        tasks.append(
            Task(
                id=ids[i],
                kind=str(t["kind"]),
                payload=dict(t.get("payload") or {}),
                depends_on=deps,
                estimate_s=float(t.get("estimate", 1.0)),
                resources=tuple(t.get("resources") or ()),
                joins=joins,
            )
        )
    sup.add_tasks(tasks)
    return sup


def simulate(scenario: Scenario, strategy: str | None = None, seed: int = 0,
             deadline_s: float | None = None) -> SimResult:
    """Run a scenario in virtual time and measure it.

    With ``deadline_s`` (or the scenario's ``deadline_s`` option) the run has that window,
    as a real one would: what has not started when it closes is cancelled, and
    :attr:`SimResult.fits` says whether the whole plan finished inside it.
    """
    if deadline_s is not None:
        scenario = dataclasses.replace(
            scenario, options={**scenario.options, "deadline_s": deadline_s})
    deadline_s = scenario.options.get("deadline_s")
    sup = build(scenario, strategy, seed)
    run = sup.run()
    durations = [
        t.finished_at - t.started_at
        for t in run.tasks.values()
        if t.status is Status.COMPLETED and t.finished_at is not None and t.started_at is not None
    ]
    return SimResult(
        strategy=strategy or scenario.strategy,
        makespan=round(run.makespan, 9),
        mean_task_s=round(sum(durations) / len(durations), 9) if durations else 0.0,
        per_worker=run.workers,
        run=run,
        deadline_s=None if deadline_s is None else float(deadline_s),
    )


BUILTIN_SCENARIOS: dict[str, dict[str, Any]] = {
    "article": {
        "strategy": "balanced",
        "workers": [{"name": f"w{i}", "kinds": ["work"]} for i in (1, 2, 3)],
        "tasks": [{"kind": "work", "estimate": d} for d in (10, 2, 2, 10, 2, 2, 10, 2, 2)],
    },
    "capability": {
        "strategy": "capability",
        "workers": [
            {"name": "specialist", "skills": {"summarise": 1.0}},
            {"name": "generalist", "skills": {"summarise": 0.25}},
        ],
        "tasks": [{"kind": "summarise", "estimate": 4} for _ in range(8)],
    },
    "fanout": {
        "strategy": "balanced",
        "workers": [{"name": f"w{i}", "capacity": 4} for i in (1, 2)],
        "tasks": [
            {"id": "fetch", "kind": "fetch", "estimate": 5,
             "spawn": [{"kind": "classify", "count": 40, "estimate": 2}]},
            {"id": "summary", "kind": "summarize", "estimate": 3, "joins": ["fetch"]},
        ],
    },
}
"""Scenarios usable by name: ``article`` and ``capability`` (from the supervisor-worker
article), ``fanout`` (one fetch spawning 40 tasks, joined by a summary)."""
