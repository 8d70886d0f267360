-- The statement catalogue. Each block starts with `-- name --` and a one-line guarantee.
-- `{schema}` is replaced by the runtime's quoted schema name when the catalogue is loaded.
-- Every statement that touches a per-actor table filters on routing_key (semantics §9.9).

-- migrations_bootstrap --
-- creates the schema and the migration ledger if they are missing
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.migrations (
    id text PRIMARY KEY,
    applied_at_ms bigint NOT NULL,
    checksum text NOT NULL
);

-- migrations_lock --
-- serializes concurrent starters on one database and schema (session advisory lock)
SELECT pg_advisory_lock(hashtextextended(%(lock_name)s, 0));

-- migrations_unlock --
-- releases the starters' advisory lock
SELECT pg_advisory_unlock(hashtextextended(%(lock_name)s, 0));

-- migrations_applied --
-- the applied migration ids, oldest first
SELECT id, checksum FROM {schema}.migrations ORDER BY id;

-- migrations_record --
-- records one applied migration inside the migration's own transaction
INSERT INTO {schema}.migrations (id, applied_at_ms, checksum)
VALUES (%(id)s, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, %(checksum)s);

-- deployment_get --
-- the single deployment row, if any
SELECT schema_version, retry_window_ms, deployment_id::text AS deployment_id, placements
FROM {schema}.deployment;

-- deployment_insert --
-- creates the deployment row once; a concurrent starter's row wins
INSERT INTO {schema}.deployment
    (singleton, schema_version, retry_window_ms, deployment_id, placements, created_at_ms)
VALUES (true, %(schema_version)s, %(retry_window_ms)s, %(deployment_id)s, %(placements)s::jsonb,
        {schema}.now_ms(0))
ON CONFLICT (singleton) DO NOTHING;

-- deployment_schema_version --
-- the deployment row records the newest applied schema version
UPDATE {schema}.deployment SET schema_version = greatest(schema_version, %(schema_version)s);

-- deployment_record_placements --
-- adds placements of types not yet recorded; recorded ones never change
UPDATE {schema}.deployment SET placements = %(placements)s::jsonb || placements;

-- clock_now --
-- the framework clock: database time in ms plus the runtime's test offset
SELECT {schema}.now_ms(%(off)s) AS now_ms;

-- turn_settings --
-- transaction-local lock wait, statement timeout, server-side bound (transaction_timeout on 17+, else idle_in_transaction_session_timeout) and plan cache mode (NULL: the session's) of one turn; sent alone only before ensure_actor (lock_actor sets them itself)
SELECT set_config('lock_timeout', %(lock_timeout)s, true),
       set_config('statement_timeout', %(statement_timeout)s, true),
       set_config(%(bound_setting)s, %(bound)s, true),
       set_config('plan_cache_mode',
                  coalesce(%(plan_cache_mode)s::text, current_setting('plan_cache_mode')), true);

-- ensure_actor --
-- inserts the fence row of a not-yet-known actor; an existing row is left alone
INSERT INTO {schema}.actors
    (routing_key, tenant_id, actor_type, actor_id, version, created, event_seq, state,
     state_version, updated_at_ms)
VALUES (%(rk)s, %(tenant)s, %(type)s, %(id)s, 0, false, 0, %(state)s::jsonb, %(state_version)s,
        {schema}.now_ms(%(off)s))
ON CONFLICT DO NOTHING;

-- lock_actor --
-- the fence: sets the turn's transaction-local timeouts and plan cache mode (turn_settings, as a one-time filter evaluated before the row is fetched, so the lock wait is bounded by them), then locks the actor row; ships state only when the cached version is stale
SELECT a.version, a.created, a.event_seq,
       CASE WHEN a.version IS DISTINCT FROM %(cached_version)s::bigint THEN a.state END AS state,
       CASE WHEN a.version IS DISTINCT FROM %(cached_version)s::bigint THEN a.state_version END
           AS state_version
FROM {schema}.actors a
WHERE a.routing_key = %(rk)s AND a.tenant_id = %(tenant)s AND a.actor_type = %(type)s
  AND a.actor_id = %(id)s
  AND (SELECT set_config('lock_timeout', %(lock_timeout)s, true) IS NOT NULL
              AND set_config('statement_timeout', %(statement_timeout)s, true) IS NOT NULL
              AND set_config(%(bound_setting)s, %(bound)s, true) IS NOT NULL
              AND set_config('plan_cache_mode',
                             coalesce(%(plan_cache_mode)s::text,
                                      current_setting('plan_cache_mode')), true) IS NOT NULL)
FOR UPDATE OF a;

-- admission_read --
-- after the lock (fresh snapshot): the turn clock and the batch's receipts, one key probe per id; NULL, not an empty array, when none is stored (a new command's usual answer leaves the client no JSON to decode)
SELECT {schema}.now_ms(%(off)s::bigint) AS now_ms,
       (SELECT jsonb_agg(jsonb_build_object(
                    'command_id', r.command_id, 'command', r.command,
                    'payload_hash', r.payload_hash, 'caller_key', r.caller_key,
                    'outcome', r.outcome, 'expires_at_ms', r.expires_at_ms))
                 FROM unnest(%(command_ids)s::text[]) AS c(command_id)
                 CROSS JOIN LATERAL (
                     SELECT * FROM {schema}.receipts r
                     WHERE r.routing_key = %(rk)s::bigint AND r.tenant_id = %(tenant)s::text
                       AND r.actor_type = %(type)s::text AND r.actor_id = %(id)s::text
                       AND r.command_id = c.command_id
                     LIMIT 1  -- keeps the probe a parameterized full-key lookup (not flattened)
                 ) r) AS receipts;

