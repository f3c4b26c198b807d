-- Memory and fact searches read only current versions. Until now every
-- version of a key kept its search vector in memory_versions' GIN index, so
-- a word that old versions held cost a search in proportion to the
-- history: on 10,001 keys with 152,299 versions all holding it, 166-176 ms
-- on the plan Postgres keeps after a connection's first five calls (the
-- matches of every version hashed against the heads). Facts' versions
-- likewise.
--
-- memory_search holds one row per live key: its current version and that
-- version's vector, written by triggers on memory_versions in the
-- statement that writes the version (so a write is findable once it
-- commits, as before). A key's newest version is its head (versions are
-- dense and a purge that takes the head takes the whole key), so the row
-- follows the newest version a statement inserts: a tombstone removes it,
-- and a version older than the row's (an import of history) leaves it.
-- A purge removes the row with its version. fact_search does the same for
-- facts (a deleted fact's newest version is marked deleted; forgetting a
-- user deletes the facts, and their versions with them). SQLite's FTS
-- tables have kept one row per key and fact this way since migration 0007.
--
-- The versions keep their generated vectors, which the triggers copy, but
-- lose their GIN indexes: a server of the previous release, still running
-- during a rolling upgrade, then searches by walking the live keys and
-- checking each current version's vector, slower but correct. A later
-- migration may drop the columns.
--
-- The versions' tables are locked against writes for the migration, so
-- that no write falls between the copy of the live items' vectors and the
-- triggers that take over (about 2 s per 100,000 keys here; see README).

LOCK TABLE memory_versions, fact_versions IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE memory_search (
    tenant      text COLLATE "C" NOT NULL,
    scope_type  smallint NOT NULL,
    scope       text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    version     bigint NOT NULL,
    search      tsvector NOT NULL,
    PRIMARY KEY (tenant, scope_type, scope, key)
);

-- Rows up to a page stay whole in it (see migration 0015).
ALTER TABLE memory_search SET (toast_tuple_target = 8160);

ALTER TABLE memory_search ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_search FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memory_search USING (engram_tenant_visible(tenant))
    WITH CHECK (engram_tenant_visible(tenant));

INSERT INTO memory_search (tenant, scope_type, scope, key, version, search)
SELECT h.tenant, h.scope_type, h.scope, h.key, h.version, v.search
FROM memory_heads h JOIN memory_versions v USING (tenant, scope_type, scope, key, version)
WHERE NOT h.deleted;

CREATE INDEX memory_search_search ON memory_search USING gin (search);

-- Statement triggers: a group's sets are one statement of many versions,
-- and a row trigger would run once for each.
CREATE FUNCTION engram_memory_search_added() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    WITH newest AS (
        SELECT DISTINCT ON (tenant, scope_type, scope, key)
               tenant, scope_type, scope, key, version, deleted, search
        FROM added ORDER BY tenant, scope_type, scope, key, version DESC
    ), removed AS (
        DELETE FROM memory_search s USING newest n
        WHERE n.deleted AND s.tenant = n.tenant AND s.scope_type = n.scope_type
          AND s.scope = n.scope AND s.key = n.key AND s.version < n.version
    )
    INSERT INTO memory_search AS s (tenant, scope_type, scope, key, version, search)
    SELECT tenant, scope_type, scope, key, version, search
    FROM newest WHERE NOT deleted
    ORDER BY tenant, scope_type, scope, key
    ON CONFLICT (tenant, scope_type, scope, key) DO UPDATE
        SET version = excluded.version, search = excluded.search
        WHERE s.version < excluded.version;
    RETURN NULL;
END
$$;

CREATE FUNCTION engram_memory_search_removed() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    DELETE FROM memory_search s USING removed r
    WHERE s.tenant = r.tenant AND s.scope_type = r.scope_type AND s.scope = r.scope
      AND s.key = r.key AND s.version = r.version;
    RETURN NULL;
END
$$;

CREATE TRIGGER memory_search_added AFTER INSERT ON memory_versions
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT
    EXECUTE FUNCTION engram_memory_search_added();

CREATE TRIGGER memory_search_removed AFTER DELETE ON memory_versions
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT
    EXECUTE FUNCTION engram_memory_search_removed();

-- Facts: the same, by fact id.
CREATE TABLE fact_search (
    tenant   text COLLATE "C" NOT NULL,
    fact_id  text COLLATE "C" NOT NULL,
    version  bigint NOT NULL,
    search   tsvector NOT NULL,
    PRIMARY KEY (tenant, fact_id)
);

ALTER TABLE fact_search SET (toast_tuple_target = 8160);

ALTER TABLE fact_search ENABLE ROW LEVEL SECURITY;
ALTER TABLE fact_search FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON fact_search USING (engram_tenant_visible(tenant))
    WITH CHECK (engram_tenant_visible(tenant));

INSERT INTO fact_search (tenant, fact_id, version, search)
SELECT f.tenant, f.id, f.version, v.search
FROM facts f JOIN fact_versions v ON v.tenant = f.tenant AND v.fact_id = f.id
    AND v.version = f.version
WHERE NOT f.deleted;

CREATE INDEX fact_search_search ON fact_search USING gin (search);

CREATE FUNCTION engram_fact_search_added() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    WITH newest AS (
        SELECT DISTINCT ON (tenant, fact_id) tenant, fact_id, version, deleted, search
        FROM added ORDER BY tenant, fact_id, version DESC
    ), removed AS (
        DELETE FROM fact_search s USING newest n
        WHERE n.deleted AND s.tenant = n.tenant AND s.fact_id = n.fact_id
          AND s.version < n.version
    )
    INSERT INTO fact_search AS s (tenant, fact_id, version, search)
    SELECT tenant, fact_id, version, search
    FROM newest WHERE NOT deleted
    ORDER BY tenant, fact_id
    ON CONFLICT (tenant, fact_id) DO UPDATE
        SET version = excluded.version, search = excluded.search
        WHERE s.version < excluded.version;
    RETURN NULL;
END
$$;

CREATE FUNCTION engram_fact_search_removed() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    DELETE FROM fact_search s USING removed r
    WHERE s.tenant = r.tenant AND s.fact_id = r.fact_id AND s.version = r.version;
    RETURN NULL;
END
$$;

CREATE TRIGGER fact_search_added AFTER INSERT ON fact_versions
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT
    EXECUTE FUNCTION engram_fact_search_added();

CREATE TRIGGER fact_search_removed AFTER DELETE ON fact_versions
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT
    EXECUTE FUNCTION engram_fact_search_removed();

DROP INDEX memory_versions_search;
DROP INDEX fact_versions_search;

CREATE OR REPLACE FUNCTION engram_merge_search_pending() RETURNS bigint
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
    AS $$ SELECT gin_clean_pending_list('episodes_search_user'::regclass)
              + gin_clean_pending_list('memory_search_search'::regclass)
              + gin_clean_pending_list('fact_search_search'::regclass) $$;
