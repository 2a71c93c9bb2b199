-- The PostgreSQL dialect of the SQL store (planrun.stores.postgres): its schema, and the
-- fragments and queries where it differs from queries.sql. JSON columns are jsonb: the
-- store sends JSON text, which the server casts, and psycopg decodes on reading. Tables
-- live in the first schema of the connection's search_path.

-- name: schema_lock
-- Serialises concurrent open() calls (several worker processes starting at once).
SELECT pg_advisory_xact_lock(4242170301);

-- name: snapshot
-- Reads of a whole run see one snapshot (the connector's "read" transactions).
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;

-- name: set_session
-- Per connection (the connector's _configure): idle_in_transaction_session_timeout cuts
-- off a session that sits idle inside a transaction (a stopped process), lock_timeout gives
-- up waiting for a lock. Session-wide (the pool's connections are in autocommit).
SELECT set_config(:name, :value, false);

-- name: now
-- The server's clock, which every machine shares (fixed for the statement).
extract(epoch FROM statement_timestamp())::float8

-- name: commit_unsynced
-- In a limiter's take and give (run on their own): the commit does not wait for the disk.
-- A limiter's state lives a minute; a server crash may lose the last few takes.
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS unsynced

-- name: task_order
pos

-- name: task_rows
-- A batch in one statement: one array per column (the connector's _arrays).
SELECT :run_id, r.id, r.kind, r.payload::jsonb, r.status, r.assigned_to, r.attempts,
       r.max_attempts, r.result::jsonb, r.error, r.error_class, r.cause, r.depends_on::jsonb,
       r.estimate_s, r.resources::jsonb, r.lease, r.token, r.reclaims, r.not_before,
       r.created_at, r.started_at, r.finished_at, r.parent, r.joins::jsonb
FROM unnest(
    :id::text[], :kind::text[], :payload::text[], :status::text[],
    :assigned_to::text[], :attempts::integer[], :max_attempts::integer[],
    :result::text[], :error::text[], :error_class::text[], :cause::text[],
    :depends_on::text[], :estimate_s::float8[], :resources::text[],
    :lease::float8[], :token::bigint[], :reclaims::integer[],
    :not_before::float8[], :created_at::float8[], :started_at::float8[],
    :finished_at::float8[], :parent::text[], :joins::text[]
) WITH ORDINALITY AS r (
    id, kind, payload, status, assigned_to, attempts, max_attempts, result, error,
    error_class, cause, depends_on, estimate_s, resources, lease, token, reclaims,
    not_before, created_at, started_at, finished_at, parent, joins, n
)
ORDER BY r.n

-- name: event_rows
-- A batch in one statement, one array per column; ids follow the order given.
SELECT :run_id, e.seq, e.at, e.task, e.event, e.worker, e.attempt, e.detail::jsonb
FROM unnest(
    :seq::bigint[], :at::float8[], :task::text[], :event::text[],
    :worker::text[], :attempt::bigint[], :detail::text[]
) WITH ORDINALITY AS e (seq, at, task, event, worker, attempt, detail, n)
ORDER BY e.n

-- name: get_tasks_by_ids
SELECT * FROM planrun_tasks WHERE run_id = :run_id AND id = ANY(:ids::text[])
ORDER BY pos;

-- name: raise_next_seq
-- After events with caller-assigned seqs (the run's one driver numbers them itself):
-- keep the base of store-made seqs past the highest one. A batch that moves it holds the
-- run's row until it commits.
UPDATE planrun_runs SET seq_base = :after WHERE id = :run_id AND seq_base < :after;

-- name: take_seq
-- A seq for an event made inside the store, above every seq of the run so far; concurrent
-- writers get distinct ones and nobody waits (a sequence is not transactional). No row:
-- unknown run.
SELECT seq_base + nextval('planrun_event_seq') AS seq FROM planrun_runs WHERE id = :run_id;

-- name: migrate_1
-- The first schema: runs, tasks (one column per Task field), events, effects, workers.
-- Dependencies stay in the depends_on jsonb array; claim reads it in the query.
CREATE TABLE planrun_runs (
    id          text PRIMARY KEY,
    created_at  double precision NOT NULL,
    status      text NOT NULL,
    goal        text NOT NULL,
    meta        jsonb NOT NULL,
    next_seq    bigint NOT NULL DEFAULT 0
);
CREATE TABLE planrun_tasks (
    run_id       text NOT NULL REFERENCES planrun_runs (id) ON DELETE CASCADE,
    id           text NOT NULL,
    pos          bigserial NOT NULL,
    kind         text NOT NULL,
    payload      jsonb NOT NULL,
    status       text NOT NULL,
    assigned_to  text,
    attempts     integer NOT NULL,
    max_attempts integer NOT NULL,
    result       jsonb,
    error        text,
    error_class  text,
    cause        text,
    depends_on   jsonb NOT NULL,
    estimate_s   double precision NOT NULL,
    resources    jsonb NOT NULL,
    lease        double precision,
    token        bigint NOT NULL,
    reclaims     integer NOT NULL,
    not_before   double precision,
    created_at   double precision,
    started_at   double precision,
    finished_at  double precision,
    PRIMARY KEY (run_id, id)
);
CREATE INDEX planrun_tasks_ready ON planrun_tasks (run_id, status, kind, pos);
CREATE TABLE planrun_events (
    id       bigserial PRIMARY KEY,
    run_id   text NOT NULL REFERENCES planrun_runs (id) ON DELETE CASCADE,
    seq      bigint NOT NULL,
    at       double precision NOT NULL,
    task     text NOT NULL,
    event    text NOT NULL,
    worker   text,
    attempt  bigint NOT NULL,
    detail   jsonb NOT NULL
);
CREATE INDEX planrun_events_run ON planrun_events (run_id, seq);
CREATE TABLE planrun_effects (
    run_id   text NOT NULL REFERENCES planrun_runs (id) ON DELETE CASCADE,
    task_id  text NOT NULL,
    key      text NOT NULL,
    state    text NOT NULL,
    result   jsonb,
    at       double precision NOT NULL,
    PRIMARY KEY (run_id, task_id)
);
CREATE TABLE planrun_workers (
    run_id          text NOT NULL REFERENCES planrun_runs (id) ON DELETE CASCADE,
    name            text NOT NULL,
    kinds           jsonb NOT NULL,
    capacity        integer NOT NULL,
    registered_at   double precision NOT NULL,
    last_heartbeat  double precision NOT NULL,
    PRIMARY KEY (run_id, name)
);

-- name: migrate_2
-- One event per (run, seq): a batch written again after a commit whose answer was lost
-- (the connection dropped during COMMIT, and the call was retried) adds nothing.
DELETE FROM planrun_events AS a USING planrun_events AS b
WHERE a.run_id = b.run_id AND a.seq = b.seq AND a.id > b.id;
DROP INDEX IF EXISTS planrun_events_run;
CREATE UNIQUE INDEX planrun_events_seq ON planrun_events (run_id, seq);

-- name: migrate_3
-- Events are numbered without a counter row: a store-numbered event takes
-- seq_base + nextval(planrun_event_seq), where seq_base (the old next_seq) is kept past
-- every seq a caller chose; nothing is locked until commit. Each event carries the id
-- of the transaction that wrote it (xid), which load_changed reads in commit order. The
-- run's owner lease: one process owns a run at a time (Store.acquire_run).
CREATE SEQUENCE planrun_event_seq AS bigint;
ALTER TABLE planrun_runs RENAME COLUMN next_seq TO seq_base;
ALTER TABLE planrun_runs ADD COLUMN owner text, ADD COLUMN owner_until double precision;
ALTER TABLE planrun_events ADD COLUMN xid bigint NOT NULL DEFAULT 0;
ALTER TABLE planrun_events ALTER COLUMN xid SET DEFAULT pg_current_xact_id()::text::bigint;
CREATE INDEX planrun_events_xid ON planrun_events (run_id, xid);

-- name: migrate_4
-- Limits shared by every process: one rate-limiter row per limit key (GCRA: each bucket
-- is kept as the time it is full again, in epoch seconds of the server's clock), one
-- spend row per run (the run's budget, what was spent and what calls in flight hold).
CREATE TABLE planrun_limits (
    key               text PRIMARY KEY,
    rpm               double precision,
    tpm               double precision,
    request_burst     double precision NOT NULL,
    token_burst       double precision NOT NULL,
    requests_full_at  double precision NOT NULL DEFAULT 0,
    tokens_full_at    double precision NOT NULL DEFAULT 0,
    paused_until      double precision NOT NULL DEFAULT 0,
    acquired          bigint NOT NULL DEFAULT 0,
    penalties         bigint NOT NULL DEFAULT 0,
    minute            bigint NOT NULL DEFAULT 0,
    minute_count      bigint NOT NULL DEFAULT 0,
    prev_count        bigint NOT NULL DEFAULT 0
);
CREATE TABLE planrun_spend (
    run_id            text PRIMARY KEY,
    max_tokens        bigint,
    max_cost          double precision,
    requests          bigint NOT NULL DEFAULT 0,
    prompt_tokens     bigint NOT NULL DEFAULT 0,
    cached_tokens     bigint NOT NULL DEFAULT 0,
    completion_tokens bigint NOT NULL DEFAULT 0,
    cost_usd          double precision NOT NULL DEFAULT 0,
    reserved_tokens   bigint NOT NULL DEFAULT 0,
    reserved_cost     double precision NOT NULL DEFAULT 0
);

-- name: migrate_5
-- Tasks created at run time: the task that spawned each one, and the tasks whose spawned
-- tasks it waits for (a join).
ALTER TABLE planrun_tasks ADD COLUMN parent text;
ALTER TABLE planrun_tasks ADD COLUMN joins jsonb NOT NULL DEFAULT '[]'::jsonb;

-- name: migrate_6
-- A rate-limiter row says whether its rates are the provider's (from its x-ratelimit-*
-- headers): a process that starts later must not write its configured rates over them.
ALTER TABLE planrun_limits ADD COLUMN learned boolean NOT NULL DEFAULT false;
