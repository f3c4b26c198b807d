-- The change feed behind MemoryService.Watch: one row per set, delete,
-- compaction write and purged key, numbered by a global revision.
--
-- The revision is taken when the row is inserted, i.e. after the writing
-- transaction has modified the key's head row and so already holds a
-- transaction id. A reader therefore never hands out revisions beyond a
-- "settled" horizon: it reads max(revision) together with the snapshot's
-- xmax, waits until the oldest running transaction is at or past that xmax,
-- and only then treats everything up to that max as final. A transaction
-- that took a lower revision but commits late is thereby waited for, never
-- skipped (the bigserial-at-insert trap).
CREATE TABLE memory_changes (
    revision         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant           text COLLATE "C" NOT NULL,
    scope_type       smallint NOT NULL,
    scope            text COLLATE "C" NOT NULL,
    key              text COLLATE "C" NOT NULL,
    kind             smallint NOT NULL,          -- 1 set, 2 delete, 3 purge, 4 compact
    version          bigint NOT NULL,            -- written, or newest purged
    versions_deleted bigint NOT NULL DEFAULT 0,  -- purge only
    create_time      timestamptz NOT NULL
);

CREATE INDEX memory_changes_scope ON memory_changes (tenant, scope_type, scope, revision);
CREATE INDEX memory_changes_create_time ON memory_changes (create_time);

-- The wake-up for watchers on every replica: one notification per writing
-- statement (and Postgres folds identical ones within a transaction). The
-- table stays the truth; a missed notification only delays delivery until
-- the next poll.
CREATE FUNCTION engram_notify_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('engram_changes', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER memory_changes_notify AFTER INSERT ON memory_changes
    FOR EACH STATEMENT EXECUTE FUNCTION engram_notify_change();