-- lock_admit --
-- lock_actor and admission_read in one statement (a turn's first flight, but on Citus): the locked row, then the turn clock and the batch's receipts read over it (the outer query runs once the lock is granted; admission_receipts, VOLATILE, probes in a snapshot of its own taken then, so it sees what the lock's previous holder committed; migration 0011); with no id to probe (each minted for its call: Request.unseen) the function is not called
WITH locked AS MATERIALIZED (
{statement:lock_actor}
)
SELECT l.version, l.created, l.event_seq, l.state, l.state_version,
       {schema}.now_ms(%(off)s::bigint) AS now_ms,
       CASE WHEN cardinality(%(command_ids)s::text[]) > 0
            THEN {schema}.admission_receipts(%(rk)s::bigint, %(tenant)s::text, %(type)s::text,
                                             %(id)s::text, %(command_ids)s::text[])
       END AS receipts
FROM locked l;

-- turn_guard --
-- a warm turn's one flight, after BEGIN: the turn's settings, the row lock, and its checks (version, receipts, id expiry, clock bound), each failure a SQLSTATE of class AK that aborts the flight (migration 0019); the clock it checked; not on Citus
SELECT {schema}.turn_guard(%(rk)s::bigint, %(tenant)s::text, %(type)s::text, %(id)s::text,
                           %(cached_version)s::bigint, %(command_ids)s::text[],
                           %(expires)s::bigint[], %(handler_now)s::bigint, %(bound_ms)s::bigint,
                           %(off)s::bigint, %(lock_timeout)s::text, %(statement_timeout)s::text,
                           %(bound_setting)s::text, %(bound)s::text, %(plan_cache_mode)s::text)
    AS now_ms;

-- update_actor_row --
-- the batch's state written under the locked version: one row, or none once the version moved (held whole by update_actor, update_actor_receipts and update_actor_receipt, which raise 40001 then)
UPDATE {schema}.actors
SET state = %(state)s::jsonb, state_version = %(state_version)s, created = %(created)s,
    event_seq = %(event_seq)s, version = version + 1, updated_at_ms = %(now)s
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s AND version = %(locked_version)s
RETURNING 1;

-- update_actor --
-- writes the batch's state under the locked version; raises 40001 unless exactly one row changed
WITH updated AS (
{statement:update_actor_row}
)
SELECT {schema}.fence_check((SELECT count(*) FROM updated));

-- update_actor_receipt --
-- update_actor and one receipt in one statement (the writes of a warm turn of one command): scalar parameters, where update_actor_receipts builds and unnests six one-element arrays
WITH updated AS (
{statement:update_actor_row}
), receipted AS (
    INSERT INTO {schema}.receipts
        (routing_key, tenant_id, actor_type, actor_id, command_id, command, payload_hash,
         caller_key, outcome, expires_at_ms)
    VALUES (%(rk)s, %(tenant)s, %(type)s, %(id)s, %(command_id)s, %(command)s,
            %(payload_hash)s, %(caller_key)s, %(outcome)s::jsonb, %(expires_at_ms)s)
    RETURNING 1
)
SELECT {schema}.fence_check((SELECT count(*) FROM updated)), (SELECT count(*) FROM receipted);

-- update_actor_receipts --
-- update_actor and insert_receipts in one statement (a warm turn's writes): the guarded state update raises 40001 unless exactly one row changed, and the batch's receipts are inserted with it
WITH updated AS (
{statement:update_actor_row}
), receipted AS (
    INSERT INTO {schema}.receipts
        (routing_key, tenant_id, actor_type, actor_id, command_id, command, payload_hash,
         caller_key, outcome, expires_at_ms)
    SELECT %(rk)s, %(tenant)s, %(type)s, %(id)s, r.command_id, r.command, r.payload_hash,
           r.caller_key, r.outcome::jsonb, r.expires_at_ms
    FROM unnest(%(command_ids)s::text[], %(commands)s::text[], %(payload_hashes)s::text[],
                %(caller_keys)s::text[], %(outcomes)s::text[], %(expires)s::bigint[])
        AS r(command_id, command, payload_hash, caller_key, outcome, expires_at_ms)
    RETURNING 1
)
SELECT {schema}.fence_check((SELECT count(*) FROM updated)), (SELECT count(*) FROM receipted);

-- insert_events --
-- appends the batch's events with their gap-free sequence numbers
INSERT INTO {schema}.events
    (routing_key, tenant_id, actor_type, actor_id, seq, tag, payload, payload_version,
     command_id, emitted_at_ms)
SELECT %(rk)s, %(tenant)s, %(type)s, %(id)s, e.seq, e.tag, e.payload::jsonb, e.version,
       e.command_id, %(now)s
FROM unnest(%(seqs)s::bigint[], %(tags)s::text[], %(payloads)s::text[], %(versions)s::int[],
            %(command_ids)s::text[])
    AS e(seq, tag, payload, version, command_id);

-- delete_timers --
-- deletes this actor's pending keyed timers that the batch replaced or cancelled
DELETE FROM {schema}.outbox
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s AND timer_key = ANY(%(keys)s::text[]) AND kind = 'intent';

-- cancel_jobs_unstarted --
-- cancelling a key deletes its job rows that never ran and never reported (semantics §5.8.1)
DELETE FROM {schema}.outbox
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s AND kind = 'job' AND timer_key = ANY(%(keys)s::text[])
  AND attempts = 0 AND NOT running;

-- cancel_jobs_started --
-- the other matches are marked cancelled and free their key (semantics §5.8.2)
UPDATE {schema}.outbox
SET cancelled_at_ms = %(now)s, timer_key = NULL, waiting = false,
    due_at_ms = CASE WHEN running THEN due_at_ms ELSE least(due_at_ms, %(now)s) END
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s AND kind = 'job' AND timer_key = ANY(%(keys)s::text[])
RETURNING intent_id, running;

-- insert_outbox --
-- stages the batch's intents, timers and jobs (each with the staging span's traceparent, or NULL); relative delays count from the commit, whose clock is passed in (bounded from admission_read's: one clock reading per turn); a job's claim rank from its ready time, priority and max_wait (migration 0006)
INSERT INTO {schema}.outbox
    (routing_key, intent_id, bucket, kind, tenant_id, actor_type, actor_id, target_type,
     target_id, command, payload, payload_version, caller, due_at_ms, scheduled_at_ms,
     ready_at_ms, timer_key, traceparent, priority, rank_ms)
SELECT %(rk)s, o.intent_id, %(bucket)s, o.kind, %(tenant)s, %(type)s, %(id)s, o.target_type,
       o.target_id, o.command, o.payload, o.payload_version, o.caller, d.due, d.due,
       r.ready, o.timer_key, %(traceparent)s::text, o.priority,
       -- least() ignores a NULL max_wait: without one the rank is priority, then ready time
       least(r.ready - o.priority * 10000000000000::bigint,
             r.ready + o.max_wait - 90000000000000::bigint)
FROM unnest(%(intent_ids)s::text[], %(kinds)s::text[], %(target_types)s::text[],
            %(target_ids)s::text[], %(commands)s::text[], %(payloads)s::text[],
            %(payload_versions)s::int[], %(callers)s::text[], %(delays)s::bigint[],
            %(ats)s::bigint[], %(timer_keys)s::text[], %(ords)s::int[],
            %(priorities)s::smallint[], %(max_waits)s::bigint[])
    AS o(intent_id, kind, target_type, target_id, command, payload, payload_version, caller,
         delay, at, timer_key, ord, priority, max_wait)
CROSS JOIN LATERAL (
    SELECT coalesce(o.at, %(commit)s::bigint + coalesce(o.delay, 0)) AS due
) d
CROSS JOIN LATERAL (
    SELECT
       -- capped jobs of one (actor, job) get strictly increasing ready times in enqueue order
       -- (§5.3.4); the two probes follow the running / not-running partial job indexes
       CASE WHEN o.kind = 'job' AND o.ord > 0 THEN greatest(d.due + o.ord - 1, greatest(
           (SELECT max(x.ready_at_ms) FROM {schema}.outbox x
            WHERE x.routing_key = %(rk)s AND x.tenant_id = %(tenant)s
              AND x.actor_type = %(type)s AND x.actor_id = %(id)s AND x.command = o.command
              AND x.kind = 'job' AND NOT x.running AND x.scheduled_at_ms <= d.due),
           (SELECT max(x.ready_at_ms) FROM {schema}.outbox x
            WHERE x.routing_key = %(rk)s AND x.tenant_id = %(tenant)s
              AND x.actor_type = %(type)s AND x.actor_id = %(id)s AND x.command = o.command
              AND x.kind = 'job' AND x.running AND x.scheduled_at_ms <= d.due),
           d.due - 1) + o.ord)
            WHEN o.kind = 'job' THEN d.due END AS ready
) r
RETURNING intent_id, kind, due_at_ms;

-- insert_receipts --
-- records each committed command's outcome under its command id
INSERT INTO {schema}.receipts
    (routing_key, tenant_id, actor_type, actor_id, command_id, command, payload_hash, caller_key,
     outcome, expires_at_ms)
SELECT %(rk)s, %(tenant)s, %(type)s, %(id)s, r.command_id, r.command, r.payload_hash,
       r.caller_key, r.outcome::jsonb, r.expires_at_ms
FROM unnest(%(command_ids)s::text[], %(commands)s::text[], %(payload_hashes)s::text[],
            %(caller_keys)s::text[], %(outcomes)s::text[], %(expires)s::bigint[])
    AS r(command_id, command, payload_hash, caller_key, outcome, expires_at_ms);

-- query_actor --
-- an unlocked read of committed state for queries
SELECT a.version, a.created, a.event_seq, a.state, a.state_version
FROM {schema}.actors a
WHERE a.routing_key = %(rk)s AND a.tenant_id = %(tenant)s AND a.actor_type = %(type)s
  AND a.actor_id = %(id)s;

-- inspect_receipts --
-- every receipt of one actor, for inspection and tests
SELECT command_id, command, payload_hash, caller_key, outcome, expires_at_ms
FROM {schema}.receipts
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s
ORDER BY command_id;

-- inspect_outbox --
-- every outbox row an actor sent or owns, for inspection and tests
SELECT intent_id, kind, target_type, target_id, command, payload, caller, due_at_ms,
       scheduled_at_ms, ready_at_ms, attempts, last_error, ambiguous, maybe_applied, running,
       waiting, final_failure, cancelled_at_ms, timer_key, bucket, routing_key, payload_version,
       parked_at_ms
FROM {schema}.outbox
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s
ORDER BY scheduled_at_ms, intent_id;

-- inspect_events --
-- every retained event of one actor, oldest first
SELECT seq, tag, payload, payload_version, command_id, emitted_at_ms
FROM {schema}.events
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s
ORDER BY seq;

-- claim_intents --
-- one claim per pass: due intents of hosted types, per-bucket probes, SKIP LOCKED, leased; returns its clock
WITH clock AS MATERIALIZED (
    SELECT {schema}.stmt_ms(%(off)s::bigint) AS now
),
candidates AS MATERIALIZED (
    SELECT p.routing_key, p.intent_id, p.due_at_ms
    FROM generate_series(-128, 127) AS b(bucket)
    CROSS JOIN clock
    CROSS JOIN LATERAL (
        SELECT o.routing_key, o.intent_id, o.due_at_ms
        FROM {schema}.outbox o
        WHERE o.bucket = b.bucket AND o.kind = 'intent' AND o.due_at_ms <= clock.now
          AND o.parked_at_ms IS NULL
          AND o.target_type = ANY(%(types)s::text[])
        ORDER BY o.due_at_ms
        LIMIT %(probe)s
    ) p
    ORDER BY p.due_at_ms
    LIMIT %(probe)s
),
locked AS (
    SELECT o.routing_key, o.intent_id, o.attempts
    FROM {schema}.outbox o
    JOIN candidates c ON c.routing_key = o.routing_key AND c.intent_id = o.intent_id
    CROSS JOIN clock
    WHERE o.kind = 'intent' AND o.due_at_ms <= clock.now
    ORDER BY o.due_at_ms
    LIMIT %(free)s
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE {schema}.outbox o
SET attempts = l.attempts + 1,
    due_at_ms = clock.now + greatest(%(lease)s::bigint,
                                     least(1000::bigint << least(l.attempts, 31),
                                           %(max_backoff)s::bigint))
FROM locked l, clock
WHERE o.routing_key = l.routing_key AND o.intent_id = l.intent_id
RETURNING o.routing_key, o.intent_id, o.tenant_id, o.actor_type, o.actor_id, o.target_type,
          o.target_id, o.command, o.payload, o.payload_version, o.caller, o.attempts,
          o.scheduled_at_ms,
          o.timer_key, o.traceparent, o.due_at_ms AS claimed_until, clock.now,
          (SELECT count(*) FROM candidates) AS candidates;

-- settle_intents --
-- delivered intents end in one statement: each deleted only under its own claim token
DELETE FROM {schema}.outbox o
USING unnest(%(rks)s::bigint[], %(intent_ids)s::text[], %(tokens)s::bigint[])
    AS s(routing_key, intent_id, token)
WHERE o.routing_key = s.routing_key AND o.intent_id = s.intent_id AND o.kind = 'intent'
  AND o.due_at_ms = s.token;

-- backoff_intent --
-- a failed delivery waits min(2^(attempts-1) s, max_backoff), only under its claim token
UPDATE {schema}.outbox
SET due_at_ms = {schema}.stmt_ms(%(off)s::bigint)
        + least(1000::bigint << least(greatest(attempts - 1, 0), 31), %(max_backoff)s::bigint),
    last_error = %(error)s
WHERE routing_key = %(rk)s AND intent_id = %(intent_id)s AND kind = 'intent'
  AND due_at_ms = %(token)s
RETURNING due_at_ms;

-- release_intent --
-- a stopping runner hands an undelivered claim back: due now, only under its claim token
UPDATE {schema}.outbox
SET due_at_ms = {schema}.stmt_ms(%(off)s::bigint)
WHERE routing_key = %(rk)s AND intent_id = %(intent_id)s AND kind = 'intent'
  AND due_at_ms = %(token)s;

-- park_intent --
-- a claimed intent the code cannot deliver is parked (evolution E3): every column kept, the claim's attempt undone, the cause recorded; only under its claim token
UPDATE {schema}.outbox
SET parked_at_ms = {schema}.stmt_ms(%(off)s::bigint), attempts = greatest(attempts - 1, 0),
    last_error = %(error)s
WHERE routing_key = %(rk)s AND intent_id = %(intent_id)s AND kind = 'intent'
  AND due_at_ms = %(token)s AND parked_at_ms IS NULL
RETURNING intent_id;

-- release_intent_uncounted --
-- a claimed intent at a payload version above the code's is handed back without counting the attempt, due after a short wait (a newer runner may take it), only under its claim token
UPDATE {schema}.outbox
SET due_at_ms = {schema}.stmt_ms(%(off)s::bigint) + %(wait)s::bigint,
    attempts = greatest(attempts - 1, 0), last_error = %(error)s
WHERE routing_key = %(rk)s AND intent_id = %(intent_id)s AND kind = 'intent'
  AND due_at_ms = %(token)s;

-- read_events --
-- one actor's retained events after a cursor, with the sequence bounds to detect gaps
SELECT a.event_seq,
       (SELECT min(e.seq) FROM {schema}.events e
        WHERE e.routing_key = a.routing_key AND e.tenant_id = a.tenant_id
          AND e.actor_type = a.actor_type AND e.actor_id = a.actor_id) AS first_seq,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                    'seq', e.seq, 'tag', e.tag, 'payload', e.payload,
                    'payload_version', e.payload_version,
                    'command_id', e.command_id, 'emitted_at_ms', e.emitted_at_ms) ORDER BY e.seq)
                 FROM (SELECT * FROM {schema}.events e
                       WHERE e.routing_key = a.routing_key AND e.tenant_id = a.tenant_id
                         AND e.actor_type = a.actor_type AND e.actor_id = a.actor_id
                         AND e.seq > %(after)s::bigint
                       ORDER BY e.seq LIMIT %(limit)s) e), '[]'::jsonb) AS events
