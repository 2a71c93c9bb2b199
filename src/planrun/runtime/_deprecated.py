"""The names of the engine worker processes ran on before DBOS, kept for one release.

``Coordinator`` is now a supervisor whose attempts go to DBOS queues
(:class:`~planrun.runtime.DBOSAttempts`); ``WorkerProcess`` is a
:class:`~planrun.runtime.DBOSWorker`. Both warn with a :class:`DeprecationWarning`.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from planrun.core import Registry, RunResult, Task, UsageError, WorkerSpec
from planrun.runtime._dbos_attempts import DBOSAttempts
from planrun.runtime._dbos_worker import DBOSWorker
from planrun.runtime._supervisor import Supervisor
from planrun.stores.base import Store

__all__ = ["Coordinator", "Mode", "WorkerProcess"]

Mode = Literal["push", "peer"]

PEER_REFUSED = ("mode='peer' is not offered: worker processes take attempts from DBOS queues "
                "(the articles' peer protocol is shown by planrun compare)")


def _url_of(store: Store, url: str | None) -> str:
    """The database URL of ``store`` (a SQLite file or a PostgreSQL server)."""
    if url is not None:
        return url
    found = getattr(store, "url", None)
    if isinstance(found, str):
        return found
    path = getattr(store, "path", None)
    if path is not None:
        return f"sqlite:///{path}"
    raise UsageError("runs on worker processes need a database both sides reach: pass url=")


class WorkerProcess(DBOSWorker):
    """Deprecated: use :class:`~planrun.runtime.DBOSWorker` (``capacity`` is its
    ``concurrency``; ``mode``, ``poll``, ``backoff`` and ``clock`` have no part any more)."""

    def __init__(self, registry: Registry, store: Store, *, url: str | None = None,
                 name: str | None = None, kinds: Sequence[str] | None = None,
                 capacity: int = 4, mode: Mode = "push", lease_s: float = 30.0,
                 poll: float = 0.2, backoff: Any = None,
                 extras: Mapping[str, Any] | None = None, idle_exit: float | None = None,
                 timeout: float | None = None, clock: Any = None,
                 extras_for: Callable[[str], Awaitable[Mapping[str, Any]]] | None = None,
                 ) -> None:
        warnings.warn("WorkerProcess is deprecated: use planrun.runtime.DBOSWorker (worker "
                      "processes run on DBOS)", DeprecationWarning, stacklevel=2)
        if mode == "peer":
            raise UsageError(PEER_REFUSED)
        super().__init__(registry, store, _url_of(store, url), name=name, kinds=kinds,
                         concurrency=capacity, lease_s=lease_s, idle_exit=idle_exit,
                         timeout=timeout, extras=extras, extras_for=extras_for)


class Coordinator:
    """Deprecated: run a :class:`~planrun.Supervisor` over
    ``DBOSAttempts(url).app(app)`` (``planrun run --workers external`` does).

    Takes the arguments it took (``stale_after`` is the workers' lease; the others are the
    supervisor's) and carries the run out the new way: attempts on DBOS queues, every
    decision in this process's core.
    """

    def __init__(self, registry: Registry, store: Store, *, url: str | None = None,
                 run_id: str | None = None, mode: Mode = "push", stale_after: float = 30.0,
                 effects: Mapping[str, Any] | None = None, poll: float = 0.2,
                 goal: str = "", meta: Mapping[str, Any] | None = None,
                 in_flight: int = 32, **options: Any) -> None:
        warnings.warn("Coordinator is deprecated: run a Supervisor over "
                      "planrun.runtime.DBOSAttempts(url).app(app) (worker processes run on "
                      "DBOS)", DeprecationWarning, stacklevel=2)
        if mode == "peer":
            raise UsageError(PEER_REFUSED)
        self.registry = registry
        self.store = store
        self.url = _url_of(store, url)
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.stale_after = stale_after
        self.effects = dict(effects or {})
        self.goal = goal
        self.meta = dict(meta or {})
        self.in_flight = in_flight
        self.options = options

    def _supervisor(self, attempts: DBOSAttempts) -> Supervisor:
        worker = WorkerSpec("dbos", None, self.in_flight)
        app = attempts.app(_Plain(self.registry, [worker]))
        return Supervisor(app.registry, app.workers, store=self.store, run_id=self.run_id,
                          stale_after=self.stale_after, effects=self.effects, goal=self.goal,
                          meta={**self.meta, "workers": "external",
                                "stale_after": self.stale_after}, **self.options)

    async def arun(self, tasks: Iterable[Task]) -> RunResult:
        """Run ``tasks`` with their attempts done by worker processes."""
        attempts = DBOSAttempts(self.url, self.store, in_flight=self.in_flight,
                                lease_s=self.stale_after)
        try:
            sup = self._supervisor(attempts)
            sup.add_tasks(list(tasks))
            return await sup.arun()
        finally:
            await attempts.aclose()

    async def aresume(self) -> RunResult:
        """Carry the stored run on."""
        attempts = DBOSAttempts(self.url, self.store, in_flight=self.in_flight,
                                lease_s=self.stale_after)
        try:
            return await self._supervisor(attempts).aresume()
        finally:
            await attempts.aclose()


@dataclass
class _Plain:
    """What :meth:`DBOSAttempts.app` needs of an app: its registry and workers."""

    registry: Registry
    workers: list[WorkerSpec]
