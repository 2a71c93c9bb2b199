"""The in-process driver's state and setup: its core, workers, tasks and decisions from outside."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from planrun.core import (
    Event,
    Handler,
    KindSpec,
    Ledger,
    Registry,
    Repair,
    Router,
    SpawnRequest,
    StoreError,
    Task,
    TaskContext,
    UsageError,
    WorkerSpec,
    get_router,
    redact,
)
from planrun.core import EventName as E
from planrun.core.scheduling import (
    EFFECT_RETRY,
    SCHEDULER_RETRY,
    Approval,
    Backoff,
    OnDead,
    ReplanRequest,
    RetryPolicy,
    Scheduler,
    SpawnLimits,
    as_policy,
    check_policies,
)
from planrun.runtime import _heap
from planrun.runtime._clock import Clock, RealClock

if TYPE_CHECKING:
    from planrun.stores.base import Store


EffectFn = Callable[[Task, str], Any | Awaitable[Any]]
"""``effect(task, key)``: apply a side effect of a completed task, once, keyed by ``key``."""


if {f.name for f in dataclasses.fields(TaskContext)} != {
        "run_id", "task_id", "kind", "attempt", "worker", "skill", "payload", "estimate_s",
        "inputs", "heartbeat", "extras", "spawned"}:  # pragma: no cover - a field was added
    raise ImportError("Supervisor._context must give every field of TaskContext")

Replanner = Callable[[ReplanRequest], Awaitable[Sequence[SpawnRequest]]]
"""``await replanner(request)``: the tasks that replace a dead task and its cancelled
dependents (depending on tasks of the run or on earlier tasks of the fragment, by the ids
``"<dead id>/<n>"`` they will get)."""


async def ask_replanner(replanner: Replanner, request: ReplanRequest,
                        ) -> tuple[list[SpawnRequest] | None, str | None]:
    """What a driver hands the core's ``replan_done``: the fragment, or the redacted error
    the replanner raised (a cancellation is not an answer and goes through)."""
    try:
        return list(await replanner(request)), None
    except Exception as exc:
        return None, redact(f"{type(exc).__name__}: {exc}")


_STATUS = attrgetter("status")
_REJECTED, _RECLAIMED, _WAITING, _STARTED = E.REJECTED, E.RECLAIMED, E.WAITING, E.STARTED
_new_object = object.__new__
_set_attr = object.__setattr__
_partial = functools.partial
_FINISHED_AT = attrgetter("finished_at")

_How = tuple[KindSpec, "Handler | None", "float | None", dict[str, Any], bool]
"""How a worker runs a kind (see :meth:`Supervisor._how`)."""

STALE_AFTER_S = 90.0
"""Seconds without a heartbeat after which a running task is reclaimed, unless given."""
WRITE_STALL_S = 0.5
"""Seconds after which a store write still under way counts as failing: no new attempt
starts until a write succeeds."""

GATHER_S = 0.002
"""Seconds a batch of changes for the store waits for more while they keep coming (attempts
running): a task changed several times in one batch has its row written once."""

GATHER_MAX_S = 0.1
"""Seconds a batch gathers at most after its first wait, however fast changes come."""


def _check_poll(approval_poll: float) -> None:
    if not approval_poll > 0:
        raise UsageError(f"approval_poll must be > 0, got {approval_poll}")


def _retry_and_attempts(retry: RetryPolicy | None, backoff: RetryPolicy | Backoff | None,
                        max_attempts: int | None) -> tuple[RetryPolicy, int]:
    """The retry policy a supervisor runs under, and its tasks' attempts: ``max_attempts``,
    else the policy's when one was given as ``retry``, else the scheduler's default."""
    policy = as_policy(retry if retry is not None else backoff, SCHEDULER_RETRY)
    attempts = policy.attempts if retry is not None else SCHEDULER_RETRY.attempts
    return policy, attempts if max_attempts is None else max_attempts


class _SupervisorState:
    """The in-process driver's state and setup: its core, workers, tasks, and the
    decisions made from outside."""

    freeze_heap: bool = _heap.ENABLED
    """While a run goes on, keep the objects the process had when it began out of the garbage
    collector's passes (``gc.freeze``, undone when the last run ends; see ``planrun._heap``).
    False, or ``PLANRUN_GC_FREEZE=0`` in the environment, turns it off."""

    if TYPE_CHECKING:  # what the parts above this one define, and this one calls

        def _heartbeat(self, task_id: str, token: int) -> None: ...

        def _advance(self, now: float) -> None: ...

        def _end_gathering(self, flush: bool = False) -> None: ...

    def __init__(
        self,
        registry: Registry,
        workers: Iterable[WorkerSpec] | None = None,
        *,
        strategy: str | Router = "balanced",
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        backoff: RetryPolicy | Backoff | None = None,
        retry_budget: int | None = None,
        timeout: float | None = None,
        stale_after: float = STALE_AFTER_S,
        max_reclaims: int = 3,
        on_dead: OnDead = "cancel_dependents",
        stall_after: float = 900.0,
        deadline_s: float | None = None,
        clock: Clock | None = None,
        run_id: str | None = None,
        effects: Mapping[str, EffectFn] | None = None,
        on_event: Callable[[Event, Task], None] | None = None,
        extras: Mapping[str, Any] | None = None,
        seed: int | None = None,
        store: Store | None = None,
        goal: str = "",
        meta: Mapping[str, Any] | None = None,
        store_patience: float = 120.0,
        effect_retry: RetryPolicy | None = None,
        spawn_limits: SpawnLimits | None = None,
        replanner: Replanner | None = None,
        max_replans: int = 2,
        approvals: Mapping[str, Approval | str] | None = None,
        task_approvals: Mapping[str, Approval | str] | None = None,
        approval_poll: float = 1.0,
    ) -> None:
        _check_poll(approval_poll)
        policy, self.max_attempts = _retry_and_attempts(retry, backoff, max_attempts)
        check_policies(on_dead=on_dead, retry_budget=retry_budget, timeout=timeout,
                       stale_after=stale_after, stall_after=stall_after,
                       max_reclaims=max_reclaims, max_attempts=self.max_attempts,
                       deadline_s=deadline_s)
        self.registry, self.retry, self.timeout = registry, policy, timeout
        self.clock: Clock = clock or RealClock()
        self._now: Callable[[], float] = (  # plain time.time for the real clock: a call less
            time.time if type(self.clock) is RealClock else self.clock.now)
        self.deadline_s, self.on_event, self.replanner = deadline_s, on_event, replanner
        self.effects, self.extras = dict(effects or {}), dict(extras or {})
        self.store, self.goal, self.meta = store, goal, dict(meta or {})
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.store_patience, self.approval_poll = store_patience, approval_poll
        self.core = Scheduler(
            router=get_router(strategy), retry=policy, sink=self._record,
            retry_budget=retry_budget, max_reclaims=max_reclaims, on_dead=on_dead,
            stale_after=stale_after, stall_after=stall_after, effects=self.effects, seed=seed,
            effect_retry=effect_retry or EFFECT_RETRY, kinds=registry,
            spawn_limits=spawn_limits, default_attempts=self.max_attempts,
            max_replans=max_replans, approvals=approvals, task_approvals=task_approvals,
            can_replan=replanner is not None)
        for spec in workers if workers is not None else [WorkerSpec("worker", None, 8)]:
            self.register(spec)
        self._new_run_state()

    def _new_run_state(self) -> None:
        """What the driver keeps while it runs: attempts, background work, the store's place."""
        self.ledger = Ledger()
        self._hows: dict[tuple[str, str], _How] = {}
        self._next_poll = 0.0
        self._running: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._zombies: set[asyncio.Task[None]] = set()
        self._effect_events: dict[str, Event] = {}
        self._effect_records: dict[str, Any] = {}
        self._wake: asyncio.Event | None = None
        self._started = False
        self._resumed = False
        self._closing = False
        self._flushed = 0
        """Ledger entries before this place are in the store (durable runs)."""
        self._apart: set[int] = set()
        """Seqs of events written to the store with a record of their own (an effect's),
        which no batch writes."""
        self._dirty: asyncio.Event | None = None
        self._flush_lock: asyncio.Lock | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._store_down = False
        self._timer_at = float("inf")
        self._settling = False
        """An outcome asked for :meth:`_settle` and it has not run yet."""
        self._passes = 0
        """Passes of the event loop that had outcomes (:meth:`_settle` counts them): an
        attempt that ends in the pass its predecessor on the same asyncio task ended in
        never let the loop go round."""
        self._start_contexts: dict[str, contextvars.Context] = {}
        self._beat = self._heartbeat  # one bound method for every attempt's heartbeat

    def register(self, worker: WorkerSpec) -> None:
        """Add a worker; names are unique."""
        self.core.add_worker(worker)

    def add(self, task: Task) -> Task:
        """Add one task; its dependencies must already be added."""
        return self.add_tasks([task])[0]

    def add_tasks(self, tasks: Iterable[Task], *, repairs: Sequence[Repair] = ()) -> list[Task]:
        """Add tasks in any order; dependencies must be in the batch or already added.

        ``repairs``: those of the plan the tasks are (given in its order, as
        :meth:`Plan.to_tasks` gives them), recorded in the ledger as ``repaired`` events.

        Raises:
            InvalidPlan: the batch has a dependency cycle.
            UsageError: a duplicate id, an unknown dependency or kind, or a started run.
        """
        if self._started:
            raise UsageError("tasks cannot be added once the run has started")
        self._choose_sink()
        with _heap.frozen_heap(self.freeze_heap):  # a large batch: a record per task
            batch = list(tasks)
            added = self.core.add(batch, self.clock.now(), default_attempts=self.max_attempts,
                                  known=self.registry.__contains__)
            if repairs:
                self.core.ready.repaired(batch, repairs)
            return added

    @property
    def tasks(self) -> Mapping[str, Task]:
        """Current records by id (read-only view)."""
        return dict(self.core.tasks)

    @property
    def waiting(self) -> list[str]:
        """Ids of the tasks waiting for a person's approval."""
        return sorted(self.core.awaiting)

    def approve(self, task_id: str, note: str | None = None) -> Task:
        """Approve a waiting task (call it on the run's event loop, e.g. from ``on_event``).

        Raises:
            UsageError: the task is not waiting (approving twice included).
        """
        task = self.core.approve(task_id, self.clock.now(), note, by="api")
        self._after_decision()
        return task

    def reject(self, task_id: str, reason: str) -> Task:
        """Reject a waiting task: it is ``dead`` with cause ``rejected``.

        Raises:
            UsageError: the task is not waiting, or ``reason`` is empty.
        """
        task = self.core.reject(task_id, self.clock.now(), reason, by="api")
        self._after_decision()
        return task

    def _after_decision(self) -> None:
        if self._started and self._wake is not None:
            self._advance(self.clock.now())
            self._wake_up()

    async def _poll_decisions(self, now: float) -> None:
        """Read the waiting rows for decisions another process wrote (``planrun approve``)."""
        if self.store is None or not self.core.awaiting or now < self._next_poll:
            return
        self._next_poll = now + self.approval_poll
        try:
            records = await self.store.load_some(self.run_id, sorted(self.core.awaiting))
        except StoreError:
            return  # read again at the next poll; the writes have their own patience
        took = False
        for record in records:
            took = self.core.take_decision(record, self.clock.now()) or took
        if took:
            self._advance(self.clock.now())

    @property
    def stale_after(self) -> float:
        """Lease length of a running attempt."""
        return self.core.stale_after

    def _spawn(self, coro: Awaitable[Any]) -> None:
        handle = asyncio.ensure_future(coro)
        self._background.add(handle)
        handle.add_done_callback(self._background_done)

    def _record(self, task: Task, event: str, worker: str | None,
                detail: Mapping[str, Any] | None, token: int) -> None:
        """The core's sink: append the event (a durable run's next batch takes it, with the
        record as it is then), hand it to the listener."""
        attempt = token if event == _REJECTED else task.token
        if self.on_event is None:
            # Nobody reads the event now: note it, its object is built if the log is read
            # (a durable run's batches are cut from the ledger, see _flush).
            self.ledger.note(self._now(), task.id, event, worker, attempt, detail)
            if self._dirty is not None:
                self._dirty.set()
                if event == _WAITING:
                    self._end_gathering(flush=True)  # a person reads the waiting row
                    self._wake_up()
            if event == _RECLAIMED:
                self._reclaimed(task)
            return
        entry = self.ledger.append(self._now(), task.id, event, worker=worker,
                                   attempt=attempt, detail=detail)
        if self._dirty is not None:  # durable: the batch is cut from the ledger
            self._dirty.set()
            if event == _WAITING:
                self._end_gathering(flush=True)  # a person reads the waiting row from the store
        if event == _RECLAIMED:
            self._reclaimed(task)
        self._notify(entry, task)
        if event == _WAITING:
            self._wake_up()  # the loop reads the store for decisions while a task waits
        if event == _STARTED:
            self._start_contexts[task.id] = contextvars.copy_context()

    def _choose_sink(self) -> None:
        """With no listener nobody reads an event as it happens: the core's common changes
        are noted straight into the ledger (a durable run's batches are cut from it), and
        the others noted by the ledger's sink (no store) or :meth:`_record`. A listener
        gets each change through :meth:`_record`."""
        if self.on_event is None:
            self.core.use_log(self.ledger.raw_appender())
            self.core.use_sink(self._record if self.store is not None
                               else self.ledger.change_sink(self._now, self._reclaimed))
        else:
            self.core.use_sink(self._record)
            self.core.use_log(None)

    def _reclaimed(self, task: Task) -> None:
        zombie = self._running.pop(task.id, None)
        if zombie is not None:
            # It may still be alive; its late result will be fenced off, not trusted.
            self._zombies.add(zombie)
            zombie.add_done_callback(self._zombies.discard)

    def _log(self, task: Task, event: str, detail: Mapping[str, Any]) -> None:
        """An event that changes no record (it still goes to the store with the record)."""
        self._record(self.core.tasks.get(task.id, task), event, None, detail, task.token)

    def _notify(self, entry: Event, task: Task) -> None:
        if self.on_event is not None:
            self.on_event(entry, task)

    def _background_done(self, handle: asyncio.Task[Any]) -> None:
        self._background.discard(handle)
        if not handle.cancelled():
            handle.exception()  # retrieved: effects report their own failures
        self._wake_up()

    def _wake_up(self) -> None:
        if self._wake is not None:
            self._wake.set()
