"""What the one SQL store asks of a database: run a transaction of named statements.

The store's logic (:mod:`planrun.stores._sql`) is written once, as *transactions*: generator
functions that yield statements and get each one's :class:`Result` back::

    def tx() -> Tx[bool]:
        got = yield Query("renew_run", args)
        return got.rowcount == 1

A :class:`Connector` (SQLite, PostgreSQL) runs one in a transaction of the :data:`Mode`
asked for, on a connection of its own, and is the only place a driver is called: it
supplies connections, transactions, retries and the few differences of its dialect
(placeholders, how many rows go in one statement, how a JSON column reads back). Every
driver error leaves it as a :class:`~planrun.StoreError`. Because a transaction is a
function, not a block of awaits, SQLite runs a whole one on its thread in one hop and
PostgreSQL runs it again, whole, after a dropped connection.

The statements live in ``sql/queries.sql``, written once where the dialects agree, and
``sql/<dialect>.sql``, which adds the schema (types differ) and overrides a named query or
fragment where they do not. A query names a fragment as ``{name}`` (a ``-- name:`` entry of
either file); parameters are ``:name`` in both files.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal, Protocol, TypeVar

from planrun.stores.base import EVENT_ROW_KEYS, TASK_ROW_KEYS, Decoder

T = TypeVar("T")

Mode = Literal["write", "read", "single"]
"""How a connector runs a transaction: ``write``, one transaction that writes (it takes the
write lock first where the database has one); ``read``, one read-only snapshot; ``single``,
each statement on its own (autocommit: a call of one statement, one round trip)."""


@dataclass(frozen=True, slots=True)
class Query:
    """Named query ``name`` with its parameters."""

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RowShape:
    """The columns of a row of a many-row statement, and the dialect's fragment for one."""

    fragment: str
    columns: tuple[str, ...]


TASK_ROW = RowShape("task_row", TASK_ROW_KEYS)
EVENT_ROW = RowShape("event_row", EVENT_ROW_KEYS)


@dataclass(frozen=True, slots=True)
class Rows:
    """Named query ``name`` over many rows of ``shape``: ``values`` holds them one after
    another, flat (no tuple per row for the garbage collector to walk), ``run_id`` first."""

    name: str
    shape: RowShape
    values: list[Any]


@dataclass(frozen=True, slots=True)
class Script:
    """Named script ``name``: several statements without parameters (a migration)."""

    name: str


Statement = Query | Rows | Script


@dataclass(frozen=True, slots=True)
class Result:
    """What a statement returned: its rows (column -> value) and the rows it changed."""

    rows: list[dict[str, Any]]
    rowcount: int

    def first(self) -> dict[str, Any] | None:
        """The first row, or None."""
        return self.rows[0] if self.rows else None


NOTHING = Result([], 0)
"""The result of an empty statement (a fragment one dialect does not need)."""

Tx = Generator[Statement, Result, T]
"""A transaction: yields statements, gets their results, returns its value."""


class Connector(Protocol):
    """Connections, transactions and a dialect: all the SQL store needs of a database."""

    url: str
    """Where the database is, with any password masked."""
    decode: Decoder
    """Reads a JSON column as the driver returns it."""
    null_text: Any
    """Stands for NULL in a nullable text column of :class:`Rows` (see ``task_values``)."""
    null_real: Any
    """Stands for NULL in a nullable number column of :class:`Rows`."""

    async def open(self, migrate: Callable[[], Tx[None]]) -> None:
        """Connect and run ``migrate`` in a write transaction before any other call."""
        ...

    async def close(self) -> None:
        """Release the connections; calling it twice is harmless."""
        ...

    async def run(self, tx: Callable[[], Tx[T]], mode: Mode = "write") -> T:
        """Run ``tx()`` as ``mode`` says, and return what it returns."""
        ...


def drive(tx: Tx[T], execute: Callable[[Statement], Result]) -> T:
    """Run every statement ``tx`` yields through ``execute``; return what ``tx`` returns."""
    try:
        statement = next(tx)
        while True:
            statement = tx.send(execute(statement))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        tx.close()


# --- the SQL files --------------------------------------------------------------------------

_FRAGMENT = re.compile(r"\{(\w+)\}")
_PARAMETER = re.compile(r"'[^']*'|--[^\n]*|(?<![:\w]):([A-Za-z_]\w*)")
"""A ``:name`` parameter (group 1), or a string or comment to leave as it is."""


@functools.cache
def load_queries(dialect: str) -> dict[str, str]:
    """The named queries of ``dialect``: ``sql/queries.sql`` overridden by ``sql/<dialect>.sql``,
    each ``{fragment}`` replaced by its text (``{rows}`` stays: a connector fills it)."""
    merged = {**_parse("queries"), **_parse(dialect)}

    def expand(sql: str) -> str:
        return _FRAGMENT.sub(lambda m: expand(merged[m[1]]) if m[1] in merged else m[0], sql)

    return {name: expand(sql) for name, sql in merged.items()}


def pyformat(sql: str) -> str:
    """A query's ``:name`` parameters as ``%(name)s`` (psycopg's style); ``%`` doubled;
    casts (``::jsonb``), strings and comments kept."""
    return _PARAMETER.sub(lambda m: f"%({m[1]})s" if m[1] else m[0], sql.replace("%", "%%"))


def _parse(file: str) -> dict[str, str]:
    """``sql/<file>.sql`` as ``{name: sql}``.

    A query starts at a ``-- name: <name>`` line and runs to the next one; the comment
    lines right after the name document it in the file and are not sent.
    """
    source = resources.files("planrun.stores").joinpath("sql").joinpath(f"{file}.sql")
    queries: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in source.read_text(encoding="utf-8").splitlines():
        if line.startswith("-- name:"):
            if name is not None:
                queries[name] = _strip_doc(lines)
            name, lines = line.split(":", 1)[1].strip(), []
        elif name is not None:
            lines.append(line)
    if name is not None:
        queries[name] = _strip_doc(lines)
    return queries


def _strip_doc(lines: Sequence[str]) -> str:
    """Drop a query's leading comment lines: they document the file, not the statement."""
    body = "\n".join(lines).strip().splitlines()
    while body and body[0].lstrip().startswith("--"):
        body.pop(0)
    return "\n".join(body).strip().removesuffix(";").strip() if body else ""
