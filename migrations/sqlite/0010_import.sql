-- Lines of imports in progress; see the Postgres migration 0012.
CREATE TABLE import_lines (
    tenant      TEXT NOT NULL,
    import_id   TEXT NOT NULL,
    line        INTEGER NOT NULL,
    body        TEXT NOT NULL,
    create_time INTEGER NOT NULL,
    PRIMARY KEY (tenant, import_id, line)
) WITHOUT ROWID;

CREATE INDEX import_lines_create_time ON import_lines (create_time);