FROM {schema}.actors a
WHERE a.routing_key = %(rk)s AND a.tenant_id = %(tenant)s AND a.actor_type = %(type)s
  AND a.actor_id = %(id)s;

-- insert_ticks --
-- the actor's missing schedule ticks (at most one pending per entry, by the timer-key index)
INSERT INTO {schema}.outbox
    (routing_key, intent_id, bucket, kind, tenant_id, actor_type, actor_id, target_type,
     target_id, command, payload, payload_version, caller, due_at_ms, scheduled_at_ms, timer_key)
SELECT %(rk)s, t.intent_id, %(bucket)s, 'intent', %(tenant)s, %(type)s, %(id)s, %(type)s, %(id)s,
       t.command, '{}', t.version, %(caller)s, t.due, t.due, t.key
FROM unnest(%(intent_ids)s::text[], %(commands)s::text[], %(dues)s::bigint[], %(keys)s::text[],
            %(versions)s::int[])
    AS t(intent_id, command, due, key, version)
ON CONFLICT DO NOTHING;

-- rewrite_tick --
-- a settled (or skipped) tick becomes the next one: new id, next fire time, payload version of this code's command, under its claim token
UPDATE {schema}.outbox
SET intent_id = %(new_id)s, due_at_ms = %(due)s, scheduled_at_ms = %(due)s, attempts = 0,
    last_error = NULL, payload_version = %(version)s
