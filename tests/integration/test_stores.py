"""The store contract, run against every backend (memory, SQLite, PostgreSQL).

PostgreSQL comes from ``PLANRUN_TEST_PG`` (default ``postgresql://postgres@127.0.0.1:5432/
test``); each test gets a schema of its own, dropped afterwards. When no server answers,
the PostgreSQL cases are skipped with the reason.

The fixtures live here rather than in a ``conftest.py``: a second module named
``conftest`` would shadow ``tests/conftest.py`` for the tests that import from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest
from pgtest import PG_URL, fresh_schema

from planrun.core._errors import (
    RunExists,
    RunInUse,
    StoreError,
    UnknownRun,
    UnstorableValue,
    UsageError,
)
from planrun.core._ledger import Event
from planrun.core._task import Status, Task, transition
from planrun.stores import (
    SCHEMA_VERSION,
    PostgresStore,
    RunInfo,
    RunOwner,
    SQLiteStore,
    Store,
    open_store,
)

BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
"""Parameters of the ``backend`` fixture."""

PERSISTENT = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
"""The backends with a schema and a life beyond the process."""

Connect = Callable[[], Awaitable[Store]]
"""Opens another connection to the test's store (the same object for ``memory://``)."""


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL whose tables land in a fresh schema, dropped after the test."""
    yield from fresh_schema()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The backend under test: ``memory``, ``sqlite`` or ``postgres``."""
    return str(request.param)


@pytest.fixture
def store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A URL of an empty store of ``backend``."""
    if backend == "memory":
        return "memory://"
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
async def connect(store_url: str) -> AsyncIterator[Connect]:
    """Open stores on the test's database; all are closed after the test."""
    opened: list[Store] = []
    shared: Store | None = None

    async def make() -> Store:
        nonlocal shared
        if store_url == "memory://" and shared is not None:
            return shared
        store = open_store(store_url)
        await store.open()
        opened.append(store)
        shared = store
        return store

    yield make
    for store in opened:
        await store.close()


@pytest.fixture
async def store(connect: Connect) -> Store:
    """An open, empty store of the backend under test."""
    return await connect()


# --- helpers --------------------------------------------------------------------------------


def new_run_id() -> str:
    return f"run-{uuid.uuid4().hex[:10]}"


async def make_run(store: Store, tasks: list[Task], goal: str = "test") -> str:
    """Create a run holding ``tasks`` (with one ``created`` event each); return its id."""
    run_id = new_run_id()
    await store.create_run(RunInfo(run_id, 1.0, goal=goal))
    events = [Event(i, 1.0, t.id, "created") for i, t in enumerate(tasks)]
    await store.add_tasks(run_id, tasks, events)
    return run_id


def chain(n: int, kind: str = "k") -> list[Task]:
    """``n`` tasks, each depending on the one before."""
    return [
        Task(f"t{i}", kind, {"i": i}, depends_on=(f"t{i - 1}",) if i else ())
        for i in range(n)
    ]


def completed(task: Task, at: float = 5.0) -> Task:
    running = transition(transition(task, Status.ASSIGNED, assigned_to="w"), Status.RUNNING)
    return transition(running, Status.COMPLETED, result={"ok": True}, finished_at=at)


async def complete(store: Store, run_id: str, task: Task, seq: int) -> None:
    await store.write(run_id, [(completed(task), Event(seq, 5.0, task.id, "completed"))])


def increasing(seqs: list[int]) -> bool:
    """Store-made seqs are unique and increasing (dense in SQLite and memory, not in
    PostgreSQL, whose sequence never waits for a commit)."""
    return all(a < b for a, b in itertools.pairwise(seqs))


# --- runs, tasks, events --------------------------------------------------------------------


async def test_round_trip_keeps_every_field(store: Store) -> None:
    full = Task(
        id="full",
        kind="deploy",
        payload={"nested": {"list": [1, 2.5, "x", None, True]}, "unicode": "ünï"},
        status=Status.FAILED,
        assigned_to="w1",
        attempts=2,
        max_attempts=5,
        result={"partial": [1, 2]},
        error="boom",
        error_class="transient",
        cause=None,
        depends_on=("a", "b"),
        estimate_s=2.5,
        resources=("db", "cache"),
        lease=12.5,
        token=3,
        reclaims=1,
        not_before=20.0,
        created_at=1.0,
        started_at=2.0,
        finished_at=3.0,
    )
    tasks = [Task("a", "k"), Task("b", "k", result="a plain string"), full]
    run = RunInfo(new_run_id(), 123.5, goal="ship it", meta={"model": "m", "n": 3})
    await store.create_run(run)
    events = [
        Event(0, 1.0, "a", "created"),
        Event(1, 1.5, "full", "failed", worker="w1", attempt=3, detail={"retry_at": 20.0}),
    ]
    await store.add_tasks(run.id, tasks, events)

    state = await store.load(run.id)

    assert state.run == run
    assert state.tasks == tasks
    assert state.events == events
    assert state.effects == {}


async def test_a_run_id_already_stored_is_a_clear_error(store: Store) -> None:
    run_id = await make_run(store, chain(1))
    with pytest.raises(RunExists, match=f"run '{run_id}' already exists") as info:
        await store.create_run(RunInfo(run_id, 2.0, goal="again"))
    assert "UNIQUE" not in str(info.value) and "duplicate key" not in str(info.value)
    assert (await store.load(run_id)).run.goal == "test"  # the first run is untouched


