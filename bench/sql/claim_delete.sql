-- The raw comparator for akter's relay (bench/relay.py): one transaction claims the earliest
-- due row FOR UPDATE SKIP LOCKED and deletes it (BEGIN, SELECT, DELETE, COMMIT: 4 round trips).
-- Tables: relay_claim_schema.sql, filled by relay_claim_fill.sql.
--   pgbench -n -f bench/sql/claim_delete.sql -c 16 -j 2 -T 10 -l
-- If every due row is taken or locked, \aset assigns nothing: the DELETE then matches no row
-- (rk and iid were reset to 0 just before), so an empty queue never aborts a client.
\set rk 0
\set iid 0
BEGIN;
SELECT routing_key AS rk, intent_id AS iid
FROM outbox_q
WHERE kind = 'intent' AND due_at_ms <= (extract(epoch FROM now()) * 1000)::bigint
ORDER BY due_at_ms
LIMIT 1
FOR UPDATE SKIP LOCKED \aset
DELETE FROM outbox_q WHERE routing_key = :rk AND intent_id = ':iid';
COMMIT;