WHERE routing_key = %(rk)s AND intent_id = %(intent_id)s AND kind = 'intent'
  AND due_at_ms = %(token)s;

-- outbox_overview --
-- operators' view of pending rows across actors, oldest due first
SELECT intent_id, kind, tenant_id, target_type, target_id, command, due_at_ms, attempts,
       last_error, running, cancelled_at_ms, timer_key, parked_at_ms
FROM {schema}.outbox
ORDER BY due_at_ms
LIMIT %(limit)s;

-- jobs_overview --
-- operators' view of job rows across actors, oldest due first, with v_jobs' status (waiting_slot, waiting_rate: flow control, migration 0006) and priority
WITH clock AS MATERIALIZED (
    SELECT {schema}.now_ms(0) AS now
),
live AS MATERIALIZED (
    SELECT r.actor_type, r.command, count(*) AS n
    FROM {schema}.outbox r, clock
    WHERE r.kind = 'job' AND r.running AND r.due_at_ms > clock.now
    GROUP BY r.actor_type, r.command
)
SELECT o.intent_id AS job_id, o.tenant_id, o.actor_type, o.actor_id, o.command AS job,
       o.attempts, o.running, o.waiting, o.ambiguous, o.maybe_applied, o.final_failure,
       o.cancelled_at_ms, o.due_at_ms, o.last_error, o.parked_at_ms, o.priority,
       CASE WHEN o.parked_at_ms IS NOT NULL THEN 'parked'
            WHEN o.cancelled_at_ms IS NOT NULL THEN 'cancelled'
            WHEN o.running THEN 'running'
            WHEN o.waiting THEN 'waiting'
            WHEN o.waiting_for = 'rate' THEN 'waiting_rate'
            WHEN o.due_at_ms <= clock.now AND l.concurrency <= coalesce(v.n, 0) THEN 'waiting_slot'
            WHEN o.attempts = 0 THEN 'pending'
            ELSE 'backoff' END AS status
