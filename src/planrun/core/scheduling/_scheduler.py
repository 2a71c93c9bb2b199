"""The scheduling core: every decision of a run, over plain data and a time given to it.

:class:`Scheduler` holds the state of one run (the records, who depends on whom, how many
dependencies each task still waits for, the ready heap ordered by critical path, resource
holders, leases, retry times, retries spent, effects due) and decides everything: what
becomes ready, which worker gets it, what a failure means (retry at a time, dead, budget
stop), what a death cancels, what an expired lease means, which effects are due, when the
run has passed its deadline, is stalled or is finished.

It does no I/O and reads no clock: every call passes ``now``. Each change it decides is a
new task record made by :func:`planrun.core._task.transition`, handed to the ``sink`` with its
ledger event; a driver persists the change (in-process: a batch for the store; the
coordinator: a fenced write) and carries it out (start an attempt, apply an effect).

Two ways to feed it:

* outcomes the driver saw itself (:meth:`Scheduler.complete`, :meth:`Scheduler.fail`,
  :meth:`Scheduler.heartbeat`), used by the in-process supervisor;
* records changed by someone else (:meth:`Scheduler.observe`), used by the coordinator for
  what worker processes wrote. A worker reports ``failed`` without deciding anything; the
  core decides retry or death when it observes the record, with the same rule as for an
  outcome it saw itself.
"""

from __future__ import annotations

import graphlib
import heapq
import itertools
import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from planrun.core._errors import ErrorClass, InvalidPlan, UsageError
from planrun.core._ledger import EventName as E
from planrun.core._registry import SpawnRequest, WorkerSpec
from planrun.core._routing import Balanced, Capability, LeastLoaded, Router, WorkerState
from planrun.core._task import (
    FINAL,
    Status,
    Task,
    advanced,
    assigned,
    completed,
    created,
    revised,
    started,
)
from planrun.core.scheduling._approval import (
    APPROVED,
    REJECTED,
    Approval,
    as_approval,
    gates_meta,
    recorded_decision,
    stage_of,
    waiting_cause,
)
from planrun.core.scheduling._outcome import Failure
from planrun.core.scheduling._retry import RetryPolicy
from planrun.core.scheduling._spawn import Addition, SpawnLimits, expand

__all__ = ["OnDead", "ReplanRequest", "RunFacts", "Scheduler", "Sink", "dependency_order",
           "replans_spent", "retries_spent"]

OnDead = Literal["cancel_dependents", "abort_run", "replan"]
ON_DEAD: tuple[str, ...] = ("cancel_dependents", "abort_run", "replan")


@dataclass(frozen=True)
class ReplanRequest:
    """A death to re-plan: the dead task, the dependents its death cancelled, and the
    results of the tasks completed so far (by id). The replacement fragment takes the dead
    task's place: its first tasks may depend on what the dead task depended on."""

    dead: Task
    cancelled: tuple[Task, ...]
    results: Mapping[str, Any]
    number: int
    """1 for the run's first replan."""

Entry = tuple[Any, ...]
"""An entry of the ready heap: sort keys, then the task id (see ``Scheduler._entry``)."""

Note = Callable[[tuple[float, str, str, "str | None", int, "Mapping[str, Any] | None"]], Any]
"""``note((at, task id, event, worker, attempt, detail))``: a change's event alone (see
:meth:`Scheduler.use_log`)."""

Sink = Callable[[Task, str, "str | None", "Mapping[str, Any] | None", int], None]
"""``sink(record, event, worker, detail, token)``: one decided change and its ledger event;
``token`` is the fencing token the change was decided under (the record's before it)."""

# The statuses as module constants: an attribute of an Enum class is looked up through
# EnumType.__getattr__ (some 1,000 instructions each); a module constant costs a global.
_PENDING = Status.PENDING
_ASSIGNED = Status.ASSIGNED
_RUNNING = Status.RUNNING
_COMPLETED = Status.COMPLETED
_FAILED = Status.FAILED
_DEAD = Status.DEAD
_CANCELLED = Status.CANCELLED
_WAITING = Status.WAITING

_IN_FLIGHT = frozenset({_ASSIGNED, _RUNNING})
_STATELESS = frozenset({LeastLoaded, Capability, Balanced})
"""Built-in routers whose pick among one candidate is that candidate, with no state kept."""
_INDEXED = _IN_FLIGHT | {_COMPLETED, _WAITING}
"""The statuses :meth:`Scheduler._index` has something to do for."""
_UNINDEXED = _IN_FLIGHT | {_WAITING}
"""The statuses :meth:`Scheduler._unindex` has something to undo for."""
_CANCELLABLE = frozenset({_PENDING, _ASSIGNED, _FAILED, _WAITING})

_ZEROS = itertools.repeat(0.0)
"""The default of every path length a critical path looks up (see _prioritise)."""

_DEFAULT_ATTEMPTS: int = Task.__dataclass_fields__["max_attempts"].default  # type: ignore[assignment]
"""``Task.max_attempts`` when it was not given."""

EFFECT_RETRY = RetryPolicy(attempts=6, base=1.0, cap=30.0, jitter=0.25, max_retry_after=60.0)
"""How a failing effect is tried again: 6 tries, 1 s doubling to 30 s."""


@dataclass
class RunFacts:
    """What the run came to, beyond its task records (for the driver's result)."""

    aborted_by: str | None = None
    budget_exhausted: bool = False
    deadline_reached: bool = False
    effects_failed: dict[str, str] = field(default_factory=dict)
    """Task id -> last error of an effect that was given up on."""


def dependency_order(batch: Sequence[Task]) -> list[Task]:
    """``batch`` reordered so that dependencies come first (stable; ties keep input order).

    Raises:
        InvalidPlan: the batch has a dependency cycle.
        UsageError: duplicate ids in the batch.
    """
    return _dependency_order(batch)[0]


def _dependency_order(batch: Sequence[Task]) -> tuple[list[Task], dict[str, int]]:
    """:func:`dependency_order`, and each id's position in ``batch``."""
    position = {t.id: i for i, t in enumerate(batch)}
    if len(position) != len(batch):
        raise UsageError("duplicate task ids in one batch")
    get = position.get
    if all(get(d, -1) < i for i, t in enumerate(batch) if t.depends_on for d in t.depends_on):
        # Nothing waits for a later task of the batch: the order given is already the
        # smallest dependency order (and has no cycle), so there is nothing to sort.
        return list(batch), position
    by_id = {t.id: t for t in batch}
    sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for t in batch:
        sorter.add(t.id, *(d for d in t.depends_on if d in by_id))
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        from planrun.core._plan import Problem

        cycle = list(exc.args[1]) if len(exc.args) > 1 else []
        raise InvalidPlan(
            [Problem("cycle", None, f"tasks form a dependency cycle: {' -> '.join(cycle)}")]
        ) from exc
    from planrun.core._plan import smallest_order

    return [by_id[i] for i in smallest_order(sorter, position.__getitem__)], position


def replans_spent(events: Iterable[Any]) -> tuple[int, set[str]]:
    """Replans of the run's ``max_replans`` spent by a stored run, and the dead tasks they
    were for (each asked once)."""
    asked = [e.task for e in events if e.event in (E.REPLANNED, E.REPLAN_FAILED)]
    return len(asked), set(asked)


def retries_spent(events: Iterable[Any]) -> int:
    """Retries of the run's budget spent by a stored run: one per ``retry`` event."""
    return sum(1 for e in events if e.event == E.RETRY)


