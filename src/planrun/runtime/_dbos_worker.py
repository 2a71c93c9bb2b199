"""A worker process on DBOS: it serves the DBOS queues of the kinds it does.

Each attempt is a DBOS workflow (``planrun.attempt``) taken from its kind's queue; the
process runs the kind's handler and returns the outcome (see :mod:`._dbos_wire`). It says
it is alive by a heartbeat per run in the run's store, which the process running the plan
reads to keep the leases of the attempts this process holds. It decides nothing: retries,
deaths, approvals, spawns and effects are the core's, in the process running the plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

from planrun.core import Registry, StoreError, Task, TaskContext, UsageError, redact
from planrun.core.scheduling import TierChoice, check_policies, timed_out
from planrun.obs import tracing
from planrun.runtime._attempt import run_attempt
from planrun.runtime._dbos_wire import (
    ATTEMPT_WORKFLOW,
    application_name,
    dbos_settings,
    failed,
    queue_name,
    succeeded,
)
from planrun.stores.base import Store

__all__ = ["DBOSWorker", "import_dbos"]

log = logging.getLogger("planrun.dbos")

_SERVING: DBOSWorker | None = None


class OneLineTracebacks(logging.Filter):
    """Shortens a traceback in a DBOS log record to its last line: while the database is
    away, each of DBOS's background threads logs one per retry, and a worker's log should
    say what failed, once a line."""

    MARK = "Traceback (most recent call last)"

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.MARK in message:
            head = message.split(self.MARK, 1)[0].rstrip(": \n")
            last = [line.strip() for line in message.splitlines() if line.strip()][-1]
            record.msg, record.args = f"{head}: {last}", None
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: " + (
                str(exc).splitlines() or [""])[0]
            record.args, record.exc_info, record.exc_text = None, None, None
        return True

    @classmethod
    def install(cls) -> None:
        """On DBOS's logger, once."""
        logger = logging.getLogger("dbos")
        if not any(isinstance(f, cls) for f in logger.filters):
            logger.addFilter(cls())
"""The worker this process serves attempts for (DBOS runs one application per process)."""


def import_dbos() -> Any:
    """The ``dbos`` package, or a one-line error saying how to install it."""
    try:
        import dbos
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise UsageError('running on DBOS needs the [dbos] extra: pip install "planrun[dbos]"'
                         ) from exc
    return dbos


_registered = False

_QUEUE_LOOK_S = 1.1
"""How long DBOS may take to start serving a queue registered after its launch."""


def register_workflows() -> None:
    """Register planrun's attempt workflow with DBOS (once per process, before launch).

    An application that runs its own DBOS instance calls this before ``DBOS.launch()``
    and serves the queues of its kinds with :class:`DBOSWorker` (``launch=False``).
    """
    global _registered
    if _registered:
        return
    dbos = import_dbos()

    @dbos.DBOS.workflow(name=ATTEMPT_WORKFLOW)  # type: ignore[untyped-decorator]
    async def planrun_attempt(call: dict[str, Any]) -> dict[str, Any]:
        worker = _SERVING
        if worker is None:
            return failed(RuntimeError("this process serves no planrun worker"))
        return await worker.attempt(call)

    _registered = True