FROM {schema}.outbox o
CROSS JOIN clock
LEFT JOIN {schema}.job_limits l ON l.actor_type = o.actor_type AND l.job = o.command
LEFT JOIN live v ON v.actor_type = o.actor_type AND v.command = o.command
WHERE o.kind = 'job'
ORDER BY o.due_at_ms
LIMIT %(limit)s;

-- cancel_job_by_id_unstarted --
-- an operator's cancel deletes the job if it never ran (semantics §5.8.1), found by its id
DELETE FROM {schema}.outbox
WHERE intent_id = %(job_id)s AND kind = 'job' AND attempts = 0 AND NOT running
RETURNING intent_id;

-- cancel_job_by_id_started --
-- otherwise marks it cancelled, freeing its key (semantics §5.8.2), at one clock reading (a materialised CTE, no function inside CASE); an attempt notices at renewal
WITH clock AS MATERIALIZED (
    SELECT {schema}.now_ms(%(off)s::bigint) AS now
)
UPDATE {schema}.outbox o
SET cancelled_at_ms = clock.now, timer_key = NULL, waiting = false,
    due_at_ms = CASE WHEN o.running THEN o.due_at_ms ELSE least(o.due_at_ms, clock.now) END
FROM clock
WHERE o.intent_id = %(job_id)s::text AND o.kind = 'job' AND o.cancelled_at_ms IS NULL
RETURNING o.intent_id, o.running;

-- release_skewed_intents --
-- claimed intents of hosted types (attempts > 0) due further ahead than a claim or backoff can make them (skew_ms: written before the clock moved back) become due now; returns how far ahead each was
WITH clock AS MATERIALIZED (
    SELECT {schema}.stmt_ms(%(off)s::bigint) AS now
),
skewed AS (
    SELECT o.routing_key, o.intent_id, o.due_at_ms - clock.now AS ahead_ms
    FROM {schema}.outbox o
    CROSS JOIN clock
    WHERE o.kind = 'intent' AND o.attempts > 0
      AND o.due_at_ms > clock.now + %(skew_ms)s::bigint
      AND o.target_type = ANY(%(types)s::text[])
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE {schema}.outbox o
SET due_at_ms = clock.now
FROM skewed s, clock
WHERE o.routing_key = s.routing_key AND o.intent_id = s.intent_id
RETURNING o.intent_id, o.target_type, o.target_id, o.attempts, s.ahead_ms;
