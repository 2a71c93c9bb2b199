"""A supervised run's work beside its attempts: effects applied once, replans asked."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from planrun.core import Event, SpawnRequest, Task, redact
from planrun.core import EventName as E
from planrun.core.scheduling import Fragment, ReplanRequest, Scheduler
from planrun.runtime._attempt import jsonable, maybe_await

if TYPE_CHECKING:
    from planrun.runtime._run_log import RunLog
    from planrun.runtime._run_writes import RunWrites
    from planrun.stores.base import EffectRecord

__all__ = ["EffectFn", "Replanner", "SideWork", "ask_replanner"]

EffectFn = Callable[[Task, str], Any | Awaitable[Any]]
"""``effect(task, key)``: apply a side effect of a completed task, once, keyed by ``key``."""

Replanner = Callable[[ReplanRequest], Awaitable[Sequence[SpawnRequest]]]
"""``await replanner(request)``: the tasks that replace a dead task and its cancelled
dependents (depending on tasks of the run or on earlier tasks of the fragment, by the ids
``"<dead id>/<n>"`` they will get)."""


async def ask_replanner(replanner: Replanner, request: ReplanRequest,
                        ) -> tuple[list[SpawnRequest] | None, str | None]:
    """What a driver hands the core's ``replan_done``: the fragment (a
    :class:`~planrun.core.scheduling.Fragment` as it is, with its repairs), or the redacted
    error the replanner raised (a cancellation is not an answer and goes through)."""
    try:
        answer = await replanner(request)
        return answer if isinstance(answer, Fragment) else list(answer), None
    except Exception as exc:
        return None, redact(f"{type(exc).__name__}: {exc}")


class SideWork:
    """The run's work beside its attempts, each piece on an asyncio task of its own: the
    effects the core has due, applied once with a key, and the replans it asks for.

    Args:
        core: the scheduling core (it says what is due and takes the answers).
        run_id: the run (an effect's key is ``"<run>:<task>"``).
        effects: kind -> effect.
        replanner: asked for the fragment replacing a dead task, or None.
        log: the run's ledger (an effect's event).
        writes: the run's writes (an effect's record goes to the store).
        now: the run's clock.
        dispatch: starts what became ready at a time (a replan's fragment).
        wake: wakes the supervisor's loop (a piece of work ended or failed).
    """

    def __init__(self, core: Scheduler, run_id: str, *, effects: Mapping[str, EffectFn],
                 replanner: Replanner | None, log: RunLog, writes: RunWrites,
                 now: Callable[[], float], dispatch: Callable[[float], None],
                 wake: Callable[[], None]) -> None:
        self.core, self.run_id, self.effects, self.replanner = core, run_id, effects, replanner
        self._log, self._writes, self._now = log, writes, now
        self._dispatch, self._wake = dispatch, wake
        self._handles: set[asyncio.Task[Any]] = set()
        self._effect_events: dict[str, Event] = {}
        self.effect_records: dict[str, EffectRecord] = {}
        """The effects a resumed run found in the store, by task id."""

    @property
    def busy(self) -> bool:
        """Some piece of work is under way."""
        return bool(self._handles)

    def handles(self) -> list[asyncio.Task[Any]]:
        """The asyncio tasks of the work under way."""
        return list(self._handles)

    def recover(self) -> None:
        """Tell the core which effects an earlier process applied (a resumed run)."""
        for task_id, record in self.effect_records.items():
            if record.state == "applied":
                self.core.effect_known(task_id)

    def carry_out_due(self, now: float) -> None:
        """Apply the effects due and ask the replans due (see ``Scheduler.has_due``)."""
        for due in self.core.effects_due(now):
            self._spawn(self._apply_effect(due))
        for request in self.core.replans_due():
            self._spawn(self._replan(request))

    def _spawn(self, coro: Awaitable[Any]) -> None:
        handle = asyncio.ensure_future(coro)
        self._handles.add(handle)
        handle.add_done_callback(self._done)

    def _done(self, handle: asyncio.Task[Any]) -> None:
        self._handles.discard(handle)
        if not handle.cancelled():
            handle.exception()  # retrieved: effects report their own failures
        self._wake()

    async def _replan(self, request: ReplanRequest) -> None:
        """Ask the replanner; the core validates and adds what it answers."""
        assert self.replanner is not None
        fragment, error = await ask_replanner(self.replanner, request)
        now = self._now()
        self.core.replan_done(request, fragment, error, now)
        self._dispatch(now)

    async def _apply_effect(self, task: Task) -> None:
        """Apply the kind's effect once, keyed by ``"<run>:<task>"``.

        With a store: the completion is written first, then the effect is recorded as
        begun, applied with its key, and recorded as applied together with its ``effect``
        event (one transaction). A failure anywhere (the effect raised, the store did) is
        handed to the core, which says when to try again with the same key; the effect's
        target must accept that key as an idempotency key.
        """
        key = f"{self.run_id}:{task.id}"
        store = self._writes.store
        try:
            if store is not None:
                await self._writes.flush()
                record = await store.effect_begin(self.run_id, task.id, key, self._now())
                if record.state == "applied":  # applied and logged by an earlier process
                    self.core.effect_applied(task.id, self._now())
                    return
            outcome = await maybe_await(self.effects[task.kind](task, key))
            entry = self._effect_events.get(task.id)
            if entry is None:
                entry = self._log.append(self._now(), task, E.EFFECT, {"key": key})
                self._effect_events[task.id] = entry
                self._writes.apart(entry.seq)  # written with the effect's record, below
            if store is not None:
                await store.effect_done(self.run_id, task.id, jsonable(outcome),
                                        self._now(), entry)
        except Exception as exc:
            error = redact(f"{type(exc).__name__}: {exc}")
            retry_at = self.core.effect_failed(task.id, error, self._now())
            self._wake()
            self._log.log(task, E.EFFECT_FAILED,
                          {"key": key, "error": error, "retry_at": retry_at})
            return
        self.core.effect_applied(task.id, self._now())
