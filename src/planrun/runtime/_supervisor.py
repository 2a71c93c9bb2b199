"""The in-process supervisor: a driver of the scheduling core on asyncio tasks.

It feeds :class:`planrun.core.scheduling.Scheduler` what happens (an attempt returned, raised or
beat; time passed) and carries out what the core decided: start an attempt as an asyncio
task, apply an effect, write each change and its ledger event to the store in batches. It
decides nothing itself: readiness, routing, retries, deaths, reclaims, locks, the budget
stop, the deadline and stall detection are the core's.
"""

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
    Router,
    RunResult,
    SpawnRequest,
    StallError,
    StoreError,
    Task,
    TaskContext,
    UsageError,
    WorkerSpec,
    WorkerState,
    analyze,
    audit_when_read,
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
    failure_of,
    replans_spent,
    retries_spent,
    timed_out,
)
from planrun.runtime import _heap
from planrun.runtime._attempt import call, checked, is_coroutine_handler, jsonable, maybe_await
from planrun.runtime._clock import Clock, RealClock, run_blocking

if TYPE_CHECKING:
    from planrun.stores.base import Store

__all__ = ["Backoff", "EffectFn", "Replanner", "RunResult", "Supervisor"]

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

WRITE_STALL_S = 0.5
"""Seconds after which a store write still under way counts as failing: no new attempt
starts until a write succeeds."""

GATHER_S = 0.002
"""Seconds a batch of changes for the store waits for more while they keep coming (attempts
running): a task changed several times in one batch has its row written once."""

GATHER_MAX_S = 0.1
"""Seconds a batch gathers at most after its first wait, however fast changes come."""


