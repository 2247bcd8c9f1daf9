-- The exact arguments of unfinished tool calls whose journaled form was redacted, encrypted by the
-- runtime (nonce || ciphertext || tag; the store never sees a key or plaintext). Written in the
-- append that journals the call's proposal and deleted in the one that journals its result.
CREATE TABLE sealed_arguments (
    tenant_id    TEXT   NOT NULL,
    session_id   TEXT   NOT NULL,
    tool_call_id TEXT   NOT NULL,
    sealed       {blob} NOT NULL,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, session_id, tool_call_id)
);