class DBOSWorker:
    """Does the attempts of a run's tasks that DBOS queues give this process.

    Args:
        registry: the kinds (with their handlers).
        store: the runs' store (heartbeats, and the run's limits for ``extras_for``).
        url: the database URL the runs use (DBOS keeps its queues beside the store).
        name: this process's name, unique among the workers (default ``host-pid``); it is
            also its DBOS executor id.
        kinds: the kinds it serves (default: all of the registry).
        concurrency: attempts run at once by this process.
        lease_s: the lease a run gives an attempt; the heartbeat comes three times in it.
        idle_exit: stop after this many seconds with no attempt (None: never).
        timeout: seconds one attempt may take when its kind says nothing.
        extras, extras_for: given to handlers (``extras_for(run_id)`` per run: its model,
            limiter and budget).
        app_name: the DBOS application these queues belong to; every process of a run uses
            the same name, and another application's queues of the same names are refused.
        poll: seconds between two looks at the queues.
        launch: launch DBOS here (False: the application's own DBOS instance, launched by
            it after :func:`register_workflows`).
    """

    def __init__(
        self,
        registry: Registry,
        store: Store,
        url: str,
        *,
        name: str | None = None,
        kinds: Sequence[str] | None = None,
        concurrency: int = 4,
        lease_s: float = 30.0,
        idle_exit: float | None = None,
        timeout: float | None = None,
        extras: Mapping[str, Any] | None = None,
        extras_for: Callable[[str], Awaitable[Mapping[str, Any]]] | None = None,
        app_name: str = "planrun",
        poll: float = 0.01,
        launch: bool = True,
    ) -> None:
        self.registry = registry
        self.store = store
        self.url = url
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.kinds = list(kinds or registry.names)
        unknown = [k for k in self.kinds if k not in registry]
        if unknown:
            raise UsageError(f"unknown kind(s) {unknown}; the app has {registry.names}")
        if concurrency < 1:
            raise UsageError("concurrency must be >= 1")
        if not lease_s > 0:
            raise UsageError(f"lease_s must be > 0, got {lease_s}")
        check_policies(timeout=timeout)
        self.concurrency = concurrency
        self.lease_s = lease_s
        self.idle_exit = idle_exit
        self.timeout = timeout
        self.extras = dict(extras or {})
        self.extras_for = extras_for
        self.app_name = application_name(app_name)
        self.poll = poll
        self.launch = launch
        self.done = 0
        self.failed = 0
        self._slots = asyncio.Semaphore(concurrency)
        self._held: dict[str, int] = {}  # run id -> attempts held
        self._registered: set[str] = set()
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()
        """Set once this process serves its queues."""
        self._last_busy = time.monotonic()

    def stop(self) -> None:
        """Finish the attempts in hand and stop serving."""
        self._stop.set()

    async def arun(self) -> None:
        """Serve the queues until stopped (or idle past ``idle_exit``)."""
        global _SERVING
        dbos = import_dbos()
        register_workflows()
        if self.launch:
            OneLineTracebacks.install()
            dbos.DBOS(config={"executor_id": self.name, "log_level": "WARNING",
                              **dbos_settings(self.url, self.app_name)})
            dbos.DBOS.listen_queues([queue_name(k) for k in self.kinds])
        _SERVING = self
        try:
            if self.launch:
                try:
                    dbos.DBOS.launch()
                except Exception as exc:
                    raise StoreError(f"DBOS cannot start on {redact(self.url)}: "
                                     f"{type(exc).__name__}: {exc}") from exc
                # Another application's queues of the same names: refused before any of
                # this one's is registered (DBOS keeps a queue to the application that
                # registered it first, and would refuse them one by one).
                taken: dict[str, str] = {}
                for kind in self.kinds:
                    found = await dbos.DBOS.retrieve_queue_async(queue_name(kind))
                    owner = getattr(found, "application_name", None)
                    if owner is not None and owner != self.app_name:
                        taken[queue_name(kind)] = owner
                if taken:
                    raise UsageError(
                        f"queue(s) {', '.join(taken)} belong to application(s) "
                        f"{', '.join(sorted(set(taken.values())))} in this database, not to "
                        f"{self.app_name}: give this app's kinds other names, or give it a "
                        "database of its own")
            for kind in self.kinds:
                try:
                    await dbos.DBOS.register_queue_async(
                        queue_name(kind), worker_concurrency=self.concurrency,
                        polling_interval_sec=self.poll, on_conflict="always_update")
                except Exception as exc:
                    raise UsageError(f"queue {queue_name(kind)!r}: {exc}") from exc
            # DBOS starts serving a queue registered after its launch at its next look for
            # new queues (once a second).
            await asyncio.sleep(_QUEUE_LOOK_S)
            self.ready.set()
            await self._beat_until_stopped()
        finally:
            _SERVING = None
            if self.launch:
                dbos.DBOS.destroy()

    async def lacking(self) -> list[str]:
        """What running runs need that this process does not do, one line per run (their
        attempts of those kinds wait on their queues for a process that does them)."""
        lines = []
        for run in await self.store.list_runs():
            if run.status != "running":
                continue
            state = await self.store.load_tasks(run.id)
            if state.run.meta.get("workers") != "external":
                continue
            needed = {t.kind for t in state.tasks if not t.finished}
            missing = sorted(needed - set(self.kinds))
            if missing:
                lines.append(f"run {run.id} needs kind(s) {', '.join(missing)}, which this "
                             "worker does not do; it serves the others")
        return lines

    async def _beat_until_stopped(self) -> None:
        """Heartbeat the runs whose attempts this process holds; stop when told or idle."""
        every = min(1.0, self.lease_s / 3)
        while not self._stop.is_set():
            now = time.time()
            for run_id in [r for r, n in self._held.items() if n > 0]:
                with contextlib.suppress(StoreError):
                    await self._beat(run_id, now)
            if self._held and any(self._held.values()):
                self._last_busy = time.monotonic()
            elif self.idle_exit is not None \
                    and time.monotonic() - self._last_busy > self.idle_exit:
                break
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(self._stop.wait(), every)
        while any(self._held.values()):  # what is in hand is finished
            await asyncio.sleep(0.05)

    async def _beat(self, run_id: str, now: float) -> None:
        if run_id not in self._registered:
            await self.store.register_worker(run_id, self.name, self.kinds, self.concurrency,
                                             now)
            self._registered.add(run_id)
        else:
            await self.store.heartbeat_worker(run_id, self.name, now)

    async def attempt(self, call: Mapping[str, Any]) -> dict[str, Any]:
        """Do one attempt; return its outcome (never raise: a failure is an outcome)."""
        run_id = str(call["run_id"])
        self._held[run_id] = self._held.get(run_id, 0) + 1
        try:
            if run_id not in self._registered:
                with contextlib.suppress(StoreError):
                    await self._beat(run_id, time.time())
            async with self._slots:
                outcome = await self._traced(call)
        finally:
            self._held[run_id] -= 1
            self._last_busy = time.monotonic()
        if "failure" in outcome:
            self.failed += 1
        else:
            self.done += 1
        return outcome

    async def _traced(self, call: Mapping[str, Any]) -> dict[str, Any]:
        """The attempt, in an attempt span of the run's trace when tracing is on."""
        if not tracing.enabled():
            return await self._run(call)
        task = Task(id=str(call["task_id"]), kind=str(call["kind"]), token=int(call["token"]),
                    attempts=int(call["token"]) - 1)
        outcome: dict[str, Any] = {}

        async def work() -> None:
            outcome.update(await self._run(call))
            failure = outcome.get("failure")
            tracing.attempt_outcome(task.evolve(
                error=failure["error"] if failure else None,
                error_class=failure["error_class"] if failure else None),
                "failed" if failure else "completed")

        await tracing.worker_attempt(work(), self.store, str(call["run_id"]), task, self.name)
        return outcome

    async def _run(self, call: Mapping[str, Any]) -> dict[str, Any]:
        kind = str(call["kind"])
        if kind not in self.registry:
            return failed(UsageError(f"worker {self.name} does not know kind {kind!r}"))
        spec = self.registry[kind]
        limit = spec.timeout_s if spec.timeout_s is not None else self.timeout
        task = Task(id=str(call["task_id"]), kind=kind, payload=dict(call["payload"]),
                    token=int(call["token"]), estimate_s=float(call.get("estimate_s", 1.0)))
        try:
            extras = self.extras
            if self.extras_for is not None:  # the run's own model, limiter and budget
                extras = {**extras, **await self.extras_for(str(call["run_id"]))}
            ctx = TaskContext(run_id=str(call["run_id"]), task_id=task.id, kind=kind,
                              attempt=task.token, worker=self.name, skill=1.0,
                              payload=task.payload, estimate_s=task.estimate_s,
                              inputs=dict(call.get("inputs") or {}), extras=extras,
                              tier=TierChoice.from_dict(call.get("tier")))
        except Exception as exc:
            return failed(exc)
        with _spent(extras.get("usage"), task.id) as used:
            try:
                result = await run_attempt(spec, spec.handler, task, ctx, limit)
            except asyncio.CancelledError:
                raise
            except (TimeoutError, asyncio.TimeoutError) as exc:
                return {**failed(timed_out(exc, limit)), **used}
            except Exception as exc:
                return {**failed(exc), **used}
            return {**succeeded(result, ctx.spawned), **used}


@contextlib.contextmanager
def _spent(meter: Any, task_id: str) -> Iterator[dict[str, Any]]:
    """The model requests task ``task_id`` makes in the block, kept as the outcome's
    ``usage`` (filled once the block ends) for the process running the run."""
    used: dict[str, Any] = {}
    if meter is None:
        yield used
        return
    key = f"task:{task_id}"
    records: list[dict[str, Any]] = []
    stop = meter.listen(lambda rec: records.append(rec.to_dict()) if key in rec.keys else None)
    used["usage"] = records
    try:
        yield used
    finally:
        stop()
