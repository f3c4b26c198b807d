-- Compounds found by their parts. Postgres's parser keeps a file name
-- (`validate.ts`, `README.md`), a host (`example.com`) and an email
-- (`ops@example.com`) whole as one word, so a search for `validate`,
-- `readme` or `example` missed them, while SQLite's tokenizer splits them
-- and found them. Both stores now read a `.` or `@` between letters and
-- digits, with a letter on at least one side, as a space, as they already
-- read `/`; a number's point stays (`3.14`, `v1.2`). So is a `-` between a
-- letter or digit and a digit, which the parser read as a minus sign
-- (`covid-19` as `covid` and `-19`, so `19` missed it). The server reads its
-- text and queries the same way (src/search/english.rs, `spaced`), and a
-- test holds the two to agreeing.
--
-- Letters with diacritics are read without them too (`café` as `cafe`,
-- `naïve` as `naive`), as SQLite's tokenizer reads them
-- (`remove_diacritics 2`): the vectors and queries use `engram_english`,
-- Postgres's `english` configuration with the `unaccent` dictionary (a
-- trusted extension shipped with Postgres, as btree_gin is) before the
-- stemmer for the words that hold a non-ASCII letter. Words of ASCII
-- letters and digits are read as `english` reads them, so the vectors the
-- server builds from plain text stay the same.
--
-- Memory and fact vectors were generated columns of their versions,
-- copied to memory_search and fact_search by statement triggers (0016).
-- The triggers now build the vector themselves, from the newest version
-- of each key or fact a statement writes; migration 0021 stops filling
-- the versions' columns, which no one reads (servers of the previous
-- release search memory_search and fact_search too, kept by these
-- triggers).
--
-- The live items whose text holds such a compound or a non-ASCII letter
-- get their vectors again here: memory_search and fact_search rows, and
-- episodes. That reads every episode's text once (19 s for 1.8 million
-- episodes on a 2-core machine) and rewrites only the rows that hold one.
-- Memory, fact and episode writes wait meanwhile (reads go on), so that
-- no write made under the old reading falls after its table's pass and
-- keeps an old vector. Servers of the previous release keep working
-- during a rolling upgrade (the vectors they build from plain text are
-- the same under both readings), but until they are replaced they ask
-- for such a compound whole, which the rows read again no longer hold.

LOCK TABLE memory_versions, fact_versions, episodes IN SHARE ROW EXCLUSIVE MODE;

CREATE EXTENSION IF NOT EXISTS unaccent;

CREATE TEXT SEARCH CONFIGURATION engram_english (COPY = english);
ALTER TEXT SEARCH CONFIGURATION engram_english
    ALTER MAPPING FOR word, hword, hword_part WITH unaccent, english_stem;

