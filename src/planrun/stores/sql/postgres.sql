-- Named queries of the PostgreSQL store (planrun.stores.postgres).
-- Parameters use psycopg's %(name)s style. JSON columns are jsonb; the store sends JSON
-- text (planrun.stores.base.dump_json) cast with ::jsonb, and psycopg decodes on reading.
-- Tables live in the first schema of the connection's search_path.

-- name: schema_lock
-- Serialises concurrent open() calls (several worker processes starting at once).
SELECT pg_advisory_xact_lock(4242170301);

-- name: schema_table
CREATE TABLE IF NOT EXISTS planrun_schema (version integer NOT NULL);

-- name: schema_version
SELECT max(version) AS version FROM planrun_schema;

-- name: clear_version
DELETE FROM planrun_schema;

-- name: stamp_version
INSERT INTO planrun_schema (version) VALUES (%(version)s);

-- name: snapshot
-- Reads of a whole run see one snapshot.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;

-- name: set_session
-- Per connection (planrun.stores.postgres): idle_in_transaction_session_timeout cuts off
-- a session that sits idle inside a transaction (a stopped process), lock_timeout gives
-- up waiting for a lock. Session-wide (the pool's connections are in autocommit).
SELECT set_config(%(name)s, %(value)s, false);

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

-- name: limiter_configure
-- Rates the provider reported (learned) replace any; configured rates replace configured
-- ones only.
INSERT INTO planrun_limits (key, rpm, tpm, request_burst, token_burst, learned)
VALUES (%(key)s, %(rpm)s, %(tpm)s, %(request_burst)s, %(token_burst)s, %(learned)s)
ON CONFLICT (key) DO UPDATE SET
    rpm = excluded.rpm, tpm = excluded.tpm, request_burst = excluded.request_burst,
    token_burst = excluded.token_burst, learned = excluded.learned
WHERE excluded.learned OR NOT planrun_limits.learned;

-- name: limiter_take
-- One statement, run on its own (autocommit): take one request and the tokens when both
-- buckets (and any pause) allow it now and answer 0, else take nothing and answer the
-- seconds to wait. Time is the server's clock, so machines whose clocks differ agree. A
-- limiter's state lives a minute: its commit need not wait for the disk.
WITH s AS (SELECT set_config('synchronous_commit', 'off', true) AS off),
c AS (SELECT extract(epoch FROM clock_timestamp())::float8 AS now FROM s),
taken AS (
    UPDATE planrun_limits AS l SET
        requests_full_at = CASE WHEN l.rpm IS NULL THEN l.requests_full_at
                                ELSE greatest(l.requests_full_at, c.now) + 60.0 / l.rpm END,
        tokens_full_at = CASE WHEN l.tpm IS NULL THEN l.tokens_full_at
                              ELSE greatest(l.tokens_full_at, c.now)
                                   + %(cost)s::float8 * 60.0 / l.tpm END,
        acquired = l.acquired + 1,
        prev_count = CASE WHEN floor(c.now / 60)::bigint = l.minute THEN l.prev_count
                          WHEN floor(c.now / 60)::bigint = l.minute + 1 THEN l.minute_count
                          ELSE 0 END,
        minute_count = CASE WHEN floor(c.now / 60)::bigint = l.minute
                            THEN l.minute_count + 1 ELSE 1 END,
        minute = floor(c.now / 60)::bigint
    FROM c
    WHERE l.key = %(key)s
      AND greatest(l.paused_until,
                   CASE WHEN l.rpm IS NULL THEN 0
                        ELSE l.requests_full_at - (l.request_burst - 1) * 60.0 / l.rpm END,
                   CASE WHEN l.tpm IS NULL THEN 0
                        ELSE l.tokens_full_at - (l.token_burst
                             - least(%(cost)s::float8, l.token_burst)) * 60.0 / l.tpm END
          ) <= c.now + 1e-6
    RETURNING true AS taken, 0.0::float8 AS wait
)
SELECT taken, wait FROM taken
UNION ALL
SELECT false AS taken,
       greatest(l.paused_until,
                CASE WHEN l.rpm IS NULL THEN 0
                     ELSE l.requests_full_at - (l.request_burst - 1) * 60.0 / l.rpm END,
                CASE WHEN l.tpm IS NULL THEN 0
                     ELSE l.tokens_full_at - (l.token_burst
                          - least(%(cost)s::float8, l.token_burst)) * 60.0 / l.tpm END
       ) - c.now AS wait
FROM planrun_limits AS l, c
WHERE l.key = %(key)s AND NOT EXISTS (SELECT 1 FROM taken);

-- name: limiter_give
-- Return tokens (negative: take more), never beyond a full bucket (autocommit, as take).
WITH s AS (SELECT set_config('synchronous_commit', 'off', true) AS off),
c AS (SELECT extract(epoch FROM clock_timestamp())::float8 AS now FROM s)
UPDATE planrun_limits AS l
SET tokens_full_at = greatest(c.now, greatest(l.tokens_full_at, c.now)
                                     - %(amount)s::float8 * 60.0 / l.tpm)
FROM c
WHERE l.key = %(key)s AND l.tpm IS NOT NULL;

-- name: limiter_defer
-- The provider says less remains than a bucket holds: full again no sooner than now + s.
WITH c AS (SELECT extract(epoch FROM clock_timestamp())::float8 AS now)
UPDATE planrun_limits AS l
SET requests_full_at = CASE WHEN %(requests)s::float8 IS NULL THEN l.requests_full_at
                            ELSE greatest(l.requests_full_at, c.now + %(requests)s::float8) END,
    tokens_full_at = CASE WHEN %(tokens)s::float8 IS NULL THEN l.tokens_full_at
                          ELSE greatest(l.tokens_full_at, c.now + %(tokens)s::float8) END
FROM c
WHERE l.key = %(key)s;

-- name: limiter_pause
WITH c AS (SELECT extract(epoch FROM clock_timestamp())::float8 AS now)
UPDATE planrun_limits AS l
SET paused_until = greatest(l.paused_until, c.now + %(seconds)s::float8),
    penalties = l.penalties + 1
FROM c
WHERE l.key = %(key)s;

-- name: limiter_state
SELECT *, extract(epoch FROM clock_timestamp())::float8 AS now FROM planrun_limits WHERE key = %(key)s;

-- name: spend_open
-- The run's budget; a second open (a resume, a joining worker) keeps what was spent.
INSERT INTO planrun_spend (run_id, max_tokens, max_cost)
VALUES (%(run_id)s, %(max_tokens)s, %(max_cost)s)
ON CONFLICT (run_id) DO UPDATE SET
    max_tokens = coalesce(excluded.max_tokens, planrun_spend.max_tokens),
    max_cost = coalesce(excluded.max_cost, planrun_spend.max_cost);

-- name: spend_reserve
-- Hold back tokens and cost for one request, only if spent + reserved + it fits.
UPDATE planrun_spend
SET reserved_tokens = reserved_tokens + %(tokens)s,
    reserved_cost = reserved_cost + %(cost)s::float8
WHERE run_id = %(run_id)s
  AND (max_tokens IS NULL
       OR prompt_tokens + completion_tokens + reserved_tokens + %(tokens)s <= max_tokens)
  AND (max_cost IS NULL OR cost_usd + reserved_cost + %(cost)s::float8 <= max_cost + 1e-12)
RETURNING run_id;

-- name: spend_settle
-- A request ended: give back its reservation and add what it really used.
UPDATE planrun_spend SET
    reserved_tokens = greatest(0, reserved_tokens - %(reserved_tokens)s),
    reserved_cost = greatest(0.0, reserved_cost - %(reserved_cost)s::float8),
    requests = requests + %(requests)s,
    prompt_tokens = prompt_tokens + %(prompt_tokens)s,
    cached_tokens = cached_tokens + %(cached_tokens)s,
    completion_tokens = completion_tokens + %(completion_tokens)s,
    cost_usd = cost_usd + %(cost_usd)s::float8
WHERE run_id = %(run_id)s;

-- name: spend_release_all
-- No call of the run is in flight (a resume of a run driven by one process).
UPDATE planrun_spend SET reserved_tokens = 0, reserved_cost = 0 WHERE run_id = %(run_id)s;

-- name: spend_get
SELECT * FROM planrun_spend WHERE run_id = %(run_id)s;

-- name: create_run
INSERT INTO planrun_runs (id, created_at, status, goal, meta)
VALUES (%(id)s, %(created_at)s, %(status)s, %(goal)s, %(meta)s::jsonb);

-- name: set_run_status
UPDATE planrun_runs SET status = %(status)s WHERE id = %(run_id)s;

-- name: get_run
SELECT id, created_at, status, goal, meta, owner, owner_until FROM planrun_runs
WHERE id = %(run_id)s;

-- name: list_runs
SELECT id, created_at, status, goal, meta, owner, owner_until FROM planrun_runs
ORDER BY created_at, id;

-- name: acquire_run
-- Take the lease when nobody holds it, when it ran out, or when it is ours already. Of
-- two racing acquirers the second waits for the first's row lock, then re-reads the row
-- (READ COMMITTED) and finds it owned.
-- take_from: the owner the caller found gone (compare and set, as for SQLite).
UPDATE planrun_runs SET owner = %(owner)s, owner_until = %(until)s
WHERE id = %(run_id)s
  AND (owner IS NULL OR owner = %(owner)s OR owner_until IS NULL OR owner_until < %(now)s
       OR owner = %(take_from)s)
RETURNING id;

-- name: renew_run
UPDATE planrun_runs SET owner_until = %(until)s WHERE id = %(run_id)s AND owner = %(owner)s
RETURNING id;

-- name: release_run
UPDATE planrun_runs SET owner = NULL, owner_until = NULL
WHERE id = %(run_id)s AND owner = %(owner)s;

-- name: get_owner
SELECT owner, owner_until FROM planrun_runs WHERE id = %(run_id)s;

-- name: count_tasks
SELECT run_id, status, count(*) AS n FROM planrun_tasks GROUP BY run_id, status;

-- name: insert_tasks
-- A batch in one statement: one array per column (a task id twice is an error).
INSERT INTO planrun_tasks (
    run_id, id, kind, payload, status, assigned_to, attempts, max_attempts, result, error,
    error_class, cause, depends_on, estimate_s, resources, lease, token, reclaims,
    not_before, created_at, started_at, finished_at, parent, joins
)
SELECT %(run_id)s, r.id, r.kind, r.payload::jsonb, r.status, r.assigned_to, r.attempts,
       r.max_attempts, r.result::jsonb, r.error, r.error_class, r.cause, r.depends_on::jsonb,
       r.estimate_s, r.resources::jsonb, r.lease, r.token, r.reclaims, r.not_before,
       r.created_at, r.started_at, r.finished_at, r.parent, r.joins::jsonb
FROM unnest(
    %(id)s::text[], %(kind)s::text[], %(payload)s::text[], %(status)s::text[],
    %(assigned_to)s::text[], %(attempts)s::integer[], %(max_attempts)s::integer[],
    %(result)s::text[], %(error)s::text[], %(error_class)s::text[], %(cause)s::text[],
    %(depends_on)s::text[], %(estimate_s)s::float8[], %(resources)s::text[],
    %(lease)s::float8[], %(token)s::bigint[], %(reclaims)s::integer[],
    %(not_before)s::float8[], %(created_at)s::float8[], %(started_at)s::float8[],
    %(finished_at)s::float8[], %(parent)s::text[], %(joins)s::text[]
) WITH ORDINALITY AS r (
    id, kind, payload, status, assigned_to, attempts, max_attempts, result, error,
    error_class, cause, depends_on, estimate_s, resources, lease, token, reclaims,
    not_before, created_at, started_at, finished_at, parent, joins, n
)
ORDER BY r.n;

-- name: upsert_tasks
-- A batch in one statement: one array per column, at most one element per task id (the
-- store keeps the last change of a task). Every column of the record is written; a row
-- keeps its pos (its place in task order).
INSERT INTO planrun_tasks (
    run_id, id, kind, payload, status, assigned_to, attempts, max_attempts, result, error,
    error_class, cause, depends_on, estimate_s, resources, lease, token, reclaims,
    not_before, created_at, started_at, finished_at, parent, joins
)
SELECT %(run_id)s, r.id, r.kind, r.payload::jsonb, r.status, r.assigned_to, r.attempts,
       r.max_attempts, r.result::jsonb, r.error, r.error_class, r.cause, r.depends_on::jsonb,
       r.estimate_s, r.resources::jsonb, r.lease, r.token, r.reclaims, r.not_before,
       r.created_at, r.started_at, r.finished_at, r.parent, r.joins::jsonb
FROM unnest(
    %(id)s::text[], %(kind)s::text[], %(payload)s::text[], %(status)s::text[],
    %(assigned_to)s::text[], %(attempts)s::integer[], %(max_attempts)s::integer[],
    %(result)s::text[], %(error)s::text[], %(error_class)s::text[], %(cause)s::text[],
    %(depends_on)s::text[], %(estimate_s)s::float8[], %(resources)s::text[],
    %(lease)s::float8[], %(token)s::bigint[], %(reclaims)s::integer[],
    %(not_before)s::float8[], %(created_at)s::float8[], %(started_at)s::float8[],
    %(finished_at)s::float8[], %(parent)s::text[], %(joins)s::text[]
) WITH ORDINALITY AS r (
    id, kind, payload, status, assigned_to, attempts, max_attempts, result, error,
    error_class, cause, depends_on, estimate_s, resources, lease, token, reclaims,
    not_before, created_at, started_at, finished_at, parent, joins, n
)
ORDER BY r.n
ON CONFLICT (run_id, id) DO UPDATE SET
    kind = EXCLUDED.kind, payload = EXCLUDED.payload, status = EXCLUDED.status,
    assigned_to = EXCLUDED.assigned_to, attempts = EXCLUDED.attempts,
    max_attempts = EXCLUDED.max_attempts, result = EXCLUDED.result, error = EXCLUDED.error,
    error_class = EXCLUDED.error_class, cause = EXCLUDED.cause,
    depends_on = EXCLUDED.depends_on, estimate_s = EXCLUDED.estimate_s,
    resources = EXCLUDED.resources, lease = EXCLUDED.lease, token = EXCLUDED.token,
    reclaims = EXCLUDED.reclaims, not_before = EXCLUDED.not_before,
    created_at = EXCLUDED.created_at, started_at = EXCLUDED.started_at,
    finished_at = EXCLUDED.finished_at, parent = EXCLUDED.parent, joins = EXCLUDED.joins;

-- name: record_decision
-- A person's decision on a waiting row, written once: only over the cause it was read with.
UPDATE planrun_tasks SET cause = %(cause)s, error = %(error)s
WHERE run_id = %(run_id)s AND id = %(id)s AND status = 'waiting'
  AND cause = %(expect_cause)s;

-- name: get_tasks
SELECT * FROM planrun_tasks WHERE run_id = %(run_id)s ORDER BY pos;

-- name: get_tasks_by_ids
SELECT * FROM planrun_tasks WHERE run_id = %(run_id)s AND id = ANY(%(ids)s::text[])
ORDER BY pos;

-- name: insert_events
-- A batch in one statement, one array per column; ids follow the order given. An event
-- already stored under its seq (the same batch written again) is kept as it is.
INSERT INTO planrun_events (run_id, seq, at, task, event, worker, attempt, detail)
SELECT %(run_id)s, e.seq, e.at, e.task, e.event, e.worker, e.attempt, e.detail::jsonb
FROM unnest(
    %(seq)s::bigint[], %(at)s::float8[], %(task)s::text[], %(event)s::text[],
    %(worker)s::text[], %(attempt)s::bigint[], %(detail)s::text[]
) WITH ORDINALITY AS e (seq, at, task, event, worker, attempt, detail, n)
ORDER BY e.n
ON CONFLICT (run_id, seq) DO NOTHING;

-- name: get_events
SELECT seq, at, task, event, worker, attempt, detail FROM planrun_events
WHERE run_id = %(run_id)s ORDER BY seq, id;

-- name: raise_next_seq
-- After events with caller-assigned seqs (the run's one driver numbers them itself):
-- keep the base of store-made seqs past the highest one.
UPDATE planrun_runs SET seq_base = %(after)s WHERE id = %(run_id)s AND seq_base < %(after)s;

-- name: take_seqs
-- n seqs for events made inside the store, increasing, above every seq of the run so
-- far; concurrent writers get distinct ones and nobody waits (a sequence is not
-- transactional). No row: unknown run.
SELECT r.seq_base + nextval('planrun_event_seq') AS seq
FROM planrun_runs AS r CROSS JOIN generate_series(1, %(n)s) AS g (i)
WHERE r.id = %(run_id)s
ORDER BY g.i;

-- name: effect_begin
INSERT INTO planrun_effects (run_id, task_id, key, state, result, at)
VALUES (%(run_id)s, %(task_id)s, %(key)s, 'started', 'null'::jsonb, %(at)s)
ON CONFLICT (run_id, task_id) DO NOTHING;

-- name: effect_done
UPDATE planrun_effects SET state = 'applied', result = %(result)s::jsonb, at = %(at)s
WHERE run_id = %(run_id)s AND task_id = %(task_id)s AND state = 'started';

-- name: get_effect
SELECT task_id, key, state, result, at FROM planrun_effects
WHERE run_id = %(run_id)s AND task_id = %(task_id)s;

-- name: get_effects
SELECT task_id, key, state, result, at FROM planrun_effects
WHERE run_id = %(run_id)s ORDER BY task_id;

-- name: register_worker
INSERT INTO planrun_workers (run_id, name, kinds, capacity, registered_at, last_heartbeat)
VALUES (%(run_id)s, %(name)s, %(kinds)s::jsonb, %(capacity)s, %(at)s, %(at)s)
ON CONFLICT (run_id, name) DO UPDATE SET
    kinds = EXCLUDED.kinds, capacity = EXCLUDED.capacity,
    registered_at = EXCLUDED.registered_at, last_heartbeat = EXCLUDED.last_heartbeat;

-- name: heartbeat_worker
UPDATE planrun_workers SET last_heartbeat = GREATEST(last_heartbeat, %(at)s)
WHERE run_id = %(run_id)s AND name = %(name)s;

-- name: list_workers
SELECT name, kinds, capacity, last_heartbeat FROM planrun_workers
WHERE run_id = %(run_id)s
ORDER BY name;
