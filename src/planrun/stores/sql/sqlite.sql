-- The SQLite dialect of the SQL store (planrun.stores.sqlite): its schema, and the
-- fragments and queries where it differs from queries.sql. JSON columns are text;
-- json_each() reads them inside queries, and a list parameter is bound as JSON text.

-- name: schema_lock
-- Nothing: a migration's BEGIN IMMEDIATE holds the file's write lock already.

-- name: now
-- This machine's clock (time.time(), bound by the connector as each statement runs):
-- only processes of one machine share a SQLite file.
:wall_clock

-- name: commit_unsynced
-- Nothing: a SQLite commit in WAL mode with synchronous=NORMAL does not wait for the disk.

-- name: task_order
rowid

-- name: task_rows
-- {rows} stands for as many task_row as the statement holds (the connector's _rows): one
-- statement of many rows costs less per row than a statement run once per row.
VALUES {rows}

-- name: task_row
-- The values of planrun.stores.base.task_values in their order, bound by position.
-- sqlite3 binds None slowly (it looks for an adapter first, about 0.35 us a value, and a
-- task row has up to ten), so a missing value of a nullable text column comes as 0 and one
-- of a nullable number column as '', and NULLIF turns it back into NULL: a text value never
-- equals 0, nor a number ''.
(?, ?, ?, ?, ?, NULLIF(?, 0), ?, ?, ?, NULLIF(?, 0), NULLIF(?, 0), NULLIF(?, 0), ?, ?, ?,
 NULLIF(?, ''), ?, ?, NULLIF(?, ''), NULLIF(?, ''), NULLIF(?, ''), NULLIF(?, ''),
 NULLIF(?, 0), ?)

-- name: event_rows
VALUES {rows}

-- name: event_row
-- The values of planrun.stores.base.event_values in their order; a missing worker comes
-- as 0 (see task_row).
(?, ?, ?, ?, ?, NULLIF(?, 0), ?, ?)

-- name: get_tasks_by_ids
SELECT * FROM planrun_tasks
WHERE run_id = :run_id AND id IN (SELECT value FROM json_each(:ids))
ORDER BY rowid;

-- name: raise_next_seq
-- After events with caller-assigned seqs: keep the counter past the highest one.
UPDATE planrun_runs SET next_seq = :after WHERE id = :run_id AND next_seq < :after;

-- name: take_seq
-- A seq for an event made inside the store (the write lock is held: no other writer).
-- No row: unknown run.
UPDATE planrun_runs SET next_seq = next_seq + 1 WHERE id = :run_id
RETURNING next_seq - 1 AS seq;

-- name: migrate_1
-- The first schema: runs, tasks (one column per Task field), events, effects, workers.
CREATE TABLE planrun_runs (
    id          TEXT PRIMARY KEY,
    created_at  REAL NOT NULL,
    status      TEXT NOT NULL,
    goal        TEXT NOT NULL,
    meta        TEXT NOT NULL,
    next_seq    INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE planrun_tasks (
    run_id       TEXT NOT NULL REFERENCES planrun_runs (id) ON DELETE CASCADE,
    id           TEXT NOT NULL,
    kind         TEXT NOT NULL,
    payload      TEXT NOT NULL,
    status       TEXT NOT NULL,
    assigned_to  TEXT,
    attempts     INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    result       TEXT,
    error        TEXT,
    error_class  TEXT,
    cause        TEXT,
    depends_on   TEXT NOT NULL,
    estimate_s   REAL NOT NULL,
    resources    TEXT NOT NULL,
    lease        REAL,
    token        INTEGER NOT NULL,
    reclaims     INTEGER NOT NULL,
    not_before   REAL,
    created_at   REAL,
    started_at   REAL,
    finished_at  REAL,
    PRIMARY KEY (run_id, id)
);
CREATE INDEX planrun_tasks_ready ON planrun_tasks (run_id, status, kind);
CREATE TABLE planrun_events (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id   TEXT NOT NULL REFERENCES planrun_runs (id) ON DELETE CASCADE,
    seq      INTEGER NOT NULL,
    at       REAL NOT NULL,
    task     TEXT NOT NULL,
    event    TEXT NOT NULL,
    worker   TEXT,
    attempt  INTEGER NOT NULL,
    detail   TEXT NOT NULL
);
CREATE INDEX planrun_events_run ON planrun_events (run_id, seq);
CREATE TABLE planrun_effects (
    run_id   TEXT NOT NULL REFERENCES planrun_runs (id) ON DELETE CASCADE,
    task_id  TEXT NOT NULL,
    key      TEXT NOT NULL,
    state    TEXT NOT NULL,
    result   TEXT,
    at       REAL NOT NULL,
    PRIMARY KEY (run_id, task_id)
);
CREATE TABLE planrun_workers (
    run_id          TEXT NOT NULL REFERENCES planrun_runs (id) ON DELETE CASCADE,
    name            TEXT NOT NULL,
    kinds           TEXT NOT NULL,
    capacity        INTEGER NOT NULL,
    registered_at   REAL NOT NULL,
    last_heartbeat  REAL NOT NULL,
    PRIMARY KEY (run_id, name)
);

-- name: migrate_2
-- One event per (run, seq): a batch written again (its commit's answer lost) adds nothing.
DELETE FROM planrun_events
WHERE id NOT IN (SELECT min(id) FROM planrun_events GROUP BY run_id, seq);
DROP INDEX IF EXISTS planrun_events_run;
CREATE UNIQUE INDEX planrun_events_seq ON planrun_events (run_id, seq);

-- name: migrate_3
-- The run's owner lease: one process owns a run at a time (Store.acquire_run).
ALTER TABLE planrun_runs ADD COLUMN owner TEXT;
ALTER TABLE planrun_runs ADD COLUMN owner_until REAL;

-- name: migrate_4
-- Limits shared by every process: one rate-limiter row per limit key (GCRA: each bucket
-- is kept as the time it is full again), one spend row per run (the run's budget, what
-- was spent and what calls in flight hold back).
CREATE TABLE planrun_limits (
    key               TEXT PRIMARY KEY,
    rpm               REAL,
    tpm               REAL,
    request_burst     REAL NOT NULL,
    token_burst       REAL NOT NULL,
    requests_full_at  REAL NOT NULL DEFAULT 0,
    tokens_full_at    REAL NOT NULL DEFAULT 0,
    paused_until      REAL NOT NULL DEFAULT 0,
    acquired          INTEGER NOT NULL DEFAULT 0,
    penalties         INTEGER NOT NULL DEFAULT 0,
    minute            INTEGER NOT NULL DEFAULT 0,
    minute_count      INTEGER NOT NULL DEFAULT 0,
    prev_count        INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE planrun_spend (
    run_id            TEXT PRIMARY KEY,
    max_tokens        INTEGER,
    max_cost          REAL,
    requests          INTEGER NOT NULL DEFAULT 0,
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    cached_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd          REAL NOT NULL DEFAULT 0,
    reserved_tokens   INTEGER NOT NULL DEFAULT 0,
    reserved_cost     REAL NOT NULL DEFAULT 0
);

-- name: migrate_5
-- Tasks created at run time: the task that spawned each one, and the tasks whose spawned
-- tasks it waits for (a join).
ALTER TABLE planrun_tasks ADD COLUMN parent TEXT;
ALTER TABLE planrun_tasks ADD COLUMN joins TEXT NOT NULL DEFAULT '[]';

-- name: migrate_6
-- A rate-limiter row says whether its rates are the provider's (from its x-ratelimit-*
-- headers): a process that starts later must not write its configured rates over them.
ALTER TABLE planrun_limits ADD COLUMN learned INTEGER NOT NULL DEFAULT 0;