CREATE FUNCTION engram_search_text(t text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT regexp_replace(translate(t, '/', ' '),
        '([A-Za-z0-9])[.@](?=[A-Za-z])|([A-Za-z])[.@](?=[0-9])|([A-Za-z0-9])-(?=[0-9])',
        '\1\2\3 ', 'g') $$;

CREATE FUNCTION engram_memory_vector(key text, value jsonb) RETURNS tsvector
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT setweight(to_tsvector('engram_english'::regconfig, engram_search_text(key)), 'A')
        || CASE WHEN value IS NULL THEN ''::tsvector ELSE jsonb_to_tsvector(
            'engram_english'::regconfig, engram_search_text(value::text)::jsonb,
            '["string", "numeric"]') END $$;

CREATE FUNCTION engram_fact_vector(subject text, predicate text, object text, content jsonb)
    RETURNS tsvector
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT setweight(to_tsvector('engram_english'::regconfig,
            engram_search_text(subject || ' ' || predicate || ' ' || object)), 'A')
        || jsonb_to_tsvector('engram_english'::regconfig, engram_search_text(content::text)::jsonb,
            '["string", "numeric"]') $$;

CREATE FUNCTION engram_episode_vector(content jsonb, metadata jsonb) RETURNS tsvector
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT jsonb_to_tsvector('engram_english'::regconfig,
            engram_search_text(content::text)::jsonb, '["string", "numeric"]')
        || jsonb_to_tsvector('engram_english'::regconfig,
            engram_search_text(metadata::text)::jsonb, '["string", "numeric"]') $$;

CREATE OR REPLACE FUNCTION engram_episode_search() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.search := engram_episode_vector(NEW.content, NEW.metadata);
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION engram_memory_search_added() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    WITH newest AS (
        SELECT DISTINCT ON (tenant, scope_type, scope, key)
               tenant, scope_type, scope, key, version, deleted, value
        FROM added ORDER BY tenant, scope_type, scope, key, version DESC
    ), removed AS (
        DELETE FROM memory_search s USING newest n
        WHERE n.deleted AND s.tenant = n.tenant AND s.scope_type = n.scope_type
          AND s.scope = n.scope AND s.key = n.key AND s.version < n.version
    )
    INSERT INTO memory_search AS s (tenant, scope_type, scope, key, version, search)
    SELECT tenant, scope_type, scope, key, version, engram_memory_vector(key, value)
    FROM newest WHERE NOT deleted
    ORDER BY tenant, scope_type, scope, key
    ON CONFLICT (tenant, scope_type, scope, key) DO UPDATE
        SET version = excluded.version, search = excluded.search
        WHERE s.version < excluded.version;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION engram_fact_search_added() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    WITH newest AS (
        SELECT DISTINCT ON (tenant, fact_id)
               tenant, fact_id, version, deleted, subject, predicate, object, content
        FROM added ORDER BY tenant, fact_id, version DESC
    ), removed AS (
        DELETE FROM fact_search s USING newest n
        WHERE n.deleted AND s.tenant = n.tenant AND s.fact_id = n.fact_id
          AND s.version < n.version
    )
    INSERT INTO fact_search AS s (tenant, fact_id, version, search)
    SELECT tenant, fact_id, version, engram_fact_vector(subject, predicate, object, content)
    FROM newest WHERE NOT deleted
    ORDER BY tenant, fact_id
    ON CONFLICT (tenant, fact_id) DO UPDATE
        SET version = excluded.version, search = excluded.search
        WHERE s.version < excluded.version;
    RETURN NULL;
END
$$;

-- The live items holding a compound or a non-ASCII letter, again. The
-- pattern finds every text the reading above may change (and some it
-- leaves, such as `3.14`); a text holds a non-ASCII letter only where it
-- has more bytes than characters.
UPDATE memory_search s SET search = engram_memory_vector(v.key, v.value)
FROM memory_versions v
WHERE v.tenant = s.tenant AND v.scope_type = s.scope_type AND v.scope = s.scope
  AND v.key = s.key AND v.version = s.version
  AND (v.key ~ '[A-Za-z0-9]([.@][A-Za-z0-9]|-[0-9])' OR v.value::text ~ '[A-Za-z0-9]([.@][A-Za-z0-9]|-[0-9])'
       OR octet_length(v.key) <> char_length(v.key)
       OR octet_length(v.value::text) <> char_length(v.value::text));

UPDATE fact_search s
SET search = engram_fact_vector(v.subject, v.predicate, v.object, v.content)
FROM fact_versions v
WHERE v.tenant = s.tenant AND v.fact_id = s.fact_id AND v.version = s.version
  AND ((v.subject || ' ' || v.predicate || ' ' || v.object || ' ' || v.content::text)
       ~ '[A-Za-z0-9]([.@][A-Za-z0-9]|-[0-9])'
       OR octet_length(v.subject || v.predicate || v.object || v.content::text)
          <> char_length(v.subject || v.predicate || v.object || v.content::text));

UPDATE episodes SET search = engram_episode_vector(content, metadata)
WHERE content::text ~ '[A-Za-z0-9]([.@][A-Za-z0-9]|-[0-9])'
   OR metadata::text ~ '[A-Za-z0-9]([.@][A-Za-z0-9]|-[0-9])'
   OR octet_length(content::text) <> char_length(content::text)
   OR octet_length(metadata::text) <> char_length(metadata::text);
