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
