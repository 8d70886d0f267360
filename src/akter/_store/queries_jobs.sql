-- The job executor's statements (semantics §5): claims, renewals, guarded settles, capped
-- groups and dead letters. Same block format as queries.sql; loaded into the same catalogue.
-- `now` is computed once per statement from statement_timestamp() (stmt_ms) plus the offset.

-- claim_jobs --
-- due job rows of the uncapped types this runner executes, highest rank first, probed per bucket, SKIP LOCKED, leased with ambiguity pre-marked; at most slots (NULL: no cap) rows
WITH clock AS MATERIALIZED (
    SELECT {schema}.stmt_ms(%(off)s::bigint) AS now
),
mine AS MATERIALIZED (
    SELECT m.actor_type, m.job, m.max_attempts
    FROM unnest(%(types)s::text[], %(jobs)s::text[], %(max_attempts)s::int[])
        AS m(actor_type, job, max_attempts)
),
candidates AS MATERIALIZED (
    SELECT p.routing_key, p.intent_id, p.rank_ms
    FROM generate_series(-128, 127) AS b(bucket)
    CROSS JOIN clock
    CROSS JOIN LATERAL (
        SELECT o.routing_key, o.intent_id, o.rank_ms
        FROM {schema}.outbox o
        WHERE o.bucket = b.bucket AND o.kind = 'job' AND o.due_at_ms <= clock.now
          AND o.parked_at_ms IS NULL
          AND (o.actor_type, o.command) IN (SELECT actor_type, job FROM mine)
        ORDER BY o.rank_ms
        LIMIT %(probe)s
    ) p
    ORDER BY p.rank_ms
    LIMIT %(probe)s
),
locked AS (
    SELECT o.routing_key, o.intent_id, o.attempts, o.ambiguous, o.maybe_applied,
           o.final_failure, o.cancelled_at_ms IS NOT NULL AS cancelled, m.max_attempts,
           o.last_error AS prior_error, o.waiting_for AS prior_waiting_for,
           (o.cancelled_at_ms IS NULL AND o.attempts < m.max_attempts
            AND NOT o.final_failure) AS attempting
    FROM {schema}.outbox o
    JOIN candidates c ON c.routing_key = o.routing_key AND c.intent_id = o.intent_id
    JOIN mine m ON m.actor_type = o.actor_type AND m.job = o.command
    CROSS JOIN clock
    WHERE o.kind = 'job' AND o.due_at_ms <= clock.now
    ORDER BY o.rank_ms
    -- least() ignores the NULL of an uncapped claim
    LIMIT greatest(0, least(%(free)s::bigint, %(slots)s::bigint))
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE {schema}.outbox o
SET due_at_ms = clock.now + %(lease)s::bigint,
    waiting = false, waiting_for = NULL,
    attempts = CASE WHEN l.attempting THEN l.attempts + 1 ELSE l.attempts END,
    running = l.attempting,
    ambiguous = CASE WHEN l.attempting THEN true ELSE l.ambiguous END,
    maybe_applied = CASE WHEN l.attempting THEN l.maybe_applied OR (l.attempts > 0 AND l.ambiguous)
                         ELSE l.maybe_applied END,
    last_error = CASE WHEN l.attempting
                      THEN 'Attempt ' || (l.attempts + 1) || ' ended without reporting an outcome'
                      ELSE o.last_error END
FROM locked l, clock
WHERE o.routing_key = l.routing_key AND o.intent_id = l.intent_id
RETURNING o.routing_key, o.intent_id, o.tenant_id, o.actor_type, o.actor_id, o.command,
          o.payload, o.payload_version, o.caller, o.attempts, o.last_error, o.ambiguous,
          o.maybe_applied, o.traceparent, o.due_at_ms AS claimed_until, l.cancelled,
          (NOT l.cancelled AND (l.attempts >= l.max_attempts OR l.final_failure)) AS exhausted,
          l.attempts AS prior_attempts, l.ambiguous AS prior_ambiguous,
          l.maybe_applied AS prior_maybe_applied, l.prior_error, l.prior_waiting_for,
          (SELECT count(*) FROM candidates) AS candidates;

-- claim_jobs_keyed --
-- the given job rows (this runner just committed them) that are due, unparked and of the uncapped types this runner executes, highest rank first, SKIP LOCKED, leased with ambiguity pre-marked like claim_jobs; by primary key, so a cached generic plan is as good as any
WITH clock AS MATERIALIZED (
    SELECT {schema}.stmt_ms(%(off)s::bigint) AS now
),
mine AS MATERIALIZED (
    SELECT m.actor_type, m.job, m.max_attempts
    FROM unnest(%(types)s::text[], %(jobs)s::text[], %(max_attempts)s::int[])
        AS m(actor_type, job, max_attempts)
),
locked AS (
    SELECT o.routing_key, o.intent_id, o.attempts, o.ambiguous, o.maybe_applied,
           o.final_failure, o.cancelled_at_ms IS NOT NULL AS cancelled, m.max_attempts,
           o.last_error AS prior_error, o.waiting_for AS prior_waiting_for,
           (o.cancelled_at_ms IS NULL AND o.attempts < m.max_attempts
            AND NOT o.final_failure) AS attempting
    FROM unnest(%(rks)s::bigint[], %(ids)s::text[]) AS k(routing_key, intent_id)
    JOIN {schema}.outbox o ON o.routing_key = k.routing_key AND o.intent_id = k.intent_id
    JOIN mine m ON m.actor_type = o.actor_type AND m.job = o.command
    CROSS JOIN clock
    WHERE o.kind = 'job' AND o.due_at_ms <= clock.now AND o.parked_at_ms IS NULL
    ORDER BY o.rank_ms
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE {schema}.outbox o
SET due_at_ms = clock.now + %(lease)s::bigint,
    waiting = false, waiting_for = NULL,
    attempts = CASE WHEN l.attempting THEN l.attempts + 1 ELSE l.attempts END,
    running = l.attempting,
    ambiguous = CASE WHEN l.attempting THEN true ELSE l.ambiguous END,
    maybe_applied = CASE WHEN l.attempting THEN l.maybe_applied OR (l.attempts > 0 AND l.ambiguous)
                         ELSE l.maybe_applied END,
    last_error = CASE WHEN l.attempting
                      THEN 'Attempt ' || (l.attempts + 1) || ' ended without reporting an outcome'
                      ELSE o.last_error END
FROM locked l, clock
WHERE o.routing_key = l.routing_key AND o.intent_id = l.intent_id
RETURNING o.routing_key, o.intent_id, o.tenant_id, o.actor_type, o.actor_id, o.command,
          o.payload, o.payload_version, o.caller, o.attempts, o.last_error, o.ambiguous,
          o.maybe_applied, o.traceparent, o.due_at_ms AS claimed_until, l.cancelled,
          (NOT l.cancelled AND (l.attempts >= l.max_attempts OR l.final_failure)) AS exhausted,
          l.attempts AS prior_attempts, l.ambiguous AS prior_ambiguous,
          l.maybe_applied AS prior_maybe_applied, l.prior_error, l.prior_waiting_for;

-- discover_capped_groups --
-- the (actor, job) groups of this runner's capped job types with due rows, earliest first, no locks
WITH clock AS MATERIALIZED (
    SELECT {schema}.stmt_ms(%(off)s::bigint) AS now
),
mine AS MATERIALIZED (
    SELECT m.actor_type, m.job
    FROM unnest(%(types)s::text[], %(jobs)s::text[]) AS m(actor_type, job)
)
SELECT p.routing_key, p.tenant_id, p.actor_type, p.actor_id, p.command,
       min(p.due_at_ms) AS due_at_ms
FROM generate_series(-128, 127) AS b(bucket)
CROSS JOIN clock
CROSS JOIN LATERAL (
    SELECT o.routing_key, o.tenant_id, o.actor_type, o.actor_id, o.command, o.due_at_ms
    FROM {schema}.outbox o
    WHERE o.bucket = b.bucket AND o.kind = 'job' AND o.due_at_ms <= clock.now
      AND o.parked_at_ms IS NULL
      AND (o.actor_type, o.command) IN (SELECT actor_type, job FROM mine)
    ORDER BY o.due_at_ms
    LIMIT %(probe)s
) p
GROUP BY p.routing_key, p.tenant_id, p.actor_type, p.actor_id, p.command
ORDER BY min(p.due_at_ms)
LIMIT %(free)s;

-- job_limit_upsert --
-- records a job type's deployment-wide cap (the declared one of the runner that starts last)
INSERT INTO {schema}.job_limits (actor_type, job, concurrency)
SELECT m.actor_type, m.job, m.concurrency
FROM unnest(%(types)s::text[], %(jobs)s::text[], %(caps)s::int[]) AS m(actor_type, job, concurrency)
ON CONFLICT (actor_type, job) DO UPDATE SET concurrency = excluded.concurrency;

-- job_limit_lock --
-- the type lock: serializes one capped type's claims across runners (the row is locked even when its cap is unchanged), recording the claimer's declared cap
INSERT INTO {schema}.job_limits (actor_type, job, concurrency)
VALUES (%(type)s, %(job)s, %(cap)s)
ON CONFLICT (actor_type, job) DO UPDATE SET concurrency = excluded.concurrency
WHERE {schema}.job_limits.concurrency <> excluded.concurrency;

-- job_type_live --
-- a capped type's live attempts across actors: running rows whose lease has not ended; read under the type lock (job_limit_lock)
SELECT count(*) AS live
FROM {schema}.outbox
WHERE kind = 'job' AND running AND actor_type = %(type)s AND command = ANY(%(jobs)s::text[])
  AND due_at_ms > {schema}.stmt_ms(%(off)s::bigint);

-- job_group_settings --
-- transaction-local lock wait of one capped group's or capped type's claim or wake, and the idle bound that ends the transaction on the server if its session goes silent inside it (a frozen claimer gives its locks back)
SELECT set_config('lock_timeout', %(lock_timeout)s, true),
       set_config('idle_in_transaction_session_timeout', %(idle_bound)s, true);

-- job_group_lock --
-- the group lock: serializes a group's claims and wakes, conflicts with turns, not with key-share locks
SELECT 1 FROM {schema}.actors
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s
FOR NO KEY UPDATE;

-- job_group_lock_bounded --
-- job_group_settings and job_group_lock in one statement: the settings are a one-time filter, evaluated before the row is fetched, so the lock wait is bounded by them (like lock_actor); plain PostgreSQL only (on Citus the lock waits on a worker: citus_job_group_settings, then job_group_lock)
SELECT 1 FROM {schema}.actors
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s
  AND (SELECT set_config('lock_timeout', %(lock_timeout)s, true) IS NOT NULL
              AND set_config('idle_in_transaction_session_timeout', %(idle_bound)s, true)
                  IS NOT NULL)
FOR NO KEY UPDATE;

-- job_group_lock_running --
-- waits for in-flight renewals and settles of the group's running rows
SELECT intent_id FROM {schema}.outbox
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s AND command = %(job)s AND kind = 'job' AND running
FOR UPDATE;

-- claim_capped_group --
-- claims a group's due cancelled rows and its oldest ready rows up to the cap minus live attempts, and at most slots (NULL: no deployment-wide cap) of them; every other due uncancelled row of the group then waits a lease, off the due index, until woken (deferred), unless the claim took all slots (rows the deployment-wide cap held back stay due for the next pass)
WITH clock AS MATERIALIZED (
    SELECT {schema}.stmt_ms(%(off)s::bigint) AS now
),
live AS MATERIALIZED (
    SELECT count(*) AS n
    FROM {schema}.outbox o, clock
    WHERE o.routing_key = %(rk)s AND o.tenant_id = %(tenant)s AND o.actor_type = %(type)s
      AND o.actor_id = %(id)s AND o.command = %(job)s AND o.kind = 'job'
      AND o.running AND o.due_at_ms > clock.now
),
settle AS MATERIALIZED (
    SELECT o.routing_key, o.intent_id
    FROM {schema}.outbox o, clock
    WHERE o.routing_key = %(rk)s AND o.tenant_id = %(tenant)s AND o.actor_type = %(type)s
      AND o.actor_id = %(id)s AND o.command = %(job)s AND o.kind = 'job'
      AND o.cancelled_at_ms IS NOT NULL AND o.due_at_ms <= clock.now
      AND o.parked_at_ms IS NULL
    ORDER BY o.due_at_ms, o.intent_id
    LIMIT %(free)s
    FOR UPDATE OF o SKIP LOCKED
),
next AS MATERIALIZED (
    SELECT o.routing_key, o.intent_id
    FROM {schema}.outbox o, clock
    WHERE o.routing_key = %(rk)s AND o.tenant_id = %(tenant)s AND o.actor_type = %(type)s
      AND o.actor_id = %(id)s AND o.command = %(job)s AND o.kind = 'job'
      AND o.cancelled_at_ms IS NULL AND o.parked_at_ms IS NULL
      AND (o.due_at_ms <= clock.now OR (o.waiting AND NOT o.running))
    ORDER BY o.ready_at_ms, o.intent_id
    LIMIT greatest(0, least(%(cap)s::bigint - (SELECT n FROM live),
                            %(free)s::bigint - (SELECT count(*) FROM settle),
                            %(slots)s::bigint))
    FOR UPDATE OF o SKIP LOCKED
),
locked AS (
    SELECT o.routing_key, o.intent_id, o.attempts, o.ambiguous, o.maybe_applied,
           o.final_failure, o.cancelled_at_ms IS NOT NULL AS cancelled,
           o.last_error AS prior_error, o.waiting_for AS prior_waiting_for,
           (o.cancelled_at_ms IS NULL AND o.attempts < %(max_attempts)s::int
            AND NOT o.final_failure) AS attempting
    FROM {schema}.outbox o
    WHERE o.routing_key = %(rk)s
      AND o.intent_id IN (SELECT intent_id FROM settle UNION ALL SELECT intent_id FROM next)
),
-- disjoint from the claimed rows (one statement updates no row twice); reads settle and next,
-- not locked, so that Citus still routes the statement to the group's shard
deferred AS (
    UPDATE {schema}.outbox d
    SET waiting = true, running = false, due_at_ms = clock.now + %(lease)s::bigint
    FROM clock
    WHERE d.routing_key = %(rk)s
      AND d.intent_id IN (
          SELECT o.intent_id FROM {schema}.outbox o, clock
          WHERE o.routing_key = %(rk)s AND o.tenant_id = %(tenant)s AND o.actor_type = %(type)s
            AND o.actor_id = %(id)s AND o.command = %(job)s AND o.kind = 'job'
            AND o.cancelled_at_ms IS NULL AND o.due_at_ms <= clock.now
            AND o.parked_at_ms IS NULL
            AND o.intent_id NOT IN (SELECT intent_id FROM settle
                                    UNION ALL SELECT intent_id FROM next)
            AND (%(slots)s::bigint IS NULL
                 OR (SELECT count(*) FROM settle) + (SELECT count(*) FROM next) < %(slots)s::bigint)
          FOR UPDATE OF o SKIP LOCKED
      )
    RETURNING d.intent_id
)
UPDATE {schema}.outbox o
SET due_at_ms = clock.now + %(lease)s::bigint,
    waiting = false, waiting_for = NULL,
    attempts = CASE WHEN l.attempting THEN l.attempts + 1 ELSE l.attempts END,
    running = l.attempting,
    ambiguous = CASE WHEN l.attempting THEN true ELSE l.ambiguous END,
    maybe_applied = CASE WHEN l.attempting THEN l.maybe_applied OR (l.attempts > 0 AND l.ambiguous)
                         ELSE l.maybe_applied END,
    last_error = CASE WHEN l.attempting
                      THEN 'Attempt ' || (l.attempts + 1) || ' ended without reporting an outcome'
                      ELSE o.last_error END
FROM locked l, clock
WHERE o.routing_key = l.routing_key AND o.intent_id = l.intent_id
RETURNING o.routing_key, o.intent_id, o.tenant_id, o.actor_type, o.actor_id, o.command,
          o.payload, o.payload_version, o.caller, o.attempts, o.last_error, o.ambiguous,
          o.maybe_applied, o.traceparent, o.due_at_ms AS claimed_until, l.cancelled,
          (NOT l.cancelled AND (l.attempts >= %(max_attempts)s::int OR l.final_failure))
              AS exhausted,
          l.attempts AS prior_attempts, l.ambiguous AS prior_ambiguous,
          l.maybe_applied AS prior_maybe_applied, l.prior_error, l.prior_waiting_for,
          0::bigint AS candidates;

-- job_groups_lock_skip --
-- the group locks of a batch of capped groups (plain PostgreSQL): each group's actor row only if nobody holds it (SKIP LOCKED: a held group goes on to the one-group claim, which waits for it), with the claims' lock wait and idle bound as a one-time filter evaluated first (as in job_group_lock_bounded); the 1-based positions of the groups it locked
SELECT g.i
FROM unnest(%(rks)s::bigint[], %(tenants)s::text[], %(types)s::text[], %(ids)s::text[])
     WITH ORDINALITY AS g(rk, tenant, type, id, i)
JOIN {schema}.actors a
  ON a.routing_key = g.rk AND a.tenant_id = g.tenant AND a.actor_type = g.type AND a.actor_id = g.id
WHERE (SELECT set_config('lock_timeout', %(lock_timeout)s, true) IS NOT NULL
              AND set_config('idle_in_transaction_session_timeout', %(idle_bound)s, true)
                  IS NOT NULL)
ORDER BY g.i
FOR NO KEY UPDATE OF a SKIP LOCKED;

-- job_groups_lock_running --
-- job_group_lock_running for a batch of groups whose locks this transaction holds: waits for in-flight renewals and settles of their running rows
SELECT o.intent_id
FROM unnest(%(rks)s::bigint[], %(tenants)s::text[], %(types)s::text[], %(ids)s::text[],
            %(jobs)s::text[]) AS g(rk, tenant, type, id, job)
JOIN {schema}.outbox o
  ON o.routing_key = g.rk AND o.tenant_id = g.tenant AND o.actor_type = g.type
 AND o.actor_id = g.id AND o.command = g.job
WHERE o.kind = 'job' AND o.running
FOR UPDATE OF o;

-- wake_waiting_job_if_free --
-- in a capped settle's own transaction, after the settle: the group lock only if nobody holds it (SKIP LOCKED: a claim holding it waits for the settled row, so waiting here could deadlock), then wake_waiting_job under it; held false: not taken, the executor wakes the group in a transaction of its own after this one commits
WITH grp AS MATERIALIZED (
    SELECT 1 FROM {schema}.actors
    WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
      AND actor_id = %(id)s
    FOR NO KEY UPDATE SKIP LOCKED
), woken AS (
    UPDATE {schema}.outbox
    SET due_at_ms = least(due_at_ms, {schema}.stmt_ms(%(off)s::bigint)), waiting = false
    WHERE routing_key = %(rk)s AND waiting AND NOT running AND cancelled_at_ms IS NULL
      AND parked_at_ms IS NULL
      AND intent_id = (
          SELECT o.intent_id FROM {schema}.outbox o
          WHERE EXISTS (SELECT 1 FROM grp)
            AND o.routing_key = %(rk)s AND o.tenant_id = %(tenant)s AND o.actor_type = %(type)s
            AND o.actor_id = %(id)s AND o.command = %(job)s AND o.kind = 'job'
            AND o.waiting AND NOT o.running AND o.cancelled_at_ms IS NULL
            AND o.parked_at_ms IS NULL
          ORDER BY o.ready_at_ms, o.intent_id
          LIMIT 1
          FOR UPDATE OF o SKIP LOCKED
      )
    RETURNING intent_id
)
SELECT EXISTS (SELECT 1 FROM grp) AS held, EXISTS (SELECT 1 FROM woken) AS woke;

-- wake_waiting_job --
-- makes the group's oldest waiting row due now; never pulls back the lease end of a row just claimed
UPDATE {schema}.outbox
SET due_at_ms = least(due_at_ms, {schema}.stmt_ms(%(off)s::bigint)), waiting = false
WHERE routing_key = %(rk)s AND waiting AND NOT running AND cancelled_at_ms IS NULL
  AND parked_at_ms IS NULL
  -- a scalar sub-select runs once (an InitPlan): with IN it could be re-run per visited row,
  -- skip the row just updated and wake the next one too
  AND intent_id = (
      SELECT o.intent_id FROM {schema}.outbox o
      WHERE o.routing_key = %(rk)s AND o.tenant_id = %(tenant)s AND o.actor_type = %(type)s
        AND o.actor_id = %(id)s AND o.command = %(job)s AND o.kind = 'job'
        AND o.waiting AND NOT o.running AND o.cancelled_at_ms IS NULL
        AND o.parked_at_ms IS NULL
      ORDER BY o.ready_at_ms, o.intent_id
      LIMIT 1
      FOR UPDATE OF o SKIP LOCKED
  )
RETURNING intent_id;

-- rate_take --
-- at most n tokens of each of a claim's buckets in one upsert (created full, else refilled to now under the row lock, in key order): only those due within horizon_ms, so the level never goes below -limit·horizon; returns each bucket's level before the take and how many it granted
WITH clock AS MATERIALIZED (
    SELECT {schema}.stmt_ms(%(off)s::bigint) AS now
),
wanted AS MATERIALIZED (
    SELECT w.type, w.job, w.no, w.key, w.per_ms, w.burst, w.n
    FROM unnest(%(types)s::text[], %(jobs)s::text[], %(nos)s::smallint[], %(keys)s::text[],
                %(per_ms)s::float8[], %(bursts)s::float8[], %(wants)s::int[])
        AS w(type, job, no, key, per_ms, burst, n)
)
INSERT INTO {schema}.rate_buckets AS b (actor_type, job, limit_no, key, tokens, at_ms, granted)
SELECT w.type, w.job, w.no, w.key, w.burst - g.n, clock.now, g.n
FROM wanted w, clock,
     LATERAL (SELECT least(w.n, greatest(0, floor(w.burst + w.per_ms * %(horizon_ms)s::float8)))::int
              AS n) g
ORDER BY w.type, w.job, w.no, w.key
ON CONFLICT (actor_type, job, limit_no, key) DO UPDATE
SET tokens = (SELECT l.level - least(w.n, greatest(0, floor(l.level + w.per_ms * %(horizon_ms)s::float8)))
              FROM wanted w,
                   LATERAL (SELECT least(w.burst, b.tokens + greatest(0, excluded.at_ms - b.at_ms)
                                                              * w.per_ms) AS level) l
              WHERE w.type = b.actor_type AND w.job = b.job AND w.no = b.limit_no
                AND w.key = b.key),
    granted = (SELECT least(w.n, greatest(0, floor(l.level + w.per_ms * %(horizon_ms)s::float8)))::int
               FROM wanted w,
                    LATERAL (SELECT least(w.burst, b.tokens + greatest(0, excluded.at_ms - b.at_ms)
                                                               * w.per_ms) AS level) l
               WHERE w.type = b.actor_type AND w.job = b.job AND w.no = b.limit_no
                 AND w.key = b.key),
    at_ms = greatest(b.at_ms, excluded.at_ms)
RETURNING b.actor_type, b.job, b.limit_no, b.key, b.tokens + b.granted AS level, b.granted;

-- defer_jobs_for_token --
-- claimed attempts that got no token (or cannot start) are handed back uncounted (attempt, ambiguity and error undone), each due after its wait, marked as waiting for a token (holding none); only under each claim
UPDATE {schema}.outbox o
SET due_at_ms = {schema}.stmt_ms(%(off)s::bigint) + u.wait,
    attempts = u.prior_attempts, ambiguous = u.prior_ambiguous,
    maybe_applied = u.prior_maybe_applied, running = false, last_error = u.prior_error,
    waiting_for = 'rate'
FROM unnest(%(rks)s::bigint[], %(job_ids)s::text[], %(attempts)s::int[], %(tokens)s::bigint[],
            %(prior_attempts)s::int[], %(prior_ambiguous)s::bool[],
            %(prior_maybe_applied)s::bool[], %(prior_errors)s::text[], %(waits)s::bigint[])
    AS u(rk, job_id, attempt, token, prior_attempts, prior_ambiguous, prior_maybe_applied,
         prior_error, wait)
WHERE o.routing_key = u.rk AND o.intent_id = u.job_id AND o.kind = 'job'
  AND o.attempts = u.attempt AND o.due_at_ms = u.token
RETURNING o.intent_id;

-- sample_flow_jobs --
-- sampled gauges (maintenance owner): per job type with flow control, due rows waiting for a deployment-wide slot and rows waiting for a rate token, across actors
WITH clock AS MATERIALIZED (
    SELECT {schema}.stmt_ms(%(off)s::bigint) AS now
),
live AS MATERIALIZED (
    SELECT r.actor_type, r.command, count(*) AS n
    FROM {schema}.outbox r, clock
    WHERE r.kind = 'job' AND r.running AND r.due_at_ms > clock.now
    GROUP BY r.actor_type, r.command
)
SELECT o.actor_type, o.command AS job,
       count(*) FILTER (WHERE o.waiting_for = 'rate') AS waiting_rate,
       count(*) FILTER (WHERE o.waiting_for IS NULL AND o.due_at_ms <= clock.now
                          AND o.cancelled_at_ms IS NULL AND l.concurrency <= coalesce(v.n, 0))
           AS waiting_slot
FROM {schema}.outbox o
CROSS JOIN clock
LEFT JOIN {schema}.job_limits l ON l.actor_type = o.actor_type AND l.job = o.command
LEFT JOIN live v ON v.actor_type = o.actor_type AND v.command = o.command
WHERE o.kind = 'job' AND o.parked_at_ms IS NULL AND NOT o.running
  AND (o.waiting_for IS NOT NULL OR l.concurrency IS NOT NULL)
GROUP BY o.actor_type, o.command
ORDER BY o.actor_type, o.command;

-- park_job --
-- a claimed job the code cannot execute is parked (evolution E3): the claim's attempt and ambiguity undone, every other column kept, the cause recorded; only under the claim (attempt N, its lease end)
UPDATE {schema}.outbox
SET parked_at_ms = {schema}.stmt_ms(%(off)s::bigint), attempts = %(prior_attempts)s,
    ambiguous = %(prior_ambiguous)s, maybe_applied = %(prior_maybe_applied)s, running = false,
    last_error = %(error)s
WHERE routing_key = %(rk)s AND intent_id = %(job_id)s AND kind = 'job'
  AND attempts = %(attempt)s AND due_at_ms = %(token)s AND parked_at_ms IS NULL
RETURNING intent_id;

-- release_job_uncounted --
-- a claimed job at a payload version above the code's is handed back uncounted (attempt and ambiguity undone), due after a short wait, only under the claim
UPDATE {schema}.outbox
SET due_at_ms = {schema}.stmt_ms(%(off)s::bigint) + %(wait)s::bigint,
    attempts = %(prior_attempts)s, ambiguous = %(prior_ambiguous)s,
    maybe_applied = %(prior_maybe_applied)s, running = false, last_error = %(error)s
WHERE routing_key = %(rk)s AND intent_id = %(job_id)s AND kind = 'job'
  AND attempts = %(attempt)s AND due_at_ms = %(token)s
RETURNING intent_id;

-- renew_job --
-- extends a running attempt's lease, never shortening it; only while the row is still at attempt N
UPDATE {schema}.outbox
SET due_at_ms = greatest(due_at_ms, {schema}.stmt_ms(%(off)s::bigint) + %(lease)s::bigint)
WHERE routing_key = %(rk)s AND intent_id = %(job_id)s AND kind = 'job'
  AND attempts = %(attempt)s
RETURNING cancelled_at_ms IS NOT NULL AS cancelled, due_at_ms;

-- shift_job_leases --
-- a test clock jump pushes the lease ends of this runner's running attempts, never stealing one
UPDATE {schema}.outbox o
SET due_at_ms = o.due_at_ms + %(ms)s::bigint
FROM unnest(%(rks)s::bigint[], %(job_ids)s::text[], %(attempts)s::int[]) AS u(rk, job_id, attempt)
WHERE o.routing_key = u.rk AND o.intent_id = u.job_id AND o.attempts = u.attempt
  AND o.kind = 'job' AND o.running
RETURNING o.intent_id, o.due_at_ms;

-- settle_job_delete --
-- ends a job without a route, under its guard (kind, cancellation, optional attempt, newer live lease)
DELETE FROM {schema}.outbox
WHERE routing_key = %(rk)s AND intent_id = %(job_id)s AND kind = 'job'
  AND (cancelled_at_ms IS NOT NULL) = %(cancelled)s
  AND (%(attempt)s::int IS NULL OR attempts = %(attempt)s::int)
  AND NOT (%(after)s::int IS NOT NULL AND attempts > %(after)s::int AND running
           AND due_at_ms > {schema}.stmt_ms(%(off)s::bigint))
RETURNING intent_id;

-- settle_job_route --
-- rewrites a job into its route intent (command id = job id, traceparent = the attempt's if given, the route command's payload version), under the same guard as settle_job_delete
UPDATE {schema}.outbox
SET kind = 'intent', command = %(command)s, payload = %(payload)s,
    payload_version = %(payload_version)s,
    traceparent = coalesce(%(traceparent)s::text, traceparent),
    due_at_ms = {schema}.stmt_ms(%(off)s::bigint), scheduled_at_ms = {schema}.stmt_ms(%(off)s::bigint),
    attempts = 0, last_error = NULL, ambiguous = false, running = false, timer_key = NULL
WHERE routing_key = %(rk)s AND intent_id = %(job_id)s AND kind = 'job'
  AND (cancelled_at_ms IS NOT NULL) = %(cancelled)s
  AND (%(attempt)s::int IS NULL OR attempts = %(attempt)s::int)
  AND NOT (%(after)s::int IS NOT NULL AND attempts > %(after)s::int AND running
           AND due_at_ms > {schema}.stmt_ms(%(off)s::bigint))
RETURNING intent_id;

-- job_newer_live --
-- whether a newer attempt of this (uncancelled or cancelled) job holds a live lease; no row when it ended
SELECT (attempts > %(after)s::int AND running
        AND due_at_ms > {schema}.stmt_ms(%(off)s::bigint)) AS live
FROM {schema}.outbox
WHERE routing_key = %(rk)s AND intent_id = %(job_id)s AND kind = 'job'
  AND (cancelled_at_ms IS NOT NULL) = %(cancelled)s;

-- record_job_failure --
-- records attempt N's failure and its backoff; a newer attempt or a settle that took the row is untouched
UPDATE {schema}.outbox
SET last_error = %(cause)s,
    ambiguous = CASE WHEN %(not_started)s THEN maybe_applied ELSE %(ambiguous)s END,
    running = false, final_failure = %(final)s,
    due_at_ms = {schema}.stmt_ms(%(off)s::bigint) + %(backoff)s::bigint
WHERE routing_key = %(rk)s AND intent_id = %(job_id)s AND kind = 'job'
  AND attempts = %(attempt)s
RETURNING cancelled_at_ms IS NOT NULL AS cancelled, maybe_applied, ambiguous;

-- cancelled_job_at --
-- the cancelled row at attempt N, if a cancellation took it before a dead letter could
SELECT maybe_applied FROM {schema}.outbox
WHERE routing_key = %(rk)s AND intent_id = %(job_id)s AND kind = 'job'
  AND attempts = %(attempt)s AND cancelled_at_ms IS NOT NULL;

-- insert_dead_letter --
-- records a job's dead letter, in the transaction that ended its row
INSERT INTO {schema}.dead_letters
    (routing_key, job_id, tenant_id, actor_type, actor_id, job, payload, payload_version,
     attempts, cause, ambiguous, dead_at_ms)
VALUES (%(rk)s, %(job_id)s, %(tenant)s, %(type)s, %(id)s, %(job)s, %(payload)s,
        %(payload_version)s, %(attempts)s, %(cause)s, %(ambiguous)s,
        {schema}.stmt_ms(%(off)s::bigint));

-- mark_dead_letter_ambiguous --
-- a late success flips the job's dead letter to ambiguous; no second outcome is routed
UPDATE {schema}.dead_letters SET ambiguous = true
WHERE routing_key = %(rk)s AND job_id = %(job_id)s
RETURNING job_id;

-- insert_late_dead_letter --
-- a success after the cancellation report was routed is recorded as an ambiguous dead letter
INSERT INTO {schema}.dead_letters
    (routing_key, job_id, tenant_id, actor_type, actor_id, job, payload, payload_version,
     attempts, cause, ambiguous, dead_at_ms)
SELECT %(rk)s, %(job_id)s, %(tenant)s, %(type)s, %(id)s, %(job)s, %(payload)s,
       %(payload_version)s, %(attempts)s, 'Succeeded after it was cancelled', true,
       {schema}.stmt_ms(%(off)s::bigint)
WHERE EXISTS (
    SELECT 1 FROM {schema}.outbox o
    WHERE o.routing_key = %(rk)s AND o.intent_id = %(job_id)s AND o.kind = 'intent'
      AND o.command = %(route)s
    UNION ALL
    SELECT 1 FROM {schema}.receipts r
    WHERE r.routing_key = %(rk)s AND r.tenant_id = %(tenant)s AND r.actor_type = %(type)s
      AND r.actor_id = %(id)s AND r.command_id = %(job_id)s AND r.command = %(route)s
)
ON CONFLICT (routing_key, job_id) DO UPDATE SET ambiguous = true
RETURNING job_id;

-- dead_letters_list --
-- every dead letter, newest first (operator view across actors)
SELECT routing_key, job_id, tenant_id, actor_type, actor_id, job, payload, payload_version,
       attempts, cause, ambiguous, dead_at_ms
FROM {schema}.dead_letters
ORDER BY dead_at_ms DESC, job_id
LIMIT %(limit)s;

-- dead_letter_find --
-- one dead letter by job id (operator lookup; job ids are unique across actors)
SELECT routing_key, job_id, tenant_id, actor_type, actor_id, job, payload, payload_version,
       attempts, cause, ambiguous, dead_at_ms
FROM {schema}.dead_letters
WHERE job_id = %(job_id)s;

-- dead_letter_take --
-- deletes one dead letter and returns it (retry and discard)
DELETE FROM {schema}.dead_letters
WHERE routing_key = %(rk)s AND job_id = %(job_id)s
RETURNING routing_key, job_id, tenant_id, actor_type, actor_id, job, payload, payload_version,
          attempts, cause, ambiguous, dead_at_ms;

-- dead_letter_requeue --
-- a retried dead letter becomes a new job row, due now, at priority 0 ranked by now, maybe applied as the letter was ambiguous
INSERT INTO {schema}.outbox
    (routing_key, intent_id, bucket, kind, tenant_id, actor_type, actor_id, target_type,
     target_id, command, payload, payload_version, caller, due_at_ms, scheduled_at_ms,
     ready_at_ms, maybe_applied, rank_ms)
VALUES (%(rk)s, %(new_id)s, %(bucket)s, 'job', %(tenant)s, %(type)s, %(id)s, %(type)s, %(id)s,
        %(job)s, %(payload)s, %(payload_version)s, %(caller)s,
        {schema}.stmt_ms(%(off)s::bigint), {schema}.stmt_ms(%(off)s::bigint),
        {schema}.stmt_ms(%(off)s::bigint), %(maybe_applied)s, {schema}.stmt_ms(%(off)s::bigint))
RETURNING intent_id, due_at_ms;

-- release_skewed_jobs --
-- running attempts of the executed job types whose lease ends further ahead than a lease can (skew_ms: written before the clock moved back) end now, to be taken over like an ended lease; returns how far ahead each was
WITH clock AS MATERIALIZED (
    SELECT {schema}.stmt_ms(%(off)s::bigint) AS now
),
skewed AS (
    SELECT o.routing_key, o.intent_id, o.due_at_ms - clock.now AS ahead_ms
    FROM {schema}.outbox o
    CROSS JOIN clock
    WHERE o.kind = 'job' AND o.running AND o.due_at_ms > clock.now + %(skew_ms)s::bigint
      AND (o.actor_type, o.command) IN (
          SELECT m.actor_type, m.job
          FROM unnest(%(types)s::text[], %(jobs)s::text[]) AS m(actor_type, job))
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE {schema}.outbox o
SET due_at_ms = clock.now
FROM skewed s, clock
WHERE o.routing_key = s.routing_key AND o.intent_id = s.intent_id
RETURNING o.intent_id, o.actor_type, o.actor_id, o.command, o.attempts, s.ahead_ms;

-- job_trace --
-- what one snapshot's durable rows say of one actor's job: its row (job, or its route intent), the route's receipt, its dead letter; read only
SELECT o.kind AS row_kind, o.command AS row_command,
       (o.cancelled_at_ms IS NOT NULL) AS row_cancelled,
       (SELECT r.command FROM {schema}.receipts r
        WHERE r.routing_key = %(rk)s AND r.tenant_id = %(tenant)s AND r.actor_type = %(type)s
          AND r.actor_id = %(id)s AND r.command_id = %(job_id)s) AS receipt_command,
       EXISTS (SELECT 1 FROM {schema}.dead_letters d
               WHERE d.routing_key = %(rk)s AND d.job_id = %(job_id)s AND d.tenant_id = %(tenant)s
                 AND d.actor_type = %(type)s AND d.actor_id = %(id)s) AS lettered
FROM (SELECT 1) AS one
LEFT JOIN {schema}.outbox o
  ON o.routing_key = %(rk)s AND o.intent_id = %(job_id)s AND o.tenant_id = %(tenant)s
 AND o.actor_type = %(type)s AND o.actor_id = %(id)s;

-- rank_unranked_jobs --
-- gives a batch of job rows written without a claim rank (by a runner older than migration 0006, during a rolling deploy) the rank of their ready time and priority; NULL ranks sort after every ranked row, so under a steady backlog they would never be claimed; no function in the modification (Citus)
WITH unranked AS (
    SELECT o.routing_key, o.intent_id
    FROM {schema}.outbox o
    WHERE o.kind = 'job' AND o.rank_ms IS NULL
    LIMIT %(batch)s
)
UPDATE {schema}.outbox o
SET rank_ms = o.ready_at_ms - o.priority * 10000000000000::bigint
FROM unranked u
WHERE o.routing_key = u.routing_key AND o.intent_id = u.intent_id AND o.rank_ms IS NULL
RETURNING 1;

-- === Batched settles (issue 45: bulk paths) ===
-- Many finished attempts whose plan is a plain success (semantics §5.9, Succeeded step 1) end in
-- one statement of the executor's settle coalescer (akter._engine.jobs.coalescer). Each row is
-- taken under exactly the guard of settle_job_route / settle_job_delete with the open guard, any
-- attempt and no newer-attempt check (uncapped jobs only); the rows a batch does not take are
-- settled one by one by the Settler, from step 2 on. Joined on routing_key and job id; plain
-- PostgreSQL only (akter._store.citus.PLAIN_ONLY): a join with unnest() spans every shard on
-- Citus, where each settle stays its own keyed statement.

-- settle_jobs_route_batch --
-- many first successes at once: each uncancelled job row (any attempt) named by (routing_key, job id) is rewritten into its route intent exactly as settle_job_route does; returns the rows it took
UPDATE {schema}.outbox o
SET kind = 'intent', command = u.command, payload = u.payload,
    payload_version = u.payload_version,
    traceparent = coalesce(u.traceparent, o.traceparent),
    due_at_ms = {schema}.stmt_ms(%(off)s::bigint), scheduled_at_ms = {schema}.stmt_ms(%(off)s::bigint),
    attempts = 0, last_error = NULL, ambiguous = false, running = false, timer_key = NULL
FROM unnest(%(rks)s::bigint[], %(job_ids)s::text[], %(commands)s::text[], %(payloads)s::text[],
            %(traceparents)s::text[], %(versions)s::int[])
    AS u(rk, job_id, command, payload, traceparent, payload_version)
WHERE o.routing_key = u.rk AND o.intent_id = u.job_id AND o.kind = 'job'
  AND o.cancelled_at_ms IS NULL
RETURNING o.intent_id;

-- settle_jobs_delete_batch --
-- many first successes without a route at once: each uncancelled job row (any attempt) named by (routing_key, job id) is deleted exactly as settle_job_delete does; returns the rows it took
DELETE FROM {schema}.outbox o
USING unnest(%(rks)s::bigint[], %(job_ids)s::text[]) AS u(rk, job_id)
WHERE o.routing_key = u.rk AND o.intent_id = u.job_id AND o.kind = 'job'
  AND o.cancelled_at_ms IS NULL
RETURNING o.intent_id;
