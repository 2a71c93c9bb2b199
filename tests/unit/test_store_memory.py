"""The in-memory store's own behaviour, ``open_store`` URLs, masking and the SQL files.

The contract every backend shares is tested in ``tests/integration/test_stores.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys

import pytest

from planrun.core import SharedLimits
from planrun.core._errors import ConfigError, UnstorableValue, UsageError
from planrun.core._ledger import Event
from planrun.core._task import Task
from planrun.stores import (
    InMemoryStore,
    PostgresStore,
    RunInfo,
    SQLiteStore,
    SQLStore,
    Store,
    mask_url,
    open_store,
)
from planrun.stores import postgres as postgres_module
from planrun.stores._connector import load_queries, pyformat
from planrun.stores.base import TASK_COLUMNS


async def test_every_statement_is_recorded() -> None:
    store = InMemoryStore()
    await store.open()
    await store.create_run(RunInfo("r", 1.0))
    await store.add_tasks("r", [Task("a", "k")], [Event(0, 1.0, "a", "created")])
    await store.acquire_run("r", "p", ttl=5.0, now=2.0)

    assert [name for name, _ in store.calls] == [
        "create_run", "get_run", "insert_tasks", "insert_events", "raise_next_seq",
        "acquire_run"]
    assert store.calls_to("acquire_run") == [{"run_id": "r", "owner": "p", "until": 7.0,
                                              "now": 2.0, "take_from": None}]


async def test_the_memory_store_keeps_its_rows_when_closed() -> None:
    store = InMemoryStore()
    await store.create_run(RunInfo("r", 1.0))
    await store.close()
    await store.open()
    assert [run.id for run in await store.list_runs()] == ["r"]


async def test_records_read_back_are_copies() -> None:
    store = InMemoryStore()
    await store.create_run(RunInfo("r", 1.0))
    payload = {"items": [1]}
    await store.add_tasks("r", [Task("a", "k", payload)], [])
    payload["items"].append(2)

    loaded = (await store.load("r")).tasks[0]
    loaded.payload["items"].append(3)

    assert (await store.load("r")).tasks[0].payload == {"items": [1]}


async def test_a_nan_is_refused_like_a_database_would() -> None:
    store = InMemoryStore()
    await store.create_run(RunInfo("r", 1.0))
    with pytest.raises(UnstorableValue, match=r"cannot be stored as JSON: \$\.x is the float nan"):
        await store.add_tasks("r", [Task("a", "k", {"x": float("nan")})], [])


def test_the_store_has_both_protocols_methods_with_the_same_signatures() -> None:
    for protocol, count in ((Store, 22), (SharedLimits, 11)):
        wanted = {
            name: inspect.signature(member)
            for name, member in vars(protocol).items()
            if inspect.iscoroutinefunction(member)
        }
        # Store: runs, the owner lease, tasks, events, effects, decisions and workers;
        # SharedLimits: the limiter_* and spend* methods.
        assert len(wanted) == count
        for name, signature in wanted.items():
            assert inspect.signature(getattr(SQLStore, name)) == signature, name
    for cls in (InMemoryStore, SQLiteStore, PostgresStore):  # nothing overridden
        assert all(getattr(cls, name) is getattr(SQLStore, name)
                   for name in vars(SQLStore) if not name.startswith("_"))


def test_the_row_mapping_covers_every_task_field() -> None:
    assert tuple(f.name for f in dataclasses.fields(Task)) == TASK_COLUMNS


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_the_sql_files_write_every_task_column(dialect: str) -> None:
    queries = load_queries(dialect)
    for name in ("insert_tasks", "upsert_tasks"):
        missing = [c for c in TASK_COLUMNS if c not in queries[name]]
        assert not missing, (name, missing)
    assert not any(sql.startswith("--") for sql in queries.values())


def test_every_query_the_store_runs_is_whole_in_each_dialect() -> None:
    """Every fragment a query names is defined, and psycopg's placeholders come out of
    the ``:name`` ones (casts kept)."""
    for dialect in ("sqlite", "postgres"):
        for name, sql in load_queries(dialect).items():
            leftover = re.findall(r"\{(?!rows\})\w+\}", sql)  # {rows}: the connector's
            assert not leftover, (dialect, name, leftover)
    assert pyformat("x = :a::jsonb AND y::text = ':b' AND 5 % 2 -- :c") == (
        "x = %(a)s::jsonb AND y::text = ':b' AND 5 %% 2 -- :c")
    assert all(c in load_queries("postgres")["task_rows"] for c in TASK_COLUMNS)


def test_the_sqlite_rows_of_many_row_statements_hold_one_value_per_column() -> None:
    queries = load_queries("sqlite")
    assert queries["task_row"].count("?") == 1 + len(TASK_COLUMNS)  # run_id first
    assert queries["event_row"].count("?") == 8
    for name in ("insert_tasks", "upsert_tasks", "insert_events"):
        assert queries[name].count("{rows}") == 1 and "?" not in queries[name]


# --- open_store and URLs --------------------------------------------------------------------


def test_open_store_picks_the_backend_from_the_url() -> None:
    assert isinstance(open_store("memory://"), InMemoryStore)
    relative = open_store("sqlite:///runs/planrun.db")
    assert isinstance(relative, SQLiteStore)
    assert relative.path == "runs/planrun.db"
    absolute = open_store("sqlite:////var/lib/planrun.db")
    assert isinstance(absolute, SQLiteStore)
    assert absolute.path == "/var/lib/planrun.db"
    assert absolute.url == "sqlite:////var/lib/planrun.db"
    assert isinstance(open_store("postgresql://u@h/db"), PostgresStore)
    assert isinstance(open_store("postgres://u@h/db"), PostgresStore)


def test_open_store_reads_planrun_db_only_without_a_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANRUN_DB", "memory://")
    assert isinstance(open_store(None), InMemoryStore)
    monkeypatch.delenv("PLANRUN_DB")
    with pytest.raises(ConfigError, match="PLANRUN_DB"):
        open_store(None)


@pytest.mark.parametrize("url", ["mysql://u:pw@h/db", "planrun.db", "sqlite://", "sqlite:///"])
def test_open_store_refuses_what_it_does_not_know(url: str) -> None:
    with pytest.raises(UsageError) as caught:
        open_store(url)
    assert "pw" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://user:secret@host/db", "postgresql://user:***@host/db"),
        ("postgresql://user:secret@host:5432/db?sslmode=require",
         "postgresql://user:***@host:5432/db?sslmode=require"),
        ("postgresql://user@host/db", "postgresql://user@host/db"),
        ("postgresql://host/db?user=u&password=secret", "postgresql://host/db?user=u&password=***"),
        ("sqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
    ],
)
def test_mask_url_hides_passwords(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_postgres_store_url_is_masked() -> None:
    assert open_store("postgresql://u:hunter2@h/db").url == "postgresql://u:***@h/db"


def test_a_missing_psycopg_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    postgres_module._drivers.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"pip install planrun\[postgres\]"):
            open_store("postgresql://u@h/db")
    finally:
        postgres_module._drivers.cache_clear()

