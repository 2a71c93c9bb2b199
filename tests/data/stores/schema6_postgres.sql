-- A run written by planrun's PostgreSQL store at schema 6 (pg_dump --inserts of schema
-- planrun_fixture_schema6, without its settings and CREATE SCHEMA).
CREATE TABLE planrun_fixture_schema6.planrun_effects (
    run_id text NOT NULL,
    task_id text NOT NULL,
    key text NOT NULL,
    state text NOT NULL,
    result jsonb,
    at double precision NOT NULL
);
CREATE SEQUENCE planrun_fixture_schema6.planrun_event_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;
CREATE TABLE planrun_fixture_schema6.planrun_events (
    id bigint NOT NULL,
    run_id text NOT NULL,
    seq bigint NOT NULL,
    at double precision NOT NULL,
    task text NOT NULL,
    event text NOT NULL,
    worker text,
    attempt bigint NOT NULL,
    detail jsonb NOT NULL,
    xid bigint DEFAULT ((pg_current_xact_id())::text)::bigint NOT NULL
);
CREATE SEQUENCE planrun_fixture_schema6.planrun_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;
ALTER SEQUENCE planrun_fixture_schema6.planrun_events_id_seq OWNED BY planrun_fixture_schema6.planrun_events.id;
CREATE TABLE planrun_fixture_schema6.planrun_limits (
    key text NOT NULL,
    rpm double precision,
    tpm double precision,
    request_burst double precision NOT NULL,
    token_burst double precision NOT NULL,
    requests_full_at double precision DEFAULT 0 NOT NULL,
    tokens_full_at double precision DEFAULT 0 NOT NULL,
    paused_until double precision DEFAULT 0 NOT NULL,
    acquired bigint DEFAULT 0 NOT NULL,
    penalties bigint DEFAULT 0 NOT NULL,
    minute bigint DEFAULT 0 NOT NULL,
    minute_count bigint DEFAULT 0 NOT NULL,
    prev_count bigint DEFAULT 0 NOT NULL,
    learned boolean DEFAULT false NOT NULL
);
CREATE TABLE planrun_fixture_schema6.planrun_runs (
    id text NOT NULL,
    created_at double precision NOT NULL,
    status text NOT NULL,
    goal text NOT NULL,
    meta jsonb NOT NULL,
    seq_base bigint DEFAULT 0 NOT NULL,
    owner text,
    owner_until double precision
);
CREATE TABLE planrun_fixture_schema6.planrun_schema (
    version integer NOT NULL
);
CREATE TABLE planrun_fixture_schema6.planrun_spend (
    run_id text NOT NULL,
    max_tokens bigint,
    max_cost double precision,
    requests bigint DEFAULT 0 NOT NULL,
    prompt_tokens bigint DEFAULT 0 NOT NULL,
    cached_tokens bigint DEFAULT 0 NOT NULL,
    completion_tokens bigint DEFAULT 0 NOT NULL,
    cost_usd double precision DEFAULT 0 NOT NULL,
    reserved_tokens bigint DEFAULT 0 NOT NULL,
    reserved_cost double precision DEFAULT 0 NOT NULL
);
CREATE TABLE planrun_fixture_schema6.planrun_tasks (
    run_id text NOT NULL,
    id text NOT NULL,
    pos bigint NOT NULL,
    kind text NOT NULL,
    payload jsonb NOT NULL,
    status text NOT NULL,
    assigned_to text,
    attempts integer NOT NULL,
    max_attempts integer NOT NULL,
    result jsonb,
    error text,
    error_class text,
    cause text,
    depends_on jsonb NOT NULL,
    estimate_s double precision NOT NULL,
    resources jsonb NOT NULL,
    lease double precision,
    token bigint NOT NULL,
    reclaims integer NOT NULL,
    not_before double precision,
    created_at double precision,
    started_at double precision,
    finished_at double precision,
    parent text,
    joins jsonb DEFAULT '[]'::jsonb NOT NULL
);
CREATE SEQUENCE planrun_fixture_schema6.planrun_tasks_pos_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;
ALTER SEQUENCE planrun_fixture_schema6.planrun_tasks_pos_seq OWNED BY planrun_fixture_schema6.planrun_tasks.pos;
CREATE TABLE planrun_fixture_schema6.planrun_workers (
    run_id text NOT NULL,
    name text NOT NULL,
    kinds jsonb NOT NULL,
    capacity integer NOT NULL,
    registered_at double precision NOT NULL,
    last_heartbeat double precision NOT NULL
);
ALTER TABLE ONLY planrun_fixture_schema6.planrun_events ALTER COLUMN id SET DEFAULT nextval('planrun_fixture_schema6.planrun_events_id_seq'::regclass);
ALTER TABLE ONLY planrun_fixture_schema6.planrun_tasks ALTER COLUMN pos SET DEFAULT nextval('planrun_fixture_schema6.planrun_tasks_pos_seq'::regclass);
INSERT INTO planrun_fixture_schema6.planrun_effects VALUES ('old', 'a', 'key-a', 'applied', '{"sent": 1}', 3.5);
INSERT INTO planrun_fixture_schema6.planrun_events VALUES (1, 'old', 0, 1, 'a', 'created', NULL, 0, '{}', 39561);
INSERT INTO planrun_fixture_schema6.planrun_events VALUES (2, 'old', 1, 1, 'b', 'created', NULL, 0, '{}', 39561);
INSERT INTO planrun_fixture_schema6.planrun_events VALUES (3, 'old', 2, 1, 'w', 'created', NULL, 0, '{}', 39561);
INSERT INTO planrun_fixture_schema6.planrun_events VALUES (4, 'old', 3, 3, 'a', 'completed', 'w1', 1, '{}', 39562);
INSERT INTO planrun_fixture_schema6.planrun_events VALUES (5, 'old', 5, 3.5, 'a', 'effect', NULL, 1, '{"key": "key-a"}', 39564);
INSERT INTO planrun_fixture_schema6.planrun_limits VALUES ('gpt', 60, 10000, 2, 500, 1796442964.657721, 1796442964.257721, 0, 1, 0, 29940716, 1, 0, false);
INSERT INTO planrun_fixture_schema6.planrun_runs VALUES ('old', 1, 'running', 'written before', '{"limits": {"rpm": 60}}', 4, 'p1', 34);
INSERT INTO planrun_fixture_schema6.planrun_schema VALUES (6);
INSERT INTO planrun_fixture_schema6.planrun_spend VALUES ('old', 1000, 1, 1, 40, 0, 20, 0.002, 0, 0);
INSERT INTO planrun_fixture_schema6.planrun_tasks VALUES ('old', 'b', 2, 'k', '{}', 'pending', NULL, 0, 3, 'null', NULL, NULL, NULL, '["a"]', 1, '[]', NULL, 0, 0, NULL, NULL, NULL, NULL, NULL, '[]');
INSERT INTO planrun_fixture_schema6.planrun_tasks VALUES ('old', 'w', 3, 'gate', '{}', 'pending', NULL, 0, 3, 'null', NULL, NULL, NULL, '[]', 1, '[]', NULL, 0, 0, NULL, NULL, NULL, NULL, NULL, '[]');
INSERT INTO planrun_fixture_schema6.planrun_tasks VALUES ('old', 'a', 1, 'k', '{"x": 1}', 'completed', 'w1', 1, 3, '{"ok": true}', NULL, NULL, NULL, '[]', 1, '[]', NULL, 1, 0, NULL, NULL, 2, 3, NULL, '[]');
INSERT INTO planrun_fixture_schema6.planrun_workers VALUES ('old', 'w1', '["k"]', 2, 2, 2);
SELECT pg_catalog.setval('planrun_fixture_schema6.planrun_event_seq', 1, true);
SELECT pg_catalog.setval('planrun_fixture_schema6.planrun_events_id_seq', 5, true);
SELECT pg_catalog.setval('planrun_fixture_schema6.planrun_tasks_pos_seq', 4, true);
ALTER TABLE ONLY planrun_fixture_schema6.planrun_effects
    ADD CONSTRAINT planrun_effects_pkey PRIMARY KEY (run_id, task_id);
