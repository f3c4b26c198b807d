-- The planner's statistics refreshed as soon as a table has doubled, not
-- when autovacuum next looks (once a minute, by default).
--
-- The server keeps its statements prepared, and Postgres keeps a
-- statement's generic plan until the statistics of a table it reads
-- change. Plans made while a table was new and nearly empty read it
-- whole (any plan is cheap over ten pages), and they stayed while the
-- table grew: on a fresh database, Gets read every key of the tenant
-- through a hash (4,027 Gets/s against 12,329 once analyzed), and appends
-- every episode of the tenant, until autovacuum's first analyze. The
-- server calls this function every second (`--analyze-interval-ms`): it
-- analyzes each of this schema's tables that has at least twice the rows
-- its statistics say (and 1,000 at least), which invalidates the plans
-- made from the old ones. A table past its early growth never doubles
-- between autovacuum's analyzes, so this does nothing there. Tables
-- another process is vacuuming or analyzing are skipped, not waited for.
--
-- ANALYZE needs the tables' owner, and the server may run as an ordinary
-- role: the owner's function, with the owner's search path.

CREATE FUNCTION engram_analyze_grown() RETURNS integer
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
    AS $$
DECLARE
    grown record;
    analyzed integer := 0;
BEGIN
    FOR grown IN
        SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
        WHERE s.schemaname = current_schema()
          AND s.n_live_tup >= 2 * greatest(c.reltuples, 500)
    LOOP
        EXECUTE format('ANALYZE (SKIP_LOCKED) %I', grown.relname);
        analyzed := analyzed + 1;
    END LOOP;
    RETURN analyzed;
END
$$;

COMMENT ON FUNCTION engram_analyze_grown() IS
    'Analyzes the tables that have doubled since their statistics were taken; returns how many.';
