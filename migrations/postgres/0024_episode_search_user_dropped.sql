-- The index of episodes' words beside the user, replaced by one that holds the
-- tenant too (migration 0023). A migration of its own: the drop takes the
-- table's exclusive lock, for this statement only, holding no other.
DROP INDEX IF EXISTS episodes_search_user;
