"""Keep the garbage collector's full passes off the heap a run starts with.

A run allocates a record per transition, so the collector runs its full passes (the oldest
generation) several times in a large run, and each walks the whole heap: the objects made
when the program imported its modules and built its tasks, which a run never frees, and
every task record. While a run goes on, :func:`frozen_heap` moves the objects the process
has when the run begins to the collector's permanent generation (:func:`gc.freeze`), so
its passes walk only what the run made, and makes every pass rarer: the young generation
is collected every :data:`YOUNG_EVERY` allocations at least (instead of 700: most records a
run makes are replaced within moments, and one freed before a pass costs the pass nothing),
and the full passes come once every :data:`FULL_EVERY` passes of the middle generation
instead of every 10 (the first and third thresholds of :func:`gc.set_threshold`); cycles of
short-lived objects are still collected within the run. When the last run of the process
ends both are undone (:func:`gc.unfreeze`, the thresholds it had, unless the program changed
them meanwhile) and everything is collected as before.

What this changes: a reference cycle among objects that existed before the run, or that
lived long enough to reach the oldest generation, dropped during the run, is collected
later (at a rarer full pass, or after the run) than it would be: nothing is lost, its
memory comes back later. Nothing is frozen when the collector is disabled or when the program
froze objects itself before the run (its own :func:`gc.freeze` is left as it is; one it
calls while a run goes on is undone with the run's). ``PLANRUN_GC_FREEZE=0``
in the environment, or ``Supervisor.freeze_heap = False``, turns it off.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ENABLED", "FULL_EVERY", "YOUNG_EVERY", "frozen_heap"]

ENABLED = os.environ.get("PLANRUN_GC_FREEZE", "1").strip().lower() not in {"0", "false", "no",
                                                                            "off"}
"""Whether runs freeze the heap they start with (``PLANRUN_GC_FREEZE=0`` turns it off)."""

FULL_EVERY = 100
"""Passes of the middle generation between two full passes while a run goes on."""

YOUNG_EVERY = 10_000
"""Allocations (less deallocations) between two passes of the young generation while a run
goes on, at least."""

_lock = threading.Lock()
_runs = 0
"""Runs in progress that froze the heap (the last one to end unfreezes it)."""
_thresholds: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None
"""(the thresholds before the first run, the ones it set)."""


@contextmanager
def frozen_heap(enabled: bool = True) -> Iterator[bool]:
    """Freeze the heap for the duration of the block; yields whether it did."""
    global _runs, _thresholds
    with _lock:
        froze = enabled and (_runs > 0 or (gc.isenabled() and gc.get_freeze_count() == 0))
        if froze:
            if _runs == 0:
                gc.freeze()
                before = gc.get_threshold()
                during = (max(before[0], YOUNG_EVERY), before[1], max(before[2], FULL_EVERY))
                gc.set_threshold(*during)
                _thresholds = (before, during)
            _runs += 1
    try:
        yield froze
    finally:
        if froze:
            with _lock:
                _runs -= 1
                if _runs == 0:
                    gc.unfreeze()
                    if _thresholds is not None and gc.get_threshold() == _thresholds[1]:
                        gc.set_threshold(*_thresholds[0])
                    _thresholds = None
