-- The named queries of the SQL store (planrun.stores._sql), written once for every dialect.
-- Parameters are :name; {name} is a fragment, here or in the dialect's file
-- (sqlite.sql, postgres.sql), which also holds the schema and overrides a query where the
-- dialects differ. JSON columns are written as text (planrun.stores.base.dump_json).
-- greatest() and least() are PostgreSQL's; the SQLite connector defines them.

-- name: schema_table
CREATE TABLE IF NOT EXISTS planrun_schema (version integer NOT NULL);

-- name: schema_version
SELECT max(version) AS version FROM planrun_schema;

-- name: clear_version
DELETE FROM planrun_schema;

-- name: stamp_version
INSERT INTO planrun_schema (version) VALUES (:version);

-- name: limiter_configure
-- Rates the provider reported (learned) replace any; configured rates replace configured
-- ones only.
INSERT INTO planrun_limits (key, rpm, tpm, request_burst, token_burst, learned)
VALUES (:key, :rpm, :tpm, :request_burst, :token_burst, :learned)
ON CONFLICT (key) DO UPDATE SET
    rpm = excluded.rpm, tpm = excluded.tpm, request_burst = excluded.request_burst,
    token_burst = excluded.token_burst, learned = excluded.learned
WHERE excluded.learned OR NOT planrun_limits.learned;

-- name: limiter_ready_at
-- When one request and :tokens tokens may be taken (GCRA: each bucket is kept as the time
-- it is full again): the latest of the pause, the request bucket and the token bucket.
greatest(paused_until,
         CASE WHEN rpm IS NULL THEN 0
              ELSE requests_full_at - (request_burst - 1) * 60.0 / rpm END,
         CASE WHEN tpm IS NULL THEN 0
              ELSE tokens_full_at
                   - (token_burst - least(CAST(:tokens AS DOUBLE PRECISION), token_burst))
                   * 60.0 / tpm END)

-- name: limiter_take
-- One request and :tokens tokens, only when both buckets (and any pause) allow it now. The
-- minute counters estimate the requests of the last minute (limiter_state).
UPDATE planrun_limits SET
    requests_full_at = CASE WHEN rpm IS NULL THEN requests_full_at
                            ELSE greatest(requests_full_at, {now}) + 60.0 / rpm END,
    tokens_full_at = CASE WHEN tpm IS NULL THEN tokens_full_at
                          ELSE greatest(tokens_full_at, {now})
                               + CAST(:tokens AS DOUBLE PRECISION) * 60.0 / tpm END,
    acquired = acquired + 1,
    prev_count = CASE WHEN floor({now} / 60) = minute THEN prev_count
                      WHEN floor({now} / 60) = minute + 1 THEN minute_count
                      ELSE 0 END,
    minute_count = CASE WHEN floor({now} / 60) = minute THEN minute_count + 1 ELSE 1 END,
    minute = floor({now} / 60)
{commit_unsynced}
WHERE key = :key AND {limiter_ready_at} <= {now} + 1e-6;

-- name: limiter_wait
-- Seconds until limiter_take can take :tokens tokens.
SELECT {limiter_ready_at} - {now} AS wait FROM planrun_limits WHERE key = :key;

-- name: limiter_give
-- Return :tokens tokens (negative: take more), never beyond a full bucket.
UPDATE planrun_limits
SET tokens_full_at = greatest({now}, greatest(tokens_full_at, {now})
                                     - CAST(:tokens AS DOUBLE PRECISION) * 60.0 / tpm)
{commit_unsynced}
WHERE key = :key AND tpm IS NOT NULL;

-- name: limiter_defer
-- The provider says less remains than a bucket holds: full again no sooner than now + s.
UPDATE planrun_limits SET
    requests_full_at = CASE WHEN CAST(:requests AS DOUBLE PRECISION) IS NULL
                            THEN requests_full_at
                            ELSE greatest(requests_full_at,
                                          {now} + CAST(:requests AS DOUBLE PRECISION)) END,
    tokens_full_at = CASE WHEN CAST(:tokens AS DOUBLE PRECISION) IS NULL THEN tokens_full_at
                          ELSE greatest(tokens_full_at,
                                        {now} + CAST(:tokens AS DOUBLE PRECISION)) END
WHERE key = :key;

-- name: limiter_pause
UPDATE planrun_limits
SET paused_until = greatest(paused_until, {now} + CAST(:seconds AS DOUBLE PRECISION)),
    penalties = penalties + 1
WHERE key = :key;

-- name: limiter_state
SELECT *, {now} AS now FROM planrun_limits WHERE key = :key;

