-- A run written by planrun's SQLite store at schema 6 (sqlite3's iterdump).
BEGIN TRANSACTION;
CREATE TABLE planrun_effects (
    run_id   TEXT NOT NULL REFERENCES planrun_runs (id) ON DELETE CASCADE,
    task_id  TEXT NOT NULL,
    key      TEXT NOT NULL,
    state    TEXT NOT NULL,
    result   TEXT,
    at       REAL NOT NULL,
    PRIMARY KEY (run_id, task_id)
);
INSERT INTO "planrun_effects" VALUES('old','a','key-a','applied','{"sent":1}',3.5);
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
INSERT INTO "planrun_events" VALUES(1,'old',0,1.0,'a','created',NULL,0,'{}');
INSERT INTO "planrun_events" VALUES(2,'old',1,1.0,'b','created',NULL,0,'{}');
INSERT INTO "planrun_events" VALUES(3,'old',2,1.0,'w','created',NULL,0,'{}');
INSERT INTO "planrun_events" VALUES(4,'old',3,3.0,'a','completed','w1',1,'{}');
INSERT INTO "planrun_events" VALUES(5,'old',4,3.5,'a','effect',NULL,1,'{"key":"key-a"}');
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
, learned INTEGER NOT NULL DEFAULT 0);
INSERT INTO "planrun_limits" VALUES('gpt',60.0,10000.0,2.0,500.0,1.79644295300480961799e+09,1.79644295260480952257e+09,0.0,1,0,29940715,1,0,0);
CREATE TABLE planrun_runs (
    id          TEXT PRIMARY KEY,
    created_at  REAL NOT NULL,
    status      TEXT NOT NULL,
    goal        TEXT NOT NULL,
    meta        TEXT NOT NULL,
    next_seq    INTEGER NOT NULL DEFAULT 0
, owner TEXT, owner_until REAL);
INSERT INTO "planrun_runs" VALUES('old',1.0,'running','written before','{"limits":{"rpm":60}}',5,'p1',34.0);
CREATE TABLE planrun_schema (version INTEGER NOT NULL);
INSERT INTO "planrun_schema" VALUES(6);
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
INSERT INTO "planrun_spend" VALUES('old',1000,1.0,1,40,0,20,0.002,0,0.0);
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
    finished_at  REAL, parent TEXT, joins TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (run_id, id)
);
INSERT INTO "planrun_tasks" VALUES('old','a','k','{"x":1}','completed','w1',1,3,'{"ok":true}',NULL,NULL,NULL,'[]',1.0,'[]',NULL,1,0,NULL,NULL,2.0,3.0,NULL,'[]');
INSERT INTO "planrun_tasks" VALUES('old','b','k','{}','pending',NULL,0,3,'null',NULL,NULL,NULL,'["a"]',1.0,'[]',NULL,0,0,NULL,NULL,NULL,NULL,NULL,'[]');
INSERT INTO "planrun_tasks" VALUES('old','w','gate','{}','pending',NULL,0,3,'null',NULL,NULL,NULL,'[]',1.0,'[]',NULL,0,0,NULL,NULL,NULL,NULL,NULL,'[]');
CREATE TABLE planrun_workers (
    run_id          TEXT NOT NULL REFERENCES planrun_runs (id) ON DELETE CASCADE,
    name            TEXT NOT NULL,
    kinds           TEXT NOT NULL,
    capacity        INTEGER NOT NULL,
    registered_at   REAL NOT NULL,
    last_heartbeat  REAL NOT NULL,
    PRIMARY KEY (run_id, name)
);
INSERT INTO "planrun_workers" VALUES('old','w1','["k"]',2,2.0,2.0);
CREATE INDEX planrun_tasks_ready ON planrun_tasks (run_id, status, kind);
CREATE UNIQUE INDEX planrun_events_seq ON planrun_events (run_id, seq);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('planrun_events',5);
COMMIT;
