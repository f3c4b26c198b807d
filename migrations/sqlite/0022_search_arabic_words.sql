-- Arabic words read as Postgres reads them since its 0031: letters spelt
-- more than one way read alike (an alef with or without its hamza or
-- madda, `أحمد` and `احمد`; a final teh marbuta and a heh; an alef maksura
-- and a yeh; the Persian and Urdu keyboards' yeh, kaf and heh and the
-- Arabic ones, `کتاب` and `كتاب`), and the article, with a conjunction or
-- preposition written before it, left off (`المدرسة`, "the school", is
-- read as `مدرسه`). `reading 8` kept each word as written, so one
-- spelling did not find the other. The FTS tables are made again with
-- `reading 9` (src/store/sqlite/fts.rs), which spells each token as
-- src/search/spelling.rs's `read` does before folding its letters, and
-- refilled from the items they index, as 0014 to 0021 did.
--
-- As after 0015, a server of an earlier release cannot open these tables:
-- roll back by restoring the database. Refilling reads every live item's
-- text once, as 0018's to 0021's did.

DROP TABLE memory_fts;
CREATE VIRTUAL TABLE memory_fts USING fts5(
    text, version UNINDEXED, owner, tokenize = 'engram_english remove_diacritics 0 categories ''L* N* Co M*'' reading 9'
);
DROP TABLE facts_fts;
CREATE VIRTUAL TABLE facts_fts USING fts5(
    text, version UNINDEXED, owner, tokenize = 'engram_english remove_diacritics 0 categories ''L* N* Co M*'' reading 9'
);
DROP TABLE episodes_fts;
CREATE VIRTUAL TABLE episodes_fts USING fts5(
    text, owner, tokenize = 'engram_english remove_diacritics 0 categories ''L* N* Co M*'' reading 9'
);

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