-- name: spend_open
-- The run's budget; a second open (a resume, a joining worker) keeps what was spent.
INSERT INTO planrun_spend (run_id, max_tokens, max_cost)
VALUES (:run_id, :max_tokens, :max_cost)
ON CONFLICT (run_id) DO UPDATE SET
    max_tokens = coalesce(excluded.max_tokens, planrun_spend.max_tokens),
    max_cost = coalesce(excluded.max_cost, planrun_spend.max_cost);

-- name: spend_reserve
-- Hold back :tokens and :cost for one request, only if spent + reserved + it fits.
UPDATE planrun_spend
SET reserved_tokens = reserved_tokens + :tokens,
    reserved_cost = reserved_cost + CAST(:cost AS DOUBLE PRECISION)
WHERE run_id = :run_id
  AND (max_tokens IS NULL
       OR prompt_tokens + completion_tokens + reserved_tokens + :tokens <= max_tokens)
  AND (max_cost IS NULL
       OR cost_usd + reserved_cost + CAST(:cost AS DOUBLE PRECISION) <= max_cost + 1e-12);

-- name: spend_settle
-- A request ended: give back its reservation and add what it really used.
UPDATE planrun_spend SET
    reserved_tokens = greatest(0, reserved_tokens - :reserved_tokens),
    reserved_cost = greatest(0.0, reserved_cost - CAST(:reserved_cost AS DOUBLE PRECISION)),
    requests = requests + :requests,
    prompt_tokens = prompt_tokens + :prompt_tokens,
    cached_tokens = cached_tokens + :cached_tokens,
    completion_tokens = completion_tokens + :completion_tokens,
    cost_usd = cost_usd + CAST(:cost_usd AS DOUBLE PRECISION)
WHERE run_id = :run_id;

-- name: spend_release_all
-- No call of the run is in flight (a resume of a run driven by one process).
UPDATE planrun_spend SET reserved_tokens = 0, reserved_cost = 0 WHERE run_id = :run_id;

-- name: spend_get
SELECT * FROM planrun_spend WHERE run_id = :run_id;

-- name: create_run
-- A run id already taken changes nothing (the store says so).
INSERT INTO planrun_runs (id, created_at, status, goal, meta)
VALUES (:id, :created_at, :status, :goal, :meta)
ON CONFLICT (id) DO NOTHING;

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

-- name: acquire_run
-- Take the lease when nobody holds it, when it ran out, when it is ours already, or when
-- its holder is the owner the caller found gone (take_from: compare and set, so an owner
-- that took the run meanwhile keeps it). Of two racing acquirers the second waits for the
-- first's lock, then finds the run owned.
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

-- name: task_columns
run_id, id, kind, payload, status, assigned_to, attempts, max_attempts, result, error,
error_class, cause, depends_on, estimate_s, resources, lease, token, reclaims,
not_before, created_at, started_at, finished_at, parent, joins

-- name: insert_tasks
-- New task rows, many in one statement: {task_rows} is the dialect's source of rows (the
-- values of planrun.stores.base.task_values, in their order). A task id twice is an error.
INSERT INTO planrun_tasks ({task_columns}) {task_rows};

-- name: upsert_tasks
-- Every column of each row (see insert_tasks); a row keeps its place in task order. The
-- rows' ids are distinct (the store keeps the last change of a task).
INSERT INTO planrun_tasks ({task_columns}) {task_rows}
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

-- name: record_decision
-- A person's decision on a waiting row, written once: only over the cause it was read with.
UPDATE planrun_tasks SET cause = :cause, error = :error
WHERE run_id = :run_id AND id = :id AND status = 'waiting' AND cause = :expect_cause;

-- name: get_tasks
SELECT * FROM planrun_tasks WHERE run_id = :run_id ORDER BY {task_order};

-- name: insert_events
-- Events, many in one statement ({event_rows}: the values of
-- planrun.stores.base.event_values). An event already stored under its seq (the same batch
-- written again after a commit whose answer was lost) is kept as it is.
INSERT INTO planrun_events (run_id, seq, at, task, event, worker, attempt, detail)
{event_rows}
ON CONFLICT (run_id, seq) DO NOTHING;

-- name: get_events
SELECT seq, at, task, event, worker, attempt, detail FROM planrun_events
WHERE run_id = :run_id ORDER BY seq, id;

-- name: effect_begin
INSERT INTO planrun_effects (run_id, task_id, key, state, result, at)
VALUES (:run_id, :task_id, :key, 'started', 'null', :at)
ON CONFLICT (run_id, task_id) DO NOTHING;

-- name: effect_done
-- Of two processes finishing the same effect, the second waits for the first's lock, then
-- finds it applied: one of them writes the effect's event.
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
UPDATE planrun_workers SET last_heartbeat = greatest(last_heartbeat, :at)
WHERE run_id = :run_id AND name = :name;

-- name: list_workers
SELECT name, kinds, capacity, last_heartbeat FROM planrun_workers
WHERE run_id = :run_id
ORDER BY name;
