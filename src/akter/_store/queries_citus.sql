-- Citus (docs/citus.md): detection and distribution, and the claim variants.
-- Citus has no multi-shard FOR UPDATE SKIP LOCKED and refuses volatile functions in
-- modifications of distributed tables, so on Citus a claim is an unlocked candidate scan across
-- shards, then one single-shard claim per candidate (pipelined), each SKIP LOCKED in its shard.
-- Same block format as queries.sql; loaded into the same catalogue.

-- citus_detect --
-- whether the citus extension is installed in this database (the claim strategy; read only)
SELECT 1 FROM pg_extension WHERE extname = 'citus';

-- citus_is_coordinator --
-- whether this Citus node is the coordinator (migrations and distribution run there)
SELECT citus_is_coordinator() AS coordinator;

-- citus_placed --
-- the schema's tables already known to Citus (distributed or reference)
SELECT c.relname::text AS relname
FROM pg_dist_partition p
JOIN pg_class c ON c.oid = p.logicalrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s;

-- citus_table_exists --
-- whether a schema-qualified table exists (distribution needs the migrated tables)
SELECT to_regclass(%(table)s) IS NOT NULL AS present;

-- citus_propagate_set_local --
-- Citus: this transaction's SET LOCAL commands reach every worker it touches; set_config does not, and a row lock waits on the worker that holds the row (citus_lock_wait follows)
SELECT set_config('citus.propagate_set_commands', 'local', true);

-- citus_lock_wait --
-- Citus: this transaction's lock wait on the workers (a turn's lock_wait, a lease round's), after citus_propagate_set_local; SET takes no parameter, so the wait is formatted in as a literal once per value (akter._store.citus.worker_lock_wait)
SET LOCAL lock_timeout = {lock_timeout};

-- citus_create_reference --
-- makes a table that belongs to no actor a reference table (a copy on every node)
SELECT create_reference_table(%(table)s::regclass);

-- citus_create_distributed --
-- distributes a per-actor table by routing_key, co-located with the named table (or the default group)
SELECT create_distributed_table(%(table)s::regclass, 'routing_key', colocate_with => %(with)s);

-- citus_reference_tables --
-- the schema's tables that Citus holds as reference tables (a layout older than 0008 kept singletons there)
SELECT c.relname::text AS relname
FROM pg_dist_partition p
JOIN pg_class c ON c.oid = p.logicalrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND p.partmethod = 'n';

-- citus_undistribute --
-- turns a Citus table back into a local table on the coordinator, its rows kept (before it is placed again)
SELECT undistribute_table(%(table)s::regclass);

-- singletons_unkeyed --
-- lease rows without the routing key of their singleton's actor (written before 0008, or by an older runner)
SELECT actor_type FROM {schema}.singletons WHERE routing_key IS NULL;

-- singletons_key --
-- fills one singleton's routing key (distribution, before the table moves into the actors' shards)
UPDATE {schema}.singletons SET routing_key = %(rk)s::bigint
WHERE actor_type = %(actor_type)s::text AND routing_key IS NULL;

-- singletons_rekey --
-- the lease rows' key becomes (routing_key, actor_type), which Citus needs of a distributed table
ALTER TABLE {schema}.singletons ALTER COLUMN routing_key SET NOT NULL,
    DROP CONSTRAINT singletons_pkey,
    ADD CONSTRAINT singletons_pkey PRIMARY KEY USING INDEX singletons_routing;

