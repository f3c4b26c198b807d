-- Scoped, versioned key-value memory; the same shape as the Postgres schema.
-- Timestamps are microseconds since the epoch. Text compares bytewise
-- (BINARY), so a key prefix is a plain range scan of the primary key.

CREATE TABLE memory_heads (
    tenant      TEXT NOT NULL,
    scope_type  INTEGER NOT NULL,
    scope       TEXT NOT NULL,
    key         TEXT NOT NULL,
    version     INTEGER NOT NULL,
    deleted     INTEGER NOT NULL,
    update_time INTEGER NOT NULL,
    PRIMARY KEY (tenant, scope_type, scope, key)
) WITHOUT ROWID;

CREATE TABLE memory_versions (
    tenant       TEXT NOT NULL,
    scope_type   INTEGER NOT NULL,
    scope        TEXT NOT NULL,
    key          TEXT NOT NULL,
    version      INTEGER NOT NULL,
    value        TEXT,             -- NULL on a tombstone
    deleted      INTEGER NOT NULL,
    execution_id TEXT NOT NULL DEFAULT '',
    flow_id      TEXT NOT NULL DEFAULT '',
    flow_name    TEXT NOT NULL DEFAULT '',
    create_time  INTEGER NOT NULL,
    PRIMARY KEY (tenant, scope_type, scope, key, version)
) WITHOUT ROWID;

CREATE TABLE memory_request_ids (
    tenant      TEXT NOT NULL,
    request_id  TEXT NOT NULL,
    fingerprint BLOB NOT NULL,
    scope_type  INTEGER NOT NULL,
    scope       TEXT NOT NULL,
    key         TEXT NOT NULL,
    version     INTEGER,
    create_time INTEGER NOT NULL,
    PRIMARY KEY (tenant, request_id)
) WITHOUT ROWID;

CREATE INDEX memory_request_ids_create_time ON memory_request_ids (create_time);
