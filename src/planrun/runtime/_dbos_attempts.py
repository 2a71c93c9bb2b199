"""The process running a plan hands its attempts to worker processes through DBOS.

The run itself is supervised here as any durable run is (the scheduling core decides; the
store keeps the record, so ``planrun status``, ``approve`` and ``resume`` work from any
machine). Only the attempts go elsewhere: the supervisor's one worker is a pool of
``in_flight`` slots whose handler puts the attempt on its kind's DBOS queue
(``planrun.<kind>``) as the workflow ``planrun.attempt`` with the id
``<run>:<task>:<token>`` and waits for its outcome. Whatever a worker process sends back
goes to the core as an in-process attempt's would: a result fenced by its token, a failure
as it was classified where it ran. Lease: an attempt waiting on its queue is kept; one a
process holds is kept while that process heartbeats; the core reclaims the rest after
``stale_after``, and the reclaimed attempt's late outcome is refused by its token.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

from planrun.core import Registry, StoreError, TaskContext, UsageError, WorkerSpec
from planrun.runtime._dbos_wire import (
    ATTEMPT_WORKFLOW,
    app_version,
    application_name,
    attempt_id,
    call_of,
    dbos_schema,
    dbos_url,
    queue_name,
    take_outcome,
)
from planrun.runtime._dbos_worker import import_dbos
from planrun.runtime._patience import patiently
from planrun.stores.base import Store

__all__ = ["DBOSAttempts"]

log = logging.getLogger("planrun.dbos")

class _WithRegistry(Protocol):
    registry: Registry


AppT = TypeVar("AppT", bound=_WithRegistry)

_FINAL = ["SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"]
_WAITING = ("ENQUEUED", "DELAYED")


@dataclass
class _InFlight:
    ctx: TaskContext
    done: asyncio.Future[Mapping[str, Any]]
    beat: float = float("-inf")
    """The last heartbeat of the process holding it that was passed on to the core."""


@dataclass
class _Pending:
    wid: str
    kind: str
    call: dict[str, Any]
    flight: _InFlight = field(repr=False)


class DBOSAttempts:
    """Attempts carried out by worker processes (``planrun worker``) through DBOS queues.

    Args:
        url: the database of the run's store and of DBOS (PostgreSQL, or a SQLite file
            whose DBOS tables live in a file beside it).
        store: the run's store, opened, where the workers' heartbeats are read (default:
            one opened here from ``url`` when first needed, closed by :meth:`aclose`).
        app_name: the DBOS application the queues belong to (the workers' ``app_name``).
        in_flight: attempts out at once, waiting on a queue or being done.
        poll: seconds between two looks for finished attempts while any is out.
        lease_s: how often the holders' heartbeats are passed on (three times a lease).
        patience: seconds an attempt that cannot be put on its queue (the database is away)
            is tried again, backing off as :data:`~planrun.core.scheduling.STORE_PATIENCE`
            says, before it fails as a store error.
    """

    def __init__(self, url: str, store: Store | None = None, *, app_name: str = "planrun",
                 in_flight: int = 32, poll: float = 0.005, lease_s: float = 30.0,
                 patience: float = 120.0) -> None:
        if in_flight < 1:
            raise UsageError("in_flight must be >= 1")
        dbos = import_dbos()
        system_url = dbos_url(url)
        try:
            schema = dbos_schema(url)
            dbos.DBOS.migrate(system_url, schema=schema)
            self.client = dbos.DBOSClient(system_database_url=system_url,
                                          dbos_system_schema=schema,
                                          application_name=application_name(app_name))
        except Exception as exc:
            raise StoreError(f"DBOS cannot use {url}: {type(exc).__name__}: {exc}") from exc
        self.url = url
        self.store = store
        self._own_store = store is None
        self.app_name = application_name(app_name)
        self.in_flight = in_flight
        self.poll = poll
        self.lease_s = lease_s
        self.patience = patience
        self._flights: dict[str, _InFlight] = {}
        self._pending: list[_Pending] = []
        self._flushing: asyncio.Task[None] | None = None
        self._collecting: asyncio.Task[None] | None = None
        self.enqueued = 0

    def app(self, app: AppT) -> AppT:
        """``app`` (a :class:`planrun.App`) with its attempts carried out by worker
        processes: its one worker is ``in_flight`` slots for every kind, and its kinds keep
        their models and rules here while their handlers and time limits stay with the
        processes that do them. Run it with ``stale_after`` set to the workers' lease."""
        registry = Registry(dataclasses.replace(spec, handler=None, timeout_s=None)
                            for spec in app.registry)
        worker = WorkerSpec("dbos", None, self.in_flight,
                            handlers={kind: self._attempt for kind in registry.names})
        replaced: AppT = dataclasses.replace(cast(Any, app), registry=registry,
                                             workers=[worker])
        return replaced

    async def aclose(self) -> None:
        """Let go of the DBOS client (attempts out stay on their queues) and of the store
        opened here."""
        self.client.destroy()
        if self._own_store and self.store is not None:
            await self.store.close()
            self.store = None

    async def _the_store(self) -> Store:
        if self.store is None:
            from planrun.stores import open_store

            store = open_store(self.url)
            await store.open()
            self.store = store
        return self.store

    # ---- one attempt --------------------------------------------------------------------

    async def _attempt(self, payload: Any, ctx: TaskContext) -> Any:
        loop = asyncio.get_running_loop()
        wid = attempt_id(ctx.run_id, ctx.task_id, ctx.attempt)
        flight = _InFlight(ctx, loop.create_future())
        self._flights[wid] = flight
        self._pending.append(_Pending(wid, ctx.kind, call_of(ctx), flight))
        if self._flushing is None:
            self._flushing = asyncio.ensure_future(self._flush())
        try:
            outcome = await flight.done
        except asyncio.CancelledError:
            self._flights.pop(wid, None)
            with contextlib.suppress(Exception):  # reclaimed or stopped: take it back
                await asyncio.to_thread(self.client.cancel_workflow, wid)
            raise
        return take_outcome(outcome, ctx)

    async def _flush(self) -> None:
        """Put every attempt asked for in this pass of the loop on its queue, in one
        transaction; start collecting."""
        await asyncio.sleep(0)
        batch, self._pending = self._pending, []
        self._flushing = None
        try:
            await self._patiently(batch)
        except Exception as exc:
            for item in batch:
                self._flights.pop(item.wid, None)
                if not item.flight.done.done():
                    item.flight.done.set_exception(
                        StoreError(f"cannot enqueue {item.wid}: {type(exc).__name__}: {exc}"))
            return
        self.enqueued += len(batch)
        if self._collecting is None or self._collecting.done():
            self._collecting = asyncio.ensure_future(self._collect())

    async def _patiently(self, batch: list[_Pending]) -> None:
        """Enqueue ``batch``, again while the database is away, for ``patience`` s."""
        loop = asyncio.get_running_loop()

        def failed(tries: int, exc: Exception) -> None:
            first = (str(exc).splitlines() or [""])[0][:200]
            log.warning("cannot enqueue %d attempt(s) (%s: %s); retrying",
                        len(batch), type(exc).__name__, first)

        await patiently(lambda: asyncio.to_thread(self._enqueue, batch),
                        patience=self.patience, now=loop.time, failed=failed)

    def _enqueue(self, batch: list[_Pending]) -> None:
        import sqlalchemy as sa

        engine: sa.Engine = self.client._sys_db.engine  # the client's own pool
        with engine.begin() as conn:
            for item in batch:
                self.client.enqueue_in_transaction(conn, {
                    "workflow_name": ATTEMPT_WORKFLOW, "queue_name": queue_name(item.kind),
                    "workflow_id": item.wid,
                    "app_version": app_version(self.app_name)}, item.call)

    # ---- outcomes and heartbeats ----------------------------------------------------------

    async def _collect(self) -> None:
        """While attempts are out: take the finished ones, pass on the holders' heartbeats."""
        loop = asyncio.get_running_loop()
        relay_at = loop.time() + self.lease_s / 3
        while self._flights:
            try:
                finished = await asyncio.to_thread(
                    self.client.list_workflows, workflow_ids=list(self._flights),
                    status=_FINAL, load_input=False)
                for status in finished:
                    self._settle(status)
                if loop.time() >= relay_at:
                    await self._relay()
                    relay_at = loop.time() + self.lease_s / 3
            except Exception as exc:  # the database is away: look again
                log.warning("attempts out: cannot read DBOS (%s); retrying", exc)
                finished = []
                await asyncio.sleep(min(1.0, self.lease_s / 3))
            if not finished:
                await asyncio.sleep(self.poll)

    def _settle(self, status: Any) -> None:
        flight = self._flights.pop(status.workflow_id, None)
        if flight is None or flight.done.done():
            return
        if status.status == "SUCCESS" and isinstance(status.output, Mapping):
            flight.done.set_result(status.output)
        else:  # the workflow itself failed or was cancelled: a transient failure
            flight.done.set_result({"failure": {
                "error": f"WorkerError: attempt {status.workflow_id} ended {status.status}"
                         + (f": {status.error}" if status.error else ""),
                "error_class": "transient", "retry_after": None, "budget": False}})

    async def _relay(self) -> None:
        """Tell the core which attempts are alive: waiting on a queue, or held by a process
        that heartbeat since the last look. It reclaims the others after their lease."""
        ids = list(self._flights)
        statuses = await asyncio.to_thread(self.client.list_workflows, workflow_ids=ids,
                                           load_input=False, load_output=False)
        beats: dict[str, dict[str, float]] = {}
        store = await self._the_store()
        for run_id in {f.ctx.run_id for f in self._flights.values()}:
            with contextlib.suppress(StoreError):
                beats[run_id] = {str(w["name"]): float(w["last_heartbeat"])
                                 for w in await store.list_workers(run_id)}
        for status in statuses:
            flight = self._flights.get(status.workflow_id)
            if flight is None:
                continue
            if status.status in _WAITING:
                flight.ctx.heartbeat()
                continue
            beat = beats.get(flight.ctx.run_id, {}).get(str(status.executor_id))
            if status.status == "PENDING" and beat is not None and beat > flight.beat:
                flight.beat = beat
                flight.ctx.heartbeat()

