-- The request that created a consolidation rule, as 0035 and 0036 keep a
-- session's, a task's and a fact's: CreateRule takes a `request_id`, and a
-- repeat (a retry after a reply that was lost) is answered with the rule
-- the first one made instead of RULE_EXISTS. A request id is unique in its
-- tenant; rules made without one hold NULL and are not in the index.
--
-- Adding nullable columns rewrites no row; the index build reads the
-- rules (a few per tenant) while their writes wait.
ALTER TABLE consolidation_rules ADD COLUMN IF NOT EXISTS create_request_id text COLLATE "C";
-- What that request asked for (SHA-256 of the rule's definition), so that
-- the id reused for another rule is told from a repeat.
ALTER TABLE consolidation_rules ADD COLUMN IF NOT EXISTS create_fingerprint bytea;
CREATE UNIQUE INDEX IF NOT EXISTS consolidation_rules_request
    ON consolidation_rules (tenant, create_request_id) WHERE create_request_id IS NOT NULL;
