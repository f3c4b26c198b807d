-- Sessions lose their index on the last activity, as on Postgres
-- (migrations/postgres/0018): every append updates the session's
-- update_time, which cost a delete and an insert in this index each time.
-- The idle sessions' cleanup narrows by creation time instead (a session
-- idle since before a time was created before it), through
-- sessions_create.
DROP INDEX IF EXISTS sessions_update;
