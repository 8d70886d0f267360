-- Statements of commands staged in the application's own transaction (akter.stage, issue 41).
-- Same block format as queries.sql; loaded into the same catalogue. They run on the
-- application's connection, not the runtime's pool, inside whatever transaction it holds.
-- A staged row is an ordinary intent on the TARGET actor's routing key (its shard on Citus);
-- its source columns name no actor: actor_type akter._kinds.TRANSACTION_SOURCE, actor_id ''.

-- stage_intents --
-- inserts the staged intents in one statement (unnest of parallel arrays); each id is the pinned one or minted here from the statement clock and the deployment's retry window (v1.<now>.<max(due,now)+slack+window>.<uuid4>, plus a suffix: a workflow start's '~<actor digest>'); nothing is inserted unless the deployment row exists at schema version %(min_version)s or later; a row whose id is already on the outbox is left alone (ON CONFLICT DO NOTHING) and reported as not inserted
WITH d AS MATERIALIZED (
    SELECT dp.retry_window_ms AS w, dp.schema_version, {schema}.stmt_ms(0) AS now
    FROM {schema}.deployment dp
),
m AS MATERIALIZED (
    SELECT u.ord, u.rk, u.tenant, u.type, u.id, u.command, u.payload, u.version, u.caller,
           coalesce(u.at, d.now + coalesce(u.delay, 0)) AS due,
           coalesce(u.pinned,
                    'v1.' || d.now || '.'
                    || (greatest(coalesce(u.at, d.now + coalesce(u.delay, 0)), d.now)
                        + CASE WHEN u.at IS NULL THEN u.slack ELSE 0 END
                        + d.w)
                    || '.' || u.uuid) || u.suffix AS intent_id
    FROM unnest(%(rks)s::bigint[], %(tenants)s::text[], %(types)s::text[], %(ids)s::text[],
                %(commands)s::text[], %(payloads)s::text[], %(versions)s::int[],
                %(callers)s::text[], %(pinned)s::text[], %(uuids)s::text[],
                %(suffixes)s::text[], %(delays)s::bigint[], %(ats)s::bigint[],
                %(slacks)s::bigint[])
        WITH ORDINALITY
        AS u(rk, tenant, type, id, command, payload, version, caller, pinned, uuid, suffix,
             delay, at, slack, ord)
    CROSS JOIN d
    WHERE d.schema_version >= %(min_version)s::int
),
ins AS (
    INSERT INTO {schema}.outbox
        (routing_key, intent_id, bucket, kind, tenant_id, actor_type, actor_id, target_type,
         target_id, command, payload, payload_version, caller, due_at_ms, scheduled_at_ms)
    SELECT m.rk, m.intent_id, (m.rk >> 56)::smallint, 'intent', m.tenant, %(source_type)s, '',
           m.type, m.id, m.command, m.payload, m.version, m.caller, m.due, m.due
    FROM m
    ORDER BY m.ord
    ON CONFLICT (routing_key, intent_id) DO NOTHING
    RETURNING routing_key, intent_id
)
SELECT d.w AS window_ms, d.schema_version, d.now,
       coalesce((SELECT array_agg(m.intent_id ORDER BY m.ord) FROM m), '{}') AS intent_ids,
       coalesce((SELECT array_agg(i.intent_id IS NOT NULL ORDER BY m.ord)
                 FROM m LEFT JOIN ins i ON i.routing_key = m.rk AND i.intent_id = m.intent_id),
                '{}') AS inserted
FROM d;

-- stage_probe --
-- what already holds the pinned ids of a staging, read in a fresh snapshot: the deployment's window and clock, and the pending outbox rows and the receipts under those ids on those routing keys (filters on routing_key = ANY and the id = ANY: a superset the caller matches row by row, routed to the keys' shards on Citus)
SELECT d.retry_window_ms AS window_ms, d.schema_version, {schema}.stmt_ms(0) AS now,
       coalesce((
           SELECT jsonb_agg(h)
           FROM (
               SELECT 'row' AS what, o.routing_key AS rk, o.intent_id AS id, o.tenant_id AS tenant,
                      o.target_type AS type, o.target_id AS actor_id, o.command, o.payload,
                      NULL::text AS payload_hash, NULL::text AS caller_key
               FROM {schema}.outbox o
               WHERE o.routing_key = ANY(%(rks)s::bigint[])
                 AND o.intent_id = ANY(%(intent_ids)s::text[])
               UNION ALL
               SELECT 'receipt', r.routing_key, r.command_id, r.tenant_id, r.actor_type,
                      r.actor_id, r.command, NULL, r.payload_hash, r.caller_key
               FROM {schema}.receipts r
               WHERE r.routing_key = ANY(%(rks)s::bigint[])
                 AND r.command_id = ANY(%(command_ids)s::text[])
           ) h
       ), '[]'::jsonb) AS found
FROM {schema}.deployment d;

-- staged_outcome --
-- the outcome of one command id on a known actor: its receipt, whether its intent is still pending (by the id index, on the actor's routing key), and the clock
SELECT {schema}.stmt_ms(%(off)s::bigint) AS now, r.command, r.outcome,
       EXISTS (SELECT 1 FROM {schema}.outbox o
               WHERE o.routing_key = %(rk)s AND o.intent_id = %(command_id)s) AS pending
FROM (SELECT 1) one
LEFT JOIN {schema}.receipts r
    ON r.routing_key = %(rk)s AND r.tenant_id = %(tenant)s AND r.actor_type = %(type)s
   AND r.actor_id = %(id)s AND r.command_id = %(command_id)s;

-- staged_locate --
-- where a staged command id went, without its actor: a pending intent by the outbox's id index, else a receipt written for a transaction caller (a receipt wins over a row still settling) by the receipts' staged-id index (migration 0015); both probe every shard on Citus (an operator-class read, one id)
SELECT o.routing_key, o.tenant_id, o.target_type AS actor_type, o.target_id AS actor_id,
       o.command, NULL::jsonb AS outcome, true AS pending,
       {schema}.stmt_ms(%(off)s::bigint) AS now
FROM {schema}.outbox o
WHERE o.intent_id = %(command_id)s AND o.kind = 'intent'
UNION ALL
SELECT r.routing_key, r.tenant_id, r.actor_type, r.actor_id, r.command, r.outcome, false,
       {schema}.stmt_ms(%(off)s::bigint)
FROM {schema}.receipts r
WHERE r.command_id = %(command_id)s AND r.caller_key LIKE '["System","transaction",%%'
ORDER BY pending
LIMIT 1;
