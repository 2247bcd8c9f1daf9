-- Tenant usage totals per UTC day (YYYY-MM-DD) and model, added to by journal appends in the same
-- transaction (INSERT … ON CONFLICT DO UPDATE adds each column). Tokens and steps are counts;
-- cost_usd is US dollars (DOUBLE PRECISION: REAL affinity in SQLite). Not owned by a session:
-- deleting a session keeps the usage it spent.
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
