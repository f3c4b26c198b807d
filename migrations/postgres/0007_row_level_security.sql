-- Row-level security: a second wall behind the tenant filter every query
-- already has. Each transaction of the server sets `engram.tenant` (SET
-- LOCAL) and sees only that tenant's rows; `*` is the server's own
-- cross-tenant work (the scheduler's rule list, pruning, the horizon). A
-- session that sets nothing sees nothing.
--
-- FORCE applies the policies to the tables' owner too. Superusers and
-- roles with BYPASSRLS are never subject to row-level security: run the
-- server as an ordinary role (see the README), ideally not the owner.

CREATE FUNCTION engram_tenant_visible(row_tenant text) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT row_tenant = current_setting('engram.tenant', true)
              OR current_setting('engram.tenant', true) = '*' $$;

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY[
        'memory_heads', 'memory_versions', 'memory_request_ids', 'memory_executions',
        'memory_changes', 'sessions', 'session_evictions', 'episodes',
        'consolidation_rules', 'facts', 'fact_versions', 'fact_sources',
        'working_memory', 'working_tasks', 'working_cache'
    ] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format(
            'CREATE POLICY tenant_isolation ON %I USING (engram_tenant_visible(tenant)) '
            'WITH CHECK (engram_tenant_visible(tenant))', t);
    END LOOP;
END
$$;
