-- The change feed behind MemoryService.Watch; see the Postgres twin. With
-- one writer connection, revisions commit in order, so the newest revision
-- is always settled.
CREATE TABLE memory_changes (
    revision         INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant           TEXT NOT NULL,
    scope_type       INTEGER NOT NULL,
    scope            TEXT NOT NULL,
    key              TEXT NOT NULL,
    kind             INTEGER NOT NULL,
    version          INTEGER NOT NULL,
    versions_deleted INTEGER NOT NULL DEFAULT 0,
    create_time      INTEGER NOT NULL
);

CREATE INDEX memory_changes_scope ON memory_changes (tenant, scope_type, scope, revision);
CREATE INDEX memory_changes_create_time ON memory_changes (create_time);
