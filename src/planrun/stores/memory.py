"""The in-memory store: the SQL store over a SQLite database in this process's memory.

It runs the same queries over the same schema as a SQLite file, so it refuses, keeps and
returns exactly what the databases do, and a record read back is a copy, never the
caller's object. Transactions run on the event loop's thread (nothing awaits inside one,
and a :class:`planrun.runtime.VirtualClock` does not advance while one runs). Every statement is
recorded in :attr:`InMemoryStore.calls`, the way procrastinate's ``InMemoryConnector``
records its queries, so a test can assert on what the run asked of its store. The
database lives as long as the object: :meth:`~InMemoryStore.close` keeps it.
"""

from __future__ import annotations

from typing import Any

from planrun.stores._sql import SQLStore
from planrun.stores.sqlite import Call, SQLiteConnector

__all__ = ["Call", "InMemoryStore"]


class InMemoryStore(SQLStore):
    """A :class:`~planrun.stores.base.Store` in memory; nothing survives the process."""

    connector: SQLiteConnector

    def __init__(self) -> None:
        connector = SQLiteConnector(":memory:", inline=True, record=True)
        connector.url = "memory://"
        super().__init__(connector)
        # Usable at once, opened or not: a test may hand it to a run that opens it.
        connector.open_here(self._migrate)
        assert connector.calls is not None
        connector.calls.clear()  # the schema's statements are not the run's

    def __repr__(self) -> str:
        return "InMemoryStore()"

    @property
    def calls(self) -> list[Call]:
        """Every statement run, oldest first: the query's name and its arguments."""
        assert self.connector.calls is not None
        return self.connector.calls

    def calls_to(self, name: str) -> list[dict[str, Any]]:
        """The arguments of every statement of query ``name`` run so far."""
        return [args for called, args in self.calls if called == name]
