-- The versions' search columns stop being filled: since migration 0020
-- the memory and fact triggers build the vectors of memory_search and
-- fact_search themselves, and nothing reads these columns. Dropping a
-- generated column's expression keeps what it holds and rewrites
-- nothing, but takes each table's exclusive lock, so it is a migration of
-- its own, holding the lock for no longer than these two statements.

ALTER TABLE memory_versions ALTER COLUMN search DROP EXPRESSION;
ALTER TABLE fact_versions ALTER COLUMN search DROP EXPRESSION;
