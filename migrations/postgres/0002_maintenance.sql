-- The execution registry: which flow an execution belongs to, learned from
-- the caller context of in-flow writes. It lets detached writes into a known
-- execution be tagged with its flow, and Reindex backfill older versions.
CREATE TABLE memory_executions (
    tenant       text COLLATE "C" NOT NULL,
    execution_id text COLLATE "C" NOT NULL,
    flow_id      text NOT NULL DEFAULT '',
    flow_name    text NOT NULL DEFAULT '',
    create_time  timestamptz NOT NULL,
    PRIMARY KEY (tenant, execution_id)
);

-- "Every execution scope of this flow" (ListScopes by flow), and the
-- versions Reindex looks at. Partial: only execution-scoped versions.
CREATE INDEX memory_versions_flow_id ON memory_versions (tenant, flow_id, scope)
    WHERE scope_type = 3 AND flow_id <> '';
CREATE INDEX memory_versions_flow_name ON memory_versions (tenant, flow_name, scope)
    WHERE scope_type = 3 AND flow_name <> '';
CREATE INDEX memory_versions_untagged ON memory_versions (tenant, scope)
    WHERE scope_type = 3 AND flow_id = '' AND flow_name = '';
