-- Generated from migrations 1-10 by `KEEL_BLESS=1 cargo test -p keel-store fresh_sqlite`:
-- do not edit. The schema they leave in an SQLite database, which a fresh database is
-- given in one script (src/sql/migrations.rs, `SQLITE_SCHEMA`).

CREATE TABLE sessions (
    tenant_id         TEXT   NOT NULL,
    session_id        TEXT   NOT NULL,
    release_id        TEXT   NOT NULL,
    parent_session_id TEXT,
    status            TEXT   NOT NULL,
    version           BIGINT NOT NULL DEFAULT 0,
    wake_at           BIGINT,
    lease_owner       TEXT,
    lease_epoch       BIGINT NOT NULL DEFAULT 0,
    lease_expires_at  BIGINT,
    metadata          TEXT   NOT NULL,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL, runnable INT NOT NULL DEFAULT 0, runnable_since BIGINT, priority INT NOT NULL DEFAULT 0, queued_turns INT NOT NULL DEFAULT 0, claim_after BIGINT, schema_version INT NOT NULL DEFAULT 2,
    PRIMARY KEY (tenant_id, session_id)
);

CREATE UNIQUE INDEX sessions_by_id ON sessions (session_id);

CREATE INDEX sessions_by_status ON sessions (tenant_id, status, created_at);

CREATE INDEX sessions_by_wake ON sessions (tenant_id, wake_at) WHERE wake_at IS NOT NULL;

CREATE TABLE events (
    tenant_id  TEXT   NOT NULL,
    session_id TEXT   NOT NULL,
    seq        BIGINT NOT NULL,
    type       TEXT   NOT NULL,
    ts         BIGINT NOT NULL,
    body       TEXT   NOT NULL,
    PRIMARY KEY (tenant_id, session_id, seq)
);

CREATE TABLE transcript (
    tenant_id  TEXT   NOT NULL,
    session_id TEXT   NOT NULL,
    idx        BIGINT NOT NULL,
    turn_id    TEXT,
    role       TEXT   NOT NULL,
    content    TEXT   NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, session_id, idx)
);

CREATE TABLE effects (
    tenant_id     TEXT   NOT NULL,
    operation_key TEXT   NOT NULL,
    session_id    TEXT   NOT NULL,
    tool_call_id  TEXT   NOT NULL,
    tool_name     TEXT   NOT NULL,
    status        TEXT   NOT NULL,
    request_hash  TEXT   NOT NULL,
    attempts      BIGINT NOT NULL,
    outcome       TEXT,
    error         TEXT,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, operation_key)
);

CREATE INDEX effects_by_session ON effects (tenant_id, session_id, status);

CREATE TABLE approvals (
    tenant_id    TEXT   NOT NULL,
    approval_id  TEXT   NOT NULL,
    session_id   TEXT   NOT NULL,
    turn_id      TEXT   NOT NULL,
    tool_call_id TEXT   NOT NULL,
    tool_name    TEXT   NOT NULL,
    arguments    TEXT   NOT NULL,
    args_hash    TEXT   NOT NULL,
    status       TEXT   NOT NULL,
    decision     TEXT,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    decided_at   BIGINT, decided_by TEXT,
    PRIMARY KEY (tenant_id, approval_id)
);

CREATE INDEX approvals_by_session ON approvals (tenant_id, session_id, status);

CREATE TABLE artifacts (
    tenant_id    TEXT   NOT NULL,
    artifact_id  TEXT   NOT NULL,
    session_id   TEXT   NOT NULL,
    name         TEXT   NOT NULL,
    content_type TEXT   NOT NULL,
    size         BIGINT NOT NULL,
    data         BLOB NOT NULL,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, artifact_id)
);

CREATE INDEX artifacts_by_session ON artifacts (tenant_id, session_id);

CREATE TABLE releases (
    tenant_id  TEXT   NOT NULL,
    release_id TEXT   NOT NULL,
    definition TEXT   NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, release_id)
);

CREATE TABLE intents (
    tenant_id  TEXT   NOT NULL,
    session_id TEXT   NOT NULL,
    intent_id  TEXT   NOT NULL,
    kind       TEXT   NOT NULL,
    payload    TEXT   NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, session_id, intent_id)
);

CREATE TABLE usage (
    tenant_id          TEXT             NOT NULL,
    day                TEXT             NOT NULL,
    model              TEXT             NOT NULL,
    input_tokens       BIGINT           NOT NULL DEFAULT 0,
    output_tokens      BIGINT           NOT NULL DEFAULT 0,
    cache_read_tokens  BIGINT           NOT NULL DEFAULT 0,
    cache_write_tokens BIGINT           NOT NULL DEFAULT 0,
    reasoning_tokens   BIGINT           NOT NULL DEFAULT 0,
    cost_usd           DOUBLE PRECISION NOT NULL DEFAULT 0,
    steps              BIGINT           NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, day, model)
);

