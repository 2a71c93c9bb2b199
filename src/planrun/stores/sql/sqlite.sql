-- Named queries of the SQLite store (planrun.stores.sqlite).
-- Parameters use sqlite3's :name style. JSON columns hold text written by
-- planrun.stores.base.dump_json; json_each() reads them inside queries.

-- name: schema_table
CREATE TABLE IF NOT EXISTS planrun_schema (version INTEGER NOT NULL);

-- name: schema_version
SELECT max(version) AS version FROM planrun_schema;

-- name: clear_version
DELETE FROM planrun_schema;

-- name: stamp_version
INSERT INTO planrun_schema (version) VALUES (:version);

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

-- name: limiter_configure
-- Rates the provider reported (learned) replace any; configured rates replace configured
-- ones only.
INSERT INTO planrun_limits (key, rpm, tpm, request_burst, token_burst, learned)
VALUES (:key, :rpm, :tpm, :request_burst, :token_burst, :learned)
ON CONFLICT (key) DO UPDATE SET
    rpm = excluded.rpm, tpm = excluded.tpm, request_burst = excluded.request_burst,
    token_burst = excluded.token_burst, learned = excluded.learned
WHERE excluded.learned OR NOT planrun_limits.learned;

-- name: limiter_take
-- One request and :cost tokens, only when both buckets (and any pause) allow it now.
UPDATE planrun_limits SET
    requests_full_at = CASE WHEN rpm IS NULL THEN requests_full_at
                            ELSE max(requests_full_at, :now) + 60.0 / rpm END,
    tokens_full_at = CASE WHEN tpm IS NULL THEN tokens_full_at
                          ELSE max(tokens_full_at, :now) + :cost * 60.0 / tpm END,
    acquired = acquired + 1,
    prev_count = CASE WHEN CAST(:now / 60 AS INTEGER) = minute THEN prev_count
                      WHEN CAST(:now / 60 AS INTEGER) = minute + 1 THEN minute_count
                      ELSE 0 END,
    minute_count = CASE WHEN CAST(:now / 60 AS INTEGER) = minute THEN minute_count + 1
                        ELSE 1 END,
    minute = CAST(:now / 60 AS INTEGER)
WHERE key = :key
  AND max(paused_until,
          CASE WHEN rpm IS NULL THEN 0
               ELSE requests_full_at - (request_burst - 1) * 60.0 / rpm END,
          CASE WHEN tpm IS NULL THEN 0
               ELSE tokens_full_at - (token_burst - min(:cost, token_burst)) * 60.0 / tpm END
      ) <= :now + 1e-6;

-- name: limiter_ready_at
SELECT max(paused_until,
           CASE WHEN rpm IS NULL THEN 0
                ELSE requests_full_at - (request_burst - 1) * 60.0 / rpm END,
           CASE WHEN tpm IS NULL THEN 0
                ELSE tokens_full_at - (token_burst - min(:cost, token_burst)) * 60.0 / tpm END
       ) AS ready_at
FROM planrun_limits WHERE key = :key;

-- name: limiter_give
-- Return :amount tokens (negative: take more), never beyond a full bucket.
UPDATE planrun_limits
SET tokens_full_at = max(:now, max(tokens_full_at, :now) - :amount * 60.0 / tpm)
WHERE key = :key AND tpm IS NOT NULL;

-- name: limiter_defer
-- The provider says less remains than a bucket holds: full again no sooner than now + s.
UPDATE planrun_limits SET
    requests_full_at = CASE WHEN :requests IS NULL THEN requests_full_at
                            ELSE max(requests_full_at, :now + :requests) END,
    tokens_full_at = CASE WHEN :tokens IS NULL THEN tokens_full_at
                          ELSE max(tokens_full_at, :now + :tokens) END
WHERE key = :key;

-- name: limiter_pause
UPDATE planrun_limits
SET paused_until = max(paused_until, :now + :seconds), penalties = penalties + 1
WHERE key = :key;

-- name: limiter_state
SELECT *, :now AS now FROM planrun_limits WHERE key = :key;

-- name: spend_open
-- The run's budget; a second open (a resume, a joining worker) keeps what was spent.
INSERT INTO planrun_spend (run_id, max_tokens, max_cost)
VALUES (:run_id, :max_tokens, :max_cost)
ON CONFLICT (run_id) DO UPDATE SET
    max_tokens = coalesce(excluded.max_tokens, max_tokens),
    max_cost = coalesce(excluded.max_cost, max_cost);

