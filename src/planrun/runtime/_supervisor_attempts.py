"""The in-process driver's attempts, replans and effects: carrying out what the core decided."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from planrun.core import EventName as E
from planrun.core import (
    SpawnRequest,
    Task,
    TaskContext,
    WorkerState,
    redact,
)
from planrun.core.scheduling import (
    ReplanRequest,
    failure_of,
    timed_out,
)
from planrun.runtime._attempt import call, checked, is_coroutine_handler, jsonable, maybe_await
from planrun.runtime._supervisor_state import (
    _How,
    _new_object,
    _partial,
    _set_attr,
    ask_replanner,
)
from planrun.runtime._supervisor_store import _SupervisorStore


class _SupervisorAttempts(_SupervisorStore):
    """The in-process driver's attempts, replans and effects: carrying out what the core decided."""

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
            if nxt is not True and handle is not None and not core.more_starts \
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
