"""A supervised run's ledger, and where each change the core decides goes from there."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from planrun.core import Event, Ledger, Task
from planrun.core import EventName as E
from planrun.core.scheduling import Scheduler

__all__ = ["RunLog"]

_REJECTED, _RECLAIMED, _WAITING, _STARTED = E.REJECTED, E.RECLAIMED, E.WAITING, E.STARTED


class RunLog:
    """The run's ledger, and the core's sink: each change it decides is appended to the
    ledger (a durable run's next batch is cut from it), handed to the listener, and told
    to the parts it concerns (a reclaim to the attempts in flight, a waiting task to the
    store's writes and the supervisor's loop).

    Args:
        on_event: called with each ledger event and the task record after it, or None.
        now: the run's clock.
    """

    def __init__(self, on_event: Callable[[Event, Task], None] | None,
                 now: Callable[[], float]) -> None:
        self.ledger = Ledger()
        self.on_event = on_event
        self._now = now
        self._core: Scheduler | None = None
        self._noted: Callable[[str], None] = _nothing
        self._reclaimed: Callable[[Task], None] = _nothing
        self._started: Callable[[Task], None] = _nothing
        self._wake: Callable[[], None] = _nothing

    def bind(self, core: Scheduler, *, noted: Callable[[str], None],
             reclaimed: Callable[[Task], None], started: Callable[[Task], None],
             wake: Callable[[], None]) -> None:
        """The core this log is the sink of, and whom its changes are told to (all made
        after the log, which the core is given): ``noted(event)`` the store's writes,
        ``reclaimed(task)`` and ``started(task)`` the attempts in flight, ``wake()`` the
        supervisor's loop."""
        self._core, self._noted, self._wake = core, noted, wake
        self._reclaimed, self._started = reclaimed, started

    def choose_sink(self, durable: bool) -> None:
        """With no listener nobody reads an event as it happens: the core's common changes
        are noted straight into the ledger (a durable run's batches are cut from it), and
        the others noted by the ledger's sink (not ``durable``) or :meth:`record`. A
        listener gets each change through :meth:`record`."""
        core = self._core
        assert core is not None
        if self.on_event is None:
            core.use_log(self.ledger.raw_appender())
            core.use_sink(self.record if durable
                          else self.ledger.change_sink(self._now, self._reclaimed))
        else:
            core.use_sink(self.record)
            core.use_log(None)

    def record(self, task: Task, event: str, worker: str | None,
               detail: Mapping[str, Any] | None, token: int) -> None:
        """The core's sink: append the event (a durable run's next batch takes it, with the
        record as it is then), hand it to the listener."""
        attempt = token if event == _REJECTED else task.token
        if self.on_event is None:
            # Nobody reads the event now: note it, its object is built if the log is read
            # (a durable run's batches are cut from the ledger).
            self.ledger.note(self._now(), task.id, event, worker, attempt, detail)
            self._noted(event)
            if event == _WAITING:
                self._wake()  # the loop reads the store for decisions while a task waits
            elif event == _RECLAIMED:
                self._reclaimed(task)
            return
        entry = self.ledger.append(self._now(), task.id, event, worker=worker,
                                   attempt=attempt, detail=detail)
        self._noted(event)
        if event == _RECLAIMED:
            self._reclaimed(task)
        self.on_event(entry, task)
        if event == _WAITING:
            self._wake()
        elif event == _STARTED:
            self._started(task)  # its attempt runs in the context the listener left

    def log(self, task: Task, event: str, detail: Mapping[str, Any]) -> None:
        """An event that changes no record (it still goes to the store with the record)."""
        assert self._core is not None
        self.record(self._core.tasks.get(task.id, task), event, None, detail, task.token)

    def append(self, at: float, task: Task, event: str, detail: Mapping[str, Any]) -> Event:
        """Append an event written apart from the batches (an effect's), for the listener
        too."""
        entry = self.ledger.append(at, task.id, event, attempt=task.token, detail=detail)
        if self.on_event is not None:
            self.on_event(entry, task)
        return entry


def _nothing(*_: object) -> None:
    return None
