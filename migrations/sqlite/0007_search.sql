-- Lexical search: one FTS5 table per source, kept by triggers in the
-- writing transaction, so a write is findable when it commits and a
-- delete, purge or eviction removes its text in the same transaction.
-- The porter stemmer over unicode61 (which splits on punctuation, so
-- src/auth/validate.ts and user_42 are found by their parts); bm25() ranks.
--
-- Rows are numbered by stable integer ids: an episode's cursor, and for
-- memory keys and facts (tables without an integer key) an id from a
-- mapping table. Each FTS row holds the current version's text only, with
-- its version, and a search joins the heads, so a stale row is never found.

CREATE TABLE memory_search_ids (
    id         INTEGER PRIMARY KEY,
    tenant     TEXT NOT NULL,
    scope_type INTEGER NOT NULL,
    scope      TEXT NOT NULL,
    key        TEXT NOT NULL,
    UNIQUE (tenant, scope_type, scope, key)
);

CREATE VIRTUAL TABLE memory_fts USING fts5(
    text, version UNINDEXED, tokenize = 'porter unicode61 remove_diacritics 2'
);

CREATE TRIGGER memory_fts_write AFTER INSERT ON memory_versions BEGIN
    INSERT OR IGNORE INTO memory_search_ids (tenant, scope_type, scope, key)
        VALUES (new.tenant, new.scope_type, new.scope, new.key);
    DELETE FROM memory_fts WHERE rowid = (
        SELECT id FROM memory_search_ids WHERE tenant = new.tenant
        AND scope_type = new.scope_type AND scope = new.scope AND key = new.key);
    INSERT INTO memory_fts (rowid, text, version)
        SELECT id, new.key || ' ' || coalesce((SELECT group_concat(value, ' ')
            FROM json_tree(new.value) WHERE type IN ('text', 'integer', 'real')), ''),
            new.version
        FROM memory_search_ids WHERE tenant = new.tenant AND scope_type = new.scope_type
        AND scope = new.scope AND key = new.key AND NOT new.deleted;
END;

CREATE TRIGGER memory_fts_purge AFTER DELETE ON memory_versions BEGIN
    DELETE FROM memory_fts WHERE rowid = (
        SELECT id FROM memory_search_ids WHERE tenant = old.tenant
        AND scope_type = old.scope_type AND scope = old.scope AND key = old.key)
        AND version = old.version;
END;

CREATE TABLE fact_search_ids (
    id      INTEGER PRIMARY KEY,
    tenant  TEXT NOT NULL,
    fact_id TEXT NOT NULL,
    UNIQUE (tenant, fact_id)
);

CREATE VIRTUAL TABLE facts_fts USING fts5(
    text, version UNINDEXED, tokenize = 'porter unicode61 remove_diacritics 2'
);

CREATE TRIGGER facts_fts_write AFTER INSERT ON fact_versions BEGIN
    INSERT OR IGNORE INTO fact_search_ids (tenant, fact_id) VALUES (new.tenant, new.fact_id);
    DELETE FROM facts_fts WHERE rowid = (
        SELECT id FROM fact_search_ids WHERE tenant = new.tenant AND fact_id = new.fact_id);
    INSERT INTO facts_fts (rowid, text, version)
        SELECT id, new.subject || ' ' || new.predicate || ' ' || new.object || ' '
            || coalesce((SELECT group_concat(value, ' ') FROM json_tree(new.content)
                WHERE type IN ('text', 'integer', 'real')), ''),
            new.version
        FROM fact_search_ids WHERE tenant = new.tenant AND fact_id = new.fact_id
        AND NOT new.deleted;
END;

CREATE TRIGGER facts_fts_delete AFTER DELETE ON facts BEGIN
    DELETE FROM facts_fts WHERE rowid = (
        SELECT id FROM fact_search_ids WHERE tenant = old.tenant AND fact_id = old.id);
    DELETE FROM fact_search_ids WHERE tenant = old.tenant AND fact_id = old.id;
END;

CREATE VIRTUAL TABLE episodes_fts USING fts5(
    text, tokenize = 'porter unicode61 remove_diacritics 2'
);

CREATE TRIGGER episodes_fts_write AFTER INSERT ON episodes BEGIN
    INSERT INTO episodes_fts (rowid, text) VALUES (new.cursor,
        coalesce((SELECT group_concat(value, ' ') FROM json_tree(new.content)
            WHERE type IN ('text', 'integer', 'real')), '')
        || ' ' || coalesce((SELECT group_concat(value, ' ') FROM json_tree(new.metadata)
            WHERE type IN ('text', 'integer', 'real')), ''));
END;

CREATE TRIGGER episodes_fts_delete AFTER DELETE ON episodes BEGIN
    DELETE FROM episodes_fts WHERE rowid = old.cursor;
END;

-- What was stored before this migration.
INSERT INTO memory_search_ids (tenant, scope_type, scope, key)
    SELECT tenant, scope_type, scope, key FROM memory_heads;
INSERT INTO memory_fts (rowid, text, version)
    SELECT i.id, v.key || ' ' || coalesce((SELECT group_concat(j.value, ' ')
        FROM json_tree(v.value) j WHERE j.type IN ('text', 'integer', 'real')), ''), v.version
    FROM memory_heads h
    JOIN memory_versions v ON v.tenant = h.tenant AND v.scope_type = h.scope_type
        AND v.scope = h.scope AND v.key = h.key AND v.version = h.version
    JOIN memory_search_ids i ON i.tenant = h.tenant AND i.scope_type = h.scope_type
        AND i.scope = h.scope AND i.key = h.key
    WHERE NOT h.deleted;
INSERT INTO fact_search_ids (tenant, fact_id) SELECT tenant, id FROM facts;
INSERT INTO facts_fts (rowid, text, version)
    SELECT i.id, v.subject || ' ' || v.predicate || ' ' || v.object || ' '
        || coalesce((SELECT group_concat(j.value, ' ') FROM json_tree(v.content) j
            WHERE j.type IN ('text', 'integer', 'real')), ''), v.version
    FROM facts f
    JOIN fact_versions v ON v.tenant = f.tenant AND v.fact_id = f.id AND v.version = f.version
    JOIN fact_search_ids i ON i.tenant = f.tenant AND i.fact_id = f.id
    WHERE NOT f.deleted;
INSERT INTO episodes_fts (rowid, text)
    SELECT cursor, coalesce((SELECT group_concat(value, ' ') FROM json_tree(content)
            WHERE type IN ('text', 'integer', 'real')), '')
        || ' ' || coalesce((SELECT group_concat(value, ' ') FROM json_tree(metadata)
            WHERE type IN ('text', 'integer', 'real')), '')
    FROM episodes;
