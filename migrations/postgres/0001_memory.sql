-- Scoped, versioned key-value memory.
--
-- memory_heads holds one row per key: its newest version and whether that is
-- a tombstone. A write bumps the head and inserts the version in the same
-- statement, so versions are dense under concurrent writers (the row lock on
-- the head serialises them), and "current keys of a scope" is a cheap join.
--
-- Identifiers use the "C" collation: byte order, so a key prefix is a plain
-- btree range scan whatever the database's default collation is.

CREATE TABLE memory_heads (
    tenant      text COLLATE "C" NOT NULL,
    scope_type  smallint NOT NULL,
    scope       text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    version     bigint NOT NULL,
    deleted     boolean NOT NULL,
    update_time timestamptz NOT NULL,
    PRIMARY KEY (tenant, scope_type, scope, key)
);

CREATE TABLE memory_versions (
    tenant       text COLLATE "C" NOT NULL,
    scope_type   smallint NOT NULL,
    scope        text COLLATE "C" NOT NULL,
    key          text COLLATE "C" NOT NULL,
    version      bigint NOT NULL,
    value        jsonb,            -- NULL on a tombstone
    deleted      boolean NOT NULL,
    execution_id text NOT NULL DEFAULT '',
    flow_id      text NOT NULL DEFAULT '',
    flow_name    text NOT NULL DEFAULT '',
    create_time  timestamptz NOT NULL,
    PRIMARY KEY (tenant, scope_type, scope, key, version)
);

-- Idempotency records: a write with a request_id stores what it asked for
-- (the fingerprint) and the version it produced, so a retry returns that
-- version instead of writing again. Pruned after a retention period.
CREATE TABLE memory_request_ids (
    tenant      text COLLATE "C" NOT NULL,
    request_id  text COLLATE "C" NOT NULL,
    fingerprint bytea NOT NULL,
    scope_type  smallint NOT NULL,
    scope       text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    version     bigint,           -- set before the writing transaction commits
    create_time timestamptz NOT NULL,
    PRIMARY KEY (tenant, request_id)
);

CREATE INDEX memory_request_ids_create_time ON memory_request_ids (create_time);
