-- The raw comparator of bench/scaling.py's "intent" variant, caller side: one actor turn
-- (actor_turn.sql) that also stages an intent to the same actor in outbox_q
-- (relay_claim_schema.sql), like akter's insert_outbox. Run beside scaling_deliver.sql:
--   pgbench -n -f bench/sql/scaling_stage.sql@1 -f bench/sql/scaling_deliver.sql@1 -D nactors=10000
\set aid random(1, :nactors)
BEGIN;
SELECT generation FROM generations WHERE actor_id = :aid FOR UPDATE;
UPDATE actor_state SET state = jsonb_set(state, '{n}', to_jsonb((state->>'n')::bigint + 1)), updated_at = now() WHERE actor_id = :aid;
INSERT INTO outbox_q (routing_key, intent_id, bucket, kind, tenant_id, actor_type, actor_id, target_type, target_id, command, payload, caller, due_at_ms, scheduled_at_ms) VALUES (:aid, gen_random_uuid()::text, 0, 'intent', 'default', 'Acct', :aid, 'Acct', :aid, 'got', '{"k":1}', '{"kind":"System","source":"actor"}', (extract(epoch FROM now()) * 1000)::bigint, (extract(epoch FROM now()) * 1000)::bigint);
INSERT INTO receipts (actor_id, generation, result) VALUES (:aid, 1, '{"ok": true}');
COMMIT;
