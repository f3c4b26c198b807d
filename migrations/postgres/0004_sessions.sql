-- Sessions and their event logs (episodes).
--
-- A session row is the lock and the counter of its log: an append locks it,
-- takes the next `seq` values from `last_seq` (dense per session) and only
-- then inserts, so the episode's `cursor` (an identity, i.e. a sequence) is
-- always taken by a transaction that already holds a transaction id. The
-- tail relies on that: it hands out cursors only up to a settled horizon
-- (see 0003_changes.sql), so a transaction that took a lower cursor but
-- commits late is waited for, never skipped.
CREATE TABLE sessions (
    tenant           text COLLATE "C" NOT NULL,
    id               text COLLATE "C" NOT NULL,
    app              text COLLATE "C" NOT NULL,
    user_id          text COLLATE "C" NOT NULL,
    metadata         jsonb NOT NULL DEFAULT '{}',
    create_time      timestamptz NOT NULL,
    update_time      timestamptz NOT NULL,      -- last activity
    end_time         timestamptz,
    last_seq         bigint NOT NULL DEFAULT 0,
    episode_count    bigint NOT NULL DEFAULT 0,
    episodes_evicted bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, id)
);

-- Newest first listings (all, by app, by user), eviction of the oldest,
-- and cleanup by idle time.
CREATE INDEX sessions_create ON sessions (tenant, create_time, id);
CREATE INDEX sessions_app ON sessions (tenant, app, create_time, id);
CREATE INDEX sessions_user ON sessions (tenant, user_id, create_time, id);
CREATE INDEX sessions_update ON sessions (tenant, update_time);

-- Sessions evicted by the per-tenant limit, for GetStats.
CREATE TABLE session_evictions (
    tenant   text COLLATE "C" PRIMARY KEY,
    sessions bigint NOT NULL DEFAULT 0
);

CREATE TABLE episodes (
    tenant      text COLLATE "C" NOT NULL,
    session_id  text COLLATE "C" NOT NULL,
    seq         bigint NOT NULL,
    id          text COLLATE "C" NOT NULL,
    cursor      bigint GENERATED ALWAYS AS IDENTITY,
    app         text COLLATE "C" NOT NULL,
    user_id     text COLLATE "C" NOT NULL,
    agent       text COLLATE "C" NOT NULL,
    type        text COLLATE "C" NOT NULL,
    content     jsonb NOT NULL,
    metadata    jsonb NOT NULL,
    source_node text NOT NULL DEFAULT '',
    timestamp   timestamptz NOT NULL,
    create_time timestamptz NOT NULL,
    fingerprint bytea NOT NULL,              -- of the append request, for idempotency
    PRIMARY KEY (tenant, session_id, seq),
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);

CREATE UNIQUE INDEX episodes_id ON episodes (tenant, id);
CREATE UNIQUE INDEX episodes_cursor ON episodes (tenant, cursor);
-- Widening reads: one index per level, user and session and agent matched
-- as columns (never LIKE on an encoded key).
CREATE INDEX episodes_user_time ON episodes (tenant, user_id, timestamp, cursor);
CREATE INDEX episodes_user_agent_time ON episodes (tenant, user_id, agent, timestamp, cursor);
CREATE INDEX episodes_session_time ON episodes (tenant, session_id, timestamp, cursor);

-- Wakes the tails of every replica; the table stays the truth.
CREATE FUNCTION engram_notify_episode() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('engram_episodes', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER episodes_notify AFTER INSERT ON episodes
    FOR EACH STATEMENT EXECUTE FUNCTION engram_notify_episode();
