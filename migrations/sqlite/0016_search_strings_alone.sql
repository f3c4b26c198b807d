-- Each string of an item read alone, as Postgres reads it. Its
-- `jsonb_to_tsvector` parses every string of a JSON value by itself and
-- puts a position between the last word of one and the first of the
-- next; here the strings were joined with spaces and read as one text.
-- So a `<script>` left open at the end of one string (a page cut short)
-- hid every string after it, a tag begun in one string and closed in the
-- next hid the words between, and a phrase ran from one string into the
-- next: all on SQLite only.
--
-- The triggers now join a value's strings with char(30) and the parts of
-- an item (a key and its value; a fact's subject, predicate and object and
-- its content; an episode's content and its metadata, which Postgres
-- reads as separate texts without a position between) with char(31);
-- either, where a string holds it, becomes a space. The FTS tables are
-- made again with `engram_english`'s `reading 3`
-- (src/store/sqlite/fts.rs), which reads markup string by string and
-- stores a gap token after a string that held a word, and refilled from
-- the items they index, as 0014 and 0015 did.
--
-- The same reading folds letters by `unaccent`'s own table, as Postgres
-- does, not by Unicode's decompositions (which read `й` as `и` and `ǣ`
-- as `ae`, where `unaccent` keeps both, and left `ƀ` and small capitals
-- unfolded), on each word as written, with `unicode61`'s own folding off
-- and combining marks kept in their word; and it keeps a decimal, a
-- version or a signed number whole (`3.14`, `10.0.0.1`, `-5`), as
-- Postgres's parser does, where `unicode61` split them (so `14` found
-- `3.14` here only).
--
-- As after 0015, a server of an earlier release cannot open these tables:
-- roll back by restoring the database. Refilling reads every live item's
-- text once (2.3 s per 100,000 episodes of 30 words here).

DROP TRIGGER episodes_fts_write;
DROP TRIGGER memory_fts_write;
DROP TRIGGER facts_fts_write;

DROP TABLE memory_fts;
CREATE VIRTUAL TABLE memory_fts USING fts5(
    text, version UNINDEXED, owner, tokenize = 'engram_english remove_diacritics 0 categories ''L* N* Co M*'' reading 3'
);
DROP TABLE facts_fts;
CREATE VIRTUAL TABLE facts_fts USING fts5(
    text, version UNINDEXED, owner, tokenize = 'engram_english remove_diacritics 0 categories ''L* N* Co M*'' reading 3'
);
DROP TABLE episodes_fts;
CREATE VIRTUAL TABLE episodes_fts USING fts5(
    text, owner, tokenize = 'engram_english remove_diacritics 0 categories ''L* N* Co M*'' reading 3'
);

CREATE TRIGGER episodes_fts_write AFTER INSERT ON episodes BEGIN
    INSERT INTO episodes_fts (rowid, text, owner) VALUES (new.cursor,
        coalesce((SELECT group_concat(replace(replace(value, char(30), ' '), char(31), ' '),
            char(30)) FROM json_tree(new.content) WHERE type IN ('text', 'integer', 'real')), '')
        || char(31)
        || coalesce((SELECT group_concat(replace(replace(value, char(30), ' '), char(31), ' '),
            char(30)) FROM json_tree(new.metadata) WHERE type IN ('text', 'integer', 'real')), ''),
        't' || hex(new.tenant) || 'x u' || hex(new.tenant || char(0) || new.user_id) || 'x');
END;

CREATE TRIGGER memory_fts_write AFTER INSERT ON memory_versions BEGIN
    INSERT OR IGNORE INTO memory_search_ids (tenant, scope_type, scope, key)
        VALUES (new.tenant, new.scope_type, new.scope, new.key);
    DELETE FROM memory_fts WHERE rowid = (
        SELECT id FROM memory_search_ids WHERE tenant = new.tenant
        AND scope_type = new.scope_type AND scope = new.scope AND key = new.key);
    INSERT INTO memory_fts (rowid, text, version, owner)
        SELECT id, replace(replace(new.key, char(30), ' '), char(31), ' ') || char(31)
            || coalesce((SELECT group_concat(replace(replace(value, char(30), ' '), char(31), ' '),
                char(30)) FROM json_tree(new.value) WHERE type IN ('text', 'integer', 'real')), ''),
            new.version,
            't' || hex(new.tenant) || 'x s'
                || hex(new.tenant || char(0) || new.scope_type || char(0) || new.scope) || 'x'
        FROM memory_search_ids WHERE tenant = new.tenant AND scope_type = new.scope_type
        AND scope = new.scope AND key = new.key AND NOT new.deleted;
