-- The search indexes' pending lists, merged by the server. A GIN index
-- with fastupdate (the default) takes new entries into a pending list and
-- merges them into the index once the list reaches gin_pending_list_limit
-- (4 MB), in whichever write fills it; every search meanwhile reads the
-- whole list. After a burst of appends that halved search throughput
-- (the `search` bench: 353 ops/s with a full list, 703 once merged) and
-- stalled the append that filled it. The server now merges the lists
-- once writes pause (`--search-merge-interval-ms`); while they go on, the
-- write that fills a list still merges it, in the large batch that costs
-- least (merging every second halved the throughput of steady appends).
--
-- gin_clean_pending_list needs the index's owner, and the server may run
-- as an ordinary role: the owner's function, with the owner's search path.

CREATE FUNCTION engram_merge_search_pending() RETURNS bigint
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
    AS $$ SELECT gin_clean_pending_list('episodes_search_user'::regclass)
              + gin_clean_pending_list('memory_versions_search'::regclass)
              + gin_clean_pending_list('fact_versions_search'::regclass) $$;

COMMENT ON FUNCTION engram_merge_search_pending() IS
    'Merges the search indexes'' pending lists into the indexes; returns the pages merged.';