async def test_write_upserts_rows_and_appends_events(store: Store) -> None:
    run_id = await make_run(store, [Task("a", "k"), Task("b", "k")])
    a = transition(Task("a", "k"), Status.ASSIGNED, assigned_to="w", token=1)
    b_new = Task("c", "k", {"late": True})
    await store.write(
        run_id,
        [(a, Event(2, 2.0, "a", "assigned", "w", 1)), (b_new, Event(3, 2.0, "c", "created"))],
    )
    a_run = transition(a, Status.RUNNING, started_at=3.0)
    await store.write(run_id, [(a_run, Event(4, 3.0, "a", "started", "w", 1))])

    state = await store.load(run_id)

    assert [t.id for t in state.tasks] == ["a", "b", "c"]
    assert state.tasks[0] == a_run
    assert state.tasks[2] == b_new
    assert [(e.seq, e.event) for e in state.events] == [
        (0, "created"), (1, "created"), (2, "assigned"), (3, "created"), (4, "started")
    ]


async def test_a_batch_may_change_a_task_twice(store: Store) -> None:
    run_id = await make_run(store, [Task("a", "k"), Task("b", "k")])
    assigned = transition(Task("a", "k"), Status.ASSIGNED, assigned_to="w", token=1)
    running = transition(assigned, Status.RUNNING, started_at=2.0)
    added = Task("c", "k")
    await store.write(
        run_id,
        [
            (assigned, Event(2, 2.0, "a", "assigned", "w", 1)),
            (added, Event(3, 2.0, "c", "created")),
            (running, Event(4, 2.0, "a", "started", "w", 1)),
        ],
    )

    state = await store.load(run_id)

    assert state.tasks == [running, Task("b", "k"), added]
    assert [e.event for e in state.events] == ["created", "created", "assigned", "created",
                                               "started"]


async def test_a_batch_cut_from_a_ledger_is_stored_as_the_same_changes_written_one_by_one(
        store: Store, connect: Connect) -> None:
    """``write_batch`` (each task's record once, the events as tuples) stores what ``write``
    stores for the same changes: the rows as they are now, every event in order with its
    detail (none is an empty one), secrets redacted; an unknown run writes nothing."""
    run_id = await make_run(store, [Task("a", "k"), Task("b", "k")])
    other = await make_run(store, [Task("a", "k"), Task("b", "k")])
    assigned = transition(Task("a", "k"), Status.ASSIGNED, assigned_to="w", token=1)
    running = transition(assigned, Status.RUNNING, started_at=2.0, lease=9.0)
    failed = transition(transition(Task("b", "k"), Status.ASSIGNED, assigned_to="w", token=1),
                        Status.RUNNING, started_at=2.0)
    failed = transition(failed, Status.FAILED, error="TransientError: 503", attempts=1,
                        not_before=4.0)
    secret = "sk-" + "a" * 40
    rows = [(2, 2.0, "a", "assigned", "w", 1, None), (3, 2.0, "b", "assigned", "w", 1, None),
            (4, 2.5, "a", "started", "w", 1, None), (5, 2.5, "b", "started", "w", 1, {}),
            (6, 3.0, "b", "failed", "w", 1, {"error": f"key {secret}", "retry_at": 4.0})]
    await store.write_batch(run_id, [running, failed], rows)
    await store.write(other, [(assigned, Event(2, 2.0, "a", "assigned", "w", 1)),
                              (failed, Event(3, 2.0, "b", "assigned", "w", 1)),
                              (running, Event(4, 2.5, "a", "started", "w", 1)),
                              (failed, Event(5, 2.5, "b", "started", "w", 1)),
                              (failed, Event(6, 3.0, "b", "failed", "w", 1,
                                             {"error": f"key {secret}", "retry_at": 4.0}))])
    reader = await connect()
    batch, one_by_one = await reader.load(run_id), await reader.load(other)
    assert batch.tasks == one_by_one.tasks == [running, failed]
    assert batch.events == one_by_one.events
    assert [(e.seq, e.event, e.detail) for e in batch.events[2:5]] == [
        (2, "assigned", {}), (3, "assigned", {}), (4, "started", {})]
    assert secret not in str(batch.events[-1].detail) and batch.events[-1].detail["retry_at"] == 4.0
    with pytest.raises(StoreError, match="unknown run 'nope'"):
        await store.write_batch("nope", [running], rows[:1])
    assert await store.load(run_id) == batch


async def test_a_batch_with_a_bad_row_writes_nothing(store: Store) -> None:
    run_id = await make_run(store, [Task("a", "k"), Task("b", "k")])
    before = await store.load(run_id)
    good = transition(Task("a", "k"), Status.ASSIGNED, assigned_to="w")
    bad = Task("b", None)  # type: ignore[arg-type]  # a NOT NULL column, refused by the DB

    with pytest.raises(StoreError):
        await store.write(
            run_id, [(good, Event(2, 2.0, "a", "assigned")), (bad, Event(3, 2.0, "b", "x"))]
        )

    assert await store.load(run_id) == before


async def test_a_value_that_is_not_json_writes_nothing(store: Store) -> None:
    run_id = await make_run(store, [Task("a", "k")])
    before = await store.load(run_id)
    good = transition(Task("a", "k"), Status.ASSIGNED, assigned_to="w")
    bad = Task("b", "k", {"when": object()})

    with pytest.raises(UnstorableValue,
                       match=r"'b' payload cannot be stored as JSON: \$\.when has type object"):
        await store.write(
            run_id, [(good, Event(1, 2.0, "a", "assigned")), (bad, Event(2, 2.0, "b", "x"))]
        )

    assert await store.load(run_id) == before


async def test_add_tasks_refuses_a_duplicate_id_and_writes_nothing(store: Store) -> None:
    run_id = await make_run(store, [Task("a", "k")])
    before = await store.load(run_id)

    with pytest.raises(StoreError):
        await store.add_tasks(run_id, [Task("b", "k"), Task("a", "k")], [])

    assert await store.load(run_id) == before


async def test_an_unknown_run_is_named(store: Store) -> None:
    with pytest.raises(StoreError, match="unknown run 'nope'"):
        await store.load("nope")
    with pytest.raises(StoreError, match="unknown run 'nope'"):
        await store.write("nope", [(Task("a", "k"), Event(0, 1.0, "a", "created"))])
    with pytest.raises(StoreError, match="unknown run 'nope'"):
        await store.set_run_status("nope", "completed")
    with pytest.raises(StoreError, match="unknown run 'nope'"):
        await store.register_worker("nope", "w", ["k"], 1, 1.0)


