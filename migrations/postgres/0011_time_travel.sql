-- Point-in-time reads and forks (MemoryService `as_of`, ForkScope).
--
-- Each version carries the change-feed revision that wrote it, so "what
-- was current at revision R" is the newest version with revision <= R,
-- however long ago the feed itself was pruned. Versions written before
-- this migration take their revision from the feed where it still has
-- them; older ones get 0 ("before any retained revision"), which is what
-- they are for every revision a client can still name.
ALTER TABLE memory_versions ADD COLUMN revision bigint NOT NULL DEFAULT 0;

UPDATE memory_versions v SET revision = c.revision
FROM (SELECT tenant, scope_type, scope, key, version, max(revision) AS revision
      FROM memory_changes WHERE kind IN (1, 2, 4)
      GROUP BY tenant, scope_type, scope, key, version) c
WHERE c.tenant = v.tenant AND c.scope_type = v.scope_type AND c.scope = v.scope
  AND c.key = v.key AND c.version = v.version;

-- What purges took: per key, the oldest version ever purged (its revision
-- and time). A read at a point from which the key has no kept version but
-- a purged one reports the key as purged instead of skipping it. Kept
-- after the key's head goes, and merged (the oldest wins) on every purge.
CREATE TABLE memory_purges (
    tenant         text COLLATE "C" NOT NULL,
    scope_type     smallint NOT NULL,
    scope          text COLLATE "C" NOT NULL,
    key            text COLLATE "C" NOT NULL,
    first_revision bigint NOT NULL,
    first_time     timestamptz NOT NULL,
    purge_time     timestamptz NOT NULL,
    PRIMARY KEY (tenant, scope_type, scope, key)
);

ALTER TABLE memory_purges ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_purges FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memory_purges USING (engram_tenant_visible(tenant))
    WITH CHECK (engram_tenant_visible(tenant));

-- How far the change feed has been pruned by age: a Watch may resume after
-- any revision at or past it. Tracked rather than read off the oldest row
-- kept, since rows also go when a user is forgotten, and a feed that lost
-- a scope's rows that way is not pruned for everyone else.
CREATE TABLE memory_feed (
    singleton      smallint PRIMARY KEY CHECK (singleton = 1),
    pruned_through bigint NOT NULL
);

INSERT INTO memory_feed (singleton, pruned_through)
    SELECT 1, oldest - 1 FROM (SELECT min(revision) AS oldest FROM memory_changes) AS kept
    WHERE oldest > 1;

-- Retention declared per scope (MemoryAdminService.SetRetention), applied
-- by the server when next_run_time comes; a replica takes a run by moving
-- next_run_time forward with a compare-and-set, so one replica runs it.
CREATE TABLE memory_retention (
    tenant                 text COLLATE "C" NOT NULL,
    scope_type             smallint NOT NULL,
    scope                  text COLLATE "C" NOT NULL,
    keep_versions          bigint,
    max_age_micros         bigint,
    tombstone_grace_micros bigint,
    next_run_time          timestamptz NOT NULL,
    last_run_time          timestamptz,
    last_versions_deleted  bigint NOT NULL DEFAULT 0,
    update_time            timestamptz NOT NULL,
    PRIMARY KEY (tenant, scope_type, scope)
);

CREATE INDEX memory_retention_due ON memory_retention (next_run_time);

ALTER TABLE memory_retention ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_retention FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memory_retention USING (engram_tenant_visible(tenant))
    WITH CHECK (engram_tenant_visible(tenant));
