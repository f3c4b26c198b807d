-- Memory and fact search narrowed by the index, as migration 0011 did for
-- episodes: each FTS row gains an `owner` column whose tokens a search
-- matches beside its words, weighted 0 in bm25(). Memory rows hold
-- `t<hex>x` (the tenant) and `s<hex>x` (the tenant, scope type and scope);
-- fact rows `t<hex>x` and `u<hex>x` (the tenant and the fact's user). Hex
-- of the UTF-8 bytes, parts joined by a NUL, the scope type in decimal;
-- built the same way in src/store/sqlite/search.rs.

DROP TRIGGER memory_fts_write;
DROP TRIGGER memory_fts_purge;
DROP TABLE memory_fts;

CREATE VIRTUAL TABLE memory_fts USING fts5(
    text, version UNINDEXED, owner, tokenize = 'porter unicode61 remove_diacritics 2'
);

CREATE TRIGGER memory_fts_write AFTER INSERT ON memory_versions BEGIN
    INSERT OR IGNORE INTO memory_search_ids (tenant, scope_type, scope, key)
        VALUES (new.tenant, new.scope_type, new.scope, new.key);
    DELETE FROM memory_fts WHERE rowid = (
        SELECT id FROM memory_search_ids WHERE tenant = new.tenant
        AND scope_type = new.scope_type AND scope = new.scope AND key = new.key);
    INSERT INTO memory_fts (rowid, text, version, owner)
        SELECT id, new.key || ' ' || coalesce((SELECT group_concat(value, ' ')
            FROM json_tree(new.value) WHERE type IN ('text', 'integer', 'real')), ''),
            new.version,
            't' || hex(new.tenant) || 'x s'
                || hex(new.tenant || char(0) || new.scope_type || char(0) || new.scope) || 'x'
        FROM memory_search_ids WHERE tenant = new.tenant AND scope_type = new.scope_type
        AND scope = new.scope AND key = new.key AND NOT new.deleted;
END;

CREATE TRIGGER memory_fts_purge AFTER DELETE ON memory_versions BEGIN
    DELETE FROM memory_fts WHERE rowid = (
        SELECT id FROM memory_search_ids WHERE tenant = old.tenant
        AND scope_type = old.scope_type AND scope = old.scope AND key = old.key)
        AND version = old.version;
END;

DROP TRIGGER facts_fts_write;
DROP TRIGGER facts_fts_delete;
DROP TABLE facts_fts;

CREATE VIRTUAL TABLE facts_fts USING fts5(
    text, version UNINDEXED, owner, tokenize = 'porter unicode61 remove_diacritics 2'
);

CREATE TRIGGER facts_fts_write AFTER INSERT ON fact_versions BEGIN
    INSERT OR IGNORE INTO fact_search_ids (tenant, fact_id) VALUES (new.tenant, new.fact_id);
    DELETE FROM facts_fts WHERE rowid = (
        SELECT id FROM fact_search_ids WHERE tenant = new.tenant AND fact_id = new.fact_id);
    INSERT INTO facts_fts (rowid, text, version, owner)
        SELECT i.id, new.subject || ' ' || new.predicate || ' ' || new.object || ' '
            || coalesce((SELECT group_concat(value, ' ') FROM json_tree(new.content)
                WHERE type IN ('text', 'integer', 'real')), ''),
            new.version,
            't' || hex(new.tenant) || 'x u' || hex(new.tenant || char(0) || f.user_id) || 'x'
        FROM fact_search_ids i JOIN facts f ON f.tenant = i.tenant AND f.id = i.fact_id
        WHERE i.tenant = new.tenant AND i.fact_id = new.fact_id AND NOT new.deleted;
END;

CREATE TRIGGER facts_fts_delete AFTER DELETE ON facts BEGIN
    DELETE FROM facts_fts WHERE rowid = (
        SELECT id FROM fact_search_ids WHERE tenant = old.tenant AND fact_id = old.id);
    DELETE FROM fact_search_ids WHERE tenant = old.tenant AND fact_id = old.id;
END;

-- What was stored before this migration.
INSERT INTO memory_fts (rowid, text, version, owner)
    SELECT i.id, v.key || ' ' || coalesce((SELECT group_concat(j.value, ' ')
        FROM json_tree(v.value) j WHERE j.type IN ('text', 'integer', 'real')), ''), v.version,
        't' || hex(h.tenant) || 'x s'
            || hex(h.tenant || char(0) || h.scope_type || char(0) || h.scope) || 'x'
    FROM memory_heads h
    JOIN memory_versions v ON v.tenant = h.tenant AND v.scope_type = h.scope_type
        AND v.scope = h.scope AND v.key = h.key AND v.version = h.version
    JOIN memory_search_ids i ON i.tenant = h.tenant AND i.scope_type = h.scope_type
        AND i.scope = h.scope AND i.key = h.key
    WHERE NOT h.deleted;
INSERT INTO facts_fts (rowid, text, version, owner)
    SELECT i.id, v.subject || ' ' || v.predicate || ' ' || v.object || ' '
        || coalesce((SELECT group_concat(j.value, ' ') FROM json_tree(v.content) j
            WHERE j.type IN ('text', 'integer', 'real')), ''), v.version,
        't' || hex(f.tenant) || 'x u' || hex(f.tenant || char(0) || f.user_id) || 'x'
    FROM facts f
    JOIN fact_versions v ON v.tenant = f.tenant AND v.fact_id = f.id AND v.version = f.version
    JOIN fact_search_ids i ON i.tenant = f.tenant AND i.fact_id = f.id
    WHERE NOT f.deleted;
