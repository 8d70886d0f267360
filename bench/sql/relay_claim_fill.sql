-- Fills outbox_q (relay_claim_schema.sql) for bench/sql/claim_delete.sql. Parameters (psycopg,
-- filled in by bench/relay.py): %(due)s rows already due (due_at_ms within the last second) and
-- %(sleeping)s rows due in 30 days, which the claim must skip over. Rows look like the intents
-- akter writes: a routing key per tenant (1,000 tenants, so every bucket has rows), a
-- v1.<issued>.<expires>.<uuid> id and a System caller.
INSERT INTO outbox_q
    (routing_key, intent_id, bucket, kind, tenant_id, actor_type, actor_id, target_type,
     target_id, command, payload, payload_version, caller, due_at_ms, scheduled_at_ms)
SELECT k.rk, 'v1.' || c.now_ms || '.' || (c.now_ms + 86400000) || '.' || gen_random_uuid(),
       (k.rk >> 56)::smallint, 'intent', 't' || k.t, 'Sender', 's-' || mod(g, 16),
       'Receiver', 'r-' || lpad(mod(g, 1000)::text, 5, '0'), 'got', '{"n":' || g || '}', 0,
       '{"kind":"System","source":"actor","ref":{"tenant":"t' || k.t
           || '","type":"Sender","id":"s-' || mod(g, 16) || '"},"on_behalf_of":null}',
       d.due, d.due
FROM generate_series(1, %(due)s + %(sleeping)s) AS g
CROSS JOIN (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms) AS c
CROSS JOIN LATERAL (
    SELECT mod(g, 1000) AS t,
           ('x' || substr(md5('tenant-' || mod(g, 1000)), 1, 16))::bit(64)::bigint AS rk
) AS k
CROSS JOIN LATERAL (
    SELECT CASE WHEN g <= %(due)s THEN c.now_ms - 1000 + mod(g, 1000)
                ELSE c.now_ms + 30 * 86400000::bigint + g END AS due
) AS d;
VACUUM ANALYZE outbox_q;
