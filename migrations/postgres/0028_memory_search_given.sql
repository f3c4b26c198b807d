-- A memory version's search vector may be given by the writer, as an
-- episode's may since 0017. Until now the versions' statement trigger
-- built every set's vector with Postgres's parser (about 160 µs for 1 KB
-- of text on a 2-core machine). The server now builds the same vector
-- when the text is plain (src/search/vector.rs, `memory`) and its write
-- statement stores it as the key's row of memory_search, in the same
-- statement that inserts the version. The trigger below then leaves a
-- key whose row already holds the version (or a newer one), and builds
-- the rest exactly as before: text the server leaves to Postgres's
-- parser, imports, forks, audit records, and writers of the previous
-- release during a rolling upgrade. The versions keep no vector.
--
-- Only the function changes: no table is rewritten or locked for long.

CREATE OR REPLACE FUNCTION engram_memory_search_added() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    WITH newest AS (
        SELECT DISTINCT ON (tenant, scope_type, scope, key)
               tenant, scope_type, scope, key, version, deleted, value
        FROM added ORDER BY tenant, scope_type, scope, key, version DESC
    ), removed AS (
        DELETE FROM memory_search s USING newest n
        WHERE n.deleted AND s.tenant = n.tenant AND s.scope_type = n.scope_type
          AND s.scope = n.scope AND s.key = n.key AND s.version < n.version
    )
    INSERT INTO memory_search AS s (tenant, scope_type, scope, key, version, search)
    SELECT tenant, scope_type, scope, key, version, engram_memory_vector(key, value)
    FROM newest n WHERE NOT deleted
      AND NOT EXISTS (SELECT 1 FROM memory_search g
          WHERE g.tenant = n.tenant AND g.scope_type = n.scope_type
            AND g.scope = n.scope AND g.key = n.key AND g.version >= n.version)
    ORDER BY tenant, scope_type, scope, key
    ON CONFLICT (tenant, scope_type, scope, key) DO UPDATE
        SET version = excluded.version, search = excluded.search
        WHERE s.version < excluded.version;
    RETURN NULL;
END
$$;
