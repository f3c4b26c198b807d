-- Text read composed (Unicode's NFC), as Postgres reads it since its
-- 0032. The same text reaches a store in either of Unicode's forms: a
-- Korean syllable as one character (`한`) or as the jamo it is made of,
-- as macOS writes file names; `が` as one kana or as `か` and a combining
-- voiced mark; `é` as one letter or as `e` and an accent. `reading 9`
-- read the jamo as a word's letters and the voiced mark as part of its
-- word, so the decomposed text found nothing a query in the composed
-- form asked for, and the other way round. And the Arabic script's digits
-- (`٠`–`٩`, and `۰`–`۹` as Persian and Urdu write them) are read as ASCII
-- digits, as Postgres reads them since its 0032: `٣٤` finds `34`. The FTS
-- tables are made again with `reading 10` (src/store/sqlite/fts.rs),
-- which reads the text so before it tokenizes it (src/search/spelling.rs,
-- `normalized`), and refilled from the items they index, as 0014 to 0022
-- did.
--
-- As after 0015, a server of an earlier release cannot open these tables:
-- roll back by restoring the database. Refilling reads every live item's
-- text once, as 0018's to 0022's did.

DROP TABLE memory_fts;
CREATE VIRTUAL TABLE memory_fts USING fts5(
    text, version UNINDEXED, owner, tokenize = 'engram_english remove_diacritics 0 categories ''L* N* Co M*'' reading 10'
);
DROP TABLE facts_fts;
CREATE VIRTUAL TABLE facts_fts USING fts5(
    text, version UNINDEXED, owner, tokenize = 'engram_english remove_diacritics 0 categories ''L* N* Co M*'' reading 10'
);
DROP TABLE episodes_fts;
CREATE VIRTUAL TABLE episodes_fts USING fts5(
    text, owner, tokenize = 'engram_english remove_diacritics 0 categories ''L* N* Co M*'' reading 10'
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
