-- Tenant budget reservations: each session's claim on its tenant's daily budget for the model step
-- it is about to sample (tokens; cost_usd in US dollars), at most one per session. A reservation
-- counts only while the session's lease is held at lease_epoch and unexpired (sessions.lease_owner
-- IS NOT NULL AND lease_expires_at > now), so a crashed worker's claim lapses with its lease and a
-- takeover (a new epoch) drops it at once. Deleted in the append that commits the step's usage (or
-- ends it), so usage and reservation never both count, or neither.
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
-- One row per tenant and UTC day that has had a reservation request; requests counts them. Every
-- request upserts its row first, so concurrent reservers of one tenant and day take turns on that
-- row's lock (PostgreSQL) or the single writer (SQLite) and each sees the others' grants.
CREATE TABLE usage_reservation_locks (
    tenant_id TEXT   NOT NULL,
    day       TEXT   NOT NULL,
    requests  BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, day)
);
