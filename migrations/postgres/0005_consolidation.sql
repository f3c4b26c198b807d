-- Consolidation rules and the facts they promote episodes into.
--
-- A rule's watermark is the cursor of the last episode a run has seen. A
-- run reads the episodes after it (never beyond the settled horizon of the
-- tail, so a late commit is not skipped), applies its deltas and moves the
-- watermark in one transaction, under the rule's row lock and an advisory
-- lock: no episode is promoted twice and none is skipped.
CREATE TABLE consolidation_rules (
    tenant            text COLLATE "C" NOT NULL,
    id                text COLLATE "C" NOT NULL,
    filter            text NOT NULL,
    every_n_episodes  bigint,                  -- one of these two
    cron              text,
    then_emits        jsonb NOT NULL,
    kind              smallint NOT NULL,        -- 1 semantic, 2 procedural
    confidence        double precision NOT NULL,
    enabled           boolean NOT NULL,
    watermark         bigint NOT NULL DEFAULT 0,
    episodes_promoted bigint NOT NULL DEFAULT 0,
    create_time       timestamptz NOT NULL,
    last_run_time     timestamptz,
    PRIMARY KEY (tenant, id),
    CHECK ((every_n_episodes IS NULL) <> (cron IS NULL))
);

-- A fact's head: its owner, key and newest version.
CREATE TABLE facts (
    tenant      text COLLATE "C" NOT NULL,
    id          text COLLATE "C" NOT NULL,
    app         text COLLATE "C" NOT NULL,
    user_id     text COLLATE "C" NOT NULL,     -- '' for app-wide facts
    kind        smallint NOT NULL,
    subject     text COLLATE "C" NOT NULL,
    predicate   text COLLATE "C" NOT NULL,
    version     bigint NOT NULL,
    deleted     boolean NOT NULL,
    create_time timestamptz NOT NULL,
    update_time timestamptz NOT NULL,
    PRIMARY KEY (tenant, id)
);

CREATE INDEX facts_owner ON facts (tenant, app, user_id, kind, id);
CREATE INDEX facts_key ON facts (tenant, app, user_id, subject, predicate)
    WHERE NOT deleted AND subject <> '' AND predicate <> '';

CREATE TABLE fact_versions (
    tenant             text COLLATE "C" NOT NULL,
    fact_id            text COLLATE "C" NOT NULL,
    version            bigint NOT NULL,
    deleted            boolean NOT NULL,
    subject            text NOT NULL,
    predicate          text NOT NULL,
    object             text NOT NULL,
    content            jsonb NOT NULL,
    confidence         double precision NOT NULL,
    source             text NOT NULL,          -- 'remember' or the rule id
    source_episode_ids jsonb NOT NULL,
    channels           jsonb NOT NULL,
    create_time        timestamptz NOT NULL,
    PRIMARY KEY (tenant, fact_id, version),
    FOREIGN KEY (tenant, fact_id) REFERENCES facts (tenant, id) ON DELETE CASCADE
);

-- Which episodes a fact came from, so a delta may name what it replaces by
-- the episode that stated it.
CREATE TABLE fact_sources (
    tenant     text COLLATE "C" NOT NULL,
    episode_id text COLLATE "C" NOT NULL,
    fact_id    text COLLATE "C" NOT NULL,
    PRIMARY KEY (tenant, episode_id, fact_id),
    FOREIGN KEY (tenant, fact_id) REFERENCES facts (tenant, id) ON DELETE CASCADE
);
