-- Arabic words read as their writers mean them: letters spelt more than
-- one way read alike, and the article left off.
--
-- Writers spell some letters one way or another: an alef with or without
-- its hamza or madda (`أحمد`, `احمد`), a final teh marbuta as a heh
-- (`مدرسة`, `مدرسه`), an alef maksura as a yeh (`على`, `علي`), and the
-- Persian and Urdu keyboards give their own yeh, kaf and heh for the
-- Arabic ones (`کتاب`, `كتاب`). And Arabic writes its article, and a
-- conjunction or preposition before it, as part of the next word: "the
-- school" is `المدرسة`, "in the school" `بالمدرسة`. Postgres's parser and
-- `unaccent` leave all of it as written, so one spelling did not find the
-- other, and `مدرسة` found no school with its article.
--
-- `engram_search_text` now reads the text as src/search/spelling.rs's
-- `read` does, after leaving the vowel points out as 0030 does, through
-- `engram_arabic_text`: each letter of `VARIANTS` as the one it stands
-- for, a madda or hamza written as a mark right after a bare alef or heh
-- (a decomposed `أ` or `ۀ`) left out, then each of `PREFIXES` (`ال`,
-- `وال`, `بال`, `كال`, `فال`, `لل`) left off where it starts a run of Arabic
-- letters and two more follow it. Text without an Arabic letter skips all
-- of it. Tests hold the functions to the Rust reading. SQLite reads text
-- so since its 0022, and the server reads Arabic words itself where the
-- database reads them so (src/search/english.rs, `Reading::Arabic`).
--
-- As 0029 and 0030 did, the live items whose text holds an Arabic letter
-- get their vectors again; no other text reads differently, and a server
-- of the previous release builds no vector for text in the Arabic script
-- itself, so it writes vectors this one reads alike.
-- Memory, fact and episode writes wait meanwhile (reads go on).

LOCK TABLE memory_versions, fact_versions, episodes IN SHARE ROW EXCLUSIVE MODE;

CREATE FUNCTION engram_arabic_text(t text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT CASE WHEN t !~ '[\u0620-\u064a\u066e-\u066f\u0671-\u06d3\u06d5\u06ee-\u06ef\u06fa-\u06fc\u06ff\u0750-\u077f\u08a0-\u08c8]' THEN t ELSE regexp_replace(regexp_replace(translate(t, E'\u0622\u0623\u0625\u0629\u0649\u0671\u06a9\u06c0\u06c1\u06c2\u06c3\u06cc', E'\u0627\u0627\u0627\u0647\u064a\u0627\u0643\u0647\u0647\u0647\u0647\u064a'), '([\u0627\u0647])[\u0653-\u0655]+', '\1', 'g'), '(?<![\u0620-\u064a\u066e-\u066f\u0671-\u06d3\u06d5\u06ee-\u06ef\u06fa-\u06fc\u06ff\u0750-\u077f\u08a0-\u08c8])(?:(?:\u0648\u0627\u0644|\u0628\u0627\u0644|\u0643\u0627\u0644|\u0641\u0627\u0644|\u0627\u0644|\u0644\u0644)(?=[\u0620-\u064a\u066e-\u066f\u0671-\u06d3\u06d5\u06ee-\u06ef\u06fa-\u06fc\u06ff\u0750-\u077f\u08a0-\u08c8]{2}))+', '', 'g') END $$;

CREATE OR REPLACE FUNCTION engram_search_text(t text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT regexp_replace(regexp_replace(regexp_replace(regexp_replace(
        engram_arabic_text(regexp_replace(t, '[\u0591-\u05bd\u05bf\u05c1-\u05c2\u05c4-\u05c5\u05c7\u0610-\u061a\u0640\u064b-\u0652\u0656-\u065f\u0670\u06d6-\u06dc\u06df-\u06e4\u06e7-\u06e8\u06ea-\u06ed]', '', 'g')),
        '(?<!<)/(?!>)', ' ', 'g'),
        '([A-Za-z0-9])[.@](?=[A-Za-z])|([A-Za-z])[.@](?=[0-9])|([A-Za-z0-9])-(?=[0-9])',
        '\1\2\3 ', 'g'),
        '([\u1100-\u11ff\u3005-\u3007\u3040-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f])', ' \1 ', 'g'),
        '([\u0e01-\u0e30\u0e32-\u0e33\u0e40-\u0e46\u0e50-\u0e59\u0e81-\u0e82\u0e84\u0e86-\u0e8a\u0e8c-\u0ea3\u0ea5\u0ea7-\u0eb0\u0eb2-\u0eb3\u0ebd\u0ec0-\u0ec4\u0ec6\u0ed0-\u0ed9\u0edc-\u0edf\u1000-\u102a\u103f-\u1049\u1050-\u1055\u105a-\u105d\u1061\u1065-\u1066\u106e-\u1070\u1075-\u1081\u108e\u1090-\u1099\u1780-\u17b3\u17d7\u17dc\u17e0-\u17e9][\u0e31\u0e34-\u0e3a\u0e47-\u0e4e\u0eb1\u0eb4-\u0ebc\u0ec8-\u0ecd\u102b-\u103e\u1056-\u1059\u105e-\u1060\u1062-\u1064\u1067-\u106d\u1071-\u1074\u1082-\u108d\u108f\u109a-\u109d\u17b4-\u17d3\u17dd]*)', ' \1 ', 'g') $$;

UPDATE memory_search s SET search = engram_memory_vector(v.key, v.value)
FROM memory_versions v
WHERE v.tenant = s.tenant AND v.scope_type = s.scope_type AND v.scope = s.scope
  AND v.key = s.key AND v.version = s.version
  AND (v.key || v.value::text) ~ '[\u0620-\u064a\u066e-\u066f\u0671-\u06d3\u06d5\u06ee-\u06ef\u06fa-\u06fc\u06ff\u0750-\u077f\u08a0-\u08c8]';

UPDATE fact_search s
SET search = engram_fact_vector(v.subject, v.predicate, v.object, v.content)
FROM fact_versions v
WHERE v.tenant = s.tenant AND v.fact_id = s.fact_id AND v.version = s.version
  AND (v.subject || ' ' || v.predicate || ' ' || v.object || ' ' || v.content::text)
      ~ '[\u0620-\u064a\u066e-\u066f\u0671-\u06d3\u06d5\u06ee-\u06ef\u06fa-\u06fc\u06ff\u0750-\u077f\u08a0-\u08c8]';

UPDATE episodes SET search = engram_episode_vector(content, metadata)
WHERE content::text ~ '[\u0620-\u064a\u066e-\u066f\u0671-\u06d3\u06d5\u06ee-\u06ef\u06fa-\u06fc\u06ff\u0750-\u077f\u08a0-\u08c8]'
   OR metadata::text ~ '[\u0620-\u064a\u066e-\u066f\u0671-\u06d3\u06d5\u06ee-\u06ef\u06fa-\u06fc\u06ff\u0750-\u077f\u08a0-\u08c8]';
