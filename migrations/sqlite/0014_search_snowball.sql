-- Words are stemmed as Postgres stems them: the FTS tables are made again
-- with the server's `engram_english` tokenizer (src/store/sqlite/fts.rs:
-- `unicode61` with Snowball's English stemmer) in place of FTS5's
-- `porter`, whose Porter algorithm stems `deploy` to `deploi` and
-- `deployment` to `deploy`, so that a search for "deployment" missed
-- "we deploy" here while Postgres found it. Each table is refilled from
-- the items it indexes, as 0011 and 0012 filled them; the triggers of
-- those migrations keep writing to the tables by name.
--
-- The tokenizer is the server's: outside it (the `sqlite3` shell) the
-- other tables read as before, but these do not open, and a write that
-- reaches them through a trigger (an append, a set, a fact) fails with
-- "no such tokenizer". Refilling reads every live item's text once:
-- about 1.7 s per 100,000 episodes of 30 words here.

DROP TABLE memory_fts;
CREATE VIRTUAL TABLE memory_fts USING fts5(
    text, version UNINDEXED, owner, tokenize = 'engram_english remove_diacritics 2'
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
    text, version UNINDEXED, owner, tokenize = 'engram_english remove_diacritics 2'
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
    text, owner, tokenize = 'engram_english remove_diacritics 2'
);
INSERT INTO episodes_fts (rowid, text, owner)
    SELECT cursor, coalesce((SELECT group_concat(value, ' ') FROM json_tree(content)
            WHERE type IN ('text', 'integer', 'real')), '')
        || ' ' || coalesce((SELECT group_concat(value, ' ') FROM json_tree(metadata)
            WHERE type IN ('text', 'integer', 'real')), ''),
        't' || hex(tenant) || 'x u' || hex(tenant || char(0) || user_id) || 'x'
    FROM episodes;
