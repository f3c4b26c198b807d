-- Working memory; the same shape as the Postgres schema.
CREATE TABLE working_memory (
    tenant      TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    goal        TEXT NOT NULL DEFAULT '',
    next_task   INTEGER NOT NULL DEFAULT 0,     -- the number of the last task id handed out
    update_time INTEGER NOT NULL,
    PRIMARY KEY (tenant, session_id),
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);

CREATE TABLE working_tasks (
    tenant      TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    number      INTEGER NOT NULL,               -- the id is 't' || number
    subject     TEXT NOT NULL,
    description TEXT NOT NULL,
    status      INTEGER NOT NULL,             -- 1 pending, 2 in progress, 3 completed, 4 blocked
    create_time INTEGER NOT NULL,
    update_time INTEGER NOT NULL,
    PRIMARY KEY (tenant, session_id, number),
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);

CREATE TABLE working_cache (
    tenant      TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    path        TEXT NOT NULL,
    content     TEXT NOT NULL,
    bytes       INTEGER NOT NULL,
    update_time INTEGER NOT NULL,
    PRIMARY KEY (tenant, session_id, path),
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);