async def test_a_run_id_is_created_once(store: Store) -> None:
    run = RunInfo(new_run_id(), 1.0)
    await store.create_run(run)
    with pytest.raises(RunExists, match=run.id):  # a usage error: the caller chose the id
        await store.create_run(run)


async def test_store_made_events_follow_the_callers_seqs(store: Store) -> None:
    run_id = await make_run(store, [Task("a", "k"), Task("b", "k")])
    await store.write(run_id, [(Task("c", "k"), Event(41, 1.0, "c", "created"))])

    for task_id in "abc":
        await store.append_event(run_id, Event(-1, 2.0, task_id, "effect", None, 0,
                                               {"key": task_id}))

    seqs = [e.seq for e in (await store.load(run_id)).events]
    assert seqs[:3] == [0, 1, 41] and len(seqs) == 6 and increasing(seqs)


async def test_list_runs_counts_tasks_by_status(store: Store) -> None:
    first = await make_run(store, chain(3), goal="first")
    second = await make_run(store, [Task("x", "k")], goal="second")
    await complete(store, first, chain(3)[0], seq=3)
    await store.set_run_status(second, "completed")

    summaries = {s.id: s for s in await store.list_runs()}

    assert summaries[first].goal == "first"
    assert summaries[first].counts["completed"] == 1
    assert summaries[first].counts["pending"] == 2
    assert summaries[first].counts["dead"] == 0
    assert summaries[second].status == "completed"
    assert sum(summaries[second].counts.values()) == 1


# --- effects and workers --------------------------------------------------------------------


async def test_effects_begin_once_and_finish_once(store: Store) -> None:
    run_id = await make_run(store, [Task("a", "k")])

    first = await store.effect_begin(run_id, "a", "key-1", at=1.0)
    again = await store.effect_begin(run_id, "a", "key-2", at=2.0)
    assert (first.state, first.key, first.result, first.at) == ("started", "key-1", None, 1.0)
    assert again == first

    assert await store.effect_done(run_id, "a", {"sent": 1}, at=3.0) is True
    assert await store.effect_done(run_id, "a", {"sent": 2}, at=4.0) is False
    record = (await store.load(run_id)).effects["a"]
    assert (record.state, record.key, record.result, record.at) == (
        "applied", "key-1", {"sent": 1}, 3.0
    )
    assert await store.effect_begin(run_id, "a", "key-3", at=5.0) == record

    with pytest.raises(StoreError, match="no effect begun"):
        await store.effect_done(run_id, "zzz", None, at=6.0)


async def test_load_some_reads_only_the_tasks_asked_for(store: Store) -> None:
    run_id = await make_run(store, chain(4))
    assert [t.id for t in await store.load_some(run_id, ["t2", "t0", "zz"])] == ["t0", "t2"]
    assert await store.load_some(run_id, []) == []
    with pytest.raises(StoreError, match="unknown run"):
        await store.load_some("nope", ["t0"])


async def test_a_batch_written_again_stores_its_events_once(store: Store) -> None:
    # A retry after a commit whose answer was lost (the connection dropped during COMMIT)
    # sends the same batch again: the records are upserts and the events stay single.
    run_id = await make_run(store, [Task("a", "k"), Task("b", "k")])
    a = transition(Task("a", "k"), Status.ASSIGNED, assigned_to="w", token=1)
    b = transition(Task("b", "k"), Status.ASSIGNED, assigned_to="w", token=1)
    batch = [(a, Event(2, 2.0, "a", "assigned", "w", 1)),
             (b, Event(3, 2.0, "b", "assigned", "w", 1))]
    await store.write(run_id, batch)
    await store.write(run_id, batch)
    state = await store.load(run_id)
    assert [(e.seq, e.task, e.event) for e in state.events] == [
        (0, "a", "created"), (1, "b", "created"), (2, "a", "assigned"), (3, "b", "assigned")]
    assert [t.status for t in state.tasks] == [Status.ASSIGNED, Status.ASSIGNED]


async def test_values_like_the_sqlite_stand_ins_for_null_stay_themselves(store: Store) -> None:
    # The SQLite store sends a missing text value as 0 and a missing number as '' (NULLIF
    # turns them into NULL): a real "0", "", 0 or 0.0 is kept, and None stays None.
    odd = Task("0", "k", {"": 0}, assigned_to="0", result="", error="", error_class="0",
               cause="", depends_on=("",), resources=("0",), lease=0.0, not_before=0,
               created_at=0.0, started_at=-0.0, finished_at=0.0, parent="0", joins=("",))
    plain = Task("p", "k")
    run_id = new_run_id()
    await store.create_run(RunInfo(run_id, 1.0))
    await store.add_tasks(run_id, [odd, plain], [Event(0, 0.0, "0", "created", worker="0"),
                                                 Event(1, 0.0, "p", "created", worker="")])
    again = transition(odd, Status.ASSIGNED, assigned_to="", token=1)
    await store.write(run_id, [(again, Event(2, 0.0, "0", "assigned", "0", 1)),
                               (plain, Event(3, 0.0, "p", "joined", None, 0, {"": ""}))])

    state = await store.load(run_id)

    assert state.tasks == [again, plain]
    assert state.tasks[0].lease == 0.0 and state.tasks[0].not_before == 0
    assert [(e.worker, e.detail) for e in state.events] == [("0", {}), ("", {}), ("0", {}),
                                                            (None, {"": ""})]


