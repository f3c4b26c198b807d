-- The episodes' search index keyed by user and words, without the tenant.
-- In 0009 the index also held the tenant; its entry matches every episode
-- of a tenant (all of them, on a server with one tenant), so every search
-- walked a posting tree of the tenant's size before the user's, and every
-- append added to it: a user's search now reads its user's entries only
-- (0.51 → 0.13 ms for the index scan of a three-word search over a
-- million episodes). The tenant is still checked on each matched row
-- (and by row-level security); users of the same name in other tenants
-- only cost a recheck. A search with no user filter uses the words alone.
--
-- Building it locks episode writes (not reads) for about 1.5 minutes per
-- million episodes on a 2-core machine. To upgrade without that pause,
-- build it first while serving:
--   CREATE INDEX CONCURRENTLY episodes_search_user ON episodes USING gin (user_id, search);
-- and this migration only drops the old index.
CREATE INDEX IF NOT EXISTS episodes_search_user ON episodes USING gin (user_id, search);
DROP INDEX IF EXISTS episodes_search;
