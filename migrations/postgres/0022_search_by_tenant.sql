-- Memory and fact searches find their tenant's matches in the index. The
-- vectors' indexes of 0016 held the words alone, so a search read every
-- tenant's items holding its words from the table and kept its own: a
-- tenant of 10 keys searching a word that another tenant's 10,000 keys
-- hold read those 10,000 rows (5 ms on a generic plan, against 0.1 with
-- the tenant in the index), and on a server shared by many tenants a
-- common word cost every tenant in proportion to all of them. The new
-- indexes hold the tenant beside the words (btree_gin, as the episodes'
-- user since 0013); a search then reads the tenant's entry together with
-- the words' and visits only its own rows. Where one tenant holds nearly
-- everything, its entry is as long as the table: a few tenths of a
-- millisecond a search at a million keys.
--
-- Each index is built while that table's writes (memory sets, fact
-- writes) wait; reads go on. These tables hold one row per live key and
-- fact, so it takes seconds. To upgrade without the pause, build them
-- first while serving:
--   CREATE INDEX CONCURRENTLY memory_search_tenant ON memory_search USING gin (tenant, search);
--   CREATE INDEX CONCURRENTLY fact_search_tenant ON fact_search USING gin (tenant, search);
-- The indexes of the words alone are dropped by migrations of their own
-- (0025, 0026): a drop takes the table's exclusive lock, and taken after
-- this build's lock in one transaction it could deadlock with a writer
-- that read the table before writing it (the race test met that with
-- the episodes' index). Servers of the release before keep working:
-- their searches name the same columns.
CREATE INDEX IF NOT EXISTS memory_search_tenant ON memory_search USING gin (tenant, search);
CREATE INDEX IF NOT EXISTS fact_search_tenant ON fact_search USING gin (tenant, search);

-- The pending lists of the search indexes there are: those of 0013 and
-- 0016 until they are dropped, then these.
CREATE OR REPLACE FUNCTION engram_merge_search_pending() RETURNS bigint
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
    AS $$ SELECT coalesce(sum(gin_clean_pending_list(to_regclass(i))), 0)::bigint
          FROM unnest(ARRAY['episodes_search_user', 'episodes_search_tenant',
                            'memory_search_search', 'memory_search_tenant',
                            'fact_search_search', 'fact_search_tenant']) AS i
          WHERE to_regclass(i) IS NOT NULL $$;