async def test_a_long_batch_is_written_whole_in_its_order(store: Store) -> None:
    # More rows than one statement takes (the SQLite store writes 41 task rows or 124 events
    # a statement), and not a multiple of it: every row and every event lands, in order.
    tasks = [Task(f"t{i}", "k", {"i": i}) for i in range(75)]
    run_id = await make_run(store, tasks)
    batch: list[tuple[Task, Event]] = []
    final: list[Task] = []
    seq = len(tasks)
    for task in tasks:
        assigned = transition(task, Status.ASSIGNED, assigned_to=f"w{seq % 3}", token=1)
        running = transition(assigned, Status.RUNNING, started_at=float(seq), lease=seq + 9.5)
        done = transition(running, Status.COMPLETED, result=[seq], finished_at=seq + 1.0,
                          lease=None)
        for record, name in ((assigned, "assigned"), (running, "started"), (done, "completed")):
            batch.append((record, Event(seq, float(seq), task.id, name, record.assigned_to, 1)))
            seq += 1
        final.append(done)
    await store.write(run_id, batch)

    state = await store.load(run_id)

    assert state.tasks == final
    assert [(e.seq, e.task, e.event) for e in state.events] == [
        (i, t.id, "created") for i, t in enumerate(tasks)] + [
        (e.seq, e.task, e.event) for _, e in batch]


async def test_sqlite_a_batch_that_fails_midway_writes_none_of_it(tmp_path: Path) -> None:
    # A batch is written in several statements; one failing after others have run (here a
    # trigger refuses one event) leaves the store as the batches before it left it.
    path = tmp_path / "store.db"
    store = SQLiteStore(str(path))
    await store.open()
    try:
        tasks = [Task(f"t{i}", "k") for i in range(150)]
        run_id = await make_run(store, tasks)  # seqs 0-149
        assigned = [transition(t, Status.ASSIGNED, assigned_to="w", token=1) for t in tasks]
        await store.write(run_id, [(a, Event(150 + i, 2.0, a.id, "assigned", "w", 1))
                                   for i, a in enumerate(assigned)])
        before = await store.load(run_id)
        running = [transition(a, Status.RUNNING, started_at=3.0) for a in assigned]
        second = [(r, Event(300 + i, 3.0, r.id, "started", "w", 1))
                  for i, r in enumerate(running)]
        with sqlite3.connect(path) as other:  # an event of the batch's second statement
            other.execute("CREATE TRIGGER refuse BEFORE INSERT ON planrun_events "
                          "WHEN NEW.seq = 440 BEGIN SELECT RAISE(ABORT, 'refused'); END")

        with pytest.raises(StoreError, match="refused"):
            await store.write(run_id, second)
        assert await store.load(run_id) == before

        with sqlite3.connect(path) as other:
            other.execute("DROP TRIGGER refuse")
        await store.write(run_id, second)
        state = await store.load(run_id)
        assert state.tasks == running
        assert [e.seq for e in state.events] == list(range(450))
    finally:
        await store.close()


async def test_an_effect_and_its_event_are_recorded_once_together(connect: Connect) -> None:
    # Two processes finish the same effect (one died with its commit in flight, one
    # resumed): exactly one marks it applied, and only that one writes the event.
    store, other = await connect(), await connect()
    run_id = await make_run(store, [Task("a", "k"), Task("b", "k"), Task("c", "k")])
    for task_id in "abc":
        await store.effect_begin(run_id, task_id, f"key-{task_id}", at=2.0)

    def effect(task_id: str, seq: int = -1) -> Event:
        return Event(seq, 3.0, task_id, "effect", None, 1, {"key": f"key-{task_id}"})

    done = await asyncio.gather(store.effect_done(run_id, "a", 1, 3.0, effect("a")),
                                other.effect_done(run_id, "a", 2, 3.0, effect("a")))
    assert sorted(done) == [False, True]
    assert await store.effect_done(run_id, "b", None, 3.0, effect("b", seq=10)) is True
    assert await other.effect_done(run_id, "c", None, 3.0, effect("c")) is True

    state = await store.load(run_id)
    effects = [e for e in state.events if e.event == "effect"]
    assert [e.task for e in effects] == ["a", "b", "c"] and effects[1].seq == 10
    assert increasing([e.seq for e in state.events]) and effects[0].seq > 2
    assert {t: r.state for t, r in state.effects.items()} == dict.fromkeys("abc", "applied")
    assert state.effects["a"].result in (1, 2)
    with pytest.raises(StoreError, match="no effect begun"):
        await store.effect_done(run_id, "zzz", None, 6.0, effect("zzz"))
    assert len((await store.load(run_id)).events) == len(state.events)


async def test_workers_register_and_heartbeat(store: Store) -> None:
    run_id = await make_run(store, [Task("a", "k"), Task("b", "k")])
    await store.register_worker(run_id, "w1", ["k", "j"], capacity=2, at=1.0)
    await store.register_worker(run_id, "w0", ["j"], capacity=1, at=1.0)
    await store.heartbeat_worker(run_id, "w1", at=5.0)
    await store.heartbeat_worker(run_id, "w1", at=4.0)  # a late beat keeps the newer one

    workers = await store.list_workers(run_id)

    assert workers == [
        {"name": "w0", "kinds": ["j"], "capacity": 1, "last_heartbeat": 1.0},
        {"name": "w1", "kinds": ["k", "j"], "capacity": 2, "last_heartbeat": 5.0},
    ]
    with pytest.raises(StoreError, match="unknown worker"):
        await store.heartbeat_worker(run_id, "ghost", at=6.0)
    await store.register_worker(run_id, "w0", ["k"], capacity=4, at=7.0)
    assert (await store.list_workers(run_id))[0]["capacity"] == 4
    assert await store.list_workers("nope") == []


# --- concurrency ----------------------------------------------------------------------------