CREATE TABLE usage_reservations (
    tenant_id   TEXT             NOT NULL,
    session_id  TEXT             NOT NULL,
    day         TEXT             NOT NULL,
    lease_epoch BIGINT           NOT NULL,
    tokens      BIGINT           NOT NULL,
    cost_usd    DOUBLE PRECISION NOT NULL,
    created_at  BIGINT           NOT NULL,
    PRIMARY KEY (tenant_id, session_id)
);

CREATE INDEX usage_reservations_by_day ON usage_reservations (tenant_id, day);

CREATE TABLE usage_reservation_locks (
    tenant_id TEXT   NOT NULL,
    day       TEXT   NOT NULL,
    requests  BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, day)
);

CREATE TABLE sealed_items (
    tenant_id  TEXT   NOT NULL,
    session_id TEXT   NOT NULL,
    kind       TEXT   NOT NULL,
    item_id    TEXT   NOT NULL,
    sealed     BLOB NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, session_id, kind, item_id)
);

CREATE TABLE tenants (
    tenant_id  TEXT   NOT NULL PRIMARY KEY,
    name       TEXT   NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE UNIQUE INDEX tenants_by_name ON tenants (name);

CREATE TABLE principals (
    principal_id TEXT   NOT NULL PRIMARY KEY,
    tenant_id    TEXT,
    name         TEXT   NOT NULL,
    role         TEXT   NOT NULL,
    created_at   BIGINT NOT NULL
);

CREATE INDEX principals_by_tenant ON principals (tenant_id, created_at);

CREATE TABLE api_keys (
    key_id       TEXT   NOT NULL PRIMARY KEY,
    principal_id TEXT   NOT NULL,
    tenant_id    TEXT,
    key_hash     TEXT   NOT NULL,
    prefix       TEXT   NOT NULL,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT,
    revoked_at   BIGINT
);

CREATE UNIQUE INDEX api_keys_by_hash ON api_keys (key_hash);

CREATE INDEX api_keys_by_tenant ON api_keys (tenant_id, created_at);

CREATE TABLE idempotency (
    scope        TEXT   NOT NULL,
    principal_id TEXT   NOT NULL,
    route        TEXT   NOT NULL,
    idem_key     TEXT   NOT NULL,
    request_hash TEXT   NOT NULL,
    state        TEXT   NOT NULL,
    status_code  BIGINT,
    response     TEXT,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    PRIMARY KEY (scope, principal_id, route, idem_key)
);

CREATE INDEX idempotency_by_expiry ON idempotency (expires_at);

CREATE INDEX approvals_by_tenant_status ON approvals (tenant_id, status, created_at);

CREATE INDEX sessions_by_release ON sessions (tenant_id, release_id, created_at);

CREATE INDEX releases_by_created ON releases (tenant_id, created_at);

CREATE TABLE workspace_claims (
    path       TEXT   NOT NULL PRIMARY KEY,
    tenant_id  TEXT   NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE INDEX sessions_runnable ON sessions (tenant_id, priority, runnable_since, session_id) WHERE runnable = 1;

CREATE INDEX sessions_leased ON sessions (tenant_id) WHERE lease_owner IS NOT NULL;

CREATE INDEX sessions_queued ON sessions (tenant_id, queued_turns) WHERE queued_turns > 0;

CREATE TABLE token_windows (
    tenant_id    TEXT   NOT NULL,
    window_start BIGINT NOT NULL,
    tokens       BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, window_start)
);

CREATE TABLE "memory" (
    id         INTEGER PRIMARY KEY,
    tenant_id  TEXT   NOT NULL,
    namespace  TEXT   NOT NULL,
    key        TEXT   NOT NULL,
    value      TEXT   NOT NULL,
    updated_at BIGINT NOT NULL,
    UNIQUE (tenant_id, namespace, key)
);

CREATE VIRTUAL TABLE memory_fts USING fts5(
    key, value, content='memory', content_rowid='id', tokenize='unicode61 remove_diacritics 0'
);

CREATE TRIGGER memory_fts_insert AFTER INSERT ON memory BEGIN
    INSERT INTO memory_fts (rowid, key, value) VALUES (new.id, new.key, new.value);
END;

CREATE TRIGGER memory_fts_delete AFTER DELETE ON memory BEGIN
    INSERT INTO memory_fts (memory_fts, rowid, key, value) VALUES ('delete', old.id, old.key, old.value);
END;

CREATE TRIGGER memory_fts_update AFTER UPDATE ON memory BEGIN
    INSERT INTO memory_fts (memory_fts, rowid, key, value) VALUES ('delete', old.id, old.key, old.value);
    INSERT INTO memory_fts (rowid, key, value) VALUES (new.id, new.key, new.value);
END;
