-- What the HTTP API needs besides sessions: tenants, principals and their API keys (stored only as
-- hashes), idempotency records of POST requests, who decided an approval, and indexes for the
-- API's lists (sessions by release, approvals per tenant by status).
--
-- tenants, principals and api_keys are the one place rows exist without a tenant: a system
-- principal (and its keys) belongs to no tenant (tenant_id NULL) and manages the tenants.

CREATE TABLE tenants (
    tenant_id  TEXT   NOT NULL PRIMARY KEY,
    name       TEXT   NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE UNIQUE INDEX tenants_by_name ON tenants (name);

-- role: system (tenant_id NULL), admin, operator or viewer (tenant_id set).
CREATE TABLE principals (
    principal_id TEXT   NOT NULL PRIMARY KEY,
    tenant_id    TEXT,
    name         TEXT   NOT NULL,
    role         TEXT   NOT NULL,
    created_at   BIGINT NOT NULL
);
CREATE INDEX principals_by_tenant ON principals (tenant_id, created_at);

-- key_hash: sha256:<hex> of the whole key text; the key itself is never stored. prefix: its
-- first characters, to tell keys apart in lists.
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

-- One row per (scope, principal, route, key): scope is the tenant id, or 'system' for system
-- keys. state in_flight while the first request runs, then done with its response.
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

ALTER TABLE approvals ADD COLUMN decided_by TEXT;
CREATE INDEX approvals_by_tenant_status ON approvals (tenant_id, status, created_at);
CREATE INDEX sessions_by_release ON sessions (tenant_id, release_id, created_at);
CREATE INDEX releases_by_created ON releases (tenant_id, created_at);
