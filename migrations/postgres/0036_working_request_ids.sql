-- The request that created a task or a remembered fact, as 0035 keeps a
-- session's: CreateTask, Remember and RecordProcedure take a
-- `request_id`, and a repeat (a retry after a reply that was lost) is
-- answered with the task or fact the first one made instead of adding a
-- second. A task's is unique in its session, a fact's per owner and
-- kind; rows made without one hold NULL and are in neither index. The
-- columns are never updated, so task and fact updates stay HOT.
--
-- Adding the columns changes no row; each index build reads its table
-- once while its writes wait (reads go on). To upgrade without that
-- pause, add the columns and build the indexes first while serving:
--   ALTER TABLE working_tasks ADD COLUMN IF NOT EXISTS create_request_id text COLLATE "C";
--   ALTER TABLE facts ADD COLUMN IF NOT EXISTS create_request_id text COLLATE "C";
--   CREATE UNIQUE INDEX CONCURRENTLY working_tasks_request
--       ON working_tasks (tenant, session_id, create_request_id) WHERE create_request_id IS NOT NULL;
--   CREATE UNIQUE INDEX CONCURRENTLY facts_request
--       ON facts (tenant, app, user_id, kind, create_request_id) WHERE create_request_id IS NOT NULL;
ALTER TABLE working_tasks ADD COLUMN IF NOT EXISTS create_request_id text COLLATE "C";
ALTER TABLE facts ADD COLUMN IF NOT EXISTS create_request_id text COLLATE "C";
-- What that request asked for (SHA-256 of its fields), so that the id
-- reused for another request is told from a repeat.
ALTER TABLE working_tasks ADD COLUMN IF NOT EXISTS create_fingerprint bytea;
ALTER TABLE facts ADD COLUMN IF NOT EXISTS create_fingerprint bytea;
CREATE UNIQUE INDEX IF NOT EXISTS working_tasks_request
    ON working_tasks (tenant, session_id, create_request_id) WHERE create_request_id IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS facts_request
    ON facts (tenant, app, user_id, kind, create_request_id) WHERE create_request_id IS NOT NULL;
