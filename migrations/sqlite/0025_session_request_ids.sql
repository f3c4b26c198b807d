-- The request that created a session, so that creating a session can be
-- retried safely (as Postgres's 0035): a repeat of a CreateSession or
-- GetOrCreateSession with the same `request_id` is answered with the
-- session it created. Unique per tenant; sessions created without one
-- (all before this migration) hold NULL and are not in the index.
ALTER TABLE sessions ADD COLUMN create_request_id TEXT;
-- What that request asked for (SHA-256 of its fields), so that the id
-- reused for another request is told from a repeat.
ALTER TABLE sessions ADD COLUMN create_fingerprint BLOB;
CREATE UNIQUE INDEX sessions_request ON sessions (tenant, create_request_id)
    WHERE create_request_id IS NOT NULL;
