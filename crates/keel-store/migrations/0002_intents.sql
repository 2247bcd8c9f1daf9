-- Durable intents: requests for a session posted by anyone (another terminal, the API) while a
-- worker may hold the session's lease — new input, a cancellation. The lease holder journals each
-- one and deletes it. Ordered by created_at, then intent_id (UUIDv7).
CREATE TABLE intents (
    tenant_id  TEXT   NOT NULL,
    session_id TEXT   NOT NULL,
    intent_id  TEXT   NOT NULL,
    kind       TEXT   NOT NULL,
    payload    TEXT   NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, session_id, intent_id)
);
