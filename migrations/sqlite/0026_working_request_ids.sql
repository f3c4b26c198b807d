-- The request that created a task or a remembered fact (as Postgres's
-- 0036): a repeat of a CreateTask, Remember or RecordProcedure with the
-- same `request_id` is answered with what the first one made. A task's is
-- unique in its session, a fact's per owner and kind; rows made without
-- one hold NULL and are in neither index.
ALTER TABLE working_tasks ADD COLUMN create_request_id TEXT;
ALTER TABLE facts ADD COLUMN create_request_id TEXT;
ALTER TABLE working_tasks ADD COLUMN create_fingerprint BLOB;
ALTER TABLE facts ADD COLUMN create_fingerprint BLOB;
CREATE UNIQUE INDEX working_tasks_request
    ON working_tasks (tenant, session_id, create_request_id) WHERE create_request_id IS NOT NULL;
CREATE UNIQUE INDEX facts_request
    ON facts (tenant, app, user_id, kind, create_request_id) WHERE create_request_id IS NOT NULL;
