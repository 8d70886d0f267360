-- Statements of the web console (akter.http.console): read-only operator views, plus the
-- dead-letter statements it shares with the CLI (queries_jobs.sql). Columns and derived fields
-- follow the inspection views of 0002_inspection_views.sql (v_actors, v_outbox, v_jobs).

-- console_statement_timeout --
-- bounds every console read: a transaction-local statement_timeout (milliseconds, as text)
SELECT set_config('statement_timeout', %(timeout)s, true);

-- console_types --
-- operators' actors and tenants per type across actors, in a sample of at most cap rows (bounded)
SELECT actor_type, count(*) AS actors, count(DISTINCT tenant_id) AS tenants
FROM (SELECT actor_type, tenant_id FROM {schema}.actors LIMIT %(cap)s) AS sample
GROUP BY actor_type
ORDER BY actor_type;

-- console_totals --
-- operators' totals of pending intents, job rows and dead letters across actors, each up to cap
SELECT (SELECT count(*) FROM (SELECT 1 FROM {schema}.outbox o WHERE o.kind = 'intent'
                              LIMIT %(cap)s) AS i) AS outbox,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.outbox j WHERE j.kind = 'job'
                              LIMIT %(cap)s) AS j) AS jobs,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.dead_letters d
                              LIMIT %(cap)s) AS d) AS dead_letters;

-- console_actors --
-- one page of a type's actors after a (tenant, id) cursor, optionally in one tenant (like v_actors)
SELECT tenant_id, actor_id, version, created, event_seq, updated_at_ms
FROM {schema}.actors
WHERE actor_type = %(type)s
  AND (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s::text)
  AND (tenant_id, actor_id) > (%(after_tenant)s::text, %(after_id)s::text)
ORDER BY tenant_id, actor_id
LIMIT %(limit)s;

-- console_actor --
-- one actor's committed row and receipt count (like v_actors), keyed
SELECT a.version, a.created, a.event_seq, a.state, a.state_version, a.updated_at_ms,
       (SELECT count(*) FROM {schema}.receipts r
        WHERE r.routing_key = a.routing_key AND r.tenant_id = a.tenant_id
          AND r.actor_type = a.actor_type AND r.actor_id = a.actor_id) AS receipts
FROM {schema}.actors a
WHERE a.routing_key = %(rk)s AND a.tenant_id = %(tenant)s AND a.actor_type = %(type)s
  AND a.actor_id = %(id)s;

-- console_recent_events --
-- one actor's newest retained events, newest first, keyed
SELECT seq, tag, payload, payload_version, command_id, emitted_at_ms
FROM {schema}.events
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s
ORDER BY seq DESC
LIMIT %(limit)s;

-- console_actor_outbox --
-- the outbox rows one actor sent or owns (roles as in v_outbox, status as in v_jobs), keyed
SELECT intent_id, kind, target_type, target_id, command, attempts, last_error, timer_key,
       due_at_ms, scheduled_at_ms, running, cancelled_at_ms,
       CASE WHEN timer_key LIKE '$cron:%%' THEN 'tick'
            WHEN kind = 'job' THEN 'job'
            WHEN timer_key IS NOT NULL OR due_at_ms > scheduled_at_ms THEN 'timer'
            ELSE 'intent' END AS role
FROM {schema}.outbox
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s
ORDER BY scheduled_at_ms, intent_id;

-- console_outbox --
-- operators' view of pending intents, timers and ticks across actors, oldest due first (like v_outbox)
SELECT intent_id, tenant_id, actor_type, actor_id, target_type, target_id, command, attempts,
       last_error, timer_key, due_at_ms, scheduled_at_ms,
       CASE WHEN timer_key LIKE '$cron:%%' THEN 'tick'
            WHEN timer_key IS NOT NULL OR due_at_ms > scheduled_at_ms THEN 'timer'
            ELSE 'intent' END AS role
FROM {schema}.outbox
WHERE kind = 'intent'
ORDER BY due_at_ms, intent_id
LIMIT %(limit)s;

-- console_jobs --
-- operators' view of job rows across actors with v_jobs' status (flow control: waiting_slot, waiting_rate) and priority, oldest first
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
       o.attempts, o.running, o.waiting, o.ambiguous, o.maybe_applied, o.last_error, o.due_at_ms,
       o.scheduled_at_ms,
       CASE WHEN o.parked_at_ms IS NOT NULL THEN 'parked'
            WHEN o.cancelled_at_ms IS NOT NULL THEN 'cancelled'
            WHEN o.running THEN 'running'
            WHEN o.waiting THEN 'waiting'
            WHEN o.waiting_for = 'rate' THEN 'waiting_rate'
            WHEN o.due_at_ms <= clock.now AND l.concurrency <= coalesce(v.n, 0) THEN 'waiting_slot'
            WHEN o.attempts = 0 THEN 'pending'
            ELSE 'backoff' END AS status,
       o.priority
FROM {schema}.outbox o
CROSS JOIN clock
LEFT JOIN {schema}.job_limits l ON l.actor_type = o.actor_type AND l.job = o.command
LEFT JOIN live v ON v.actor_type = o.actor_type AND v.command = o.command
WHERE o.kind = 'job'
ORDER BY o.scheduled_at_ms, o.intent_id
LIMIT %(limit)s;
