-- The searchable rows kept whole in their heap pages up to 8,160 bytes.
--
-- A row past 2 KB (the default toast_tuple_target) is compressed and, if
-- still too wide, its widest values move to the table's TOAST relation.
-- A 1 KB episode carries a search vector of about 2 KB of random-ish
-- lexemes that pglz cannot shrink by the quarter it requires, so every
-- such episode paid a failed compression and two TOAST chunks on insert,
-- and every search paid a TOAST index lookup and two chunk reads for each
-- match it checks: over 50,000 episodes of 150 words, the search's match
-- statement took 7.0–10.6 ms with the vectors in TOAST and 2.4–2.8 ms
-- with them inline (pgbench, one client; see README, Search).
--
-- Rows wider than 8,160 bytes are still compressed and moved out as
-- before. The setting applies to rows written from now on: existing ones
-- stay as they are until rewritten. Changing it takes a brief lock that
-- waits for running writes; no table is rewritten.

ALTER TABLE episodes SET (toast_tuple_target = 8160);
ALTER TABLE memory_versions SET (toast_tuple_target = 8160);
ALTER TABLE fact_versions SET (toast_tuple_target = 8160);
