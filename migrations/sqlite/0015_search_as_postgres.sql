-- Text read as Postgres reads it, where the two still differed: the FTS
-- tables are made again with `engram_english`'s `reading 2`
-- (src/store/sqlite/fts.rs), which leaves out what Postgres's parser
-- reads as markup (tags such as `<div class="x">` and `</p>`, entities
-- such as `&amp;`, the bodies of `script` and `style` elements:
-- src/search/markup.rs; Postgres's migration 0027 makes its reading of
-- closing tags right) and folds the letters Postgres's `unaccent` folds
-- (`ß` as `ss`, `æ` as `ae`, `ł` as `l`, `ﬁ` as `fi`: `folded` in
-- src/search/english.rs). Before, a search for `div` or `nbsp` found every
-- episode holding a web page here and none on Postgres, and `strasse`
-- found `Straße` there only. A table keeps the reading it was made with,
-- as FTS5 needs to remove a row's tokens as it added them, so each table
-- is made again and refilled from the items it indexes, as 0014 did; the
-- triggers of 0011 and 0012 keep writing to the tables by name.
--
-- A server of the previous release cannot open these tables (it does not
-- know `reading`): roll back by restoring the database, not by starting
-- the older binary on it. Refilling reads every live item's text once:
-- about 1.7 s per 100,000 episodes of 30 words here.

DROP TABLE memory_fts;
CREATE VIRTUAL TABLE memory_fts USING fts5(
    text, version UNINDEXED, owner, tokenize = 'engram_english remove_diacritics 2 reading 2'
);
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

DROP TABLE facts_fts;
CREATE VIRTUAL TABLE facts_fts USING fts5(
    text, version UNINDEXED, owner, tokenize = 'engram_english remove_diacritics 2 reading 2'
);
INSERT INTO facts_fts (rowid, text, version, owner)
    SELECT i.id, v.subject || ' ' || v.predicate || ' ' || v.object || ' '
        || coalesce((SELECT group_concat(j.value, ' ') FROM json_tree(v.content) j
            WHERE j.type IN ('text', 'integer', 'real')), ''), v.version,
        't' || hex(f.tenant) || 'x u' || hex(f.tenant || char(0) || f.user_id) || 'x'
    FROM facts f
    JOIN fact_versions v ON v.tenant = f.tenant AND v.fact_id = f.id AND v.version = f.version
    JOIN fact_search_ids i ON i.tenant = f.tenant AND i.fact_id = f.id
    WHERE NOT f.deleted;

DROP TABLE episodes_fts;
CREATE VIRTUAL TABLE episodes_fts USING fts5(
    text, owner, tokenize = 'engram_english remove_diacritics 2 reading 2'
);
INSERT INTO episodes_fts (rowid, text, owner)
    SELECT cursor, coalesce((SELECT group_concat(value, ' ') FROM json_tree(content)
            WHERE type IN ('text', 'integer', 'real')), '')
        || ' ' || coalesce((SELECT group_concat(value, ' ') FROM json_tree(metadata)
            WHERE type IN ('text', 'integer', 'real')), ''),
        't' || hex(tenant) || 'x u' || hex(tenant || char(0) || user_id) || 'x'
    FROM episodes;