async def test_concurrent_connections_number_their_events_apart(connect: Connect) -> None:
    # Store-made seqs (an effect's event) come from the run's counter, or in PostgreSQL a
    # sequence that never waits for a commit: writers on eight connections at once get
    # distinct ones, and an event stored under a seq already taken would be lost.
    first = await connect()
    run_id = await make_run(first, [Task(f"t{i}", "k") for i in range(8)])
    stores = [first] + [await connect() for _ in range(7)]

    async def append(store: Store, task_id: str) -> None:
        for n in range(25):
            await store.append_event(run_id, Event(-1, 2.0, task_id, "effect", None, n))

    await asyncio.gather(*(append(s, f"t{i}") for i, s in enumerate(stores)))

    events = (await first.load(run_id)).events
    assert len(events) == 8 + 200 and len({e.seq for e in events}) == len(events)
    effects = [e for e in events if e.event == "effect"]
    assert Counter(e.task for e in effects) == {f"t{i}": 25 for i in range(8)}
    for i in range(8):  # each connection's events in the order it appended them
        assert [e.attempt for e in effects if e.task == f"t{i}"] == list(range(25))


# --- schema, URLs and failures --------------------------------------------------------------


def stamp(store_url: str, version: int) -> None:
    """Set the schema version the way a newer planrun would have left it."""
    if store_url.startswith("sqlite"):
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
            conn.execute("UPDATE planrun_schema SET version = ?", (version,))
        return
    import psycopg

    with psycopg.connect(store_url, autocommit=True) as conn:
        conn.execute("UPDATE planrun_schema SET version = %s", (version,))


@pytest.mark.parametrize("backend", PERSISTENT)
async def test_reopening_keeps_the_data_and_the_schema(store_url: str) -> None:
    store = open_store(store_url)
    await store.open()
    run_id = await make_run(store, chain(2))
    await store.close()

    again = open_store(store_url)
    await again.open()
    try:
        assert [t.id for t in (await again.load(run_id)).tasks] == ["t0", "t1"]
    finally:
        await again.close()


DATA = Path(__file__).parent.parent / "data" / "stores"


def restore_schema_6(store_url: str) -> None:
    """Fill the empty store at ``store_url`` with a run as planrun wrote it at schema 6
    (``tests/data/stores``: every kind of row, made by the store before it was one store
    over connectors)."""
    if store_url.startswith("sqlite"):
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
            conn.executescript((DATA / "schema6_sqlite.sql").read_text())
        return
    import psycopg

    schema = unquote(store_url).rsplit("search_path=", 1)[1]
    script = (DATA / "schema6_postgres.sql").read_text()
    with psycopg.connect(store_url, autocommit=True) as conn:
        conn.execute(script.replace("planrun_fixture_schema6", schema).encode())


@pytest.mark.parametrize("backend", PERSISTENT)
async def test_a_store_written_at_schema_6_opens_and_carries_on(store_url: str) -> None:
    restore_schema_6(store_url)
    store = open_store(store_url)
    await store.open()
    try:
        state = await store.load("old")
        assert (state.run.goal, state.run.meta, state.run.owner) == (
            "written before", {"limits": {"rpm": 60}}, "p1")
        assert [(t.id, t.status, t.result) for t in state.tasks] == [
            ("a", Status.COMPLETED, {"ok": True}), ("b", Status.PENDING, None),
            ("w", Status.PENDING, None)]
        assert state.tasks[1].depends_on == ("a",)
        assert [(e.seq, e.event) for e in state.events][:4] == [
            (0, "created"), (1, "created"), (2, "created"), (3, "completed")]
        assert state.events[4].event == "effect" and state.events[4].seq > 3
        assert (state.effects["a"].state, state.effects["a"].result) == ("applied", {"sent": 1})
        assert [w["name"] for w in await store.list_workers("old")] == ["w1"]
        limiter = await store.limiter_state("gpt")
        assert limiter is not None and (limiter.rpm, limiter.acquired) == (60.0, 1)
        spent = await store.spend("old")
        assert spent is not None and (spent.requests, spent.total_tokens) == (1, 60)

        # It carries on: a caller's batch, a store-numbered event after every seq, limits.
        b = transition(state.tasks[1], Status.ASSIGNED, assigned_to="w1", token=1)
        await store.write("old", [(b, Event(6, 5.0, "b", "assigned", "w1", 1))])
        await store.append_event("old", Event(-1, 5.0, "w", "effect"))
        assert await store.spend_reserve("old", 10, 0.0) is None
        await store.limiter_configure("gpt", 120.0, None, 1.0, 1.0)
        seqs = [e.seq for e in (await store.load("old")).events]
        assert seqs[:4] == [0, 1, 2, 3] and seqs[5] == 6 and len(seqs) == 7 and seqs[6] > 6
        assert [t.status for t in (await store.load("old")).tasks][1] is Status.ASSIGNED
    finally:
        await store.close()
    assert schema_version(store_url) == SCHEMA_VERSION == 6


UNDO_3_SQLITE = ["ALTER TABLE planrun_runs DROP COLUMN owner",
                 "ALTER TABLE planrun_runs DROP COLUMN owner_until"]
UNDO_3_POSTGRES = [
    "DROP INDEX planrun_events_xid",
    "ALTER TABLE planrun_events DROP COLUMN xid",
    "ALTER TABLE planrun_runs DROP COLUMN owner, DROP COLUMN owner_until",
    "ALTER TABLE planrun_runs RENAME COLUMN seq_base TO next_seq",
    "DROP SEQUENCE planrun_event_seq",
    # schema 2 kept the counter past every seq of the run
    "UPDATE planrun_runs AS r SET next_seq = (SELECT coalesce(max(seq) + 1, 0) "
    "FROM planrun_events AS e WHERE e.run_id = r.id)",
]


UNDO_5 = ["ALTER TABLE planrun_tasks DROP COLUMN parent",
          "ALTER TABLE planrun_tasks DROP COLUMN joins"]
UNDO_4 = ["DROP TABLE planrun_limits", "DROP TABLE planrun_spend"]


