-- Semantic search. An item's vector lives on its row (the memory version,
-- the fact version, the episode), so a purge, an eviction or a deleted
-- session takes it along; the worker clears the vectors of versions a
-- newer one replaced. Vectors are computed off the write path: the writing
-- statement queues its items in embedding_outbox (the triggers below), and
-- a worker in every replica claims, embeds and stores them.
--
-- Nothing is queued until a server with an embedder has recorded its model
-- in `embedder`; `engram reembed` queues what was written before that, or
-- under another model.

CREATE TABLE embedder (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    model       text NOT NULL,
    update_time timestamptz NOT NULL
);

ALTER TABLE memory_versions ADD COLUMN embedding bytea, ADD COLUMN embedding_model text;
ALTER TABLE fact_versions ADD COLUMN embedding bytea, ADD COLUMN embedding_model text;
ALTER TABLE episodes ADD COLUMN embedding bytea, ADD COLUMN embedding_model text;

-- One row per item version to embed. source: 1 memory (scope_type, scope,
-- key, version), 2 facts (key = the fact id, version), 3 episodes (scope =
-- the session, version = seq). due_time: NULL is due now; a claim moves it
-- to the end of the claim's lease, a failure to the next attempt.
CREATE TABLE embedding_outbox (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant     text COLLATE "C" NOT NULL,
    source     smallint NOT NULL,
    scope_type smallint NOT NULL DEFAULT 0,
    scope      text COLLATE "C" NOT NULL DEFAULT '',
    key        text COLLATE "C" NOT NULL DEFAULT '',
    version    bigint NOT NULL,
    attempts   bigint NOT NULL DEFAULT 0,
    due_time   timestamptz,
    claim      text
);

ALTER TABLE embedding_outbox ENABLE ROW LEVEL SECURITY;
ALTER TABLE embedding_outbox FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON embedding_outbox USING (engram_tenant_visible(tenant))
    WITH CHECK (engram_tenant_visible(tenant));

-- Statement triggers: a batch append queues its episodes in one INSERT.
CREATE FUNCTION engram_queue_memory() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO embedding_outbox (tenant, source, scope_type, scope, key, version)
    SELECT n.tenant, 1, n.scope_type, n.scope, n.key, n.version FROM added n
    WHERE NOT n.deleted AND substr(n.key, 1, 12) <> '_compaction/'
      AND EXISTS (SELECT 1 FROM embedder);
    RETURN NULL;
END $$;

CREATE FUNCTION engram_queue_facts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO embedding_outbox (tenant, source, key, version)
    SELECT n.tenant, 2, n.fact_id, n.version FROM added n
    WHERE NOT n.deleted AND EXISTS (SELECT 1 FROM embedder);
    RETURN NULL;
END $$;

CREATE FUNCTION engram_queue_episodes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO embedding_outbox (tenant, source, scope, version)
    SELECT n.tenant, 3, n.session_id, n.seq FROM added n
    WHERE EXISTS (SELECT 1 FROM embedder);
    RETURN NULL;
END $$;

CREATE TRIGGER memory_versions_embedding AFTER INSERT ON memory_versions
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION engram_queue_memory();
CREATE TRIGGER fact_versions_embedding AFTER INSERT ON fact_versions
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION engram_queue_facts();
CREATE TRIGGER episodes_embedding AFTER INSERT ON episodes
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION engram_queue_episodes();
