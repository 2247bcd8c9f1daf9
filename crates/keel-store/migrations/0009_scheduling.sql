-- The scheduler's columns (issue 13, see keel_store::scheduling): what workers claim and in which
-- order, and the per-tenant token windows of rate admission. Integers only, so the same SQL runs
-- on SQLite and PostgreSQL.
--
-- runnable        1 while a worker should run the session (a queued turn, or an active turn not
--                 waiting on a human), as marked by the runtime on every journal commit; else 0.
-- runnable_since  Unix ms of the commit that set runnable from 0 to 1 (kept while it stays 1,
--                 NULL while 0): the claim order within a priority.
-- priority        Higher is claimed first within its tenant (the latest submitted turn's).
-- queued_turns    Turns queued and not yet started (admission control counts them).
-- claim_after     Unix ms before which the session is not claimed (a released claim's backoff).
-- schema_version  The highest event envelope schema_version appended to the session: a worker
--                 claims only sessions its build can read.
ALTER TABLE sessions ADD COLUMN runnable INT NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN runnable_since BIGINT;
ALTER TABLE sessions ADD COLUMN priority INT NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN queued_turns INT NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN claim_after BIGINT;
ALTER TABLE sessions ADD COLUMN schema_version INT NOT NULL DEFAULT 2;

-- A session running a turn when this migration runs has work: it is runnable since its last
-- write. Queued turns are not counted from the journal; the next commit writes the real mark.
UPDATE sessions SET runnable = 1, runnable_since = updated_at WHERE status = 'running';

-- Claim candidates: runnable sessions (this index), due wake-ups (sessions_by_wake) and intents
-- (the intents primary key). Live leases per tenant (the scheduler's concurrency in use), and
-- queued turns per tenant (admission), without a scan of every session.
CREATE INDEX sessions_runnable ON sessions (tenant_id, priority, runnable_since, session_id) WHERE runnable = 1;
CREATE INDEX sessions_leased ON sessions (tenant_id) WHERE lease_owner IS NOT NULL;
CREATE INDEX sessions_queued ON sessions (tenant_id, queued_turns) WHERE queued_turns > 0;

-- Model tokens reserved or used per tenant and minute (window_start: Unix ms of the window's
-- start), for the per-tenant tokens-per-minute limit. Windows older than two minutes are deleted
-- by the reservations that pass by.
CREATE TABLE token_windows (
    tenant_id    TEXT   NOT NULL,
    window_start BIGINT NOT NULL,
    tokens       BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, window_start)
);
