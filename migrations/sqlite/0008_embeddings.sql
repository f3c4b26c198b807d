-- Semantic search: vectors on the items' rows, an outbox filled by the
-- writing transaction (the triggers below) once an embedder has recorded
-- its model. The same design as the Postgres migration 0010, which says
-- why; SQLite's triggers run per row.

CREATE TABLE embedder (
    singleton   INTEGER PRIMARY KEY CHECK (singleton = 1),
    model       TEXT NOT NULL,
    update_time INTEGER NOT NULL
);

ALTER TABLE memory_versions ADD COLUMN embedding BLOB;
ALTER TABLE memory_versions ADD COLUMN embedding_model TEXT;
ALTER TABLE fact_versions ADD COLUMN embedding BLOB;
ALTER TABLE fact_versions ADD COLUMN embedding_model TEXT;
ALTER TABLE episodes ADD COLUMN embedding BLOB;
ALTER TABLE episodes ADD COLUMN embedding_model TEXT;

CREATE TABLE embedding_outbox (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant     TEXT NOT NULL,
    source     INTEGER NOT NULL,
    scope_type INTEGER NOT NULL DEFAULT 0,
    scope      TEXT NOT NULL DEFAULT '',
    key        TEXT NOT NULL DEFAULT '',
    version    INTEGER NOT NULL,
    attempts   INTEGER NOT NULL DEFAULT 0,
    due_time   INTEGER,
    claim      TEXT
);

CREATE TRIGGER memory_versions_embedding AFTER INSERT ON memory_versions
WHEN NOT new.deleted AND substr(new.key, 1, 12) <> '_compaction/'
    AND EXISTS (SELECT 1 FROM embedder)
BEGIN
    INSERT INTO embedding_outbox (tenant, source, scope_type, scope, key, version)
    VALUES (new.tenant, 1, new.scope_type, new.scope, new.key, new.version);
END;

CREATE TRIGGER fact_versions_embedding AFTER INSERT ON fact_versions
WHEN NOT new.deleted AND EXISTS (SELECT 1 FROM embedder)
BEGIN
    INSERT INTO embedding_outbox (tenant, source, key, version)
    VALUES (new.tenant, 2, new.fact_id, new.version);
END;

CREATE TRIGGER episodes_embedding AFTER INSERT ON episodes
WHEN EXISTS (SELECT 1 FROM embedder)
BEGIN
    INSERT INTO embedding_outbox (tenant, source, scope, version)
    VALUES (new.tenant, 3, new.session_id, new.seq);
END;
