-- The request that created a session, so that creating a session can be
-- retried safely: CreateSession and GetOrCreateSession take a
-- `request_id`, kept here, and a repeat of the request (a retry after a
-- reply that was lost) is answered with the session it created, as
-- created, instead of ALREADY_EXISTS, a second session (when the caller
-- gave no id) or `created` false. Unique per tenant; sessions created
-- without one (all before this migration) hold NULL and are not in the
-- index. The column is never updated, so appends' updates of a session
-- stay HOT.
--
-- Adding the column changes no row. The index is built while session
-- writes wait (reads go on); it holds no row yet, but the build reads the
-- table once. To upgrade without that pause, build it first while serving:
--   CREATE UNIQUE INDEX CONCURRENTLY sessions_request ON sessions (tenant, create_request_id)
--       WHERE create_request_id IS NOT NULL;
-- after adding the column (`ALTER TABLE sessions ADD COLUMN IF NOT EXISTS
-- create_request_id text COLLATE "C"`, which takes no time).
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS create_request_id text COLLATE "C";
-- What that request asked for (SHA-256 of its fields), so that the id
-- reused for another request is told from a repeat.
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS create_fingerprint bytea;
CREATE UNIQUE INDEX IF NOT EXISTS sessions_request ON sessions (tenant, create_request_id)
    WHERE create_request_id IS NOT NULL;
