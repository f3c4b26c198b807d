-- Text read composed (Unicode's NFC) before anything else reads it.
--
-- The same text reaches Engram in either of Unicode's forms: a Korean
-- syllable as one character (`한`) or as the jamo it is made of, as
-- macOS writes file names and some converters write text; `が` as one
-- kana or as `か` and a combining voiced mark; `ؤ` as one letter or as a
-- waw and a hamza. Postgres's parser read the jamo as a word of letters
-- of their own and left the voiced mark out, so the decomposed text found
-- nothing a query in the composed form asked for, and the other way
-- round. `engram_search_text` now composes its text first
-- (`engram_composed_text`), as src/search/spelling.rs's `composed` does;
-- the server composes queries as it parses them and builds no vector of
-- a text that is not composed (it leaves those to this function).
--
-- And the Arabic script's digits (Arabic-Indic `٠`–`٩`, and the extended
-- `۰`–`۹` Persian and Urdu write) are read as ASCII digits
-- (`engram_normalized_text`, spelling.rs's `ascii_digits`), as Lucene's
-- decimal digit filter reads them: `٣٤` and `۳۴` find `34`, and `34`
-- finds them. The parser read them as letters, so a page, a price or a
-- date written in them was found by none of the other spellings. The
-- `translate` runs only on text holding one (it costs per character
-- times the digits it maps).
--
-- Postgres's check of a text's form (`IS NFC NORMALIZED`) costs about
-- 60 µs a KB here, more than a regular expression's scan, so only text
-- holding a character that can make it not composed is checked: a mark
-- or jamo that may compose with what stands before it, a character NFC
-- reads as another, any combining mark (spelling.rs's `may_decompose`
-- and `postgres_composing_class`, with the test that holds the class
-- here). All of them stand from U+0300 on (`COMPOSED_BELOW`), and text
-- without a character from there on also skips the expressions for the
-- scripts above it (the points, Arabic, Chinese, Japanese and Korean,
-- Thai, Lao, Khmer and Burmese), whose result it cannot change. The two
-- functions are no longer STRICT (a null reads as null either way), so
-- that Postgres inlines them into their callers instead of calling them
-- as functions of their own. Building a vector (this reading and the
-- parse, through `jsonb_to_tsvector`), the fastest of ten interleaved
-- runs, before → now: 1 KB of English 220 → 180 µs; 2 KB of Arabic 533
-- → 543 µs; 2.3 KB of Chinese and Japanese 665 → 670 µs.
--
-- The live items whose text is not composed or holds such a digit get
-- their vectors again; no other text reads differently, and a server of the previous release
-- builds no vector for text with characters outside the blocks it reads
-- itself, so it writes vectors this one reads alike. Memory, fact and
-- episode writes wait meanwhile (reads go on).

LOCK TABLE memory_versions, fact_versions, episodes IN SHARE ROW EXCLUSIVE MODE;

CREATE FUNCTION engram_composed_text(t text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT CASE WHEN t !~ '[\u0300-\u034e\u0350-\u036f\u0374\u037e\u0387\u0483-\u0487\u0591-\u05bd\u05bf\u05c1-\u05c2\u05c4-\u05c5\u05c7-\u05c9\u0610-\u061a\u064b-\u065f\u0670\u06d6-\u06dc\u06df-\u06e4\u06e7-\u06e8\u06ea-\u06ed\u0711\u0730-\u074a\u07eb-\u07f3\u07fd\u0816-\u0819\u081b-\u0823\u0825-\u0827\u0829-\u082d\u0859-\u085b\u0897-\u089f\u08ca-\u08e1\u08e3-\u08ff\u093c\u094d\u0951-\u0954\u0958-\u095f\u09bc\u09be\u09cd\u09d7\u09dc-\u09dd\u09df\u09fe\u0a33\u0a36\u0a3c\u0a4d\u0a59-\u0a5b\u0a5e\u0abc\u0acd\u0b3c\u0b3e\u0b4d\u0b56-\u0b57\u0b5c-\u0b5d\u0bbe\u0bcd\u0bd7\u0c3c\u0c4d\u0c55-\u0c56\u0cbc\u0cc2\u0ccd\u0cd5-\u0cd6\u0d3b-\u0d3c\u0d3e\u0d4d\u0d57\u0dca\u0dcf\u0ddf\u0e38-\u0e3a\u0e48-\u0e4b\u0eb8-\u0eba\u0ec8-\u0ecb\u0f18-\u0f19\u0f35\u0f37\u0f39\u0f43\u0f4d\u0f52\u0f57\u0f5c\u0f69\u0f71-\u0f76\u0f78\u0f7a-\u0f7d\u0f80-\u0f84\u0f86-\u0f87\u0f93\u0f9d\u0fa2\u0fa7\u0fac\u0fb9\u0fc6\u102e\u1037\u1039-\u103a\u108d\u1161-\u1175\u11a8-\u11c2\u135d-\u135f\u1714-\u1715\u1734\u17d2\u17dd\u18a9\u1939-\u193b\u1a17-\u1a18\u1a60\u1a75-\u1a7c\u1a7f\u1ab0-\u1abd\u1abf-\u1af0\u1b34-\u1b35\u1b44\u1b6b-\u1b73\u1baa-\u1bab\u1be6\u1bf2-\u1bf3\u1c37\u1cd0-\u1cd2\u1cd4-\u1ce0\u1ce2-\u1ce8\u1ced\u1cf4\u1cf8-\u1cf9\u1dc0-\u1dff\u1f71\u1f73\u1f75\u1f77\u1f79\u1f7b\u1f7d\u1fbb\u1fbe\u1fc9\u1fcb\u1fd3\u1fdb\u1fe3\u1feb\u1fee-\u1fef\u1ff9\u1ffb\u1ffd\u2000-\u2001\u20d0-\u20dc\u20e1\u20e5-\u20f0\u2126\u212a-\u212b\u2329-\u232a\u2adc\u2cef-\u2cf1\u2d7f\u2de0-\u2dff\u302a-\u302f\u3099-\u309a\ua66f\ua674-\ua67d\ua69e-\ua69f\ua6f0-\ua6f1\ua806\ua82c\ua8c4\ua8e0-\ua8f1\ua92b-\ua92d\ua953\ua9b3\ua9c0\uaab0\uaab2-\uaab4\uaab7-\uaab8\uaabe-\uaabf\uaac1\uaaf6\uabed\uf900-\ufa0d\ufa10\ufa12\ufa15-\ufa1e\ufa20\ufa22\ufa25-\ufa26\ufa2a-\ufa6d\ufa70-\ufad9\ufb1d-\ufb1f\ufb2a-\ufb36\ufb38-\ufb3c\ufb3e\ufb40-\ufb41\ufb43-\ufb44\ufb46-\ufb4e\ufe20-\ufe2f\U000101fd\U000102e0\U00010376-\U0001037a\U00010a0d\U00010a0f\U00010a38-\U00010a3a\U00010a3f\U00010ae5-\U00010ae6\U00010d24-\U00010d27\U00010d69-\U00010d6d\U00010eab-\U00010eac\U00010ecb-\U00010ecf\U00010ef0-\U00010efb\U00010efd-\U00010eff\U00010f46-\U00010f50\U00010f82-\U00010f85\U00011046\U00011070\U0001107f\U000110b9-\U000110ba\U00011100-\U00011102\U00011127\U00011133-\U00011134\U00011173\U000111c0\U000111ca\U00011235-\U00011236\U000112e9-\U000112ea\U0001133b-\U0001133c\U0001133e\U0001134d\U00011357\U00011366-\U0001136c\U00011370-\U00011374\U000113b8\U000113bb\U000113c2\U000113c5\U000113c7-\U000113c9\U000113ce-\U000113d0\U00011442\U00011446\U0001145e\U000114b0\U000114ba\U000114bd\U000114c2-\U000114c3\U000115af\U000115bf-\U000115c0\U0001163f\U000116b6-\U000116b7\U0001172b\U00011839-\U0001183a\U00011930\U0001193d-\U0001193e\U00011943\U000119e0\U00011a34\U00011a47\U00011a99\U00011c3f\U00011d42\U00011d44-\U00011d45\U00011d97\U00011f41-\U00011f42\U0001611e-\U00016129\U0001612f\U00016af0-\U00016af4\U00016b30-\U00016b36\U00016d67-\U00016d68\U00016ff0-\U00016ff1\U0001bc9e\U0001d127-\U0001d128\U0001d15e-\U0001d169\U0001d16d-\U0001d172\U0001d17b-\U0001d182\U0001d185-\U0001d18b\U0001d1aa-\U0001d1ad\U0001d1bb-\U0001d1c0\U0001d242-\U0001d244\U0001d250-\U0001d252\U0001d25b-\U0001d25c\U0001d25f\U0001d280-\U0001d281\U0001e000-\U0001e006\U0001e008-\U0001e018\U0001e01b-\U0001e021\U0001e023-\U0001e024\U0001e026-\U0001e02a\U0001e08f\U0001e130-\U0001e136\U0001e2ae\U0001e2ec-\U0001e2ef\U0001e4ec-\U0001e4ef\U0001e5ee-\U0001e5ef\U0001e6e3\U0001e6e6\U0001e6ee-\U0001e6ef\U0001e6f5\U0001e8d0-\U0001e8d6\U0001e944-\U0001e94a\U0002f800-\U0002fa1d]' OR t IS NFC NORMALIZED THEN t ELSE normalize(t, NFC) END $$;

CREATE FUNCTION engram_normalized_text(t text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT CASE WHEN t ~ '[\u0660-\u0669\u06f0-\u06f9]' THEN translate(engram_composed_text(t), E'\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669\u06f0\u06f1\u06f2\u06f3\u06f4\u06f5\u06f6\u06f7\u06f8\u06f9', '01234567890123456789') ELSE engram_composed_text(t) END $$;

CREATE OR REPLACE FUNCTION engram_search_text(t text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT CASE WHEN t !~ '[\u0300-\U0010ffff]' THEN
        regexp_replace(regexp_replace(t, '(?<!<)/(?!>)', ' ', 'g'),
        '([A-Za-z0-9])[.@](?=[A-Za-z])|([A-Za-z])[.@](?=[0-9])|([A-Za-z0-9])-(?=[0-9])',
        '\1\2\3 ', 'g')
    ELSE regexp_replace(regexp_replace(regexp_replace(regexp_replace(
            engram_arabic_text(regexp_replace(engram_normalized_text(t), '[\u0591-\u05bd\u05bf\u05c1-\u05c2\u05c4-\u05c5\u05c7\u0610-\u061a\u0640\u064b-\u0652\u0656-\u065f\u0670\u06d6-\u06dc\u06df-\u06e4\u06e7-\u06e8\u06ea-\u06ed]', '', 'g')),
            '(?<!<)/(?!>)', ' ', 'g'),
            '([A-Za-z0-9])[.@](?=[A-Za-z])|([A-Za-z])[.@](?=[0-9])|([A-Za-z0-9])-(?=[0-9])',
            '\1\2\3 ', 'g'),
            '([\u1100-\u11ff\u3005-\u3007\u3040-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f])', ' \1 ', 'g'),
            '([\u0e01-\u0e30\u0e32-\u0e33\u0e40-\u0e46\u0e50-\u0e59\u0e81-\u0e82\u0e84\u0e86-\u0e8a\u0e8c-\u0ea3\u0ea5\u0ea7-\u0eb0\u0eb2-\u0eb3\u0ebd\u0ec0-\u0ec4\u0ec6\u0ed0-\u0ed9\u0edc-\u0edf\u1000-\u102a\u103f-\u1049\u1050-\u1055\u105a-\u105d\u1061\u1065-\u1066\u106e-\u1070\u1075-\u1081\u108e\u1090-\u1099\u1780-\u17b3\u17d7\u17dc\u17e0-\u17e9][\u0e31\u0e34-\u0e3a\u0e47-\u0e4e\u0eb1\u0eb4-\u0ebc\u0ec8-\u0ecd\u102b-\u103e\u1056-\u1059\u105e-\u1060\u1062-\u1064\u1067-\u106d\u1071-\u1074\u1082-\u108d\u108f\u109a-\u109d\u17b4-\u17d3\u17dd]*)', ' \1 ', 'g') END $$;

UPDATE memory_search s SET search = engram_memory_vector(v.key, v.value)
FROM memory_versions v
WHERE v.tenant = s.tenant AND v.scope_type = s.scope_type AND v.scope = s.scope
  AND v.key = s.key AND v.version = s.version
  AND (v.key || v.value::text) ~ '[\u0300-\U0010ffff]'
  AND ((v.key || v.value::text) IS NOT NFC NORMALIZED OR (v.key || v.value::text) ~ '[\u0660-\u0669\u06f0-\u06f9]');

UPDATE fact_search s
SET search = engram_fact_vector(v.subject, v.predicate, v.object, v.content)
FROM fact_versions v
WHERE v.tenant = s.tenant AND v.fact_id = s.fact_id AND v.version = s.version
  AND (v.subject || ' ' || v.predicate || ' ' || v.object || ' ' || v.content::text)
      ~ '[\u0300-\U0010ffff]'
  AND ((v.subject || ' ' || v.predicate || ' ' || v.object || ' ' || v.content::text)
      IS NOT NFC NORMALIZED
    OR (v.subject || ' ' || v.predicate || ' ' || v.object || ' ' || v.content::text)
      ~ '[\u0660-\u0669\u06f0-\u06f9]');

UPDATE episodes SET search = engram_episode_vector(content, metadata)
WHERE (content::text ~ '[\u0300-\U0010ffff]'
       AND (content::text IS NOT NFC NORMALIZED OR content::text ~ '[\u0660-\u0669\u06f0-\u06f9]'))
   OR (metadata::text ~ '[\u0300-\U0010ffff]'
       AND (metadata::text IS NOT NFC NORMALIZED OR metadata::text ~ '[\u0660-\u0669\u06f0-\u06f9]'));
