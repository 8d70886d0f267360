-- Operators' statements on parked outbox rows (evolution E3): list, retry, discard with audit.
-- Same block format as queries.sql; loaded into the same catalogue. A parked row is one with
-- parked_at_ms set: no claim takes it, and the runtime never deletes it.

-- parked_list --
-- operators' read-only listing of parked rows across actors, oldest parking first, filtered by kind, the receiving type and the command
SELECT o.routing_key, o.intent_id, o.kind, o.tenant_id,
       CASE WHEN o.kind = 'job' THEN o.actor_type ELSE o.target_type END AS actor_type,
       CASE WHEN o.kind = 'job' THEN o.actor_id ELSE o.target_id END AS actor_id,
       o.command, o.payload, o.payload_version, o.attempts, o.parked_at_ms, o.last_error,
       o.timer_key
FROM {schema}.outbox o
WHERE o.parked_at_ms IS NOT NULL
  AND (%(kind)s::text IS NULL OR o.kind = %(kind)s::text)
  AND (%(type)s::text IS NULL
       OR (CASE WHEN o.kind = 'job' THEN o.actor_type ELSE o.target_type END) = %(type)s::text)
  AND (%(command)s::text IS NULL OR o.command = %(command)s::text)
ORDER BY o.parked_at_ms, o.intent_id
LIMIT %(limit)s;

-- parked_lock --
-- locks the parked rows an operator names (by id, or every parked row matching the filters) for a retry or a discard in this transaction
SELECT o.routing_key, o.intent_id
FROM {schema}.outbox o
WHERE o.parked_at_ms IS NOT NULL
  AND (%(ids)s::text[] IS NULL OR o.intent_id = ANY(%(ids)s::text[]))
  AND (%(type)s::text IS NULL
       OR (CASE WHEN o.kind = 'job' THEN o.actor_type ELSE o.target_type END) = %(type)s::text)
  AND (%(command)s::text IS NULL OR o.command = %(command)s::text)
ORDER BY o.routing_key, o.intent_id
FOR UPDATE OF o;

-- retry_parked --
-- the locked parked rows become due now, every other column kept (a row that still cannot be delivered parks again with its new cause)
UPDATE {schema}.outbox o
SET parked_at_ms = NULL, due_at_ms = {schema}.stmt_ms(%(off)s::bigint)
FROM unnest(%(rks)s::bigint[], %(ids)s::text[]) AS u(rk, intent_id)
WHERE o.routing_key = u.rk AND o.intent_id = u.intent_id AND o.parked_at_ms IS NOT NULL
RETURNING o.intent_id;

-- discard_parked --
-- deletes the locked parked rows and writes one operator_audit row per row (the whole row as JSON, who, when, why) in the same statement
WITH gone AS (
    DELETE FROM {schema}.outbox o
    USING unnest(%(rks)s::bigint[], %(ids)s::text[], %(audit_ids)s::text[])
        AS u(rk, intent_id, audit_id)
    WHERE o.routing_key = u.rk AND o.intent_id = u.intent_id AND o.parked_at_ms IS NOT NULL
    RETURNING u.audit_id, o.*
)
INSERT INTO {schema}.operator_audit
    (audit_id, routing_key, at_ms, operator, action, kind, tenant_id, actor_type, actor_id,
     command, row_json, reason)
SELECT g.audit_id, g.routing_key, {schema}.stmt_ms(%(off)s::bigint), %(operator)s, 'discard',
       g.kind, g.tenant_id,
       CASE WHEN g.kind = 'job' THEN g.actor_type ELSE g.target_type END,
       CASE WHEN g.kind = 'job' THEN g.actor_id ELSE g.target_id END,
       g.command, to_jsonb(g) - 'audit_id', %(reason)s
FROM gone g
RETURNING audit_id;

-- sample_due_jobs --
-- the maintenance owner's view of due, unparked job rows by (actor type, job) across actors, without a live attempt: what no live runner may be serving
SELECT o.actor_type, o.command AS job, count(*) AS due
FROM {schema}.outbox o
WHERE o.kind = 'job' AND o.parked_at_ms IS NULL
  AND o.due_at_ms <= {schema}.stmt_ms(%(off)s::bigint)
GROUP BY o.actor_type, o.command
ORDER BY o.actor_type, o.command;