class Scheduler:
    """The state and the rules of one run.

    Args:
        router: picks a worker among capable candidates.
        retry: backoff between attempts and the ``Retry-After`` clamp (attempts per task
            come from each record's ``max_attempts``).
        retry_budget: retries allowed over the whole run (None: no limit).
        max_reclaims: reclaims of an expired lease after which a task is dead.
        on_dead: ``cancel_dependents``, ``abort_run`` or ``replan`` (cancel the dependents,
            then ask the driver's replanner for a fragment that replaces the dead task and
            them; without a replanner, or past ``max_replans``, as ``cancel_dependents``).
        max_replans: replans allowed over the whole run.
        stale_after: lease length, from assignment (push) or start.
        stall_after: seconds without any change before :meth:`stalled` says so.
        effects: kinds whose completion has an effect to apply once.
        sink: receives every decided change.
        seed: seed of the jitter.
        deadline: time after which nothing new starts (None: no deadline).
        kinds: the registry additions at run time are validated against (None: a run that
            cannot grow; a spawn is then refused).
        spawn_limits: how far the run may grow while it runs.
        default_attempts: ``max_attempts`` of a task added at run time.
        approvals: kind -> :class:`Approval` (or ``"start"`` / ``"effect"``): tasks of that
            kind wait for a person's decision (:meth:`approve`, :meth:`reject`).
        task_approvals: task id -> :class:`Approval`, for single tasks (over their kind's).
    """

    def __init__(
        self,
        *,
        router: Router,
        retry: RetryPolicy,
        sink: Sink,
        retry_budget: int | None = None,
        max_reclaims: int = 3,
        on_dead: OnDead = "cancel_dependents",
        stale_after: float = 90.0,
        stall_after: float = 900.0,
        effects: Collection[str] = (),
        seed: int | None = None,
        deadline: float | None = None,
        effect_retry: RetryPolicy = EFFECT_RETRY,
        kinds: Any = None,
        spawn_limits: SpawnLimits | None = None,
        default_attempts: int | None = None,
        max_replans: int = 2,
        approvals: Mapping[str, Approval | str] | None = None,
        task_approvals: Mapping[str, Approval | str] | None = None,
    ) -> None:
        check_policies(on_dead=on_dead, retry_budget=retry_budget, stale_after=stale_after,
                       stall_after=stall_after, max_reclaims=max_reclaims)
        if max_replans < 0:
            raise UsageError(f"max_replans must be >= 0, got {max_replans}")
        self.router = router
        self.retry = retry
        self.retry_budget = retry_budget
        self.max_reclaims = max_reclaims
        self.on_dead: OnDead = on_dead
        self.stale_after = stale_after
        self.stall_after = stall_after
        self.effect_kinds = frozenset(effects)
        self.deadline = deadline
        self.effect_retry = effect_retry
        self.approvals = {k: as_approval(v) for k, v in (approvals or {}).items()}
        self.task_approvals = {k: as_approval(v) for k, v in (task_approvals or {}).items()}
        self.awaiting: set[str] = set()
        self.claims_alone = False
        """Set by a driver whose workers claim ready tasks on their own (peer mode): a task
        that needs approval before it starts waits from the moment it is added, before any
        worker can claim it, and an approval makes it pending again."""
        """Ids of the tasks in status ``waiting`` (waiting for a person)."""
        self._asking: list[str] = []
        self._approval_timeouts: list[tuple[float, str]] = []
        self.facts = RunFacts()
        self.kinds = kinds
        self.spawn_limits = spawn_limits or SpawnLimits()
        self.default_attempts = default_attempts
        self.max_replans = max_replans
        self.can_replan = False
        """Set by a driver that has a replanner."""
        self.replans_used = 0
        self.replanned: set[str] = set()
        """Dead tasks a replan was asked for (once each)."""
        self._replans_due: list[ReplanRequest] = []
        self._replans_open: set[str] = set()
        self._sink = sink
        self._note: Note | None = None
        """Where the common changes' events go as tuples, when a driver asks (:meth:`use_log`)."""
        self._rng = random.Random(seed)
        self.tasks: dict[str, Task] = {}
        self._order: dict[str, int] = {}
        self._dependents: dict[str, list[str]] = {}
        """Task id -> the ids that depend on it (no entry when none does)."""
        self._waiting: dict[str, int] = {}
        self._entry: dict[str, Entry] = {}
        """Task id -> its entry in the ready heap: ``(order, id)``, or under a critical-path
        router ``(-longest path to the end, order, id)`` (flat: cheaper to compare)."""
        self._ready: list[Entry] = []
        self._first: list[Entry] = []
        """The entries that were ready at :meth:`start`, sorted last first: taken from the
        end while they go before the heap's head (a sorted batch costs no heap)."""
        self._queued: set[str] = set()
        self._delayed: list[tuple[float, str, int]] = []
        self._decided: set[str] = set()
        self._leases: list[tuple[float, str, int]] = []
        self._locks: dict[str, str] = {}
        self._parked: dict[str, list[str]] = {}
        self._avoid: dict[str, str] = {}
        self.workers: dict[str, WorkerState] = {}
        self._capable: dict[str, list[WorkerState]] = {}
        """Kind -> the workers that do it, in registration order (cleared when they change)."""
        self._effects_due: list[tuple[float, str]] = []
        self._effect_tries: dict[str, int] = {}
        self._effects_open: set[str] = set()
        self.effects_applied: set[str] = set()
        self.unfinished = 0
        self.retries_used = 0
        self.last_change = 0.0
        self.started = False
        self.paused = False
        """While true nothing starts (the driver cannot record what would happen)."""
        self._held_back = False  # a worker's queue waited for the pause to end
        self._extra_starts: list[tuple[WorkerState, Task]] = []

    # ---- the graph -------------------------------------------------------------------------

    def add(self, tasks: Sequence[Task], now: float, *, default_attempts: int | None = None,
            known: Callable[[str], bool] | None = None) -> list[Task]:
        """Add pending tasks (any order; dependencies in the batch or already added).

        Each gets ``created_at`` and, when it kept the default, ``default_attempts``; each
        is handed to the sink as ``created``. Added to a started run, the ready ones are
        queued at once.

        Raises:
            InvalidPlan: a dependency cycle in the batch.
            UsageError: a duplicate id, an unknown dependency or kind, a task not pending.
        """
        have = self.tasks
        batch = [_with_joins(t) if t.joins else t for t in tasks]
        # One pass for the checks that need no order, and for whether the order given is
        # already one where every dependency comes first (then nothing is sorted).
        position: dict[str, int] = {}
        kinds: set[str] = set()
        pending = _PENDING
        in_order = True
        for i, task in enumerate(batch):
            tid = task.id
            if tid in position:
                raise UsageError("duplicate task ids in one batch")
            if tid in have:
                raise UsageError(f"task id {tid!r} is already in this run")
            deps = task.depends_on
            if deps and in_order:
                for d in deps:
                    if d not in position and d not in have:
                        in_order = False  # a later task of the batch, or an unknown one
                        break
            if known is not None and task.kind not in kinds:
                if not known(task.kind):
                    raise UsageError(f"task {tid!r}: kind {task.kind!r} is not registered")
                kinds.add(task.kind)
            if task.status is not pending:
                raise UsageError(f"task {tid!r} must be pending to be added")
            position[tid] = i
        if in_order:
            ordered = batch
        else:
            for task in batch:
                unknown = [d for d in task.depends_on if d not in have and d not in position]
                if unknown:
                    raise UsageError(
                        f"task {task.id!r} depends on unknown or later task(s) {unknown}")
            ordered = _dependency_order(batch)[0]  # a cycle raises InvalidPlan
        default = _DEFAULT_ATTEMPTS if default_attempts is not None else None
        sink, note, created_event, insert = self._sink, self._note, E.CREATED, self._insert
        new: list[Task] = []
        append = new.append
        for task in ordered:
            if task.created_at is None:
                task = created(task, now, default_attempts if task.max_attempts == default
                               else None)
            elif task.max_attempts == default:
                task = revised(task, {"max_attempts": default_attempts})
            insert(task)
            if note is None:
                sink(task, created_event, None, None, task.token)
            else:
                note((now, task.id, created_event, None, task.token, None))
            append(task)
        self._prioritise(new)
        if self.started:
            for task in new:
                self._offer(task.id)
        return new

    def restore(self, tasks: Sequence[Task]) -> None:
        """Load stored records as they are (resume, or a coordinator's first read)."""
        ordered = dependency_order(tasks)
        for task in ordered:
            self._insert(task)
            if task.status is _WAITING and task.not_before is not None:
                heapq.heappush(self._approval_timeouts, (task.not_before, task.id))
        self._prioritise(ordered)

    def _insert(self, task: Task) -> None:
        """Take ``task`` into the run: its place in the order, who waits for whom, how many
        of its dependencies it still waits for, and the indexes of its status."""
        tid = task.id
        have = self.tasks
        have[tid] = task
        order = self._order
        order[tid] = len(order)
        waiting = 0
        deps = task.depends_on
        if deps:
            dependents = self._dependents
            completed_ = _COMPLETED
            for dep in deps:
                below = dependents.get(dep)
                if below is None:
                    dependents[dep] = [tid]
                else:
                    below.append(tid)
                other = have.get(dep)
                if other is None or other.status is not completed_:
                    waiting += 1
        self._waiting[tid] = waiting
        status = task.status
        if status is not _PENDING:  # a pending task has nothing to index
            if status not in FINAL:
                self.unfinished += 1
            self._index(task)
            if status is _COMPLETED and tid in self._dependents:
                self._released(tid)  # a join widened to it before it was seen, completed
        else:
            self.unfinished += 1

    def _prioritise(self, batch: Sequence[Task]) -> None:
        """Longest path to the end of the graph (critical path) first, when the router asks
        for it; otherwise the order tasks were added in."""
        entry, order = self._entry, self._order
        if not self.router.orders_by_critical_path:
            for t in batch:
                entry[t.id] = (order[t.id], t.id)
            return
        path: dict[str, float] = {}
        known = path.get
        dependents = self._dependents.get
        for t in reversed(batch):
            tid = t.id
            below = dependents(tid)
            if below:
                if len(below) == 1:
                    longest = t.estimate_s + known(below[0], 0.0)
                else:
                    longest = t.estimate_s + max(map(known, below, _ZEROS))
            else:
                longest = t.estimate_s
            path[tid] = longest
            entry[tid] = (-longest, order[tid], tid)

    # ---- workers ---------------------------------------------------------------------------

    def add_worker(self, spec: WorkerSpec) -> WorkerState:
        """Register a worker the router may pick (a name once)."""
        if spec.name in self.workers:
            raise UsageError(f"worker {spec.name!r} is already registered")
        state = WorkerState(spec)
        self.workers[spec.name] = state
        self._capable.clear()
        self._count_in(state)
        return state

    def sync_worker(self, name: str, kinds: Sequence[str], capacity: int) -> WorkerState:
        """Create or refresh a worker seen in the store (external workers)."""
        state = self.workers.get(name)
        spec = WorkerSpec(name, dict.fromkeys(kinds, 1.0), max(1, capacity))
        if state is None:
            state = WorkerState(spec)
            self.workers[name] = state
        elif state.spec == spec:
            return state
        else:
            state.spec = spec
        self._capable.clear()
        self._count_in(state)
        return state

    def _count_in(self, worker: WorkerState) -> None:
        """A worker the core meets, or meets again with other skills: its load and active
        count from the tasks in flight on it already (a resumed coordinator reads the
        stored tasks before the workers that hold them)."""
        mine = [t for t in self.tasks.values()
                if t.assigned_to == worker.name and t.status in _IN_FLIGHT]
        worker.active = sum(1 for t in mine if t.status is _RUNNING)
        worker.load_s = sum(worker.cost(t) for t in mine)

    def capable(self, kind: str) -> bool:
        """True when some registered worker does ``kind``."""
        return any(w.spec.can_do(kind) for w in self.workers.values())

    # ---- starting --------------------------------------------------------------------------

    def start(self, now: float) -> None:
        """Begin: queue every ready task."""
        self.started = True
        self.last_change = now
        if (self.approvals or self.task_approvals or self.claims_alone or self._ready
                or self._first):
            for tid, task in self.tasks.items():
                if task.status is _PENDING:
                    self._offer(tid)
            return
        # What _offer does for each, with no approval to ask for: the ready heap at once.
        pending, waiting, entry = _PENDING, self._waiting, self._entry
        queued = [tid for tid, task in self.tasks.items()
                  if task.status is pending and not waiting[tid]]
        self._queued.update(queued)
        ready = [entry[tid] for tid in queued]
        ready.sort(reverse=True)  # in the order added, or by critical path: a run or two
        self._first = ready

    def recover(self, now: float, reason: str | None = "supervisor restart") -> None:
        """Turn what a dead driver left into a state this one can run.

        With a ``reason``, tasks that were assigned or running are put back without counting
        a reclaim (their driver died, not they: only a lease that expired while a live worker
        held the task counts toward ``max_reclaims``); ``None`` leaves them to their workers
        (a coordinator's workers outlive it). Failed tasks get their retry decided again; a
        death's dependents are cancelled; a budget stop stands.
        """
        for task in list(self.tasks.values()):
            if task.status in _IN_FLIGHT and reason is not None:
                self._change(task, _PENDING, E.RECLAIMED, task.assigned_to,
                             {"reason": reason}, assigned_to=None, lease=None)
                self._offer(task.id)
            elif task.status is _FAILED:
                self._decide_failed(self.tasks[task.id], now)
            elif task.status is _DEAD:
                self._after_death(task, now)
            elif task.status is _CANCELLED and task.cause == "budget":
                self._budget_stop(now)
            elif task.status is _WAITING:
                self.take_decision(task, now)

    # ---- assigning -------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """Nothing new starts: aborted, out of budget, or past the deadline."""
        f = self.facts
        return f.aborted_by is not None or f.budget_exhausted or f.deadline_reached

    def dispatch(self, now: float) -> list[tuple[WorkerState, Task]]:
        """In-process: give every ready task to a worker's queue; return what starts now."""
        if self._asking:
            self._ask(now)
        if self.stopping:
            return []
        touched: list[WorkerState] = []
        if self._held_back and not self.paused:  # the pause is over: start what it held
            self._held_back = False
            touched = [w for w in self.workers.values()
                       if w.queue and w.active < w.spec.capacity]
        elif not self._ready and not self._first:  # nothing below changes the facts
            return []
        while (self._ready or self._first) and not self.paused:
            task = self._pop_ready(now)
            if task is None:
                continue
            worker = self._route(task, None)
            if worker is None:
                self._queued.add(task.id)
                heapq.heappush(self._ready, self._entry[task.id])
                break  # no worker for it yet; _check_workers refuses this up front
            self._assign(task, worker, now)
            worker.queue.append(task.id)
            if worker.active < worker.spec.capacity and worker not in touched:
                touched.append(worker)
        starts: list[tuple[WorkerState, Task]] = []
        for worker in touched:
            self._pump(worker, now, starts)
        return starts

    def assign(self, now: float, free: dict[str, int]) -> list[Task]:
        """Push mode: assign ready tasks to workers with ``free`` slots (name -> slots)."""
        self._ask(now)
        assigned: list[Task] = []
        later: list[str] = []
        while ((self._ready or self._first) and not self.stopping and not self.paused
               and any(n > 0 for n in free.values())):
            task = self._pop_ready(now)
            if task is None:
                continue
            worker = self._route(task, free)
            if worker is None:
                later.append(task.id)
                continue
            assigned.append(self._assign(task, worker, now, lease=now + self.stale_after))
            free[worker.name] -= 1
        for tid in later:
            self._queued.add(tid)
            heapq.heappush(self._ready, self._entry[tid])
        return assigned

    def _pop_ready(self, now: float) -> Task | None:
        first, heap = self._first, self._ready
        if first and (not heap or first[-1] <= heap[0]):
            tid = first.pop()[-1]
        else:
            tid = heapq.heappop(heap)[-1]
        self._queued.discard(tid)
        task = self.tasks[tid]
        if task.status is not _PENDING or self._waiting[tid]:
            return None  # stale entry
        if task.not_before is not None and task.not_before > now:
            heapq.heappush(self._delayed, (task.not_before, tid, task.token))
            return None
        for r in task.resources:
            if r in self._locks:
                self._parked.setdefault(r, []).append(tid)
                return None
        return task

    def _route(self, task: Task, free: Mapping[str, int] | None) -> WorkerState | None:
        candidates = self._capable.get(task.kind)
        if candidates is None:
            candidates = [w for w in self.workers.values() if w.spec.can_do(task.kind)]
            self._capable[task.kind] = candidates
        if free is not None:
            candidates = [w for w in candidates if free.get(w.name, 0) > 0]
        if not candidates:
            return None
        if len(candidates) == 1 and type(self.router) in _STATELESS:
            return candidates[0]  # the one choice, whatever the strategy
        avoid = self._avoid.get(task.id)
        if avoid is not None and len(candidates) > 1:
            candidates = [w for w in candidates if w.name != avoid] or candidates
        return self.router.pick(task, candidates)

    def _assign(self, task: Task, worker: WorkerState, now: float,
                lease: float | None = None) -> Task:
        self.last_change = now
        name = worker.name
        token = task.token
        new = assigned(task, name, lease)
        tid = task.id
        self.tasks[tid] = new
        for r in new.resources:  # what _replace's _index does for a pending task
            self._locks[r] = tid
        worker.load_s += worker.cost(new)
        note = self._note
        if note is None:
            self._sink(new, E.ASSIGNED, name, None, token)
        else:
            note((now, tid, E.ASSIGNED, name, token + 1, None))
        return new

    def _pump(self, worker: WorkerState, now: float,
              starts: list[tuple[WorkerState, Task]]) -> None:
        queue = worker.queue
        while worker.active < worker.spec.capacity and queue and not self.paused:
            task = self.tasks[queue.popleft()]
            if task.status is not _ASSIGNED or task.assigned_to != worker.name:
                continue
            lease = now + self.stale_after
            old = task
            task = started(old, now, lease)
            # A start on the worker it was assigned to: its locks and its load stay, one
            # more is active (what _replace's _unindex and _index come to, in line).
            tid = task.id
            self.tasks[tid] = task
            worker.active += 1
            note = self._note
            if note is None:
                self._sink(task, E.STARTED, worker.name, None, old.token)
            else:
                note((now, tid, E.STARTED, worker.name, old.token, None))
            heapq.heappush(self._leases, (lease, tid, old.token))
            starts.append((worker, task))
            self.last_change = now
        if self.paused and queue and worker.active < worker.spec.capacity:
            self._held_back = True  # dispatch starts them once the pause ends

    # ---- outcomes seen by the driver -------------------------------------------------------

    def current(self, task_id: str, token: int, worker: str | None) -> bool:
        """True when ``token`` is the task's running attempt; else log the refusal."""
        task = self.tasks[task_id]
        if task.token == token and task.status is _RUNNING:
            return True
        self._sink(task, E.REJECTED, worker,
                   {"reason": "stale fencing token", "current": task.token}, token)
        return False

    def complete(self, task_id: str, token: int, result: Any, now: float,
                 worker: str | None, spawned: Sequence[SpawnRequest] = ()) -> bool:
        """An attempt returned ``result``; False when it was fenced off.

        ``spawned``: the tasks the attempt asked to add. They are validated first; an
        invalid addition makes the task dead (permanent) with every problem listed, and
        adds nothing. A valid one is handed to the sink right after the completion, so a
        driver writes both together.
        """
        task = self.tasks[task_id]
        if task.token != token or task.status is not _RUNNING:
            return self.current(task_id, token, worker)  # logs the refusal
        addition = None
        if spawned:
            try:
                addition = self.expansion(task, spawned, now)
            except InvalidPlan as exc:
                return self.fail(task_id, token, spawn_refused(exc), now, worker)
        detail = {"spawned": len(addition.tasks)} if addition is not None else None
        rule = self.approval_for(task) if self.approvals or self.task_approvals else None
        if rule is not None and rule.before == "effect" and task.cause != APPROVED \
                and rule.applies(task.evolve(result=result)):
            self._wait(task, "effect", now, worker, result=result, attempts=task.attempts + 1,
                       lease=None, error=None, error_class=None)
        else:
            new = completed(task, result, now)
            self._replace(task, new)
            note = self._note
            if note is None:
                self._sink(new, E.COMPLETED, worker, detail, token)
            else:
                note((now, task_id, E.COMPLETED, worker, token, detail))
        if addition is not None:
            self.grow(addition, now)
        self.last_change = now  # touch
        return True

    def finish(self, worker: WorkerState, task_id: str, token: int, result: Any,
               now: float) -> Task | bool:
        """An attempt of ``task_id`` on ``worker`` returned ``result`` and spawned nothing:
        :meth:`complete`, then :meth:`release` with ``dispatch=False``, in one call. Returns
        the start of ``worker``'s next queued task (the record, running), True when nothing
        starts on it, False when the outcome was fenced off.

        The common case (no approval rule, no resource) is decided here in line, as
        :meth:`complete`, :meth:`_replace` and :meth:`_pump` decide it; any other goes
        through them.
        """
        task = self.tasks[task_id]
        if task.resources or self.approvals or self.task_approvals or task.token != token \
                or task.status is not _RUNNING or task.assigned_to != worker.name:
            if not self.complete(task_id, token, result, now, worker.name):
                return False
            starts = self.release(worker, self.tasks[task_id], now, dispatch=False)
            if len(starts) > 1:
                self._extra_starts.extend(starts[1:])
            return starts[0][1] if starts else True
        new = completed(task, result, now)
        tasks = self.tasks
        tasks[task_id] = new
        # What _replace does for running -> completed on its own worker, with no resource:
        load = worker.load_s - worker.cost(task)
        worker.load_s = load if load > 0.0 else 0.0
        worker.active -= 1
        self.unfinished -= 1
        if self.effect_kinds and task.kind in self.effect_kinds \
                and task_id not in self.effects_applied:
            heapq.heappush(self._effects_due, (now, task_id))
        dependents = self._dependents.get(task_id)
        if dependents:
            waiting = self._waiting
            if self.claims_alone or not self.started:
                for dep in dependents:
                    left = waiting[dep] - 1
                    waiting[dep] = left
                    if not left and self.started:
                        self._offer(dep)
            else:  # what _offer does with no approval rule, in line
                queued, ready, entry = self._queued, self._ready, self._entry
                for dep in dependents:
                    left = waiting[dep] - 1
                    waiting[dep] = left
                    if not left and dep not in queued and tasks[dep].status is _PENDING:
                        queued.add(dep)
                        heapq.heappush(ready, entry[dep])
        note = self._note
        name = worker.name
        if note is None:
            self._sink(new, E.COMPLETED, name, None, token)
        else:
            note((now, task_id, E.COMPLETED, name, token, None))
        self.last_change = now
        # What release does after it, without dispatching:
        worker.done += 1
        if task.started_at is not None:
            worker.busy_s += now - task.started_at
        # and _pump, for the one slot that freed:
        queue = worker.queue
        while queue and not self.paused and worker.active < worker.spec.capacity:
            nxt = tasks[queue.popleft()]
            if nxt.status is not _ASSIGNED or nxt.assigned_to != name:
                continue
            lease = now + self.stale_after
            run = started(nxt, now, lease)
            nid = run.id
            tasks[nid] = run
            worker.active += 1
            if note is None:
                self._sink(run, E.STARTED, name, None, nxt.token)
            else:
                note((now, nid, E.STARTED, name, nxt.token, None))
            heapq.heappush(self._leases, (lease, nid, nxt.token))
            return run
        if self.paused and queue and worker.active < worker.spec.capacity:
            self._held_back = True  # dispatch starts them once the pause ends
        return True

    def extra_starts(self) -> list[tuple[WorkerState, Task]]:
        """Starts :meth:`finish` decided beyond the one it returned (a worker whose free
        slots outnumber the attempt that ended), each handed out once."""
        extra, self._extra_starts = self._extra_starts, []
        return extra

    # ---- growing at run time ---------------------------------------------------------------

    def expansion(self, spawner: Task, spawned: Sequence[SpawnRequest], now: float) -> Addition:
        """What ``spawned`` adds to this run (see :func:`planrun.core.scheduling.expand`).

        Raises:
            InvalidPlan: the addition's problems.
        """
        if self.kinds is None:
            raise InvalidPlan([_problem("unknown_kind", None,
                                        "this run has no registry to validate additions")])
        return expand(spawner, spawned, self.tasks, self.kinds, self.spawn_limits, now,
                      default_attempts=self.default_attempts)

    def grow(self, addition: Addition, now: float) -> None:
        """Add what a completion spawned: joiners wait longer, the new tasks join the run."""
        for joiner in addition.joiners:
            old = self.tasks.get(joiner.id)
            if old is None or old.status in FINAL:
                continue
            new = old.evolve(depends_on=joiner.depends_on)
            self._rewire(old, new)
            self._sink(new, E.JOINED, None, {"depends_on": len(new.depends_on)}, new.token)
        for task in addition.tasks:
            self._insert(task)
            self._sink(task, E.CREATED, None, {"parent": task.parent}, task.token)
        self._prioritise(list(addition.tasks))
        self.gate_unclaimed(addition.tasks, now)
        if self.started:
            for task in addition.tasks:
                self._offer(task.id)

    def _rewire(self, old: Task, new: Task) -> None:
        """``new`` is ``old`` with more dependencies (a join widened)."""
        tid = new.id
        before = set(old.depends_on)
        for dep in new.depends_on:
            if dep not in before:
                self._dependents.setdefault(dep, []).append(tid)
        self.tasks[tid] = new
        self._waiting[tid] = sum(
            1 for d in new.depends_on
            if (t := self.tasks.get(d)) is None or t.status is not _COMPLETED)
        if self.started:
            self._offer(tid)

    def fail(self, task_id: str, token: int, failure: Failure, now: float,
             worker: str | None) -> bool:
        """An attempt raised; decide retry, death or budget stop. False when fenced off."""
        if not self.current(task_id, token, worker):
            return False
        task = self.tasks[task_id]
        if failure.budget:
            self._change(task, _CANCELLED, E.CANCELLED, worker, cause="budget",
                         error=failure.error, error_class=failure.error_class,
                         finished_at=now, lease=None, detail={"cause": "budget"})
            self._budget_stop(now)
            return True
        server_at = None if failure.retry_after is None else now + failure.retry_after
        attempts = task.attempts + 1
        at, error = self._decision(task, attempts, failure.error_class, failure.error,
                                   server_at, now)
        if at is None:
            dead = self._change(task, _DEAD, E.DEAD, worker, error=error,
                                error_class=failure.error_class, attempts=attempts,
                                finished_at=now, lease=None, detail={"error": error})
            self._after_death(dead, now)
        else:
            self._change(task, _FAILED, E.FAILED, worker, error=error,
                         error_class=failure.error_class, attempts=attempts, lease=None,
                         not_before=at, detail={"error": error, "retry_at": at})
            self._schedule_retry(task_id, at, worker)
        self.touch(now)
        return True

    def heartbeat(self, task_id: str, token: int, now: float) -> None:
        """The attempt ``token`` of ``task_id`` is alive: extend its lease."""
        task = self.tasks[task_id]
        if task.token != token or task.status is not _RUNNING:
            return
        lease = now + self.stale_after
        self.tasks[task_id] = task.evolve(lease=lease)
        heapq.heappush(self._leases, (lease, task_id, token))

    def _decision(self, task: Task, attempts: int, error_class: str | None, error: str | None,
                  server_at: float | None, now: float) -> tuple[float | None, str]:
        """When a failed task is tried again (None: never), and the error to record."""
        error = error or "failed"
        if error_class != ErrorClass.TRANSIENT or attempts >= task.max_attempts:
            return None, error
        if self.stopping:
            return None, error
        if self.retry_budget is not None and self.retries_used >= self.retry_budget:
            return None, f"{error} (retry budget exhausted)"
        self.retries_used += 1
        at = now + self.retry.backoff(attempts, self._rng)
        if server_at is not None:
            at = max(at, min(server_at, now + self.retry.max_retry_after))
        return at, error

    def _schedule_retry(self, task_id: str, at: float, worker: str | None) -> None:
        self._decided.add(task_id)
        if worker is not None:
            self._avoid[task_id] = worker
        heapq.heappush(self._delayed, (at, task_id, self.tasks[task_id].token))

    def _decide_failed(self, task: Task, now: float) -> None:
        """A ``failed`` record nobody decided on yet (a worker's report, or a resume)."""
        # A failed record says a retry may follow: only a permanent error class rules it out.
        at, error = self._decision(task, task.attempts, task.error_class or ErrorClass.TRANSIENT,
                                   task.error, task.not_before, now)
        if at is None:
            dead = self._change(task, _DEAD, E.DEAD, task.assigned_to, error=error,
                                finished_at=now, lease=None, detail={"error": error})
            self._after_death(dead, now)
            return
        self._schedule_retry(task.id, at, task.assigned_to)

    # ---- time ------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Everything due by ``now``: the deadline, expired leases, retries whose time came."""
        if self.deadline is not None and now >= self.deadline and not self.facts.deadline_reached:
            self.facts.deadline_reached = True
            self._cancel_all("deadline", now)
            self.touch(now)
        while self._leases and self._leases[0][0] <= now:
            _, tid, token = heapq.heappop(self._leases)
            task = self.tasks[tid]
            if task.token != token or task.status is not _RUNNING:
                continue
            if task.lease is not None and task.lease > now:
                continue  # renewed; a newer heap entry stands for it
            self.expire(task, now)
        while self._delayed and self._delayed[0][0] <= now:
            _, tid, token = heapq.heappop(self._delayed)
            task = self.tasks[tid]
            if task.token != token:
                continue
            if task.status is _FAILED:
                self._decided.discard(tid)
                self._change(task, _PENDING, E.RETRY, None, None, assigned_to=None,
                             not_before=None)
                self._offer(tid)
                self.touch(now)  # a record changed: the stall clock starts again
            elif task.status is _PENDING:
                self._offer(tid)
        while self._approval_timeouts and self._approval_timeouts[0][0] <= now:
            at, tid = heapq.heappop(self._approval_timeouts)
            task = self.tasks[tid]
            if task.status is _WAITING and task.not_before == at:
                self._timed_out(task, now)
        self._ask(now)

    def expire(self, task: Task, now: float) -> None:
        """The lease of ``task`` (a fresh record) ran out while a live worker held it."""
        self.observe(task, now)
        task = self.tasks[task.id]
        if task.status not in _IN_FLIGHT:
            return
        worker = task.assigned_to
        self.touch(now)
        if task.reclaims >= self.max_reclaims:
            error = f"reclaimed {task.reclaims} times without a result; giving up"
            dead = self._change(task, _DEAD, E.DEAD, worker, error=error,
                                error_class=ErrorClass.TRANSIENT, finished_at=now, lease=None,
                                detail={"error": error})
            self._after_death(dead, now)
            return
        # The token moves on: the reclaimed attempt's result can no longer be written.
        self._change(task, _PENDING, E.RECLAIMED, worker, {"reason": "lease expired"},
                     reclaims=task.reclaims + 1, assigned_to=None, lease=None,
                     token=task.token + 1)
        if worker is not None:
            self._avoid[task.id] = worker
        self._offer(task.id)

    def next_wakeup(self, now: float) -> float:
        """The next time something is due: a lease, a retry, an effect, an approval timeout,
        the deadline, a stall.

        While a retry or an effect waits for its time, or a task waits for a person, the stall
        time is not one of them: it may have passed already, and a time in the past would
        make the driver spin."""
        delayed, effects = self._delayed, self._effects_due
        if delayed or effects or self.awaiting:
            # a run that waits for a known time or a person is no stall (see stalled)
            at = float("inf")
            if delayed:
                at = delayed[0][0]
            if effects and effects[0][0] < at:
                at = effects[0][0]
        else:
            at = self.last_change + self.stall_after
        if self._leases and self._leases[0][0] < at:
            at = self._leases[0][0]
        if self._approval_timeouts and self._approval_timeouts[0][0] < at:
            at = self._approval_timeouts[0][0]
        if self._asking and now < at:
            at = now
        if self.deadline is not None and not self.facts.deadline_reached and self.deadline < at:
            at = self.deadline
        return at

    def wakes_before(self, at: float, now: float) -> bool:
        """True when the driver should look again before ``at``: the run is done or
        stopping, or something falls due before then (see :meth:`next_wakeup`)."""
        return self.done or self.stopping or self.next_wakeup(now) < at

    def has_due(self, now: float) -> bool:
        """Effects due at ``now`` or replans to ask for (:meth:`effects_due`,
        :meth:`replans_due`)."""
        due = self._effects_due
        return bool(self._replans_due) or (bool(due) and due[0][0] <= now)

    def use_sink(self, sink: Sink) -> None:
        """Hand decided changes to ``sink`` from now on (a driver that stopped needing
        what its first sink did)."""
        self._sink = sink

    def use_log(self, note: Note | None) -> None:
        """Hand the events of the common changes (a task created, assigned, started,
        completed) to ``note`` as tuples ``(at, task id, event, worker, attempt, detail)``
        instead of to the sink; None: to the sink again. For a driver that only logs those
        changes (nothing to write, nobody listening): ``note`` may be a list's ``append``.
        Every other change still goes to the sink."""
        self._note = note

    def touch(self, now: float) -> None:
        """Something changed at ``now`` (the stall clock starts again)."""
        self.last_change = now

    def stalled(self, now: float) -> bool:
        """No change for ``stall_after`` seconds, with work left and nothing scheduled.

        A task waiting for a known retry time, or an effect waiting for its next try, is not
        a stall: the run knows when it goes on. Nor is a task waiting for a person's
        approval: while one waits, the run is never called stalled.
        """
        if not self.unfinished and not self.effects_pending and not self._replans_open:
            return False
        if self.awaiting:
            return False
        if self._delayed or self._effects_due or self._replans_open:
            return False
        # the same sum as next_wakeup's: a wakeup at that time sees the stall (no float gap)
        return now >= self.last_change + self.stall_after

    def stall_message(self, run_id: str, now: float) -> str:
        """Why :meth:`stalled` is true, naming a few stuck tasks."""
        stuck = [t for t in self.tasks.values()
                 if t.status not in FINAL and t.status is not _WAITING]
        sample = ", ".join(f"{t.id} ({t.status.value})" for t in stuck[:5])
        more = f" and {len(stuck) - 5} more" if len(stuck) > 5 else ""
        return (f"run {run_id} stalled: no task changed for {now - self.last_change:.0f} s "
                f"with {len(stuck)} unfinished: {sample}{more}")

    @property
    def done(self) -> bool:
        """Every task final, every effect applied or given up on, every replan answered."""
        return not self.unfinished and not self.effects_pending and not self._replans_open

    # ---- records changed elsewhere ---------------------------------------------------------

    def observe(self, new: Task, now: float) -> None:
        """A record as the store has it now (written by a worker, or by this driver)."""
        old = self.tasks.get(new.id)
        if old is None:
            # A task added elsewhere (a worker's spawn, a replan), seen now in whatever state
            # it reached meanwhile: peer workers may have claimed, run and failed it already.
            self._insert(new)
            self._prioritise([new])
            if new.status is not _PENDING:
                self.touch(now)
            self._settle(None, new, now)
            return
        if old is new or (old.status is new.status and old.token == new.token
                          and old.attempts == new.attempts):
            if old is not new:
                if old.depends_on != new.depends_on:
                    self._rewire(old, new)  # a join widened by a spawn
                    self.touch(now)
                else:
                    self.tasks[new.id] = new
                if new.status is _WAITING:
                    self.take_decision(new, now)
            return
        if old.depends_on != new.depends_on:
            self._rewire(old, old.evolve(depends_on=new.depends_on))
        self._replace(old, new)
        self.touch(now)
        self._settle(old, new, now)

    def _settle(self, old: Task | None, new: Task, now: float) -> None:
        """Decide what an observed record's status asks for (``old``: the record this
        core had, None for one it never saw): a failure's retry or death, what a death
        cancels, a budget stop, a start, a wait."""
        status = new.status
        if status is _FAILED:
            self._decide_failed(new, now)
        elif status is _DEAD and (old is None or old.status is not _DEAD):
            self._after_death(new, now)
        elif status is _CANCELLED and new.cause == "budget":
            self._budget_stop(now)
        elif status is _PENDING:
            if old is not None or self.started:
                self._offer(new.id)
        elif status is _WAITING:
            self._observed_wait(new, now)

    # ---- approvals -------------------------------------------------------------------------

    def approval_for(self, task: Task) -> Approval | None:
        """The approval ``task`` needs (its own, else its kind's), or None."""
        return self.task_approvals.get(task.id) or self.approvals.get(task.kind)

    def _needs_start_approval(self, task: Task) -> bool:
        rule = self.approval_for(task)
        return (rule is not None and rule.before == "start" and task.cause != APPROVED
                and rule.applies(task))

    def _ask(self, now: float) -> None:
        """Ready tasks that need approval before they start go to ``waiting`` (every such
        task when workers claim alone)."""
        if not self._asking:
            return
        asking, self._asking = self._asking, []
        for tid in asking:
            task = self.tasks[tid]
            if task.status is _PENDING and not self.stopping \
                    and (not self._waiting[tid] or self.claims_alone):
                self._wait(task, "start", now, None)

    def gate_unclaimed(self, tasks: Iterable[Task], now: float) -> None:
        """With :attr:`claims_alone`: the pending ``tasks`` that need approval before they
        start go to ``waiting`` now (the driver writes them so before a worker sees them)."""
        if not self.claims_alone or not (self.approvals or self.task_approvals):
            return
        for task in tasks:
            current = self.tasks[task.id]
            if current.status is _PENDING and self._needs_start_approval(current) \
                    and not self.stopping:
                self._wait(current, "start", now, None)

    def gates(self) -> dict[str, Any]:
        """The approval rules as a run's meta keeps them for worker processes."""
        return gates_meta(self.approvals, self.task_approvals)

    def _observed_wait(self, task: Task, now: float) -> None:
        """A worker process wrote ``task`` waiting (its result held for an approval before
        the effect): time it out by its rule, and complete it at once when the rule's
        condition says it needs none."""
        if self.take_decision(task, now):
            return
        if task.not_before is not None:
            heapq.heappush(self._approval_timeouts, (task.not_before, task.id))
        rule = self.approval_for(task)
        if rule is not None and rule.applies(task):
            return
        if stage_of(task) == "effect":
            self._change(task, _COMPLETED, E.COMPLETED, None, {"approved": False},
                         cause=None, error=None, not_before=None, finished_at=now)
        else:  # written waiting by a worker that cannot run the rule's condition
            self._change(task, _PENDING, E.APPROVED, None,
                         {"for": "start", "note": "no approval needed", "by": "rule"},
                         cause=APPROVED, error=None, not_before=None)
            self._offer(task.id)

    def _wait(self, task: Task, stage: str, now: float, worker: str | None,
              **changes: Any) -> Task:
        rule = self.approval_for(task)
        at = None if rule is None or rule.timeout_s is None else now + rule.timeout_s
        new = self._change(task, _WAITING, E.WAITING, worker,
                           {"for": stage, "timeout_at": at}, cause=waiting_cause(stage),
                           not_before=at, **changes)
        if at is not None:
            heapq.heappush(self._approval_timeouts, (at, task.id))
        self.touch(now)
        return new

    def _waiting_record(self, task_id: str) -> Task:
        task = self.tasks.get(task_id)
        if task is None:
            raise UsageError(f"no task {task_id!r} in this run")
        if task.status is not _WAITING:
            raise UsageError(
                f"task {task_id!r} is not waiting for approval (it is {task.status.value})")
        return task

    def approve(self, task_id: str, now: float, note: str | None = None,
                by: str | None = None) -> Task:
        """A person approved ``task_id``: it starts, or it completes and its effect is due.

        Raises:
            UsageError: the task is unknown or not waiting (approving twice included).
        """
        task = self._waiting_record(task_id)
        stage = stage_of(task)
        detail = {"for": stage, "note": note, "by": by}
        if stage == "effect":
            # The approval, then the completion it allows (the audit reads completions).
            self._sink(task, E.APPROVED, by, detail, task.token)
            new = self._change(task, _COMPLETED, E.COMPLETED, by, {"approved": True},
                               cause=APPROVED, error=None, not_before=None, finished_at=now)
        else:
            new = self._change(task, _PENDING, E.APPROVED, by, detail, cause=APPROVED,
                               error=None, not_before=None)
            self._offer(task_id)
        self.touch(now)
        return new

    def reject(self, task_id: str, now: float, reason: str, by: str | None = None) -> Task:
        """A person rejected ``task_id``: it is ``dead`` with cause ``rejected``; its
        dependents follow ``on_dead``.

        Raises:
            UsageError: the task is unknown or not waiting, or ``reason`` is empty.
        """
        if not reason:
            raise UsageError("a rejection needs a reason")
        task = self._waiting_record(task_id)
        error = f"rejected: {reason}"
        dead = self._change(task, _DEAD, E.DEAD, by,
                            {"cause": REJECTED, "for": stage_of(task), "reason": reason},
                            cause=REJECTED, error=error, error_class="permanent",
                            not_before=None, finished_at=now, lease=None)
        self._after_death(dead, now)
        self.touch(now)
        return dead

    def take_decision(self, record: Task, now: float) -> bool:
        """Carry out a decision another process wrote on a waiting record (True: one was)."""
        decision = recorded_decision(record)
        if decision is None:
            return False
        current = self.tasks.get(record.id)
        if current is None or current.status is not _WAITING:
            return False
        approved, note = decision
        if approved:
            self.approve(record.id, now, note, by="store")
        else:
            self.reject(record.id, now, note or "rejected", by="store")
        return True

    def _timed_out(self, task: Task, now: float) -> None:
        rule = self.approval_for(task)
        if rule is not None and rule.on_timeout == "approve":
            self.approve(task.id, now, "approval timed out: approved by default", by="timeout")
        else:
            self.reject(task.id, now, "approval timed out", by="timeout")

    # ---- deaths and stops ------------------------------------------------------------------

    def _after_death(self, task: Task, now: float) -> None:
        if self.on_dead == "abort_run":
            if self.facts.aborted_by is None:
                self.facts.aborted_by = task.id
            self._cancel_all(f"abort: {task.id} died", now)
            return
        stack = list(self._dependents.get(task.id, ()))
        seen: set[str] = set()
        while stack:
            dep_id = stack.pop()
            if dep_id in seen:
                continue
            seen.add(dep_id)
            stack.extend(self._dependents.get(dep_id, ()))
            dep = self.tasks.get(dep_id)
            if dep is not None and dep.status in _CANCELLABLE:
                self._cancel(dep, task.id, now)
        if self.on_dead == "replan":
            self._ask_replan(task, seen)

    # ---- replanning ------------------------------------------------------------------------

    def _ask_replan(self, dead: Task, downstream: Collection[str]) -> None:
        """Queue a replan of ``dead`` unless the run cannot (no replanner, bound reached,
        asked before, stopping): then the dependents stay cancelled."""
        if (not self.can_replan or dead.id in self.replanned or self.stopping
                or self.replans_used >= self.max_replans):
            return
        self.replanned.add(dead.id)
        self.replans_used += 1
        cancelled = tuple(self.tasks[d] for d in sorted(downstream, key=self._order.__getitem__)
                          if self.tasks[d].status is _CANCELLED
                          and self.tasks[d].cause == dead.id)
        results = {t.id: t.result for t in self.tasks.values() if t.status is _COMPLETED}
        self._replans_due.append(ReplanRequest(dead, cancelled, results, self.replans_used))
        self._replans_open.add(dead.id)

    def replans_due(self) -> list[ReplanRequest]:
        """Replans the driver should ask its replanner for now (each handed out once)."""
        due, self._replans_due = self._replans_due, []
        return due

    def replan_done(self, request: ReplanRequest, fragment: Sequence[SpawnRequest] | None,
                    error: str | None, now: float) -> bool:
        """The replanner answered ``fragment`` (or failed with ``error``).

        The fragment is validated as an addition spawned by the dead task (the plan's
        checks and the spawn limits); valid, it joins the run with a ``replanned`` event
        on the dead task; otherwise ``replan_failed`` is recorded with the problems and the
        dependents stay cancelled. Returns whether the fragment was added.
        """
        dead = self.tasks[request.dead.id]
        self._replans_open.discard(dead.id)
        self.touch(now)
        if error is None and fragment is not None and not self.stopping:
            try:
                addition = self.expansion(dead, fragment, now)
            except InvalidPlan as exc:
                error = spawn_refused(exc).error
            else:
                self._sink(dead, E.REPLANNED, None,
                           {"cause": dead.error, "replan": request.number,
                            "tasks": [t.id for t in addition.tasks],
                            "replaces": [t.id for t in request.cancelled]}, dead.token)
                self.grow(addition, now)
                return True
        self._sink(dead, E.REPLAN_FAILED, None,
                   {"cause": dead.error, "replan": request.number,
                    "error": error or "stopping"}, dead.token)
        return False

    def _cancel(self, task: Task, cause: str, now: float) -> None:
        self._change(task, _CANCELLED, E.CANCELLED, None, {"cause": cause}, cause=cause,
                     finished_at=now, lease=None)

    def _cancel_all(self, cause: str, now: float) -> None:
        for task in list(self.tasks.values()):
            if task.status in _CANCELLABLE:
                self._cancel(task, cause, now)

    def _budget_stop(self, now: float) -> None:
        if not self.facts.budget_exhausted:
            self.facts.budget_exhausted = True
        self._cancel_all("budget", now)

    def budget_exhausted(self, now: float) -> None:
        """The run's budget is spent: nothing more starts, what has not started is cancelled."""
        self._budget_stop(now)

    # ---- effects ---------------------------------------------------------------------------

    @property
    def effects_pending(self) -> bool:
        """Effects due or being applied."""
        return bool(self._effects_due or self._effects_open)

    def effects_due(self, now: float) -> list[Task]:
        """Completed tasks whose effect is due now (each handed out once until it reports)."""
        due: list[Task] = []
        while self._effects_due and self._effects_due[0][0] <= now:
            _, tid = heapq.heappop(self._effects_due)
            if tid in self.effects_applied or tid in self._effects_open:
                continue
            self._effects_open.add(tid)
            due.append(self.tasks[tid])
        return due

    def effect_applied(self, task_id: str, now: float) -> None:
        """The effect of ``task_id`` is applied and recorded."""
        self._effects_open.discard(task_id)
        self.effects_applied.add(task_id)
        self.facts.effects_failed.pop(task_id, None)
        self.touch(now)

    def effect_failed(self, task_id: str, error: str, now: float,
                      transient: bool = True) -> float | None:
        """Applying the effect failed: when to try again (None: given up, recorded)."""
        self._effects_open.discard(task_id)
        tries = self._effect_tries.get(task_id, 0) + 1
        self._effect_tries[task_id] = tries
        self.touch(now)
        if not transient or tries >= self.effect_retry.attempts:
            self.facts.effects_failed[task_id] = error
            return None
        at = now + self.effect_retry.backoff(tries, self._rng)
        heapq.heappush(self._effects_due, (at, task_id))
        return at

    def effect_known(self, task_id: str) -> None:
        """The effect of ``task_id`` was applied by an earlier process."""
        self.effects_applied.add(task_id)

    # ---- bookkeeping -----------------------------------------------------------------------

    def _offer(self, tid: str) -> None:
        if tid in self._queued:
            return
        task = self.tasks[tid]
        if task.status is _PENDING and (not self._waiting[tid] or self.claims_alone):
            if (self.approvals or self.task_approvals) and self._needs_start_approval(task):
                if tid not in self._asking:
                    self._asking.append(tid)
                return
            if self._waiting[tid]:
                return
            self._queued.add(tid)
            heapq.heappush(self._ready, self._entry[tid])

    def _change(self, task: Task, to: Status, event: str, worker: str | None,
                detail: Mapping[str, Any] | None = None, **changes: Any) -> Task:
        new = advanced(task, to, changes)
        self._replace(task, new)
        self._sink(new, event, worker, detail, task.token)
        return new

    def _replace(self, old: Task, new: Task) -> None:
        """Put ``new`` in place of ``old`` and keep every index right."""
        tid = new.id
        self.tasks[tid] = new
        was, now_is = old.status, new.status
        if (was is _ASSIGNED and now_is is _RUNNING and not old.resources
                and not new.resources and old.assigned_to == new.assigned_to
                and old.kind == new.kind and old.estimate_s == new.estimate_s):
            # A start on the worker it was assigned to: its load stays, one more is active
            # (what _unindex then _index would do, without taking the load off and back).
            worker = self.workers.get(new.assigned_to or "")
            if worker is not None:
                worker.active += 1
            return
        if was in _UNINDEXED:
            self._unindex(old)
        if now_is in _INDEXED and (now_is is not _COMPLETED or self.effect_kinds):
            self._index(new)
        if was not in FINAL:
            if now_is in FINAL:
                self.unfinished -= 1
        elif now_is not in FINAL:
            self.unfinished += 1  # a mirror that ran ahead of the store, corrected
        if now_is is _COMPLETED and was is not _COMPLETED:
            self._released(tid)

    def _released(self, tid: str) -> None:
        """``tid`` completed: each dependent waits for one dependency less."""
        dependents = self._dependents.get(tid)
        if dependents:
            waiting = self._waiting
            for dep in dependents:
                left = waiting[dep] - 1
                waiting[dep] = left
                if not left and self.started:
                    self._offer(dep)

    def _index(self, task: Task) -> None:
        status = task.status
        if status is _WAITING:
            self.awaiting.add(task.id)
        elif status in _IN_FLIGHT:
            for r in task.resources:
                self._locks[r] = task.id
            worker = self.workers.get(task.assigned_to or "")
            if worker is not None:
                worker.load_s += worker.cost(task)
                if status is _RUNNING:
                    worker.active += 1
        elif status is _COMPLETED and task.kind in self.effect_kinds \
                and task.id not in self.effects_applied:
            heapq.heappush(self._effects_due, (task.finished_at or 0.0, task.id))

    def _unindex(self, task: Task) -> None:
        status = task.status
        if status is _WAITING:
            self.awaiting.discard(task.id)
        if status not in _IN_FLIGHT:
            return
        worker = self.workers.get(task.assigned_to or "")
        if worker is not None:
            load = worker.load_s - worker.cost(task)
            worker.load_s = load if load > 0.0 else 0.0
            if status is _RUNNING:
                worker.active -= 1
        if not task.resources:
            return
        freed: list[str] = []
        for r in task.resources:
            if self._locks.get(r) == task.id:
                del self._locks[r]
                freed.append(r)
        for r in freed:
            for tid in self._parked.pop(r, ()):
                self._offer(tid)

    def release(self, worker: WorkerState, task: Task, now: float, *,
                dispatch: bool = True) -> list[tuple[WorkerState, Task]]:
        """After an attempt ended on ``worker``: what starts now (queued work, freed locks).

        ``dispatch=False``: only what ``worker`` has queued starts; what became ready (a
        dependent, a task a freed lock held back) waits for the driver's next
        :meth:`dispatch`, which gives the ready tasks of several outcomes out at once.
        """
        if task.status is _COMPLETED:
            worker.done += 1
        if task.started_at is not None:
            worker.busy_s += now - task.started_at
        starts = self.dispatch(now) if dispatch and (self._ready or self._first) else []
        if worker.queue and worker.active < worker.spec.capacity:  # else nothing to start
            self._pump(worker, now, starts)
        return starts