class Supervisor:
    """Owns a run's tasks and drives them to completion through registered workers.

    Args:
        registry: the kinds that exist, with their handlers.
        workers: the workers; default one worker doing every kind, 8 at a time.
        strategy: ``round_robin``, ``least_loaded``, ``capability`` or ``balanced``.
        max_attempts: attempts per task before it is ``dead`` (a task may override it).
        retry: the :class:`~planrun.RetryPolicy` between attempts (default: 2 s doubling to
            60 s, up to 25 % less at random, ``Retry-After`` honoured up to 60 s). Its
            ``attempts`` is the default of ``max_attempts`` when that is not given.
        backoff: the older name of ``retry`` (a ``RetryPolicy``; a deprecated
            :class:`Backoff` still works).
        retry_budget: retries allowed over the whole run; ``None`` for no limit.
        timeout: seconds one attempt may take before it counts as a transient failure
            (a kind's ``KindSpec.timeout_s`` overrides it).
        stale_after: seconds without a heartbeat after which a running task is reclaimed.
        max_reclaims: reclaims after which a task is ``dead`` instead of tried again (only
            a lease that expired under a live supervisor counts; a restart does not).
        on_dead: ``cancel_dependents`` (default) or ``abort_run``.
        stall_after: seconds without any task record changing before :class:`StallError`
            (a task waiting for a known retry time is not a stall).
        deadline_s: seconds from the start after which nothing new starts: tasks not started
            are ``cancelled`` with cause ``deadline``; attempts in flight keep their timeout.
        clock: :class:`RealClock` (default) or :class:`VirtualClock`.
        effects: kind -> effect applied once after a task of that kind completes (retried
            with backoff while it fails; one that finally fails makes the run not ok).
        on_event: called with each ledger event and the task record after it.
        extras: objects handed to every handler through ``TaskContext.extras``.
        seed: seed of the jitter's random generator (for reproducible runs).
        store: an opened :class:`~planrun.stores.Store`; every transition and its event are
            written to it (in batches, each batch one transaction) so a run survives a
            crash and :meth:`resume` carries it on.
        goal: recorded with the run in the store.
        meta: recorded with the run in the store.
        store_patience: seconds a failing store is retried (a database restart) before the
            run stops with :class:`StoreError`; no new attempt starts meanwhile.
        effect_retry: how a failing effect is tried again (default 6 tries, 1 s doubling
            to 30 s); one that fails every try makes the run not ok.
        spawn_limits: how far the run may grow while it runs (tasks handlers add with
            :meth:`TaskContext.spawn`): tasks per run, per spawning task, depth of spawning.
        replanner: with ``on_dead="replan"``, asked for a fragment that replaces a dead task
            and the dependents its death cancelled (``await replanner(request)`` returns
            :class:`SpawnRequest` items); the fragment is validated like a spawn. None: a
            death cancels its dependents.
        max_replans: replans allowed over the whole run; past it a death cancels.
        approvals: kind -> :class:`~planrun.Approval` (or ``"start"`` /
            ``"effect"``): its tasks wait in status ``waiting`` until :meth:`approve` or
            :meth:`reject` (or ``planrun approve`` / ``planrun reject`` on the store).
        task_approvals: task id -> approval, for single tasks.
        approval_poll: seconds between reads of the store for decisions another process
            wrote (only while a task waits, and only with a store).
    """

    freeze_heap: bool = _heap.ENABLED
    """While a run goes on, keep the objects the process had when it began out of the garbage
    collector's passes (``gc.freeze``, undone when the last run ends; see ``planrun._heap``).
    False, or ``PLANRUN_GC_FREEZE=0`` in the environment, turns it off."""

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
        stale_after: float = 90.0,
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
        if not approval_poll > 0:
            raise UsageError(f"approval_poll must be > 0, got {approval_poll}")
        policy = as_policy(retry if retry is not None else backoff, SCHEDULER_RETRY)
        attempts = policy.attempts if retry is not None else SCHEDULER_RETRY.attempts
        self.max_attempts = attempts if max_attempts is None else max_attempts
        check_policies(on_dead=on_dead, retry_budget=retry_budget, timeout=timeout,
                       stale_after=stale_after, stall_after=stall_after,
                       max_reclaims=max_reclaims, max_attempts=self.max_attempts)
        if deadline_s is not None and not deadline_s > 0:
            raise UsageError(f"deadline_s must be > 0 or None, got {deadline_s}")
        self.registry = registry
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.clock: Clock = clock or RealClock()
        self._now: Callable[[], float] = (
            time.time if type(self.clock) is RealClock else self.clock.now)
        """The clock's ``now``; plain ``time.time`` for the real clock (a call less)."""
        self._hows: dict[tuple[str, str], _How] = {}
        self.retry = policy
        self.timeout = timeout
        self.deadline_s = deadline_s
        self.effects = dict(effects or {})
        self.on_event = on_event
        self.extras = dict(extras or {})
        self.store = store
        self.goal = goal
        self.meta = dict(meta or {})
        self.store_patience = store_patience
        self.ledger = Ledger()
        self.core = Scheduler(
            router=get_router(strategy), retry=policy, sink=self._record,
            retry_budget=retry_budget, max_reclaims=max_reclaims, on_dead=on_dead,
            stale_after=stale_after, stall_after=stall_after, effects=self.effects, seed=seed,
            effect_retry=effect_retry or EFFECT_RETRY, kinds=registry,
            spawn_limits=spawn_limits, default_attempts=self.max_attempts,
            max_replans=max_replans, approvals=approvals, task_approvals=task_approvals,
        )
        self.replanner = replanner
        self.core.can_replan = replanner is not None
        self.approval_poll = approval_poll
        self._next_poll = 0.0
        for spec in workers if workers is not None else [WorkerSpec("worker", None, 8)]:
            self.register(spec)
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

    # ---- setup -----------------------------------------------------------------------------

    def register(self, worker: WorkerSpec) -> None:
        """Add a worker; names are unique."""
        self.core.add_worker(worker)

    def add(self, task: Task) -> Task:
        """Add one task; its dependencies must already be added."""
        return self.add_tasks([task])[0]

    def add_tasks(self, tasks: Iterable[Task]) -> list[Task]:
        """Add tasks in any order; dependencies must be in the batch or already added.

        Raises:
            InvalidPlan: the batch has a dependency cycle.
            UsageError: a duplicate id, an unknown dependency or kind, or a started run.
        """
        if self._started:
            raise UsageError("tasks cannot be added once the run has started")
        self._choose_sink()
        with _heap.frozen_heap(self.freeze_heap):  # a large batch: a record per task
            return self.core.add(list(tasks), self.clock.now(),
                                 default_attempts=self.max_attempts,
                                 known=self.registry.__contains__)

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

    # ---- running ---------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Run to completion from synchronous code (under the supervisor's clock).

        Inside a running event loop (a notebook) the run happens on a private thread.
        """
        return run_blocking(self.clock, self.arun)

    async def arun(self) -> RunResult:
        """Run every task to a final status and return the result.

        Raises:
            StallError: task records stopped changing for ``stall_after`` seconds.
        """
        self.clock.check_loop()
        if self._started:
            raise UsageError("a supervisor runs once; create a new one")
        self._started = True
        self._check_workers()
        self._wake = asyncio.Event()
        started = self.clock.now()
        if self.deadline_s is not None:
            self.core.deadline = started + self.deadline_s
        # The store's first and last batches (every record) are built while it is frozen too.
        with _heap.frozen_heap(self.freeze_heap):
            await self._open_run(started)
            self._choose_sink()
            status = "failed"
            try:
                self.core.start(started)
                if self._resumed:
                    self._recover(started)
                self._advance(started)
                await self._loop()
                status = "aborted" if self.core.facts.aborted_by else "finished"
            except (asyncio.CancelledError, KeyboardInterrupt):
                status = "interrupted"
                raise
            finally:
                try:
                    leftovers = [*self._running.values(), *self._background, *self._zombies]
                    for handle in leftovers:
                        handle.cancel()
                    if leftovers:
                        await asyncio.gather(*leftovers, return_exceptions=True)
                finally:
                    await self._close_run(status)
            return self._result(started)

    async def aresume(self) -> RunResult:
        """Carry on the run ``run_id`` from the store after a crash or a stop.

        Completed tasks keep their results and never run again; tasks that were assigned
        or running under the dead supervisor are put back (no attempt is consumed, and the
        restart does not count toward ``max_reclaims``); backoff deadlines are kept;
        effects begun but not recorded are applied again with the same key.
        """
        if self.store is None:
            raise UsageError("resume needs a store")
        if self.core.tasks:
            raise UsageError("resume loads its tasks from the store; add none")
        state = await self.store.load(self.run_id)
        self.goal = self.goal or state.run.goal
        self.meta = {**state.run.meta, **self.meta}
        self.ledger = Ledger(state.events)
        self._effect_records = dict(state.effects)
        self.core.retries_used = retries_spent(state.events)
        self.core.replans_used, self.core.replanned = replans_spent(state.events)
        self.core.restore(list(state.tasks))
        self._resumed = True
        return await self.arun()

    def resume(self) -> RunResult:
        """Synchronous :meth:`aresume` (on a private thread inside a running loop)."""
        return run_blocking(self.clock, self.aresume)

    def _recover(self, now: float) -> None:
        for task_id, record in self._effect_records.items():
            if record.state == "applied":
                self.core.effect_known(task_id)
        self.core.recover(now)

    async def _loop(self) -> None:
        """Sleep until the run ends or the next time something is due.

        Outcomes do not wake this loop: they are carried out in the callbacks that report
        them. It wakes for the end of the run, timers, and a store that failed.
        """
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        core = self.core
        while not core.done or self._background:
            self._wake.clear()
            if self._flusher is not None and self._flusher.done():
                self._flusher.result()  # a store that stayed down: raise its StoreError
            now = self.clock.now()
            await self._poll_decisions(now)
            now = self.clock.now()
            self._advance(now)
            if core.stalled(now) and not self._background:
                raise StallError(core.stall_message(self.run_id, now))
            if core.done and not self._background:
                break
            self._timer_at = core.next_wakeup(now)
            if self.store is not None and core.awaiting:
                self._timer_at = min(self._timer_at, max(now, self._next_poll))
            self._timer_at = min(self._timer_at, now + 3600.0)  # waiting for a person only
            timer = loop.call_later(max(0.0, self._timer_at - now), self._wake.set)
            try:
                await self._wake.wait()
            finally:
                timer.cancel()

    def _advance(self, now: float) -> None:
        """Let the core handle what is due, then carry out what it decided."""
        core = self.core
        core.paused = self._store_down
        core.tick(now)
        self._launch(core.dispatch(now))
        for task in core.effects_due(now):
            self._spawn(self._apply_effect(task))
        self._ask_replans()
        self._to_store()

    def _check_workers(self) -> None:
        done: set[str] = set()  # kinds some worker does
        for task in self.core.tasks.values():
            if task.kind in done or task.finished:
                continue
            if not self.core.capable(task.kind):
                raise UsageError(f"no registered worker does kind {task.kind!r} (task {task.id!r})")
            done.add(task.kind)

    # ---- attempts --------------------------------------------------------------------------

    def _launch(self, starts: Sequence[tuple[WorkerState, Task]]) -> None:
        for worker, task in starts:
            ctx = self._start_contexts.pop(task.id, None)
            if ctx is None:
                self._running[task.id] = asyncio.ensure_future(self._attempt(worker, task))
            else:  # in the context the start's observer left (a tracing span current)
                self._running[task.id] = ctx.run(asyncio.ensure_future,
                                                 self._attempt(worker, task))

    async def _attempt(self, worker: WorkerState, task: Task) -> None:
        """Run the attempt, then each start its outcome frees that this asyncio task can
        carry on (one with a context of its own gets a task of its own).

        One coroutine runs them all: an attempt adds only its handler's coroutine, and
        nothing of ours stands between the loop and the handler when it resumes."""
        runs = 0
        seen = self._passes
        how_of: tuple[WorkerState | None, str] = (None, "")
        while True:
            kind = task.kind
            if how_of[0] is not worker or how_of[1] != kind:  # the same as the last, mostly
                how = self._hows.get((worker.name, kind)) or self._how(worker, kind)
                spec, handler, limit, same, is_async = how
                how_of = (worker, kind)
            token = task.token
            ctx = self._context(task, same)
            try:
                result = checked(spec, task,
                                 await call(spec, handler, task, ctx, limit, is_async))
            except asyncio.CancelledError:
                raise
            except (TimeoutError, asyncio.TimeoutError) as exc:
                carried = self._outcome(worker, task, token, None, timed_out(exc, limit))
            except Exception as exc:
                carried = self._outcome(worker, task, token, None, exc)
            else:
                carried = self._outcome(worker, task, token, result, None, ctx.spawned)
            if carried is None:
                return
            worker, task = carried
            if self._passes != seen:  # the loop went round since: the handler waited
                seen, runs = self._passes, 0
                continue
            runs += 1
            if runs >= 16:
                # Handlers that never wait would keep the loop from its timers and others.
                runs = 0
                await asyncio.sleep(0)

    def _how(self, worker: WorkerState, kind: str) -> _How:
        """How ``worker`` runs ``kind``: its spec, handler, time limit, the context fields
        every attempt of it shares, and whether the handler is a coroutine function."""
        spec = self.registry[kind]
        limit = spec.timeout_s if spec.timeout_s is not None else self.timeout
        handler = worker.spec.handlers.get(kind) or spec.handler
        same = {"run_id": self.run_id, "kind": kind, "worker": worker.name,
                "skill": worker.spec.skill(kind), "extras": self.extras}
        how = (spec, handler, limit, same, handler is not None and is_coroutine_handler(handler))
        self._hows[worker.name, kind] = how
        return how

    def _context(self, task: Task, same: dict[str, Any]) -> TaskContext:
        """What the handler of one attempt is given: its context (``same``: the fields
        every attempt of its worker and kind shares, see :meth:`_how`)."""
        tid = task.id
        token = task.token
        inputs: dict[str, Any] = {}
        deps = task.depends_on
        if deps:
            tasks = self.core.tasks
            for d in deps:
                inputs[d] = tasks[d].result
        # Every field given (checked at import), stored one by one into a copy of the
        # shared ones: the frozen __init__'s setattr per field is skipped.
        state = same.copy()
        state["task_id"] = tid
        state["attempt"] = token
        state["payload"] = task.payload
        state["estimate_s"] = task.estimate_s
        state["inputs"] = inputs
        state["heartbeat"] = _partial(self._beat, tid, token)
        state["spawned"] = []
        ctx = _new_object(TaskContext)
        _set_attr(ctx, "__dict__", state)
        return ctx

    def _heartbeat(self, task_id: str, token: int) -> None:
        """An attempt's ``ctx.heartbeat()``: its lease is extended."""
        self.core.heartbeat(task_id, token, self._now())

    def _outcome(self, worker: WorkerState, task: Task, token: int, result: Any,
                 exc: BaseException | None, spawned: Sequence[SpawnRequest] = (),
                 ) -> tuple[WorkerState, Task] | None:
        """Hand the outcome to the core and carry out what it decided; return the start
        the calling asyncio task carries on with, if any."""
        now = self._now()
        core = self.core
        # What became ready is given out once per pass of the loop (_settle): the next
        # attempt of this worker starts first, and the other attempts that end in this
        # pass start theirs sooner.
        if exc is None and not spawned:
            nxt = core.finish(worker, task.id, token, result, now)
            if nxt is False:
                return None  # fenced off: a reclaimed attempt's late outcome
            handle = self._running.pop(task.id, None)
            if nxt is not True and handle is not None and not core._extra_starts \
                    and nxt.id not in self._start_contexts:
                self._running[nxt.id] = handle  # the common case: this task carries on
                carried: tuple[WorkerState, Task] | None = (worker, nxt)
                if not self._settling:
                    self._settling = True
                    asyncio.get_running_loop().call_soon(self._settle)
                if core.has_due(now):
                    self._carry_out_due(now)
                return carried
            starts = [(worker, nxt)] if nxt is not True else []
            starts += core.extra_starts()
        else:
            if exc is None:
                ok = core.complete(task.id, token, result, now, worker.name, spawned)
            else:
                ok = core.fail(task.id, token, failure_of(exc), now, worker.name)
            if not ok:
                return None  # fenced off: a reclaimed attempt's late outcome
            handle = self._running.pop(task.id, None)
            starts = core.release(worker, core.tasks[task.id], now, dispatch=False)
        carried = None
        if handle is not None and starts and starts[0][1].id not in self._start_contexts:
            carried = starts[0]
            self._running[carried[1].id] = handle
            if len(starts) > 1:
                self._launch(starts[1:])
        elif starts:
            self._launch(starts)
        if core.has_due(now):
            self._carry_out_due(now)
        if not self._settling:  # once for all the outcomes of this pass of the event loop
            self._settling = True
            asyncio.get_running_loop().call_soon(self._settle)
        return carried

    def _carry_out_due(self, now: float) -> None:
        """Apply the effects due and ask the replans due (see ``Scheduler.has_due``)."""
        for due in self.core.effects_due(now):
            self._spawn(self._apply_effect(due))
        self._ask_replans()

    def _settle(self) -> None:
        """After the outcomes of a pass of the event loop: start what they made ready, and
        wake :meth:`_loop` if it sleeps until a time that is no longer the next one (the
        run ended, a lease or retry falls due sooner)."""
        self._settling = False
        self._passes += 1
        now = self._now()
        self._launch(self.core.dispatch(now))
        self._to_store()
        if self.core.wakes_before(self._timer_at, now):
            self._wake_up()

    # ---- replans -----------------------------------------------------------------------------

    def _ask_replans(self) -> None:
        for request in self.core.replans_due():
            self._spawn(self._replan(request))

    async def _replan(self, request: ReplanRequest) -> None:
        """Ask the replanner; the core validates and adds what it answers."""
        assert self.replanner is not None
        fragment, error = await ask_replanner(self.replanner, request)
        now = self.clock.now()
        self.core.replan_done(request, fragment, error, now)
        self._launch(self.core.dispatch(now))
        self._to_store()

    # ---- effects -----------------------------------------------------------------------------

    def _spawn(self, coro: Awaitable[Any]) -> None:
        handle = asyncio.ensure_future(coro)
        self._background.add(handle)
        handle.add_done_callback(self._background_done)

    async def _apply_effect(self, task: Task) -> None:
        """Apply the kind's effect once, keyed by ``"<run>:<task>"``.

        With a store: the completion is written first, then the effect is recorded as
        begun, applied with its key, and recorded as applied together with its ``effect``
        event (one transaction). A failure anywhere (the effect raised, the store did) is
        handed to the core, which says when to try again with the same key; the effect's
        target must accept that key as an idempotency key.
        """
        key = f"{self.run_id}:{task.id}"
        try:
            if self.store is not None:
                await self._flush()
                record = await self.store.effect_begin(self.run_id, task.id, key,
                                                       self.clock.now())
                if record.state == "applied":  # applied and logged by an earlier process
                    self.core.effect_applied(task.id, self.clock.now())
                    return
            outcome = await maybe_await(self.effects[task.kind](task, key))
            entry = self._effect_events.get(task.id)
            if entry is None:
                entry = self.ledger.append(self.clock.now(), task.id, E.EFFECT,
                                           attempt=task.token, detail={"key": key})
                self._effect_events[task.id] = entry
                if self.store is not None:  # written with the effect's record, below
                    self._apart.add(entry.seq)
                self._notify(entry, task)
            if self.store is not None:
                # The event goes to the store with the effect's record, not with a batch.
                await self.store.effect_done(self.run_id, task.id, jsonable(outcome),
                                             self.clock.now(), entry)
        except Exception as exc:
            error = redact(f"{type(exc).__name__}: {exc}")
            now = self.clock.now()
            retry_at = self.core.effect_failed(task.id, error, now)
            self._wake_up()
            self._log(task, E.EFFECT_FAILED,
                      {"key": key, "error": error, "retry_at": retry_at})
            return
        self.core.effect_applied(task.id, self.clock.now())

    # ---- durability ----------------------------------------------------------------------

    async def _open_run(self, now: float) -> None:
        if self.store is None:
            return
        from planrun.stores.base import RunInfo

        self._dirty = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._gathering: asyncio.Future[None] | None = None
        self._flush_now = False
        if self._resumed:
            await self.store.set_run_status(self.run_id, "running")
        else:
            await self.store.create_run(RunInfo(self.run_id, now, "running", self.goal, self.meta))
            await self.store.add_tasks(self.run_id, list(self.core.tasks.values()),
                                       list(self.ledger.events))
        self._flushed = len(self.ledger)
        self._flusher = asyncio.ensure_future(self._flush_forever())
        self._flusher.add_done_callback(lambda _: self._wake_up())

    async def _close_run(self, status: str) -> None:
        if self.store is None:
            return
        if self._flusher is not None and self._dirty is not None:
            # Never cancel a write in flight: a cancelled batch may or may not have been
            # committed. Ask the flusher to drain and finish instead.
            self._closing = True
            self._end_gathering(flush=True)
            self._dirty.set()
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self._flush()
        await self.store.set_run_status(self.run_id, status)

    async def _flush_forever(self) -> None:
        assert self._dirty is not None
        while True:
            await self._dirty.wait()
            await self._gather()
            self._dirty.clear()
            await self._flush()
            if self._closing and self._flushed == len(self.ledger):
                return

    async def _gather(self) -> None:
        """Let the next batch wait for more changes while they keep coming (attempts run),
        so a task changed several times in it has its row written once: :data:`GATHER_S`
        at a time, :data:`GATHER_MAX_S` at most. Closing the run, a waiting row (a person
        reads it from the store) or a store that refuses writes ends the wait at once.

        The store stays a log written behind the run: a crash keeps the batches committed
        before it, and a resume puts back what was assigned or running. An effect does not
        wait: :meth:`_apply_effect` flushes its task's completion itself.
        """
        loop = asyncio.get_running_loop()
        until = loop.time() + GATHER_MAX_S
        seen = -1
        ledger = self.ledger
        while seen != len(ledger) and not self._flush_now and not self._store_down:
            now = loop.time()
            if now >= until:
                break
            seen = len(ledger)
            self._gathering = woken = loop.create_future()
            timer = loop.call_later(min(GATHER_S, until - now), self._end_gathering)
            try:
                await woken
            finally:
                timer.cancel()
                self._gathering = None
        self._flush_now = False

    def _end_gathering(self, flush: bool = False) -> None:
        """Wake :meth:`_gather` (``flush``: and write the batch now)."""
        if flush:
            self._flush_now = True
        woken = self._gathering
        if woken is not None and not woken.done():
            woken.set_result(None)

    async def _flush(self) -> None:
        """Write what changed, batch by batch; ride out a store that is briefly down.

        While writes fail no new attempt starts (their results could not be recorded);
        a write that has not returned after :data:`WRITE_STALL_S` counts as failing (a
        server that is gone makes a call wait for a connection before it fails). Work
        resumes as soon as a write succeeds.
        """
        if self.store is None or self._flush_lock is None:
            return
        async with self._flush_lock:
            delay, deadline = 0.2, self.clock.now() + self.store_patience
            tasks = self.core.tasks
            while self._flushed < len(self.ledger):
                # The batch is cut at once: the entries so far, with each task's record as
                # it is now (every change comes with its event, so the two agree).
                end = len(self.ledger)
                events = self.ledger.rows(self._flushed, end, self._apart)
                rows = [tasks[t] for t in dict.fromkeys([e[2] for e in events]) if t in tasks]
                stalled = asyncio.get_running_loop().call_later(WRITE_STALL_S, self._stalled)
                try:
                    await self.store.write_batch(self.run_id, rows, events)
                except Exception as exc:  # an UnstorableValue is raised at once
                    # Nothing is lost: the next try cuts its batch from the same place.
                    self._store_down = self.core.paused = True
                    if not isinstance(exc, StoreError) or self.clock.now() >= deadline:
                        raise
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
                else:
                    self._flushed = end
                    if self._store_down:
                        self._store_down = self.core.paused = False
                        self._wake_up()
                finally:
                    stalled.cancel()

    def _to_store(self) -> None:
        """Wake the flusher when the ledger holds changes the store has not (the core notes
        its common changes straight into the ledger: nobody else tells the flusher)."""
        if self._dirty is not None and self._flushed < len(self.ledger):
            self._dirty.set()

    def _stalled(self) -> None:
        """A write is taking too long to be a healthy store: start nothing until it ends."""
        self._store_down = self.core.paused = True

    # ---- bookkeeping -------------------------------------------------------------------------

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

    def _result(self, started: float) -> RunResult:
        tasks = dict(self.core.tasks)
        ends = list(filter(None, map(_FINISHED_AT, tasks.values())))
        finished = max(ends, default=started)
        if len(ends) < len(tasks):  # a task with no end counts as ending at the start
            finished = max(finished, started)
        facts = self.core.facts
        return RunResult(
            run_id=self.run_id,
            tasks=tasks,
            events=self.ledger.view(),
            audit=audit_when_read(functools.partial(
                analyze, tasks.values(), self.ledger.view(), tuple(self.effects))),
            started_at=started,
            finished_at=finished,
            aborted_by=facts.aborted_by,
            budget_exhausted=facts.budget_exhausted,
            workers={w.name: {"tasks": w.done, "busy_s": w.busy_s}
                     for w in self.core.workers.values()},
            deadline_reached=facts.deadline_reached,
            effects_failed=dict(facts.effects_failed),
        )