-- === Singleton leases on Citus (0008): the rows live in their singleton actor's shard ===
-- Each statement names the routing key, so Citus routes it to that one shard: the fence's
-- FOR KEY SHARE is a row lock in the shard of the singleton's own turns, a takeover's
-- FOR UPDATE a row lock there. The clock is a parameter (now, from clock_now on the
-- coordinator, or the turn's one reading): Citus would read now_ms() on the worker.

-- citus_singleton_takeover --
-- Citus: singleton_takeover in the lease's shard
SELECT t.lease_until_ms - %(now)s::bigint AS ahead_ms
FROM {schema}.singletons t
WHERE t.routing_key = %(rk)s::bigint AND t.actor_type = %(actor_type)s::text
  AND t.owner IS DISTINCT FROM %(runner_id)s::uuid
  AND (t.lease_until_ms <= %(now)s::bigint
       OR t.lease_until_ms > %(now)s::bigint + %(skew_ms)s::bigint)
FOR UPDATE OF t;

-- citus_acquire_singleton --
-- Citus: acquire_singleton in the lease's shard, on the (routing_key, actor_type) key
INSERT INTO {schema}.singletons AS s
    (routing_key, actor_type, owner, lease_until_ms, acquired_at_ms)
VALUES (%(rk)s::bigint, %(actor_type)s::text, %(runner_id)s::uuid,
        %(now)s::bigint + %(lease_ms)s::bigint, %(now)s::bigint)
ON CONFLICT (routing_key, actor_type) DO UPDATE
SET owner = excluded.owner, lease_until_ms = excluded.lease_until_ms,
    acquired_at_ms = CASE WHEN s.owner = excluded.owner THEN s.acquired_at_ms
                          ELSE excluded.acquired_at_ms END
WHERE s.lease_until_ms <= excluded.acquired_at_ms OR s.owner = excluded.owner
   OR s.lease_until_ms > excluded.acquired_at_ms + %(skew_ms)s::bigint
RETURNING owner::text AS owner, lease_until_ms, acquired_at_ms;

-- citus_release_singleton --
-- Citus: release_singleton in the lease's shard, at the coordinator's clock (now)
UPDATE {schema}.singletons s
SET lease_until_ms = %(now)s::bigint
WHERE s.routing_key = %(rk)s::bigint AND s.actor_type = %(actor_type)s::text
  AND s.owner = %(runner_id)s::uuid;

-- citus_check_singleton_fence --
-- Citus: check_singleton_fence in the lease's shard
SELECT lease_until_ms FROM {schema}.singletons
WHERE routing_key = %(rk)s::bigint AND actor_type = %(actor_type)s
  AND owner = %(owner)s::uuid AND acquired_at_ms = %(epoch)s::bigint;

-- citus_hold_singleton_fence --
-- Citus: hold_singleton_fence in the lease's shard (a row lock there, not on a whole reference shard), at the turn's estimate of the coordinator's clock (now): the shard's worker clock is not the one the lease was written at
SELECT {schema}.fence_check(count(*)) FROM (
    SELECT 1 FROM {schema}.singletons
    WHERE routing_key = %(rk)s::bigint AND actor_type = %(actor_type)s
      AND owner = %(owner)s::uuid AND acquired_at_ms = %(epoch)s::bigint
      AND lease_until_ms > %(now)s::bigint
    FOR KEY SHARE
) AS fence;

-- citus_insert_receipt --
-- Citus: one committed command's outcome under its command id, by scalar parameters (a turn's receipts after update_actor, one statement each): Citus routes this INSERT to the actor's shard as it is, where update_actor_receipt's INSERT inside a CTE is planned on the coordinator as subplans
INSERT INTO {schema}.receipts
    (routing_key, tenant_id, actor_type, actor_id, command_id, command, payload_hash,
     caller_key, outcome, expires_at_ms)
VALUES (%(rk)s, %(tenant)s, %(type)s, %(id)s, %(command_id)s, %(command)s,
        %(payload_hash)s, %(caller_key)s, %(outcome)s::jsonb, %(expires_at_ms)s);

-- citus_insert_event --
-- Citus: one event of a turn with its sequence number, by scalar parameters (one statement each): routed to the actor's shard as it is, where insert_events' INSERT ... SELECT from unnest is pulled to the coordinator and written with COPY over a second connection, which makes the turn's commit two-phase
INSERT INTO {schema}.events
    (routing_key, tenant_id, actor_type, actor_id, seq, tag, payload, payload_version,
     command_id, emitted_at_ms)
VALUES (%(rk)s, %(tenant)s, %(type)s, %(id)s, %(seq)s::bigint, %(tag)s::text,
        %(payload)s::jsonb, %(payload_version)s::int, %(command_id)s::text, %(now)s);

