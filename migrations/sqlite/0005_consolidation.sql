-- Consolidation rules and facts; the same shape as the Postgres schema.
-- Runs are serialised by the single writer connection.
CREATE TABLE consolidation_rules (
    tenant            TEXT NOT NULL,
    id                TEXT NOT NULL,
    filter            TEXT NOT NULL,
    every_n_episodes  INTEGER,                  -- one of these two
    cron              TEXT,
    then_emits        TEXT NOT NULL,
    kind              INTEGER NOT NULL,        -- 1 semantic, 2 procedural
    confidence        REAL NOT NULL,
    enabled           INTEGER NOT NULL,
    watermark         INTEGER NOT NULL DEFAULT 0,
    episodes_promoted INTEGER NOT NULL DEFAULT 0,
    create_time       INTEGER NOT NULL,
    last_run_time     INTEGER,
    PRIMARY KEY (tenant, id),
    CHECK ((every_n_episodes IS NULL) <> (cron IS NULL))
);

-- A fact's head: its owner, key and newest version.
CREATE TABLE facts (
    tenant      TEXT NOT NULL,
    id          TEXT NOT NULL,
    app         TEXT NOT NULL,
    user_id     TEXT NOT NULL,     -- '' for app-wide facts
    kind        INTEGER NOT NULL,
    subject     TEXT NOT NULL,
    predicate   TEXT NOT NULL,
    version     INTEGER NOT NULL,
    deleted     INTEGER NOT NULL,
    create_time INTEGER NOT NULL,
    update_time INTEGER NOT NULL,
    PRIMARY KEY (tenant, id)
);

CREATE INDEX facts_owner ON facts (tenant, app, user_id, kind, id);
CREATE INDEX facts_key ON facts (tenant, app, user_id, subject, predicate)
    WHERE deleted = 0 AND subject <> '' AND predicate <> '';

CREATE TABLE fact_versions (
    tenant             TEXT NOT NULL,
    fact_id            TEXT NOT NULL,
    version            INTEGER NOT NULL,
    deleted            INTEGER NOT NULL,
    subject            TEXT NOT NULL,
    predicate          TEXT NOT NULL,
    object             TEXT NOT NULL,
    content            TEXT NOT NULL,
    confidence         REAL NOT NULL,
    source             TEXT NOT NULL,          -- 'remember' or the rule id
    source_episode_ids TEXT NOT NULL,
    channels           TEXT NOT NULL,
    create_time        INTEGER NOT NULL,
    PRIMARY KEY (tenant, fact_id, version),
    FOREIGN KEY (tenant, fact_id) REFERENCES facts (tenant, id) ON DELETE CASCADE
);

-- Which episodes a fact came from, so a delta may name what it replaces by
-- the episode that stated it.
CREATE TABLE fact_sources (
    tenant     TEXT NOT NULL,
    episode_id TEXT NOT NULL,
    fact_id    TEXT NOT NULL,
    PRIMARY KEY (tenant, episode_id, fact_id),
    FOREIGN KEY (tenant, fact_id) REFERENCES facts (tenant, id) ON DELETE CASCADE
);
