"""Durable stores: task rows and ledger events, written in one transaction.

    store = open_store("sqlite:///planrun.db")   # or memory://, postgresql://…
    await store.open()
    ...
    await store.close()

Every store is one :class:`SQLStore` over a connector (SQLite, PostgreSQL, or SQLite in
memory): it implements :class:`Store`, what a run needs, and
:class:`planrun.core.SharedLimits`, the limits every process of a run shares.
:func:`open_store` picks one from a URL.
"""

from __future__ import annotations

import os

from planrun.core import ConfigError, UsageError
from planrun.stores._owners import owner_gone, owner_name
from planrun.stores._sql import SQLStore
from planrun.stores.base import (
    SCHEMA_VERSION,
    EffectRecord,
    RunInfo,
    RunOwner,
    RunState,
    RunSummary,
    Store,
    mask_url,
    shown_status,
    strict_json,
)
from planrun.stores.memory import InMemoryStore
from planrun.stores.postgres import PostgresStore
from planrun.stores.sqlite import SQLiteStore

__all__ = [
    "SCHEMA_VERSION",
    "EffectRecord",
    "InMemoryStore",
    "PostgresStore",
    "RunInfo",
    "RunOwner",
    "RunState",
    "RunSummary",
    "SQLStore",
    "SQLiteStore",
    "Store",
    "mask_url",
    "open_store",
    "owner_gone",
    "owner_name",
    "shown_status",
    "strict_json",
]

ENV_VAR = "PLANRUN_DB"


def open_store(url: str | None = None) -> SQLStore:
    """Make the store a URL names; call ``await store.open()`` before using it.

    ``memory://``; ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``;
    ``postgresql://user:password@host:port/db`` (or ``postgres://``). Without a URL,
    the ``PLANRUN_DB`` environment variable names one.

    Raises:
        ConfigError: no URL and no ``PLANRUN_DB``; psycopg missing for a PostgreSQL URL.
        UsageError: a scheme planrun does not know, or a SQLite URL without a path.
    """
    if url is None:
        url = os.environ.get(ENV_VAR)
        if not url:
            raise ConfigError(f"no store URL given and {ENV_VAR} is not set")
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise UsageError(f"not a store URL: {mask_url(url)!r}")
    if scheme == "memory":
        return InMemoryStore()
    if scheme == "sqlite":
        if not rest.startswith("/") or rest == "/":
            raise UsageError(
                f"a SQLite URL names a file: sqlite:///relative.db or sqlite:////abs.db, "
                f"not {url!r}"
            )
        return SQLiteStore(rest[1:])
    if scheme in ("postgresql", "postgres"):
        return PostgresStore(url)
    raise UsageError(
        f"unknown store scheme {scheme!r} in {mask_url(url)!r}: "
        "use memory://, sqlite:///path.db or postgresql://…"
    )