-- citus_insert_outbox_row --
-- Citus: one staged intent, timer or job without an enqueue ordinal (not of a capped type), as insert_outbox writes it (due from the commit's clock, rank from the ready time, priority and max_wait), by scalar parameters: routed to the actor's shard as it is (insert_outbox's INSERT ... SELECT from unnest would make the commit two-phase)
INSERT INTO {schema}.outbox
    (routing_key, intent_id, bucket, kind, tenant_id, actor_type, actor_id, target_type,
     target_id, command, payload, payload_version, caller, due_at_ms, scheduled_at_ms,
     ready_at_ms, timer_key, traceparent, priority, rank_ms)
VALUES (%(rk)s, %(intent_id)s::text, %(bucket)s, %(kind)s::text, %(tenant)s, %(type)s, %(id)s,
        %(target_type)s::text, %(target_id)s::text, %(command)s::text, %(payload)s::text,
        %(payload_version)s::int, %(caller)s::text,
        coalesce(%(at)s::bigint, %(commit)s::bigint + coalesce(%(delay)s::bigint, 0)),
        coalesce(%(at)s::bigint, %(commit)s::bigint + coalesce(%(delay)s::bigint, 0)),
        CASE WHEN %(kind)s::text = 'job'
             THEN coalesce(%(at)s::bigint, %(commit)s::bigint + coalesce(%(delay)s::bigint, 0))
        END,
        %(timer_key)s::text, %(traceparent)s::text, %(priority)s::smallint,
        -- as insert_outbox: NULL for an intent (no ready time), least() ignores a NULL max_wait
        CASE WHEN %(kind)s::text = 'job' THEN least(
            coalesce(%(at)s::bigint, %(commit)s::bigint + coalesce(%(delay)s::bigint, 0))
                - %(priority)s::smallint * 10000000000000::bigint,
            coalesce(%(at)s::bigint, %(commit)s::bigint + coalesce(%(delay)s::bigint, 0))
                + %(max_wait)s::bigint - 90000000000000::bigint)
        END);

-- citus_wf_start_in_turn --
-- Citus: one workflow run a turn starts, as wf_start_in_turn writes it, by scalar parameters: routed to the actor's shard as it is (wf_start_in_turn's INSERT ... SELECT from unnest would make the commit two-phase); a keyed start whose key a live run holds fails with unique_violation naming the shard's workflows_live_key index in its message (live_key_taken)
INSERT INTO {schema}.workflows
    (routing_key, run_id, tenant_id, actor_type, actor_id, workflow, run_key, input,
     input_hash, caller, status, wake_at_ms, deadline_ms, started_at_ms, updated_at_ms,
     traceparent)
VALUES (%(rk)s, %(run_id)s::text, %(tenant)s, %(type)s, %(id)s, %(workflow)s::text,
        %(run_key)s::text, %(input)s::text, %(input_hash)s::text, %(caller)s::text, 'runnable',
        %(commit)s::bigint, %(commit)s::bigint + %(timeout_ms)s::bigint, %(commit)s::bigint,
        %(commit)s::bigint, %(traceparent)s::text);

-- citus_sub_feed_bump_routed --
-- Citus: a source's commit upserts one routed subscription's feed, as sub_feeds_bump_routed does for each, by scalar parameters: routed to the source's shard as it is (the upsert from unnest is pulled to the coordinator and makes the turn's commit two-phase)
INSERT INTO {schema}.subscription_feeds
    (routing_key, tenant_id, actor_type, actor_id, subscription, head, done, due_at_ms,
     updated_at_ms)
VALUES (%(rk)s, %(tenant)s, %(type)s, %(id)s, %(name)s::text, %(head)s::bigint,
        %(floor)s::bigint, %(now)s, %(now)s)
ON CONFLICT (routing_key, tenant_id, actor_type, actor_id, subscription)
DO UPDATE SET head = greatest(subscription_feeds.head, excluded.head),
              updated_at_ms = excluded.updated_at_ms;