-- name: spend_reserve
-- Hold back :tokens and :cost for one request, only if spent + reserved + it fits.
UPDATE planrun_spend
SET reserved_tokens = reserved_tokens + :tokens, reserved_cost = reserved_cost + :cost
WHERE run_id = :run_id
  AND (max_tokens IS NULL
       OR prompt_tokens + completion_tokens + reserved_tokens + :tokens <= max_tokens)
  AND (max_cost IS NULL OR cost_usd + reserved_cost + :cost <= max_cost + 1e-12);

-- name: spend_settle
-- A request ended: give back its reservation and add what it really used.
UPDATE planrun_spend SET
    reserved_tokens = max(0, reserved_tokens - :reserved_tokens),
    reserved_cost = max(0.0, reserved_cost - :reserved_cost),
    requests = requests + :requests,
    prompt_tokens = prompt_tokens + :prompt_tokens,
    cached_tokens = cached_tokens + :cached_tokens,
    completion_tokens = completion_tokens + :completion_tokens,
    cost_usd = cost_usd + :cost_usd
WHERE run_id = :run_id;

-- name: spend_release_all
-- No call of the run is in flight (a resume of a run driven by one process).
UPDATE planrun_spend SET reserved_tokens = 0, reserved_cost = 0 WHERE run_id = :run_id;

-- name: spend_get
SELECT * FROM planrun_spend WHERE run_id = :run_id;

-- name: create_run
INSERT INTO planrun_runs (id, created_at, status, goal, meta)
VALUES (:id, :created_at, :status, :goal, :meta);

-- name: acquire_run
-- Take the lease when nobody holds it, when it ran out, when it is ours already, or when
-- its holder is the owner the caller found gone (take_from: compare and set, so an owner
-- that took the run meanwhile keeps it).
UPDATE planrun_runs SET owner = :owner, owner_until = :until
WHERE id = :run_id
  AND (owner IS NULL OR owner = :owner OR owner_until IS NULL OR owner_until < :now
       OR owner = :take_from);

-- name: renew_run
UPDATE planrun_runs SET owner_until = :until WHERE id = :run_id AND owner = :owner;

-- name: release_run
UPDATE planrun_runs SET owner = NULL, owner_until = NULL
WHERE id = :run_id AND owner = :owner;

-- name: get_owner
SELECT owner, owner_until FROM planrun_runs WHERE id = :run_id;

-- name: set_run_status
UPDATE planrun_runs SET status = :status WHERE id = :run_id;

-- name: get_run
SELECT id, created_at, status, goal, meta, owner, owner_until FROM planrun_runs
WHERE id = :run_id;

-- name: list_runs
SELECT id, created_at, status, goal, meta, owner, owner_until FROM planrun_runs
ORDER BY created_at, id;

-- name: count_tasks
SELECT run_id, status, count(*) AS n FROM planrun_tasks GROUP BY run_id, status;

-- name: insert_tasks_rows
-- New task rows, many at once, by position: {rows} stands for one task_values_row per row
-- (planrun.stores.sqlite._rows). One statement of many rows costs less per row than a
-- one-row statement run once per row (each run is a statement of its own).
INSERT INTO planrun_tasks (
    run_id, id, kind, payload, status, assigned_to, attempts, max_attempts, result, error,
    error_class, cause, depends_on, estimate_s, resources, lease, token, reclaims,
    not_before, created_at, started_at, finished_at, parent, joins
) VALUES {rows};

-- name: upsert_tasks_rows
-- Every column of each row (see insert_tasks_rows); a row keeps its rowid (its place in
-- task order). The rows' ids are distinct.
INSERT INTO planrun_tasks (
    run_id, id, kind, payload, status, assigned_to, attempts, max_attempts, result, error,
    error_class, cause, depends_on, estimate_s, resources, lease, token, reclaims,
    not_before, created_at, started_at, finished_at, parent, joins
) VALUES {rows}
ON CONFLICT (run_id, id) DO UPDATE SET
    kind = excluded.kind, payload = excluded.payload, status = excluded.status,
    assigned_to = excluded.assigned_to, attempts = excluded.attempts,
    max_attempts = excluded.max_attempts, result = excluded.result, error = excluded.error,
    error_class = excluded.error_class, cause = excluded.cause,
    depends_on = excluded.depends_on, estimate_s = excluded.estimate_s,
    resources = excluded.resources, lease = excluded.lease, token = excluded.token,
    reclaims = excluded.reclaims, not_before = excluded.not_before,
    created_at = excluded.created_at, started_at = excluded.started_at,
    finished_at = excluded.finished_at, parent = excluded.parent, joins = excluded.joins;