def as_version_2(store_url: str) -> None:
    """Turn a fresh store back into schema 2 (no shared limits, no owner lease, a counter row
    in PostgreSQL)."""
    if store_url.startswith("sqlite"):
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
            for sql in [*UNDO_5, *UNDO_4, *UNDO_3_SQLITE]:
                conn.execute(sql)
            conn.execute("UPDATE planrun_schema SET version = 2")
        return
    import psycopg

    with psycopg.connect(store_url, autocommit=True) as conn:
        for sql in [*UNDO_5, *UNDO_4, *UNDO_3_POSTGRES]:
            conn.execute(sql)
        conn.execute("UPDATE planrun_schema SET version = 2")


def as_version_1(store_url: str, duplicate: tuple[str, int]) -> None:
    """Turn a fresh store back into schema 1, with an event stored twice under one seq."""
    as_version_2(store_url)
    run_id, seq = duplicate
    copy = ("INSERT INTO planrun_events (run_id, seq, at, task, event, worker, attempt, "
            "detail) SELECT run_id, seq, at, task, event, worker, attempt, detail "
            "FROM planrun_events WHERE run_id = {p} AND seq = {p}")
    undo = ["DROP INDEX planrun_events_seq",
            "CREATE INDEX planrun_events_run ON planrun_events (run_id, seq)"]
    if store_url.startswith("sqlite"):
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
            for sql in undo:
                conn.execute(sql)
            conn.execute(copy.format(p="?"), (run_id, seq))
            conn.execute("UPDATE planrun_schema SET version = 1")
        return
    import psycopg

    with psycopg.connect(store_url, autocommit=True) as conn:
        for sql in undo:
            conn.execute(sql)
        conn.execute(copy.format(p="%s"), (run_id, seq))
        conn.execute("UPDATE planrun_schema SET version = 1")


@pytest.mark.parametrize("backend", PERSISTENT)
async def test_schema_1_is_migrated_to_one_event_per_seq(store_url: str) -> None:
    store = open_store(store_url)
    await store.open()
    run_id = await make_run(store, chain(2))
    await store.close()
    as_version_1(store_url, (run_id, 1))

    again = open_store(store_url)
    await again.open()
    try:
        events = (await again.load(run_id)).events
        assert [(e.seq, e.task) for e in events] == [(0, "t0"), (1, "t1")]  # the copy is gone
        await again.write(run_id, [(Task("t0", "k"), Event(1, 5.0, "t0", "retry"))])
        assert len((await again.load(run_id)).events) == 2  # seq 1 stays the first one
    finally:
        await again.close()
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1} is newer"):
        stamp(store_url, SCHEMA_VERSION + 1)
        await open_store(store_url).open()


def schema_version(store_url: str) -> int:
    if store_url.startswith("sqlite"):
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
            return int(conn.execute("SELECT version FROM planrun_schema").fetchone()[0])
    import psycopg

    with psycopg.connect(store_url) as conn:
        row = conn.execute("SELECT version FROM planrun_schema").fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.parametrize("backend", PERSISTENT)
async def test_schema_2_is_migrated_to_owner_leases_and_lock_free_numbering(
    store_url: str,
) -> None:
    store = open_store(store_url)
    await store.open()
    run_id = await make_run(store, chain(3))
    started = transition(transition(chain(3)[0], Status.ASSIGNED, assigned_to="w", token=1),
                         Status.RUNNING, started_at=2.0)
    await store.write(run_id, [(started, Event(3, 2.0, "t0", "started", "w", 1))])
    await store.close()
    as_version_2(store_url)
    assert schema_version(store_url) == 2

    again = open_store(store_url)
    await again.open()
    try:
        assert schema_version(store_url) == SCHEMA_VERSION == 6
        before = await again.load(run_id)
        assert [e.event for e in before.events] == ["created"] * 3 + ["started"]
        assert before.run.owner is None and await again.run_owner(run_id) is None
        await again.acquire_run(run_id, "me", ttl=30.0, now=10.0)
        assert await again.run_owner(run_id) == RunOwner("me", 40.0)
        await complete(again, run_id, chain(3)[0], seq=before.events[-1].seq + 1)
        await again.append_event(run_id, Event(-1, 12.0, "t0", "effect", None, 1,
                                               {"key": "k"}))  # store-numbered
        after = await again.load(run_id)
        seqs = [e.seq for e in after.events]
        assert increasing(seqs) and len(seqs) == 6 and after.events[-1].event == "effect"
    finally:
        await again.close()


@pytest.mark.parametrize("backend", PERSISTENT)
async def test_a_newer_schema_is_refused(store_url: str) -> None:
    store = open_store(store_url)
    await store.open()
    await store.close()
    stamp(store_url, SCHEMA_VERSION + 1)

    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1} is newer"):
        await open_store(store_url).open()


@pytest.mark.parametrize("backend", PERSISTENT)
async def test_a_store_that_is_not_open_says_so(store_url: str) -> None:
    store = open_store(store_url)
    with pytest.raises(StoreError, match="not open"):
        await store.list_runs()


