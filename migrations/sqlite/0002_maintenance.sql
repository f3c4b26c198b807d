-- The execution registry and the flow-tag indexes; see the Postgres twin.
CREATE TABLE memory_executions (
    tenant       TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    flow_id      TEXT NOT NULL DEFAULT '',
    flow_name    TEXT NOT NULL DEFAULT '',
    create_time  INTEGER NOT NULL,
    PRIMARY KEY (tenant, execution_id)
) WITHOUT ROWID;

CREATE INDEX memory_versions_flow_id ON memory_versions (tenant, flow_id, scope)
    WHERE scope_type = 3 AND flow_id <> '';
CREATE INDEX memory_versions_flow_name ON memory_versions (tenant, flow_name, scope)
    WHERE scope_type = 3 AND flow_name <> '';
CREATE INDEX memory_versions_untagged ON memory_versions (tenant, scope)
    WHERE scope_type = 3 AND flow_id = '' AND flow_name = '';
