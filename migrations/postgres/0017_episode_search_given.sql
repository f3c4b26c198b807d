-- An episode's search vector may be given by the writer. Until now it was
-- a generated column, so Postgres parsed every appended episode's text
-- (about 160 µs for 1 KB on a 2-core machine, the largest part of an
-- append). The server now builds the same vector when the text is plain
-- (src/search/vector.rs) and sends it with the episode; when it sends
-- none (text it leaves to Postgres's parser, an import, a writer of the
-- previous release during a rolling upgrade), the trigger below builds it
-- exactly as the generated column did. A change to an episode's content or
-- metadata builds it again, as the generated column would.
--
-- Dropping the expression keeps every stored vector and rewrites nothing.

ALTER TABLE episodes ALTER COLUMN search DROP EXPRESSION;

CREATE FUNCTION engram_episode_search() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.search := jsonb_to_tsvector(
        'english'::regconfig, translate(NEW.content::text, '/', ' ')::jsonb, '["string", "numeric"]')
    || jsonb_to_tsvector(
        'english'::regconfig, translate(NEW.metadata::text, '/', ' ')::jsonb, '["string", "numeric"]');
    RETURN NEW;
END
$$;

CREATE TRIGGER episodes_search_built BEFORE INSERT ON episodes
    FOR EACH ROW WHEN (NEW.search IS NULL)
    EXECUTE FUNCTION engram_episode_search();

CREATE TRIGGER episodes_search_rebuilt BEFORE UPDATE OF content, metadata ON episodes
    FOR EACH ROW WHEN (NEW.content IS DISTINCT FROM OLD.content
        OR NEW.metadata IS DISTINCT FROM OLD.metadata)
    EXECUTE FUNCTION engram_episode_search();