async def test_sqlite_cannot_open_a_file_in_a_missing_folder(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "x.db"
    with pytest.raises(StoreError, match=str(path)):
        await open_store(f"sqlite:///{path}").open()


def open_in_process(url: str) -> str:
    """Entry point of a process that opens a store and lists its runs: '' or the error."""

    async def go() -> None:
        store = open_store(url)
        await store.open()
        try:
            await store.list_runs()
        finally:
            await store.close()

    try:
        asyncio.run(go())
    except StoreError as exc:
        return str(exc)
    return ""


def test_sqlite_a_new_file_opened_by_many_processes_at_once(tmp_path: Path) -> None:
    # A CLI run and `planrun runs` started together both create the schema and switch the
    # new file to WAL; SQLite answers the loser of that race "locked" without waiting.
    urls = [f"sqlite:///{tmp_path / f'new{i}.db'}" for i in range(20)]
    with multiprocessing.get_context("spawn").Pool(8) as pool:
        errors = pool.map(open_in_process, [u for u in urls for _ in range(8)], chunksize=1)
    assert [e for e in errors if e] == []
    for url in urls:
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_sqlite_switching_to_wal_waits_out_a_lock_and_nothing_else() -> None:
    from planrun.stores.sqlite import _enable_wal

    class Conn:
        def __init__(self, errors: list[str]) -> None:
            self.errors, self.calls = errors, 0

        def execute(self, sql: str) -> None:
            self.calls += 1
            if self.errors:
                raise sqlite3.OperationalError(self.errors.pop(0))

    busy = Conn(["database is locked", "database is locked"])
    _enable_wal(busy, 5.0)  # type: ignore[arg-type]
    assert busy.calls == 3
    broken = Conn(["disk I/O error", "database is locked"])
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        _enable_wal(broken, 5.0)  # type: ignore[arg-type]
    assert broken.calls == 1
    stuck = Conn(["database is locked"] * 10_000)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        _enable_wal(stuck, 0.05)  # type: ignore[arg-type]
    assert 1 < stuck.calls < 100


async def test_sqlite_inline_mode_runs_on_the_loop_thread(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "inline.db"), inline=True)
    await store.open()
    try:
        run_id = await make_run(store, chain(2))
        await complete(store, run_id, chain(2)[0], seq=2)
        assert [t.status for t in await store.load_some(run_id, ["t0"])] == [Status.COMPLETED]
    finally:
        await store.close()


async def test_postgres_unreachable_fails_fast_with_the_password_masked() -> None:
    url = "postgresql://planrun:s3cret@127.0.0.1:1/nowhere"
    store = open_store(url)
    assert store.url == "postgresql://planrun:***@127.0.0.1:1/nowhere"
    started = time.monotonic()

    with pytest.raises(StoreError) as caught:
        await store.open()

    assert time.monotonic() - started < 5.0
    message = str(caught.value)
    assert "postgresql://planrun:***@127.0.0.1:1/nowhere" in message
    assert "s3cret" not in message
    assert "\n" not in message


@pytest.mark.postgres
async def test_postgres_survives_a_dropped_connection(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    import psycopg

    name = f"planrun-test-{uuid.uuid4().hex[:8]}"
    store = PostgresStore(pg_url, application_name=name, min_size=2)
    await store.open()
    try:
        run_id = await make_run(store, chain(3))
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (name,),
            ).fetchall()
        assert len(killed) >= 2
        with caplog.at_level(logging.WARNING, logger="planrun.stores"):
            await complete(store, run_id, chain(3)[0], seq=3)
        assert "retrying" in caplog.text
        assert (await store.load(run_id)).tasks[0].status is Status.COMPLETED
    finally:
        await store.close()


@pytest.mark.postgres
async def test_postgres_accepts_the_postgres_scheme(pg_url: str) -> None:
    store = open_store(pg_url.replace("postgresql://", "postgres://", 1))
    await store.open()
    try:
        assert isinstance(await store.list_runs(), list)
    finally:
        await store.close()


# --- light reads and store-numbered events ---------------------------------------------------


async def test_load_tasks_is_load_without_the_ledger(store: Store) -> None:
    run_id = await make_run(store, chain(3))
    await complete(store, run_id, chain(3)[0], seq=3)
    await store.effect_begin(run_id, "t0", f"{run_id}:t0", 6.0)
    light, full = await store.load_tasks(run_id), await store.load(run_id)
    assert light.events == [] and len(full.events) == 4
    assert light.tasks == full.tasks and light.effects == full.effects
    with pytest.raises(StoreError, match="unknown run"):
        await store.load_tasks("nope")


async def test_append_event_is_numbered_after_everything_else(store: Store) -> None:
    run_id = await make_run(store, chain(2))
    await complete(store, run_id, chain(2)[0], seq=7)
    await store.append_event(run_id, Event(-1, 9.0, "t0", "effect", None, 1, {"key": "k"}))
    events = (await store.load(run_id)).events
    assert [e.event for e in events][-1] == "effect"
    assert events[-1].seq > 7 and len({e.seq for e in events}) == len(events)
    with pytest.raises(StoreError, match="unknown run"):
        await store.append_event("nope", Event(-1, 9.0, "t0", "effect"))


# --- the run's owner lease --------------------------------------------------------------------


async def test_a_run_has_one_owner_at_a_time(store: Store) -> None:
    run_id = await make_run(store, [Task("a", "k")])
    assert await store.run_owner(run_id) is None

    await store.acquire_run(run_id, "p1", ttl=30.0, now=100.0)
    assert await store.run_owner(run_id) == RunOwner("p1", 130.0)
    with pytest.raises(RunInUse, match=r"run run-\w+ is owned by p1, whose lease ends") as info:
        await store.acquire_run(run_id, "p2", ttl=30.0, now=120.0)
    assert (info.value.owner, info.value.until) == ("p1", 130.0)
    await store.acquire_run(run_id, "p1", ttl=30.0, now=120.0)  # ours already: extended
    assert await store.run_owner(run_id) == RunOwner("p1", 150.0)
    assert await store.renew_run(run_id, "p1", ttl=30.0, now=140.0) is True
    assert await store.renew_run(run_id, "p2", ttl=30.0, now=140.0) is False
    state, [summary] = await store.load(run_id), await store.list_runs()
    assert (state.run.owner, state.run.owner_until) == ("p1", 170.0)
    assert (summary.owner, summary.owner_until) == ("p1", 170.0)

    # The lease ran out: another process takes the run, and the old owner cannot renew.
    await store.acquire_run(run_id, "p2", ttl=30.0, now=171.0)
    assert await store.renew_run(run_id, "p1", ttl=30.0, now=172.0) is False
    await store.release_run(run_id, "p1")  # not the owner: nothing changes
    assert await store.run_owner(run_id) == RunOwner("p2", 201.0)
    await store.release_run(run_id, "p2")
    assert await store.run_owner(run_id) is None
    await store.acquire_run(run_id, "p3", ttl=5.0, now=172.0)  # released: free at once
    assert await store.run_owner(run_id) == RunOwner("p3", 177.0)


