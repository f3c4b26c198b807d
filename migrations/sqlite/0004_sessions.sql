-- Sessions and their event logs; the same shape as the Postgres schema.
-- With one writer connection cursors commit in order, so the newest cursor
-- is always settled. Foreign keys are enabled on every connection.
CREATE TABLE sessions (
    tenant           TEXT NOT NULL,
    id               TEXT NOT NULL,
    app              TEXT NOT NULL,
    user_id          TEXT NOT NULL,
    metadata         TEXT NOT NULL DEFAULT '{}',
    create_time      INTEGER NOT NULL,
    update_time      INTEGER NOT NULL,
    end_time         INTEGER,
    last_seq         INTEGER NOT NULL DEFAULT 0,
    episode_count    INTEGER NOT NULL DEFAULT 0,
    episodes_evicted INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, id)
) WITHOUT ROWID;

CREATE INDEX sessions_create ON sessions (tenant, create_time, id);
CREATE INDEX sessions_app ON sessions (tenant, app, create_time, id);
CREATE INDEX sessions_user ON sessions (tenant, user_id, create_time, id);
CREATE INDEX sessions_update ON sessions (tenant, update_time);

CREATE TABLE session_evictions (
    tenant   TEXT PRIMARY KEY,
    sessions INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

CREATE TABLE episodes (
    cursor      INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant      TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    id          TEXT NOT NULL,
    app         TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    agent       TEXT NOT NULL,
    type        TEXT NOT NULL,
    content     TEXT NOT NULL,
    metadata    TEXT NOT NULL,
    source_node TEXT NOT NULL DEFAULT '',
    timestamp   INTEGER NOT NULL,
    create_time INTEGER NOT NULL,
    fingerprint BLOB NOT NULL,
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);

CREATE UNIQUE INDEX episodes_session_seq ON episodes (tenant, session_id, seq);
CREATE UNIQUE INDEX episodes_id ON episodes (tenant, id);
CREATE INDEX episodes_tenant_cursor ON episodes (tenant, cursor);
CREATE INDEX episodes_user_time ON episodes (tenant, user_id, timestamp, cursor);
CREATE INDEX episodes_user_agent_time ON episodes (tenant, user_id, agent, timestamp, cursor);
CREATE INDEX episodes_session_time ON episodes (tenant, session_id, timestamp, cursor);
