-- Working memory: per session, a goal, a todo list and a content cache.
-- Everything hangs off the session row (ON DELETE CASCADE), so deleting a
-- session deletes its working memory in the same statement; EndSession
-- deletes these rows explicitly.
CREATE TABLE working_memory (
    tenant      text COLLATE "C" NOT NULL,
    session_id  text COLLATE "C" NOT NULL,
    goal        text NOT NULL DEFAULT '',
    next_task   bigint NOT NULL DEFAULT 0,     -- the number of the last task id handed out
    update_time timestamptz NOT NULL,
    PRIMARY KEY (tenant, session_id),
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);

CREATE TABLE working_tasks (
    tenant      text COLLATE "C" NOT NULL,
    session_id  text COLLATE "C" NOT NULL,
    number      bigint NOT NULL,               -- the id is 't' || number
    subject     text NOT NULL,
    description text NOT NULL,
    status      smallint NOT NULL,             -- 1 pending, 2 in progress, 3 completed, 4 blocked
    create_time timestamptz NOT NULL,
    update_time timestamptz NOT NULL,
    PRIMARY KEY (tenant, session_id, number),
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);

CREATE TABLE working_cache (
    tenant      text COLLATE "C" NOT NULL,
    session_id  text COLLATE "C" NOT NULL,
    path        text COLLATE "C" NOT NULL,
    content     text NOT NULL,
    bytes       bigint NOT NULL,
    update_time timestamptz NOT NULL,
    PRIMARY KEY (tenant, session_id, path),
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);
