-- Point-in-time reads and forks; see the Postgres migration 0011.
ALTER TABLE memory_versions ADD COLUMN revision INTEGER NOT NULL DEFAULT 0;

UPDATE memory_versions SET revision = coalesce((
    SELECT c.revision FROM memory_changes c
    WHERE c.tenant = memory_versions.tenant AND c.scope_type = memory_versions.scope_type
      AND c.scope = memory_versions.scope AND c.key = memory_versions.key
      AND c.version = memory_versions.version AND c.kind IN (1, 2, 4)
    ORDER BY c.revision DESC LIMIT 1), 0);

CREATE TABLE memory_purges (
    tenant         TEXT NOT NULL,
    scope_type     INTEGER NOT NULL,
    scope          TEXT NOT NULL,
    key            TEXT NOT NULL,
    first_revision INTEGER NOT NULL,
    first_time     INTEGER NOT NULL,
    purge_time     INTEGER NOT NULL,
    PRIMARY KEY (tenant, scope_type, scope, key)
) WITHOUT ROWID;

-- A key's search id goes with its head (a purge of every version, a
-- forgotten user's run), so no key name outlives its data.
CREATE TRIGGER memory_search_ids_gone AFTER DELETE ON memory_heads BEGIN
    DELETE FROM memory_search_ids WHERE tenant = old.tenant
        AND scope_type = old.scope_type AND scope = old.scope AND key = old.key;
END;

-- How far the change feed has been pruned by age: a Watch may resume after
-- any revision at or past it. Tracked rather than read off the oldest row
-- kept, since rows also go when a user is forgotten, and a feed that lost
-- a scope's rows that way is not pruned for everyone else.
CREATE TABLE memory_feed (
    singleton      INTEGER PRIMARY KEY CHECK (singleton = 1),
    pruned_through INTEGER NOT NULL
);

INSERT INTO memory_feed (singleton, pruned_through)
    SELECT 1, oldest - 1 FROM (SELECT min(revision) AS oldest FROM memory_changes) AS kept
    WHERE oldest > 1;

-- Retention declared per scope; see the Postgres migration 0011.
CREATE TABLE memory_retention (
    tenant                 TEXT NOT NULL,
    scope_type             INTEGER NOT NULL,
    scope                  TEXT NOT NULL,
    keep_versions          INTEGER,
    max_age_micros         INTEGER,
    tombstone_grace_micros INTEGER,
    next_run_time          INTEGER NOT NULL,
    last_run_time          INTEGER,
    last_versions_deleted  INTEGER NOT NULL DEFAULT 0,
    update_time            INTEGER NOT NULL,
    PRIMARY KEY (tenant, scope_type, scope)
) WITHOUT ROWID;

CREATE INDEX memory_retention_due ON memory_retention (next_run_time);