-- name: task_values_row
-- One row of insert_tasks_rows / upsert_tasks_rows: the values of
-- planrun.stores.base.task_values in their order. sqlite3 binds None slowly (it looks for an
-- adapter first, about 0.35 us a value, and a task row has up to ten), so a missing value of
-- a nullable text column comes as 0 and one of a nullable number column as '', and NULLIF
-- turns it back into NULL: a text value never equals 0, nor a number ''.
(?, ?, ?, ?, ?, NULLIF(?, 0), ?, ?, ?, NULLIF(?, 0), NULLIF(?, 0), NULLIF(?, 0), ?, ?, ?,
 NULLIF(?, ''), ?, ?, NULLIF(?, ''), NULLIF(?, ''), NULLIF(?, ''), NULLIF(?, ''),
 NULLIF(?, 0), ?)

-- name: record_decision
-- A person's decision on a waiting row, written once: only over the cause it was read with.
UPDATE planrun_tasks SET cause = :cause, error = :error
WHERE run_id = :run_id AND id = :id AND status = 'waiting' AND cause = :expect_cause;

-- name: get_tasks
SELECT * FROM planrun_tasks WHERE run_id = :run_id ORDER BY rowid;

-- name: get_tasks_by_ids
SELECT * FROM planrun_tasks
WHERE run_id = :run_id AND id IN (SELECT value FROM json_each(:ids))
ORDER BY rowid;

-- name: insert_event
-- An event already stored under its seq (the same batch written twice) is kept as it is.
INSERT INTO planrun_events (run_id, seq, at, task, event, worker, attempt, detail)
VALUES (:run_id, :seq, :at, :task, :event, :worker, :attempt, :detail)
ON CONFLICT (run_id, seq) DO NOTHING;

-- name: insert_events_rows
-- insert_event for many rows at once, by position: {rows} stands for one event_values_row
-- per row (see insert_tasks_rows); an event already stored under its seq is kept as it is.
INSERT INTO planrun_events (run_id, seq, at, task, event, worker, attempt, detail)
VALUES {rows}
ON CONFLICT (run_id, seq) DO NOTHING;

-- name: event_values_row
-- One row of insert_events_rows: the values of planrun.stores.base.event_values in their
-- order; a missing worker comes as 0 (see task_values_row).
(?, ?, ?, ?, ?, NULLIF(?, 0), ?, ?)

-- name: get_events
SELECT seq, at, task, event, worker, attempt, detail FROM planrun_events
WHERE run_id = :run_id ORDER BY seq, id;

-- name: raise_next_seq
-- After events with caller-assigned seqs: keep the counter past the highest one.
UPDATE planrun_runs SET next_seq = max(next_seq, :after) WHERE id = :run_id;

-- name: take_seqs
-- Reserve :n seqs for events made inside the store; the first is next_seq - :n.
UPDATE planrun_runs SET next_seq = next_seq + :n WHERE id = :run_id;

-- name: get_next_seq
SELECT next_seq FROM planrun_runs WHERE id = :run_id;

-- name: effect_begin
INSERT INTO planrun_effects (run_id, task_id, key, state, result, at)
VALUES (:run_id, :task_id, :key, 'started', 'null', :at)
ON CONFLICT (run_id, task_id) DO NOTHING;

-- name: effect_done
UPDATE planrun_effects SET state = 'applied', result = :result, at = :at
WHERE run_id = :run_id AND task_id = :task_id AND state = 'started';

-- name: get_effect
SELECT task_id, key, state, result, at FROM planrun_effects
WHERE run_id = :run_id AND task_id = :task_id;

-- name: get_effects
SELECT task_id, key, state, result, at FROM planrun_effects
WHERE run_id = :run_id ORDER BY task_id;

-- name: register_worker
INSERT INTO planrun_workers (run_id, name, kinds, capacity, registered_at, last_heartbeat)
VALUES (:run_id, :name, :kinds, :capacity, :at, :at)
ON CONFLICT (run_id, name) DO UPDATE SET
    kinds = excluded.kinds, capacity = excluded.capacity,
    registered_at = excluded.registered_at, last_heartbeat = excluded.last_heartbeat;

-- name: heartbeat_worker
UPDATE planrun_workers SET last_heartbeat = max(last_heartbeat, :at)
WHERE run_id = :run_id AND name = :name;

-- name: list_workers
SELECT name, kinds, capacity, last_heartbeat FROM planrun_workers
WHERE run_id = :run_id
ORDER BY name;