END;

CREATE TRIGGER facts_fts_write AFTER INSERT ON fact_versions BEGIN
    INSERT OR IGNORE INTO fact_search_ids (tenant, fact_id) VALUES (new.tenant, new.fact_id);
    DELETE FROM facts_fts WHERE rowid = (
        SELECT id FROM fact_search_ids WHERE tenant = new.tenant AND fact_id = new.fact_id);
    INSERT INTO facts_fts (rowid, text, version, owner)
        SELECT i.id, replace(replace(new.subject || ' ' || new.predicate || ' ' || new.object,
                char(30), ' '), char(31), ' ') || char(31)
            || coalesce((SELECT group_concat(replace(replace(value, char(30), ' '), char(31), ' '),
                char(30)) FROM json_tree(new.content) WHERE type IN ('text', 'integer', 'real')), ''),
            new.version,
            't' || hex(new.tenant) || 'x u' || hex(new.tenant || char(0) || f.user_id) || 'x'
        FROM fact_search_ids i JOIN facts f ON f.tenant = i.tenant AND f.id = i.fact_id
        WHERE i.tenant = new.tenant AND i.fact_id = new.fact_id AND NOT new.deleted;
END;

-- What was stored before this migration.
INSERT INTO memory_fts (rowid, text, version, owner)
    SELECT i.id, replace(replace(v.key, char(30), ' '), char(31), ' ') || char(31)
        || coalesce((SELECT group_concat(replace(replace(j.value, char(30), ' '), char(31), ' '),
            char(30)) FROM json_tree(v.value) j WHERE j.type IN ('text', 'integer', 'real')), ''),
        v.version,
        't' || hex(h.tenant) || 'x s'
            || hex(h.tenant || char(0) || h.scope_type || char(0) || h.scope) || 'x'
    FROM memory_heads h
    JOIN memory_versions v ON v.tenant = h.tenant AND v.scope_type = h.scope_type
        AND v.scope = h.scope AND v.key = h.key AND v.version = h.version
    JOIN memory_search_ids i ON i.tenant = h.tenant AND i.scope_type = h.scope_type
        AND i.scope = h.scope AND i.key = h.key
    WHERE NOT h.deleted;
INSERT INTO facts_fts (rowid, text, version, owner)
    SELECT i.id, replace(replace(v.subject || ' ' || v.predicate || ' ' || v.object,
            char(30), ' '), char(31), ' ') || char(31)
        || coalesce((SELECT group_concat(replace(replace(j.value, char(30), ' '), char(31), ' '),
            char(30)) FROM json_tree(v.content) j WHERE j.type IN ('text', 'integer', 'real')), ''),
        v.version,
        't' || hex(f.tenant) || 'x u' || hex(f.tenant || char(0) || f.user_id) || 'x'
    FROM facts f
    JOIN fact_versions v ON v.tenant = f.tenant AND v.fact_id = f.id AND v.version = f.version
    JOIN fact_search_ids i ON i.tenant = f.tenant AND i.fact_id = f.id
    WHERE NOT f.deleted;
INSERT INTO episodes_fts (rowid, text, owner)
    SELECT cursor,
        coalesce((SELECT group_concat(replace(replace(value, char(30), ' '), char(31), ' '),
            char(30)) FROM json_tree(content) WHERE type IN ('text', 'integer', 'real')), '')
        || char(31)
        || coalesce((SELECT group_concat(replace(replace(value, char(30), ' '), char(31), ' '),
            char(30)) FROM json_tree(metadata) WHERE type IN ('text', 'integer', 'real')), ''),
        't' || hex(tenant) || 'x u' || hex(tenant || char(0) || user_id) || 'x'
    FROM episodes;
