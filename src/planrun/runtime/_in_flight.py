"""A supervised run's attempts in flight: each on an asyncio task, its outcome to the core."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from planrun.core import Handler, KindSpec, Registry, SpawnRequest, Task, TaskContext, WorkerState
from planrun.core.scheduling import Scheduler, failure_of, timed_out
from planrun.runtime._attempt import call, checked, is_coroutine_handler

__all__ = ["InFlight"]

if {f.name for f in dataclasses.fields(TaskContext)} != {
        "run_id", "task_id", "kind", "attempt", "worker", "skill", "payload", "estimate_s",
        "inputs", "heartbeat", "extras", "spawned", "tier"}:  # pragma: no cover - a field was added
    raise ImportError("InFlight._context must give every field of TaskContext")

_new_object = object.__new__
_set_attr = object.__setattr__
_partial = functools.partial

_How = tuple[KindSpec, "Handler | None", "float | None", dict[str, Any], bool, bool]
"""How a worker runs a kind (see :meth:`InFlight._how`)."""


class InFlight:
    """The attempts in flight: each started on an asyncio task, its handler given its
    context, its outcome handed to the core, and what the core decided then carried out
    (the next start, mostly on the same asyncio task).

    What became ready is given out once per pass of the event loop (:meth:`_settle`): the
    next attempt of a worker starts first, and the other attempts that end in the same pass
    start theirs sooner. A reclaimed attempt may still be alive: its handle is kept apart
    (a zombie) and its late outcome is fenced off by its token.

    Args:
        core: the scheduling core.
        registry: the kinds, with their handlers and time limits.
        run_id: given to every handler in its context.
        extras: objects given to every handler in its context.
        timeout: seconds an attempt may take, unless its kind says.
        now: the run's clock.
        due: carries out the effects and replans the core has due at a time.
        settled: after the outcomes of a pass of the loop were carried out (at a time).
    """

    def __init__(self, core: Scheduler, registry: Registry, *, run_id: str,
                 extras: Mapping[str, Any], timeout: float | None, now: Callable[[], float],
                 due: Callable[[float], None], settled: Callable[[float], None]) -> None:
        self.core, self.registry, self.run_id = core, registry, run_id
        self.extras, self.timeout = extras, timeout
        self._now, self._due, self._settled = now, due, settled
        self._running: dict[str, asyncio.Task[None]] = {}
        self._zombies: set[asyncio.Task[None]] = set()
        self._hows: dict[tuple[str, str], _How] = {}
        self._start_contexts: dict[str, contextvars.Context] = {}
        self._settling = False
        """An outcome asked for :meth:`_settle` and it has not run yet."""
        self._passes = 0
        """Passes of the event loop that had outcomes (:meth:`_settle` counts them): an
        attempt that ends in the pass its predecessor on the same asyncio task ended in
        never let the loop go round."""
        self._beat = self.heartbeat  # one bound method for every attempt's heartbeat

    def handles(self) -> list[asyncio.Task[None]]:
        """Every asyncio task running an attempt, reclaimed ones included."""
        return [*self._running.values(), *self._zombies]

    def launch(self, starts: Sequence[tuple[WorkerState, Task]]) -> None:
        """Start each attempt on an asyncio task of its own."""
        for worker, task in starts:
            ctx = self._start_contexts.pop(task.id, None)
            if ctx is None:
                self._running[task.id] = asyncio.ensure_future(self._attempt(worker, task))
            else:  # in the context the start's observer left (a tracing span current)
                self._running[task.id] = ctx.run(asyncio.ensure_future,
                                                 self._attempt(worker, task))

    def started(self, task: Task) -> None:
        """A listener heard ``task`` start: its attempt runs in the context it leaves."""
        self._start_contexts[task.id] = contextvars.copy_context()

    def reclaimed(self, task: Task) -> None:
        """The core reclaimed ``task``: its attempt may still be alive; its late result
        will be fenced off, not trusted."""
        zombie = self._running.pop(task.id, None)
        if zombie is not None:
            self._zombies.add(zombie)
            zombie.add_done_callback(self._zombies.discard)

    def heartbeat(self, task_id: str, token: int) -> None:
        """An attempt's ``ctx.heartbeat()``: its lease is extended."""
        self.core.heartbeat(task_id, token, self._now())

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
                spec, handler, limit, same, is_async, tiered = how
                how_of = (worker, kind)
            token = task.token
            ctx = self._context(task, same, tiered)
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
        every attempt of it shares, whether the handler is a coroutine function, and whether
        the core chooses each attempt's tier (the run's tiers are set before it starts)."""
        spec = self.registry[kind]
        limit = spec.timeout_s if spec.timeout_s is not None else self.timeout
        handler = worker.spec.handlers.get(kind) or spec.handler
        same = {"run_id": self.run_id, "kind": kind, "worker": worker.name,
                "skill": worker.spec.skill(kind), "extras": self.extras}
        how = (spec, handler, limit, same, handler is not None and is_coroutine_handler(handler),
               self.core.chooses_tiers)
        self._hows[worker.name, kind] = how
        return how

    def _context(self, task: Task, same: dict[str, Any], tiered: bool) -> TaskContext:
        """What the handler of one attempt is given: its context (``same``: the fields
        every attempt of its worker and kind shares, see :meth:`_how`; ``tiered``: the core
        chooses the attempt's tier)."""
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
        state["tier"] = self.core.tier_for(tid, self._now()) if tiered else None
        ctx = _new_object(TaskContext)
        _set_attr(ctx, "__dict__", state)
        return ctx

    def _outcome(self, worker: WorkerState, task: Task, token: int, result: Any,
                 exc: BaseException | None, spawned: Sequence[SpawnRequest] = (),
                 ) -> tuple[WorkerState, Task] | None:
        """Hand the outcome to the core and carry out what it decided; return the start
        the calling asyncio task carries on with, if any."""
        now = self._now()
        core = self.core
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
                    self._due(now)
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
                self.launch(starts[1:])
        elif starts:
            self.launch(starts)
        if core.has_due(now):
            self._due(now)
        if not self._settling:  # once for all the outcomes of this pass of the event loop
            self._settling = True
            asyncio.get_running_loop().call_soon(self._settle)
        return carried

    def _settle(self) -> None:
        """After the outcomes of a pass of the event loop: start what they made ready, and
        tell the supervisor (see ``settled``)."""
        self._settling = False
        self._passes += 1
        now = self._now()
        self.launch(self.core.dispatch(now))
        self._settled(now)
