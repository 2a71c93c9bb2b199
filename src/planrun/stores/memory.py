"""The in-memory store: the same interface over dicts, for tests and simulation.

It keeps the same rows the SQL stores keep (JSON columns encoded), so a value that could
not be stored in a database fails here too, and a record read back is a copy, never the
caller's object. Every call is recorded in :attr:`InMemoryStore.calls`, the way
procrastinate's ``InMemoryConnector`` records its queries, so a test can assert on what the
supervisor asked of its store. Nothing awaits inside a call, so each is atomic on its loop.
"""

from __future__ import annotations

from planrun.stores._memory_rows import (
    Call,
)
from planrun.stores._memory_shared import _MemoryShared

__all__ = ["Call", "InMemoryStore"]


class InMemoryStore(_MemoryShared):
    """A :class:`~planrun.stores.base.Store` over dicts; nothing survives the process."""

    url = "memory://"