-- citus_claim_intents_scan --
-- Citus, step 1 of an intent claim: due unparked intents of hosted types at the pass's clock reading (now, from clock_now), oldest first, read without locks across shards
SELECT o.routing_key, o.intent_id, o.due_at_ms
FROM {schema}.outbox o
WHERE o.kind = 'intent' AND o.due_at_ms <= %(now)s::bigint AND o.parked_at_ms IS NULL
  AND o.target_type = ANY(%(types)s::text[])
ORDER BY o.due_at_ms, o.routing_key, o.intent_id
LIMIT %(probe)s;

-- citus_claim_intent --
-- Citus, step 2: claims one candidate in its own shard, SKIP LOCKED, only while it is still due and unparked; leased like claim_intents, at the scan's clock reading
WITH locked AS (
    SELECT o.routing_key, o.intent_id, o.attempts
    FROM {schema}.outbox o
    WHERE o.routing_key = %(rk)s::bigint AND o.intent_id = %(intent_id)s::text
      AND o.kind = 'intent' AND o.due_at_ms <= %(now)s::bigint AND o.parked_at_ms IS NULL
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE {schema}.outbox o
SET attempts = l.attempts + 1,
    due_at_ms = %(now)s::bigint + greatest(%(lease)s::bigint,
                                           least(1000::bigint << least(l.attempts, 31),
                                                 %(max_backoff)s::bigint))
FROM locked l
WHERE o.routing_key = %(rk)s::bigint AND o.intent_id = l.intent_id
RETURNING o.routing_key, o.intent_id, o.tenant_id, o.actor_type, o.actor_id, o.target_type,
          o.target_id, o.command, o.payload, o.payload_version, o.caller, o.attempts,
          o.scheduled_at_ms,
          o.timer_key, o.traceparent, o.due_at_ms AS claimed_until, %(now)s::bigint AS now;

-- citus_claim_intent_keyed --
-- Citus: claims one intent a local commit named (no scan), in its own shard, SKIP LOCKED, only while it is still due and unparked; the coordinator's clock read in a table-free CTE, which Citus evaluates there and sends the worker as a literal (one statement, one round trip); leased like claim_intents
WITH clock AS MATERIALIZED (
    SELECT {schema}.stmt_ms(%(off)s::bigint) AS now
), locked AS (
    SELECT o.routing_key, o.intent_id, o.attempts
    FROM {schema}.outbox o, clock c
    WHERE o.routing_key = %(rk)s::bigint AND o.intent_id = %(intent_id)s::text
      AND o.kind = 'intent' AND o.due_at_ms <= c.now AND o.parked_at_ms IS NULL
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE {schema}.outbox o
SET attempts = l.attempts + 1,
    due_at_ms = c.now + greatest(%(lease)s::bigint,
                                 least(1000::bigint << least(l.attempts, 31),
                                       %(max_backoff)s::bigint))
FROM locked l, clock c
WHERE o.routing_key = %(rk)s::bigint AND o.intent_id = l.intent_id
RETURNING o.routing_key, o.intent_id, o.tenant_id, o.actor_type, o.actor_id, o.target_type,
          o.target_id, o.command, o.payload, o.payload_version, o.caller, o.attempts,
          o.scheduled_at_ms,
          o.timer_key, o.traceparent, o.due_at_ms AS claimed_until, c.now AS now;

-- citus_claim_jobs_scan --
-- Citus, step 1 of an uncapped job claim: due unparked job rows of the (actor type, job) pairs this runner executes, at the pass's clock reading, highest rank first (priority, max_wait: migration 0006), read without locks across shards
SELECT o.routing_key, o.intent_id, o.actor_type, o.command, o.due_at_ms
FROM {schema}.outbox o
WHERE o.kind = 'job' AND o.due_at_ms <= %(now)s::bigint AND o.parked_at_ms IS NULL
  AND o.actor_type = ANY(%(types)s::text[]) AND o.command = ANY(%(jobs)s::text[])
ORDER BY o.rank_ms, o.routing_key, o.intent_id
LIMIT %(probe)s;

-- citus_claim_job --
-- Citus, step 2: claims one job candidate in its own shard, SKIP LOCKED, only while still due and unparked; leased with ambiguity pre-marked like claim_jobs (no non-IMMUTABLE expression inside CASE)
WITH locked AS (
    SELECT o.routing_key, o.intent_id, o.attempts, o.ambiguous, o.maybe_applied,
           o.final_failure, o.cancelled_at_ms IS NOT NULL AS cancelled,
           o.last_error AS prior_error, o.waiting_for AS prior_waiting_for,
           (o.cancelled_at_ms IS NULL AND o.attempts < %(max_attempts)s::int
            AND NOT o.final_failure) AS attempting
    FROM {schema}.outbox o
    WHERE o.routing_key = %(rk)s::bigint AND o.intent_id = %(intent_id)s::text
      AND o.kind = 'job' AND o.actor_type = %(type)s::text AND o.command = %(job)s::text
      AND o.due_at_ms <= %(now)s::bigint AND o.parked_at_ms IS NULL
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE {schema}.outbox o
SET due_at_ms = %(now)s::bigint + %(lease)s::bigint,
    waiting = false, waiting_for = NULL,
    attempts = CASE WHEN l.attempting THEN l.attempts + 1 ELSE l.attempts END,
    running = l.attempting,
    ambiguous = CASE WHEN l.attempting THEN true ELSE l.ambiguous END,
    maybe_applied = CASE WHEN l.attempting THEN l.maybe_applied OR (l.attempts > 0 AND l.ambiguous)
                         ELSE l.maybe_applied END,
    last_error = CASE WHEN l.attempting
                      THEN 'Attempt ' || (l.attempts + 1)::text
                           || ' ended without reporting an outcome'
                      ELSE o.last_error END
FROM locked l
WHERE o.routing_key = %(rk)s::bigint AND o.intent_id = l.intent_id
RETURNING o.routing_key, o.intent_id, o.tenant_id, o.actor_type, o.actor_id, o.command,
          o.payload, o.payload_version, o.caller, o.attempts, o.last_error, o.ambiguous,
          o.maybe_applied, o.traceparent, o.due_at_ms AS claimed_until, l.cancelled,
          (NOT l.cancelled AND (l.attempts >= %(max_attempts)s::int OR l.final_failure))
              AS exhausted,
          l.attempts AS prior_attempts, l.ambiguous AS prior_ambiguous,
          l.maybe_applied AS prior_maybe_applied, l.prior_error, l.prior_waiting_for;

-- citus_discover_capped_groups --
-- Citus: the (actor, job) groups of this runner's capped job types with due unparked rows at the pass's clock reading, earliest first, no locks (each group is then claimed by keyed statements)
SELECT o.routing_key, o.tenant_id, o.actor_type, o.actor_id, o.command,
       min(o.due_at_ms) AS due_at_ms
FROM {schema}.outbox o
WHERE o.kind = 'job' AND o.due_at_ms <= %(now)s::bigint AND o.parked_at_ms IS NULL
  AND o.actor_type = ANY(%(types)s::text[]) AND o.command = ANY(%(jobs)s::text[])
GROUP BY o.routing_key, o.tenant_id, o.actor_type, o.actor_id, o.command
ORDER BY min(o.due_at_ms), o.routing_key
LIMIT %(free)s;

-- citus_prune_receipts --
-- Citus: deletes a batch of a type's receipts past expiry + margin whose id no claimed outbox row of that type still carries (a receipt exists only for a delivered row, which a claim made attempts > 0); the carried ids are read in a subplan, no row locks
WITH doomed AS MATERIALIZED (
    SELECT r.routing_key, r.tenant_id, r.actor_type, r.actor_id, r.command_id
    FROM {schema}.receipts r
    WHERE r.actor_type = %(type)s::text AND r.expires_at_ms <= %(cutoff)s::bigint
    ORDER BY r.expires_at_ms
    LIMIT %(batch)s
), carried AS MATERIALIZED (
    SELECT o.intent_id, o.tenant_id, o.target_id
    FROM {schema}.outbox o
    WHERE o.target_type = %(type)s::text AND o.attempts > 0
      AND o.intent_id IN (SELECT d.command_id FROM doomed d)
)
DELETE FROM {schema}.receipts r
USING doomed d
WHERE r.routing_key = d.routing_key AND r.tenant_id = d.tenant_id
  AND r.actor_type = d.actor_type AND r.actor_id = d.actor_id AND r.command_id = d.command_id
  AND NOT EXISTS (SELECT 1 FROM carried c
                  WHERE c.intent_id = d.command_id AND c.tenant_id = d.tenant_id
                    AND c.target_id = d.actor_id)
RETURNING 1;

-- citus_release_skewed_intents_scan --
-- Citus, step 1 of the skew release: claimed intents of hosted types due further ahead than a claim or backoff can make them, at the check's clock reading (now), read without locks
SELECT o.routing_key, o.intent_id
FROM {schema}.outbox o
WHERE o.kind = 'intent' AND o.attempts > 0
  AND o.due_at_ms > %(now)s::bigint + %(skew_ms)s::bigint
  AND o.target_type = ANY(%(types)s::text[])
LIMIT %(limit)s;

-- citus_release_skewed_intent --
-- Citus, step 2: one such intent becomes due now in its own shard, SKIP LOCKED, only while still skewed; returns how far ahead it was
WITH skewed AS (
    SELECT o.routing_key, o.intent_id, o.due_at_ms - %(now)s::bigint AS ahead_ms
    FROM {schema}.outbox o
    WHERE o.routing_key = %(rk)s::bigint AND o.intent_id = %(intent_id)s::text
      AND o.kind = 'intent' AND o.attempts > 0
      AND o.due_at_ms > %(now)s::bigint + %(skew_ms)s::bigint
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE {schema}.outbox o
SET due_at_ms = %(now)s::bigint
FROM skewed s
WHERE o.routing_key = %(rk)s::bigint AND o.intent_id = s.intent_id
RETURNING o.intent_id, o.target_type, o.target_id, o.attempts, s.ahead_ms;

-- citus_release_skewed_jobs_scan --
-- Citus, step 1: running attempts of the executed job types whose lease ends further ahead than a lease can, at the check's clock reading (now), read without locks
SELECT o.routing_key, o.intent_id, o.actor_type, o.command
FROM {schema}.outbox o
WHERE o.kind = 'job' AND o.running AND o.due_at_ms > %(now)s::bigint + %(skew_ms)s::bigint
  AND o.actor_type = ANY(%(types)s::text[]) AND o.command = ANY(%(jobs)s::text[])
LIMIT %(limit)s;

-- citus_release_skewed_job --
-- Citus, step 2: one such attempt's lease ends now in its own shard, SKIP LOCKED, only while still skewed; returns how far ahead it was
WITH skewed AS (
    SELECT o.routing_key, o.intent_id, o.due_at_ms - %(now)s::bigint AS ahead_ms
    FROM {schema}.outbox o
    WHERE o.routing_key = %(rk)s::bigint AND o.intent_id = %(intent_id)s::text
      AND o.kind = 'job' AND o.running
      AND o.due_at_ms > %(now)s::bigint + %(skew_ms)s::bigint
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE {schema}.outbox o
SET due_at_ms = %(now)s::bigint
FROM skewed s
WHERE o.routing_key = %(rk)s::bigint AND o.intent_id = s.intent_id
RETURNING o.intent_id, o.actor_type, o.actor_id, o.command, o.attempts, s.ahead_ms;

-- citus_settle_intent --
-- Citus: one delivered intent ends in its own shard, only under its claim token (settle_intents joins an unnest, which spans every shard)
DELETE FROM {schema}.outbox
WHERE routing_key = %(rk)s::bigint AND intent_id = %(intent_id)s::text AND kind = 'intent'
  AND due_at_ms = %(token)s::bigint;

-- === Flow control on Citus ===
-- Deployment-wide caps and rate tokens (docs/flow-control.md). The type lock stays a row lock
-- of job_limits (a reference table: Citus also takes the lock of the table's whole shard, on
-- its first worker, so capped types' claims serialize with one another); the lock waits on a
-- worker, where only SET LOCAL reaches (citus.propagate_set_commands). Rate tokens are taken by
-- one upsert per bucket, in key order, in one transaction, at one clock reading.

-- citus_job_group_settings --
-- Citus: job_group_settings, and the transaction's SET LOCAL commands reach every worker it touches (the type and group locks wait there, out of reach of set_config)
SELECT set_config('lock_timeout', %(lock_timeout)s, true),
       set_config('idle_in_transaction_session_timeout', %(idle_bound)s, true),
       set_config('citus.propagate_set_commands', 'local', true);

-- citus_job_lock_wait --
-- Citus: the lock wait of a capped group's or capped type's claim or wake on the workers (GROUP_LOCK_WAIT, jobs.py; SET takes no parameter)
SET LOCAL lock_timeout = '2000ms';

-- citus_job_type_live --
-- Citus: job_type_live at the claim's clock reading (now, from clock_now): a capped type's running rows whose lease has not ended, across shards; read under the type lock
SELECT count(*) AS live
FROM {schema}.outbox
WHERE kind = 'job' AND running AND actor_type = %(type)s AND command = ANY(%(jobs)s::text[])
  AND due_at_ms > %(now)s::bigint;

-- citus_rate_take --
-- Citus: at most n tokens of one bucket of a claim (rate_take, one bucket per statement, in key order, in one transaction): created full, else refilled to now under the row lock; only those due within horizon_ms; returns the bucket's level before the take and how many it granted
INSERT INTO {schema}.rate_buckets AS b (actor_type, job, limit_no, key, tokens, at_ms, granted)
VALUES (%(type)s::text, %(job)s::text, %(no)s::smallint, %(key)s::text,
        %(burst)s::float8 - least(%(n)s::int, greatest(0, floor(
            %(burst)s::float8 + %(per_ms)s::float8 * %(horizon_ms)s::float8)))::int,
        %(now)s::bigint,
        least(%(n)s::int, greatest(0, floor(
            %(burst)s::float8 + %(per_ms)s::float8 * %(horizon_ms)s::float8)))::int)
ON CONFLICT (actor_type, job, limit_no, key) DO UPDATE
SET tokens = least(%(burst)s::float8, b.tokens + greatest(0, excluded.at_ms - b.at_ms) * %(per_ms)s::float8)
             - least(%(n)s::int, greatest(0, floor(
                   least(%(burst)s::float8, b.tokens + greatest(0, excluded.at_ms - b.at_ms) * %(per_ms)s::float8)
                   + %(per_ms)s::float8 * %(horizon_ms)s::float8))),
    granted = least(%(n)s::int, greatest(0, floor(
                  least(%(burst)s::float8, b.tokens + greatest(0, excluded.at_ms - b.at_ms) * %(per_ms)s::float8)
                  + %(per_ms)s::float8 * %(horizon_ms)s::float8)))::int,
    at_ms = greatest(b.at_ms, excluded.at_ms)
RETURNING b.actor_type, b.job, b.limit_no, b.key, b.tokens + b.granted AS level, b.granted;

-- citus_defer_job_for_token --
-- Citus: one claimed attempt that got no token (or cannot start) is handed back uncounted in its own shard (defer_jobs_for_token joins an unnest, which spans every shard), due after its wait, marked as waiting for a token (holding none); only under its claim
UPDATE {schema}.outbox
SET due_at_ms = {schema}.stmt_ms(%(off)s::bigint) + %(wait)s::bigint,
    attempts = %(prior_attempts)s::int, ambiguous = %(prior_ambiguous)s::bool,
    maybe_applied = %(prior_maybe_applied)s::bool, running = false,
    last_error = %(prior_error)s::text, waiting_for = 'rate'
WHERE routing_key = %(rk)s::bigint AND intent_id = %(job_id)s::text AND kind = 'job'
  AND attempts = %(attempt)s::int AND due_at_ms = %(token)s::bigint
RETURNING intent_id;
