-- How the server binds the tenant that row-level security (0007) checks;
-- 0007's header describes an earlier framing, and applied migrations are
-- never edited, so the current one is recorded here and on the function.
--
-- Each pooled connection's session is bound to one tenant with
-- `set_config('engram.tenant', $1, false)` (a bound parameter, outside any
-- transaction, so no rollback can undo it) and rebound only when the next
-- caller is another tenant. The server's cross-tenant work (the scheduler's
-- rule list, pruning, the feeds' horizons) runs on connections of its own
-- whose start-up packet sets `engram.tenant` to `*`; they never serve a
-- tenant's call. Migrations run on a connection set to `*` as well, so a
-- data migration sees every tenant's rows. A session that sets nothing
-- sees nothing.

COMMENT ON FUNCTION engram_tenant_visible(text) IS
    'Row-level security: a row is visible when its tenant is the session''s engram.tenant '
    '(bound per pooled connection by set_config), or when engram.tenant is * '
    '(the server''s own cross-tenant connections and migrations).';