def _with_joins(task: Task) -> Task:
    """A task that joins X waits for X itself too."""
    missing = tuple(j for j in task.joins if j not in task.depends_on)
    return task.evolve(depends_on=task.depends_on + missing) if missing else task


def spawn_refused(exc: InvalidPlan) -> Failure:
    """A refused addition as the permanent failure of the task that asked for it."""
    listed = "; ".join(str(p) for p in exc.problems)
    return Failure(f"InvalidPlan: spawn refused: {listed}", ErrorClass.PERMANENT)


def _problem(code: str, task: int | None, message: str) -> Any:
    from planrun.core._plan import Problem

    return Problem(code, task, message)


def check_policies(*, on_dead: str = "cancel_dependents", retry_budget: int | None = None,
                   timeout: float | None = None, stale_after: float = 1.0,
                   stall_after: float = 1.0, max_reclaims: int = 0,
                   max_attempts: int = 1) -> None:
    """Refuse settings no run can honour, with one clear message each."""
    if on_dead not in ON_DEAD:
        raise UsageError(f"on_dead must be 'cancel_dependents', 'abort_run' or 'replan', "
                         f"not {on_dead!r}")
    if max_attempts < 1:
        raise UsageError("max_attempts must be >= 1")
    if not (stale_after > 0 and stall_after > 0):
        raise UsageError("stale_after and stall_after must be > 0")
    if max_reclaims < 0:
        raise UsageError(f"max_reclaims must be >= 0, got {max_reclaims}")
    if retry_budget is not None and retry_budget < 0:
        raise UsageError(f"retry_budget must be >= 0 or None, got {retry_budget}")
    if timeout is not None and not timeout > 0:
        raise UsageError(f"timeout must be > 0 or None, got {timeout}")
