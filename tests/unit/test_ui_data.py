"""What the run viewer shows, read from a real SQLite store (no server, no browser)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from planrun.cli.ui._data import (
    PAGE_SIZE,
    Loaded,
    clean,
    decide,
    decision_text,
    run_view,
    runs_page,
)
from planrun.core import Event, Status, Task, UsageError
from planrun.stores import RunInfo, open_store


async def _store(tmp_path: Path, runs: int) -> Loaded:
    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    await store.open()
    t0 = time.time() - 1000
    for n in range(runs):
        run_id = f"r{n:02d}"
        await store.create_run(RunInfo(run_id, t0 + n, status="finished" if n % 2 else "running",
                                       goal=f"goal {n} sk-abcdefghijklmnopqrst"))
        tasks = [Task(id="a", kind="k", status=Status.COMPLETED, finished_at=t0 + n + 5),
                 Task(id="b", kind="k", depends_on=("a",), status=Status.WAITING,
                      cause="approval:start")]
        await store.add_tasks(run_id, tasks, [Event(0, t0, "a", "created"),
                                              Event(1, t0, "b", "created")])
    return Loaded(store)


async def test_the_runs_list_is_newest_first_paged_and_shows_unowned_runs_interrupted(
        tmp_path: Path) -> None:
    runs = await _store(tmp_path, PAGE_SIZE + 3)
    try:
        first = await runs_page(runs, 1, time.time())
        second = await runs_page(runs, 2, time.time())
        beyond = await runs_page(runs, 99, time.time())
    finally:
        await runs.store.close()
    assert (first["total"], first["pages"]) == (PAGE_SIZE + 3, 2)
    ids = [r["id"] for r in first["runs"]] + [r["id"] for r in second["runs"]]
    assert ids == [f"r{n:02d}" for n in reversed(range(PAGE_SIZE + 3))]
    assert beyond["page"] == 2  # a page past the end shows the last one
    newest = first["runs"][0]  # r27: finished
    assert newest["status"] == "finished" and newest["duration_s"] == pytest.approx(5.0)
    assert first["runs"][1]["status"] == "interrupted"  # running, and nobody owns it
    assert newest["counts"] == {"completed": 1, "waiting": 1}
    assert newest["goal"] == "goal 27 sk-[redacted]"


async def test_a_run_view_is_unchanged_until_the_run_changes(tmp_path: Path) -> None:
    runs = await _store(tmp_path, 1)
    try:
        view = await run_view(runs, "r00", time.time())
        same = await run_view(runs, "r00", time.time(), since=view["version"])
        await decide(runs.store, "r00", "b", True, "ann", "fine", time.time())
        changed = await run_view(runs, "r00", time.time(), since=view["version"])
    finally:
        await runs.store.close()
    assert view["tasks"][1][:5] == ["b", 0, view["statuses"].index("waiting"), 0, [0]]
    assert view["status"]["waiting"][0]["task"] == "b"
    assert same == {"version": view["version"], "unchanged": True}
    assert changed["version"] != view["version"] and changed["tasks"][1][6] == "approve:start"


async def test_a_decision_says_who_and_when_and_a_second_one_is_refused(
        tmp_path: Path) -> None:
    runs = await _store(tmp_path, 1)
    try:
        task = await decide(runs.store, "r00", "b", False, "  ann  lee ", None, 0.0)
        with pytest.raises(UsageError, match="already rejected"):
            await decide(runs.store, "r00", "b", True, None, "again", 1.0)
        stored = (await runs.store.load_tasks("r00")).tasks[1]
    finally:
        await runs.store.close()
    assert task.error == "by ann lee at 1970-01-01 00:00:00 UTC in planrun ui"
    assert stored.cause == "reject:start" and stored.error == task.error


def test_the_decision_note_defaults_to_ui_and_keeps_the_note() -> None:
    assert decision_text(None, " ok ", 86400.0) == (
        "by ui at 1970-01-02 00:00:00 UTC in planrun ui: ok")
    assert decision_text("x" * 100, "", 0.0).startswith("by " + "x" * 60 + " at")


def test_every_string_is_redacted_however_deep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "the-environment-key-123")
    cleaned = clean({"a": ["sk-abcdefghijkl", {"b": "x the-environment-key-123 y"}],
                     "n": float("nan"), "k": 1})
    assert cleaned == {"a": ["sk-[redacted]", {"b": "x [redacted] y"}], "n": None, "k": 1}