ALTER TABLE ONLY planrun_fixture_schema6.planrun_events
    ADD CONSTRAINT planrun_events_pkey PRIMARY KEY (id);
ALTER TABLE ONLY planrun_fixture_schema6.planrun_limits
    ADD CONSTRAINT planrun_limits_pkey PRIMARY KEY (key);
ALTER TABLE ONLY planrun_fixture_schema6.planrun_runs
    ADD CONSTRAINT planrun_runs_pkey PRIMARY KEY (id);
ALTER TABLE ONLY planrun_fixture_schema6.planrun_spend
    ADD CONSTRAINT planrun_spend_pkey PRIMARY KEY (run_id);
ALTER TABLE ONLY planrun_fixture_schema6.planrun_tasks
    ADD CONSTRAINT planrun_tasks_pkey PRIMARY KEY (run_id, id);
ALTER TABLE ONLY planrun_fixture_schema6.planrun_workers
    ADD CONSTRAINT planrun_workers_pkey PRIMARY KEY (run_id, name);
CREATE UNIQUE INDEX planrun_events_seq ON planrun_fixture_schema6.planrun_events USING btree (run_id, seq);
CREATE INDEX planrun_events_xid ON planrun_fixture_schema6.planrun_events USING btree (run_id, xid);
CREATE INDEX planrun_tasks_ready ON planrun_fixture_schema6.planrun_tasks USING btree (run_id, status, kind, pos);
ALTER TABLE ONLY planrun_fixture_schema6.planrun_effects
    ADD CONSTRAINT planrun_effects_run_id_fkey FOREIGN KEY (run_id) REFERENCES planrun_fixture_schema6.planrun_runs(id) ON DELETE CASCADE;
ALTER TABLE ONLY planrun_fixture_schema6.planrun_events
    ADD CONSTRAINT planrun_events_run_id_fkey FOREIGN KEY (run_id) REFERENCES planrun_fixture_schema6.planrun_runs(id) ON DELETE CASCADE;
ALTER TABLE ONLY planrun_fixture_schema6.planrun_tasks
    ADD CONSTRAINT planrun_tasks_run_id_fkey FOREIGN KEY (run_id) REFERENCES planrun_fixture_schema6.planrun_runs(id) ON DELETE CASCADE;
ALTER TABLE ONLY planrun_fixture_schema6.planrun_workers
    ADD CONSTRAINT planrun_workers_run_id_fkey FOREIGN KEY (run_id) REFERENCES planrun_fixture_schema6.planrun_runs(id) ON DELETE CASCADE;
