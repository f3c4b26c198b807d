-- One owner's facts in id order, for `ListFacts` by app and user and the
-- memory block's newest facts (as Postgres's 0034). SQLite walked the
-- tenant's facts in id order and kept the owner's: 19 ms for an owner
-- with none among 200,000 facts, 0.05 ms through this index.
CREATE INDEX IF NOT EXISTS facts_owner_id ON facts (tenant, app, user_id, id);
