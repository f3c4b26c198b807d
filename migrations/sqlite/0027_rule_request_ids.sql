-- The request that created a consolidation rule (as Postgres's 0037): a
-- repeat of a CreateRule with the same `request_id` is answered with the
-- rule the first one made. A request id is unique in its tenant; rules
-- made without one hold NULL and are not in the index.
ALTER TABLE consolidation_rules ADD COLUMN create_request_id TEXT;
ALTER TABLE consolidation_rules ADD COLUMN create_fingerprint BLOB;
CREATE UNIQUE INDEX consolidation_rules_request
    ON consolidation_rules (tenant, create_request_id) WHERE create_request_id IS NOT NULL;
