-- An item too wordy for one search vector is stored, and found by its
-- leading text.
--
-- A `tsvector` holds at most 1 MB of distinct words (Postgres's
-- `MAXSTRPOS`: "string is too long for tsvector"). A value, an episode
-- or a fact whose distinct words passed that failed its write as an
-- internal error: a base64 blob of 1 MB (its `/` and `+` cut it into
-- words), a long log of ids, a few thousand numbers with large exponents
-- (which jsonb prints in full). Each vector function now builds the
-- vector as before and, when Postgres refuses it as too long, builds it
-- from the item's leading text instead: its strings and numbers in
-- jsonb's order, joined by line breaks, to 65,536 characters (at most
-- 256 KB, which no reading of it takes past the limit), after the key's
-- or the fact's words as before. Such an item is found by its key and by
-- the words of that leading text. The server builds no vector past the
-- limit either (src/search/vector.rs, `send`), so those writes come here.
--
-- No stored vector changes: every item stored so far had one that fit.
-- The functions become PL/pgSQL for the exception block; the block costs
-- nothing measurable here (5,000 vectors of 1 KB, 0.51 s either way).

CREATE FUNCTION engram_leading_text(value jsonb) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT left(string_agg(v #>> '{}', E'\n'), 65536)
        FROM jsonb_path_query(value, 'strict $.**') AS v
        WHERE jsonb_typeof(v) IN ('string', 'number') $$;

CREATE OR REPLACE FUNCTION engram_memory_vector(key text, value jsonb) RETURNS tsvector
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $$
BEGIN
    RETURN setweight(to_tsvector('engram_english'::regconfig, engram_search_text(key)), 'A')
        || CASE WHEN value IS NULL THEN ''::tsvector ELSE jsonb_to_tsvector(
            'engram_english'::regconfig, engram_search_text(value::text)::jsonb,
            '["string", "numeric"]') END;
EXCEPTION WHEN program_limit_exceeded THEN
    RETURN setweight(to_tsvector('engram_english'::regconfig, engram_search_text(key)), 'A')
        || to_tsvector('engram_english'::regconfig,
            coalesce(engram_search_text(engram_leading_text(value)), ''));
END
$$;

CREATE OR REPLACE FUNCTION engram_fact_vector(subject text, predicate text, object text,
    content jsonb) RETURNS tsvector
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $$
BEGIN
    RETURN setweight(to_tsvector('engram_english'::regconfig,
            engram_search_text(subject || ' ' || predicate || ' ' || object)), 'A')
        || jsonb_to_tsvector('engram_english'::regconfig, engram_search_text(content::text)::jsonb,
            '["string", "numeric"]');
EXCEPTION WHEN program_limit_exceeded THEN
    RETURN setweight(to_tsvector('engram_english'::regconfig,
            engram_search_text(subject || ' ' || predicate || ' ' || object)), 'A')
        || to_tsvector('engram_english'::regconfig,
            coalesce(engram_search_text(engram_leading_text(content)), ''));
END
$$;

CREATE OR REPLACE FUNCTION engram_episode_vector(content jsonb, metadata jsonb)
    RETURNS tsvector
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $$
BEGIN
    RETURN jsonb_to_tsvector('engram_english'::regconfig,
            engram_search_text(content::text)::jsonb, '["string", "numeric"]')
        || jsonb_to_tsvector('engram_english'::regconfig,
            engram_search_text(metadata::text)::jsonb, '["string", "numeric"]');
EXCEPTION WHEN program_limit_exceeded THEN
    RETURN to_tsvector('engram_english'::regconfig, coalesce(engram_search_text(left(
        concat_ws(E'\n', engram_leading_text(content), engram_leading_text(metadata)),
        65536)), ''));
END
$$;
