-- Lines of imports in progress (DataService.Import). An import stages
-- each checked line here in short transactions while the client streams,
-- then applies them all in one transaction and deletes them in it; so no
-- transaction that takes revisions or cursors stays open while a client
-- sends, and the feeds' settled horizons never wait for one. Lines of an
-- import that never finished (a dropped stream, a killed server) are
-- deleted by the next import once a day old.
CREATE TABLE import_lines (
    tenant      text COLLATE "C" NOT NULL,
    import_id   text COLLATE "C" NOT NULL,
    line        bigint NOT NULL,
    body        text NOT NULL,
    create_time timestamptz NOT NULL,
    PRIMARY KEY (tenant, import_id, line)
);

CREATE INDEX import_lines_create_time ON import_lines (create_time);

ALTER TABLE import_lines ENABLE ROW LEVEL SECURITY;
ALTER TABLE import_lines FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON import_lines USING (engram_tenant_visible(tenant))
    WITH CHECK (engram_tenant_visible(tenant));
