-- Sealed rows of every kind in one table (generalizes migration 4's sealed_arguments): opaque
-- bytes the runtime encrypted (nonce || ciphertext || tag; the store never sees a key or
-- plaintext), keyed within a session by what they hold (`kind`) and whose they are (`item_id`):
--   arguments  the exact arguments of an unfinished tool call whose journaled form was redacted;
--              item_id is the tool call id (written with the call's proposal, deleted with its result)
--   reasoning  a completed step's provider reasoning items (thinking blocks with signature,
--              encrypted reasoning), needed back within the turn's tool loop; item_id is the step
--              id (written with step.completed, deleted with the turn's turn.finished)
-- Existing sealed_arguments rows move over as kind 'arguments'.
CREATE TABLE sealed_items (
    tenant_id  TEXT   NOT NULL,
    session_id TEXT   NOT NULL,
    kind       TEXT   NOT NULL,
    item_id    TEXT   NOT NULL,
    sealed     {blob} NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, session_id, kind, item_id)
);
INSERT INTO sealed_items (tenant_id, session_id, kind, item_id, sealed, created_at)
    SELECT tenant_id, session_id, 'arguments', tool_call_id, sealed, created_at FROM sealed_arguments;
DROP TABLE sealed_arguments;
