-- Tags read as tags. Since 0020 every `/` of a text became a space before
-- Postgres's parser read it, so `</div>` reached it as `< div>`: not a tag,
-- so the closing tags' names were indexed (`div`, `p`, `span`), and a
-- `<script>` or `<style>` element was never closed, so nothing after it
-- in the same string was indexed at all (`<style>p {}</style> deploy
-- notes` could not be found by `deploy`). The `/` of `</` and `/>` now
-- stays, as it does in the server's own reading (src/search/english.rs,
-- `spaced`), and SQLite's tokenizer leaves out what the parser reads as
-- markup (tags, entities, script and style bodies; migration 0015 there,
-- src/search/markup.rs).
--
-- The live items whose text holds `</` or `/>` get their vectors again;
-- no other text reads differently. That reads every live item's text
-- once (18 s for 1.4 million episodes and 1 s for 10,000 memory keys of
-- 1.8 million versions on a 2-core machine) and rewrites only those rows. Memory, fact and episode
-- writes wait meanwhile (reads go on), as in 0020. A server of the
-- previous release builds vectors only for text without `<`, which both
-- readings read alike.

LOCK TABLE memory_versions, fact_versions, episodes IN SHARE ROW EXCLUSIVE MODE;

CREATE OR REPLACE FUNCTION engram_search_text(t text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT regexp_replace(regexp_replace(t, '(?<!<)/(?!>)', ' ', 'g'),
        '([A-Za-z0-9])[.@](?=[A-Za-z])|([A-Za-z])[.@](?=[0-9])|([A-Za-z0-9])-(?=[0-9])',
        '\1\2\3 ', 'g') $$;

UPDATE memory_search s SET search = engram_memory_vector(v.key, v.value)
FROM memory_versions v
WHERE v.tenant = s.tenant AND v.scope_type = s.scope_type AND v.scope = s.scope
  AND v.key = s.key AND v.version = s.version
  AND (v.key || v.value::text) ~ '</|/>';

UPDATE fact_search s
SET search = engram_fact_vector(v.subject, v.predicate, v.object, v.content)
FROM fact_versions v
WHERE v.tenant = s.tenant AND v.fact_id = s.fact_id AND v.version = s.version
  AND (v.subject || ' ' || v.predicate || ' ' || v.object || ' ' || v.content::text) ~ '</|/>';

UPDATE episodes SET search = engram_episode_vector(content, metadata)
WHERE content::text ~ '</|/>' OR metadata::text ~ '</|/>';