async def test_a_gone_owner_is_taken_over_only_while_it_still_holds_the_run(
    store: Store,
) -> None:
    run_id = await make_run(store, [Task("a", "k")])
    await store.acquire_run(run_id, "dead", ttl=30.0, now=100.0)
    # Its lease still holds, but the caller found it gone: compare and set takes it over.
    await store.acquire_run(run_id, "p1", ttl=30.0, now=101.0, take_from="dead")
    assert await store.run_owner(run_id) == RunOwner("p1", 131.0)
    # A second process that also saw "dead" finds p1 there instead and is refused.
    with pytest.raises(RunInUse, match="owned by p1") as info:
        await store.acquire_run(run_id, "p2", ttl=30.0, now=102.0, take_from="dead")
    assert info.value.owner == "p1"
    assert await store.run_owner(run_id) == RunOwner("p1", 131.0)


async def test_owner_calls_name_an_unknown_run_and_refuse_a_bad_ttl(store: Store) -> None:
    run_id = await make_run(store, [Task("a", "k")])
    for call in (store.acquire_run("nope", "p", 30.0, 1.0), store.renew_run("nope", "p", 30.0, 1.0),
                 store.release_run("nope", "p"), store.run_owner("nope")):
        with pytest.raises(UnknownRun, match="unknown run 'nope'"):
            await call
    with pytest.raises(UsageError, match="positive ttl"):
        await store.acquire_run(run_id, "p", 0.0, 1.0)
    assert await store.run_owner(run_id) is None


async def test_two_connections_racing_to_acquire_get_one_owner(connect: Connect) -> None:
    store, other = await connect(), await connect()
    for _ in range(8):
        run_id = await make_run(store, [Task("a", "k")])
        now = time.time()
        got = await asyncio.gather(store.acquire_run(run_id, "p1", 30.0, now),
                                   other.acquire_run(run_id, "p2", 30.0, now),
                                   return_exceptions=True)
        refused = [r for r in got if isinstance(r, RunInUse)]
        assert sorted(map(repr, got)).count("None") == 1 and len(refused) == 1, got
        owner = await other.run_owner(run_id)
        assert owner is not None and refused[0].owner == owner.name


# --- values that are not JSON -------------------------------------------------------------------


async def test_a_result_that_is_not_json_fails_at_once_naming_type_and_path(
    store: Store,
) -> None:
    import datetime

    run_id = await make_run(store, [Task("a", "k")])
    before = await store.load(run_id)
    bad = completed(Task("a", "k")).evolve(result={"rows": [{"ok": 1}, {"when": datetime.date(
        2026, 1, 2)}]})

    with pytest.raises(UnstorableValue, match=r"task 'a' result cannot be stored as JSON: "
                       r"\$\.rows\[1\]\.when has type datetime\.date") as info:
        await store.write(run_id, [(bad, Event(1, 2.0, "a", "completed"))])
    assert not isinstance(info.value, StoreError)  # permanent: no driver retries it
    assert (info.value.path, info.value.type_name) == ("$.rows[1].when", "datetime.date")
    with pytest.raises(UnstorableValue, match=r"\$ has type set"):
        await store.write_batch(run_id, [bad.evolve(result={1, 2})],
                                [(1, 2.0, "a", "completed", None, 0, None)])
    await store.effect_begin(run_id, "a", "key-a", at=2.0)
    with pytest.raises(UnstorableValue, match=r"effect result of task 'a' cannot be stored "
                       r"as JSON: \$\.n is the float nan"):
        await store.effect_done(run_id, "a", {"n": float("nan")}, 3.0)
    after = await store.load(run_id)
    assert (after.tasks, after.events) == (before.tasks, before.events)


@pytest.mark.parametrize("backend", PERSISTENT)
async def test_a_value_that_is_not_json_is_refused_before_any_io(store_url: str) -> None:
    store = open_store(store_url)  # never opened: an encoding error comes first
    with pytest.raises(UnstorableValue, match="payload cannot be stored as JSON"):
        await store.write("r", [(Task("a", "k", {"x": b"bytes"}), Event(0, 1.0, "a", "x"))])


async def test_sqlite_close_returns_before_the_checkpoint_and_loses_nothing(
        tmp_path: Path) -> None:
    """Closing returns once the last commit is done; the checkpoint SQLite runs as its last
    connection closes goes on on the store's thread. Another connection reads everything at
    once, the same store opens again after it, and a process that exits right after close
    leaves a file another process reads whole."""
    path = tmp_path / "close.db"
    store = SQLiteStore(str(path))
    await store.open()
    run_id = await make_run(store, [Task(f"t{i}", "k", {"pad": "x" * 500}) for i in range(400)])
    closing = store.connector._executor
    await store.close()
    assert store.connector._closing is not None and closing is not None
    with sqlite3.connect(path) as other:  # the commits are in the log already
        assert other.execute("SELECT count(*) FROM planrun_tasks").fetchone() == (400,)
    await store.open()  # waits for the checkpoint of the last close
    assert store.connector._closing is None and len((await store.load(run_id)).tasks) == 400
    await store.close()
    script = (f"import asyncio\nfrom planrun.stores import SQLiteStore\n"
              f"from planrun.stores.base import RunInfo\n"
              f"async def go():\n    s = SQLiteStore({str(tmp_path / 'exit.db')!r})\n"
              f"    await s.open()\n    await s.create_run(RunInfo('r', 1.0))\n"
              f"    await s.close()\nasyncio.run(go())\n")
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert not (tmp_path / "exit.db-wal").exists()  # the exit waited for the checkpoint
    with contextlib.closing(sqlite3.connect(tmp_path / "exit.db")) as conn:
        assert conn.execute("SELECT id FROM planrun_runs").fetchall() == [("r",)]