-- park_undeclared_jobs --
-- the maintenance owner parks a batch of one (actor type, job)'s rows that no definition declares and no live runner executes, without a live attempt; every other column kept
WITH doomed AS (
    SELECT o.routing_key, o.intent_id
    FROM {schema}.outbox o
    WHERE o.kind = 'job' AND o.parked_at_ms IS NULL AND o.actor_type = %(type)s
      AND o.command = %(job)s
      AND NOT (o.running AND o.due_at_ms > {schema}.stmt_ms(%(off)s::bigint))
    LIMIT %(batch)s
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE {schema}.outbox o
SET parked_at_ms = {schema}.stmt_ms(%(off)s::bigint), last_error = %(error)s
FROM doomed d
WHERE o.routing_key = d.routing_key AND o.intent_id = d.intent_id
RETURNING o.intent_id;

-- count_intent_backlog --
-- admission backpressure (akter._engine.loop.backlog): due, unclaimed, unparked intents of hosted types across actors, by per-bucket probes of outbox_due, stopping after %(limit)s rows (cost bounded by the limit, never a full count)
SELECT count(*) AS backlog
FROM (
    SELECT 1
    FROM generate_series(-128, 127) AS b(bucket)
    CROSS JOIN LATERAL (
        SELECT 1
        FROM {schema}.outbox o
        WHERE o.bucket = b.bucket AND o.kind = 'intent'
          AND o.due_at_ms <= {schema}.stmt_ms(%(off)s::bigint)
          AND o.parked_at_ms IS NULL
          AND o.target_type = ANY(%(types)s::text[])
        LIMIT %(limit)s
    ) p
    LIMIT %(limit)s
) due;

-- any_due --
-- an idle relay's poll: whether any unparked intent or job row, or any workflow run, is due across actors (one index probe per bucket, stopping at the first, then one on the runs' wake times); every claim requires all of these, so false means no claim of this pass could take a row
SELECT EXISTS (
    SELECT 1
    FROM generate_series(-128, 127) AS b(bucket)
    CROSS JOIN LATERAL (
        SELECT 1
        FROM {schema}.outbox o
        WHERE o.bucket = b.bucket AND o.kind IN ('intent', 'job')
          AND o.due_at_ms <= {schema}.stmt_ms(%(off)s::bigint)
          AND o.parked_at_ms IS NULL
        LIMIT 1
    ) p
) OR coalesce(
    -- the first wake time (one index entry of workflows_wake), not a scan of the due runs
    (SELECT min(w.wake_at_ms) FROM {schema}.workflows w WHERE w.wake_at_ms IS NOT NULL)
        <= {schema}.stmt_ms(%(off)s::bigint),
    false
) AS due;

-- next_due --
-- an idle relay's poll with notify=True: how long until the first unparked intent or job row, or workflow run, is due across actors (one index probe per bucket and kind, each reading one entry, and one on the runs' wake times), NULL when nothing waits; the relay sleeps until then or a wake
SELECT least(min(p.due_at_ms),
             (SELECT min(w.wake_at_ms) FROM {schema}.workflows w WHERE w.wake_at_ms IS NOT NULL))
       - {schema}.stmt_ms(%(off)s::bigint) AS wait_ms
FROM generate_series(-128, 127) AS b(bucket)
CROSS JOIN (VALUES ('intent'::text), ('job'::text)) AS k(kind)
CROSS JOIN LATERAL (
    SELECT o.due_at_ms
    FROM {schema}.outbox o
    WHERE o.bucket = b.bucket AND o.kind = k.kind AND o.parked_at_ms IS NULL
    ORDER BY o.due_at_ms
    LIMIT 1
) p;

-- count_intent_backlog_flat --
-- count_intent_backlog without the per-bucket probe, for Citus (which plans no lateral join over a distributed table): due, unclaimed, unparked intents of hosted types, stopping after %(limit)s rows
SELECT count(*) AS backlog
FROM (
    SELECT 1
    FROM {schema}.outbox o
    WHERE o.kind = 'intent' AND o.due_at_ms <= %(now)s::bigint AND o.parked_at_ms IS NULL
      AND o.target_type = ANY(%(types)s::text[])
    LIMIT %(limit)s
) due;

-- lean_tuples --
-- the lean watch's view of the tables it keeps (akter._engine.loop.vacuum): the outbox's and the actors' live and dead tuples as the server's statistics count them, one row each (pg_stat_user_tables by the tables' oids, no table access)
SELECT s.relname AS name, coalesce(s.n_live_tup, 0) AS live, coalesce(s.n_dead_tup, 0) AS dead
FROM pg_stat_user_tables s
WHERE s.relid IN (to_regclass('{schema}.outbox'), to_regclass('{schema}.actors'));

-- vacuum_outbox --
-- the lean watch's vacuum of the outbox (plain PostgreSQL; autocommit, outside any transaction): SKIP_LOCKED, so a runner whose peer or autovacuum holds the table's vacuum lock skips instead of queueing; no truncation, whose exclusive lock would stop the turns and claims
VACUUM (SKIP_LOCKED, TRUNCATE false) {schema}.outbox;

-- vacuum_actors --
-- the lean watch's vacuum of the actors table (plain PostgreSQL; autocommit, outside any transaction): every turn rewrites its actor's row, whose dead versions pile up under a held snapshot; SKIP_LOCKED and no truncation, as vacuum_outbox
VACUUM (SKIP_LOCKED, TRUNCATE false) {schema}.actors;

-- xmin_horizon --
-- the lean watch's look at what holds this database's removal horizon after a futile vacuum (read-only, no table access): the oldest of the other sessions' snapshots and transactions (pg_stat_activity's backend_xmin and backend_xid, shown for every role's sessions; sessions of no database, such as a standby's walsender, hold every database), prepared transactions and replication slots of this database; NULL when none holds one
SELECT h.x::text AS horizon
FROM (
    SELECT a.backend_xmin AS x FROM pg_stat_activity a
    WHERE (a.datname = current_database() OR a.datid IS NULL) AND a.pid <> pg_backend_pid()
    UNION ALL
    SELECT a.backend_xid FROM pg_stat_activity a
    WHERE (a.datname = current_database() OR a.datid IS NULL) AND a.pid <> pg_backend_pid()
    UNION ALL
    SELECT p.transaction FROM pg_prepared_xacts p WHERE p.database = current_database()
    UNION ALL
    SELECT r.xmin FROM pg_replication_slots r
    WHERE r.database = current_database() OR r.database IS NULL
) h
WHERE h.x IS NOT NULL
ORDER BY age(h.x) DESC
LIMIT 1;
