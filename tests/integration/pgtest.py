"""The test PostgreSQL server: is it there, and a fresh schema per test.

``$PLANRUN_TEST_PG`` names the server (default the local one, database ``test``). Tests
skip with the reason when it does not answer, except under ``$PLANRUN_REQUIRE_PG`` (CI),
where a missing server fails them.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from planrun.stores import mask_url

PG_URL = os.environ.get("PLANRUN_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@functools.cache
def pg_unreachable() -> str | None:
    """Why the test server cannot be used, or None when it answers."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install planrun[postgres])"
    try:
        with psycopg.connect(PG_URL, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"no PostgreSQL server at {mask_url(PG_URL)}: {str(exc).splitlines()[0]}"
    return None


def require_pg() -> None:
    """Skip (or, in CI, fail) the calling test when the server does not answer."""
    reason = pg_unreachable()
    if reason is not None:
        if os.environ.get("PLANRUN_REQUIRE_PG"):
            pytest.fail(reason)
        pytest.skip(reason)


def with_search_path(url: str, schema: str) -> str:
    """``url`` with a libpq ``options`` query that puts ``schema`` first on the search path."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}')}"


def fresh_schema(prefix: str = "planrun_t") -> Iterator[str]:
    """A URL whose tables land in a new schema, dropped afterwards with the schema of the
    DBOS tables a run on DBOS kept beside it (a fixture body)."""
    require_pg()
    import psycopg

    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_search_path(PG_URL, schema)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
            conn.execute(f"DROP SCHEMA IF EXISTS {schema}_dbos CASCADE")
