-- The index of memory_search's words alone, replaced by one that holds the
-- tenant too (migration 0022). A migration of its own: the drop takes the
-- table's exclusive lock, for this statement only, holding no other.
DROP INDEX IF EXISTS memory_search_search;
