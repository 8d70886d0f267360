-- The raw comparator of bench/scaling.py's "intent" variant, delivery side: claim the earliest
-- due intent (SKIP LOCKED), delete it and run its turn on the target actor, all in one
-- transaction (akter claims, runs the turn and settles in three). If nothing is due, \aset
-- assigns nothing: tid stays 0, which names no actor, and every statement matches no row.
\set rk 0
\set iid 0
\set tid 0
BEGIN;
SELECT routing_key AS rk, intent_id AS iid, target_id::bigint AS tid
FROM outbox_q
WHERE kind = 'intent' AND due_at_ms <= (extract(epoch FROM now()) * 1000)::bigint
ORDER BY due_at_ms
LIMIT 1
FOR UPDATE SKIP LOCKED \aset
DELETE FROM outbox_q WHERE routing_key = :rk AND intent_id = ':iid';
SELECT generation FROM generations WHERE actor_id = :tid FOR UPDATE;
UPDATE actor_state SET state = jsonb_set(state, '{got}', to_jsonb(coalesce((state->>'got')::bigint, 0) + 1)), updated_at = now() WHERE actor_id = :tid;
INSERT INTO receipts (actor_id, generation, result) SELECT :tid, 1, '{"ok": true}' WHERE :tid > 0;
COMMIT;
