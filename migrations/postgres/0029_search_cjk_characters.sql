-- Chinese, Japanese and Korean read one character at a time. Postgres's
-- parser reads a run of such characters as one word, so `深色` ("dark")
-- did not find "我喜欢深色模式": only the whole run did. `engram_search_text`
-- now puts a space on each side of every character of those scripts'
-- blocks (src/search/cjk.rs, `BLOCKS`; a test holds the class below to
-- it), so each is a word of its own, at its own position, and a query
-- looks for a run's pairs of neighbouring characters side by side
-- (src/search/query.rs). SQLite reads text so since its 0018.
--
-- The live items whose text holds such a character get their vectors
-- again; no other text reads differently, and the server builds vectors
-- only for text without them (src/search/english.rs, `plain`), so a
-- server of the previous release writes vectors this one reads alike.
-- That reads every live item's text once (3.3 s for the bench's 1 million
-- episodes of 30 words on a 2-core machine, none of them with such a
-- character) and rewrites only the rows that hold one. Memory, fact and
-- episode writes wait meanwhile (reads go on).

LOCK TABLE memory_versions, fact_versions, episodes IN SHARE ROW EXCLUSIVE MODE;

CREATE OR REPLACE FUNCTION engram_search_text(t text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT regexp_replace(regexp_replace(regexp_replace(t, '(?<!<)/(?!>)', ' ', 'g'),
        '([A-Za-z0-9])[.@](?=[A-Za-z])|([A-Za-z])[.@](?=[0-9])|([A-Za-z0-9])-(?=[0-9])',
        '\1\2\3 ', 'g'),
        '([\u1100-\u11ff\u3005-\u3007\u3040-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f])', ' \1 ', 'g') $$;

UPDATE memory_search s SET search = engram_memory_vector(v.key, v.value)
FROM memory_versions v
WHERE v.tenant = s.tenant AND v.scope_type = s.scope_type AND v.scope = s.scope
  AND v.key = s.key AND v.version = s.version
  AND (v.key || v.value::text) ~ '[\u1100-\u11ff\u3005-\u3007\u3040-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f]';

UPDATE fact_search s
SET search = engram_fact_vector(v.subject, v.predicate, v.object, v.content)
FROM fact_versions v
WHERE v.tenant = s.tenant AND v.fact_id = s.fact_id AND v.version = s.version
  AND (v.subject || ' ' || v.predicate || ' ' || v.object || ' ' || v.content::text)
      ~ '[\u1100-\u11ff\u3005-\u3007\u3040-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f]';

UPDATE episodes SET search = engram_episode_vector(content, metadata)
WHERE content::text ~ '[\u1100-\u11ff\u3005-\u3007\u3040-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f]' OR metadata::text ~ '[\u1100-\u11ff\u3005-\u3007\u3040-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f]';
