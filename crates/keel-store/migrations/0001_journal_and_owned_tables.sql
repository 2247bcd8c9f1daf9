-- Keel store schema v1. Timestamps are Unix milliseconds (BIGINT); JSON is stored as TEXT; ids
-- are UUID text. Every table is keyed by tenant first: every query filters on tenant_id.

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
    updated_at        BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, session_id)
);
CREATE UNIQUE INDEX sessions_by_id ON sessions (session_id);
CREATE INDEX sessions_by_status ON sessions (tenant_id, status, created_at);
CREATE INDEX sessions_by_wake ON sessions (tenant_id, wake_at) WHERE wake_at IS NOT NULL;

-- The journal: authoritative, append-only. body is the whole event envelope as JSON.
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
    decided_at   BIGINT,
    PRIMARY KEY (tenant_id, approval_id)
);
CREATE INDEX approvals_by_session ON approvals (tenant_id, session_id, status);

CREATE TABLE memory (
    tenant_id  TEXT   NOT NULL,
    namespace  TEXT   NOT NULL,
    key        TEXT   NOT NULL,
    value      TEXT   NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, namespace, key)
);

CREATE TABLE artifacts (
    tenant_id    TEXT   NOT NULL,
    artifact_id  TEXT   NOT NULL,
    session_id   TEXT   NOT NULL,
    name         TEXT   NOT NULL,
    content_type TEXT   NOT NULL,
    size         BIGINT NOT NULL,
    data         {blob} NOT NULL,
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
