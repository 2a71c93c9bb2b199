"""Leases: how long a running attempt is believed alive without a word from it.

:class:`Leases` owns the lease length (``stale_after``) and the heap of lease ends. A start
is granted a lease, a heartbeat extends it, and :meth:`Leases.expired` hands out the running
tasks whose lease ran out (what that means, a reclaim or a death, is the failure policy's:
:meth:`~planrun.core.scheduling._failing.FailurePolicy.expire`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from planrun.core._task import Task
from planrun.core.scheduling._common import _RUNNING

__all__ = ["Leases"]


class Leases:
    """The lease ends of the running attempts of one run."""

    def __init__(self, tasks: dict[str, Task], stale_after: float) -> None:
        self.tasks = tasks
        self.stale_after = stale_after
        """Lease length, from start (or the last heartbeat)."""
        self.heap: list[tuple[float, str, int]] = []
        """``(lease end, id, token)``; an entry a heartbeat renewed stays, and is skipped."""

    def grant(self, task_id: str, token: int, now: float) -> float:
        """The lease of an attempt (``token``) of ``task_id`` that starts at ``now``."""
        lease = now + self.stale_after
        heapq.heappush(self.heap, (lease, task_id, token))
        return lease

    def heartbeat(self, task_id: str, token: int, now: float) -> None:
        """The attempt ``token`` of ``task_id`` is alive: extend its lease."""
        task = self.tasks[task_id]
        if task.token != token or task.status is not _RUNNING:
            return
        lease = now + self.stale_after
        self.tasks[task_id] = task.evolve(lease=lease)
        heapq.heappush(self.heap, (lease, task_id, token))

    def expired(self, now: float) -> Iterator[Task]:
        """The running tasks whose lease ran out by ``now``."""
        heap = self.heap
        while heap and heap[0][0] <= now:
            _, tid, token = heapq.heappop(heap)
            task = self.tasks[tid]
            if task.token != token or task.status is not _RUNNING:
                continue
            if task.lease is not None and task.lease > now:
                continue  # renewed; a newer heap entry stands for it
            yield task

    def next_end(self) -> float | None:
        """The earliest lease end still in the heap (None: none)."""
        return self.heap[0][0] if self.heap else None
