-- Which tenant a server-side workspace directory belongs to (`keel serve`): the first tenant to
-- create a session in a directory claims it, and no other tenant may then use it, a directory
-- above it or one below it — tenants share the server's workspace roots, never a workspace.
-- `path` is canonical and absolute. A claim outlives the tenant's sessions.
CREATE TABLE workspace_claims (
    path       TEXT   NOT NULL PRIMARY KEY,
    tenant_id  TEXT   NOT NULL,
    created_at BIGINT NOT NULL
);
