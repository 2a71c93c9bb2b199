"""The SQLite store: one file, one connection, one transaction per call.

The file runs in WAL mode with ``synchronous=NORMAL`` (a commit survives a process crash;
a power cut may lose the last few) and a busy timeout, so several processes can share it.
Every write starts with ``BEGIN IMMEDIATE``: it takes the write lock up front (waiting up to
the busy timeout for another process's), so a write that reads first (an effect, a
decision) is atomic across processes and never turns a reader into a writer that
deadlocks. Batches of rows go through statements of many rows each (see
:func:`_rows`), their values bound by position.

sqlite3 blocks, so calls run on one private thread (the connection's only user) and the
event loop stays free; ``inline=True`` runs them on the loop's thread instead, which keeps
a :class:`planrun.runtime.VirtualClock` from advancing while a query runs.
"""

from __future__ import annotations

from planrun.stores._sqlite_shared import _SQLiteShared

__all__ = ["SQLiteStore"]


class SQLiteStore(_SQLiteShared):
    """A :class:`~planrun.stores.base.Store` in one SQLite file.

    Args:
        path: the database file (created when absent), or ``":memory:"``.
        busy_timeout: seconds a call waits for another connection's write lock.
        inline: run queries on the event loop's thread instead of a private one.
    """

