"""The in-memory store's own behaviour, ``open_store`` URLs, masking and the SQL files.

The contract every backend shares is tested in ``tests/integration/test_stores.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys

import pytest

from planrun.core._errors import ConfigError, UnstorableValue, UsageError
from planrun.core._ledger import Event
from planrun.core._task import Task
from planrun.stores import (
    InMemoryStore,
    PostgresStore,
    RunInfo,
    SQLiteStore,
    Store,
    mask_url,
    open_store,
)
from planrun.stores import _postgres_rows as postgres_module
from planrun.stores.base import TASK_COLUMNS, load_queries


async def test_every_call_is_recorded() -> None:
    store = InMemoryStore()
    await store.open()
    await store.create_run(RunInfo("r", 1.0))
    await store.add_tasks("r", [Task("a", "k")], [Event(0, 1.0, "a", "created")])
    await store.acquire_run("r", "p", ttl=5.0, now=2.0)

    assert [name for name, _ in store.calls] == ["open", "create_run", "add_tasks",
                                                 "acquire_run"]
    assert store.calls_to("acquire_run") == [{"run_id": "r", "owner": "p", "ttl": 5.0,
                                              "now": 2.0}]


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


def test_every_backend_has_the_protocols_methods_with_the_same_signatures() -> None:
    wanted = {
        name: inspect.signature(member)
        for name, member in vars(Store).items()
        if inspect.iscoroutinefunction(member)
    }
    assert len(wanted) == 33  # runs, the owner lease, tasks, events, effects and workers
    # (22), the limiter_* and spend* methods (11)
    for cls in (InMemoryStore, SQLiteStore, PostgresStore):
        for name, signature in wanted.items():
            assert inspect.signature(getattr(cls, name)) == signature, (cls, name)


def test_the_row_mapping_covers_every_task_field() -> None:
    assert tuple(f.name for f in dataclasses.fields(Task)) == TASK_COLUMNS


@pytest.mark.parametrize(
    ("backend", "writes"),
    [
        ("sqlite", ("insert_tasks_rows", "upsert_tasks_rows")),
        ("postgres", ("insert_tasks", "upsert_tasks")),
    ],
)
def test_the_sql_files_write_every_task_column(backend: str, writes: tuple[str, ...]) -> None:
    queries = load_queries(backend)
    for name in writes:
        missing = [c for c in TASK_COLUMNS if c not in queries[name]]
        assert not missing, (name, missing)
    assert all(sql and not sql.startswith("--") for sql in queries.values())


def test_the_sqlite_rows_of_many_row_statements_hold_one_value_per_column() -> None:
    queries = load_queries("sqlite")
    assert queries["task_values_row"].count("?") == 1 + len(TASK_COLUMNS)  # run_id first
    assert queries["event_values_row"].count("?") == 8
    for name in ("insert_tasks_rows", "upsert_tasks_rows", "insert_events_rows"):
        assert queries[name].count("{rows}") == 1 and "?" not in queries[name]


def test_both_sql_files_share_their_core_queries() -> None:
    core = {
        "schema_table", "schema_version", "clear_version", "stamp_version", "migrate_1",
        "create_run", "set_run_status", "get_run", "list_runs", "count_tasks",
        "get_tasks", "get_tasks_by_ids", "get_events", "record_decision",
        "raise_next_seq", "take_seqs", "effect_begin", "effect_done",
        "get_effect", "get_effects", "register_worker", "heartbeat_worker", "list_workers",
    }
    assert core <= set(load_queries("sqlite"))
    assert core <= set(load_queries("postgres"))


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

