-- 0002_inspection_views: read-only views for operators (a public SQL contract, semantics §1.8).
-- Times stay in epoch ms (the framework clock) and are also shown as timestamptz. Each view reads
-- through a subquery, which makes it read-only (not auto-updatable) at no planning cost.

CREATE VIEW {schema}.v_actors AS
SELECT a.tenant_id, a.actor_type, a.actor_id, a.version, a.created, a.event_seq, a.state,
       a.state_version, to_timestamp(a.updated_at_ms / 1000.0) AS updated_at,
       (SELECT count(*) FROM {schema}.receipts r
        WHERE r.routing_key = a.routing_key AND r.tenant_id = a.tenant_id
          AND r.actor_type = a.actor_type AND r.actor_id = a.actor_id) AS receipts,
       a.routing_key
FROM (SELECT * FROM {schema}.actors) a;

CREATE VIEW {schema}.v_outbox AS
SELECT o.intent_id, o.kind, o.tenant_id, o.actor_type AS sender_type, o.actor_id AS sender_id,
       o.target_type, o.target_id, o.command, o.attempts, o.last_error, o.timer_key,
       to_timestamp(o.due_at_ms / 1000.0) AS due_at,
       to_timestamp(o.scheduled_at_ms / 1000.0) AS scheduled_at,
       CASE WHEN o.timer_key LIKE '$cron:%' THEN 'tick'
            WHEN o.kind = 'job' THEN 'job'
            WHEN o.timer_key IS NOT NULL OR o.due_at_ms > o.scheduled_at_ms THEN 'timer'
            ELSE 'intent' END AS role,
       o.routing_key, o.due_at_ms
FROM (SELECT * FROM {schema}.outbox) o;

CREATE VIEW {schema}.v_jobs AS
SELECT o.intent_id AS job_id, o.tenant_id, o.actor_type, o.actor_id, o.command AS job,
       o.attempts, o.running, o.waiting, o.ambiguous, o.maybe_applied, o.final_failure,
       o.last_error,
       CASE WHEN o.cancelled_at_ms IS NOT NULL THEN 'cancelled'
            WHEN o.running THEN 'running'
            WHEN o.waiting THEN 'waiting'
            WHEN o.attempts = 0 THEN 'pending'
            ELSE 'backoff' END AS status,
       to_timestamp(o.due_at_ms / 1000.0) AS due_at,
       to_timestamp(o.cancelled_at_ms / 1000.0) AS cancelled_at,
       substr(o.timer_key, 6) AS job_key,
       o.routing_key
FROM (SELECT * FROM {schema}.outbox) o
WHERE o.kind = 'job';

CREATE VIEW {schema}.v_dead_letters AS
SELECT d.job_id, d.tenant_id, d.actor_type, d.actor_id, d.job, d.attempts, d.cause, d.ambiguous,
       to_timestamp(d.dead_at_ms / 1000.0) AS dead_at, d.payload, d.routing_key
FROM (SELECT * FROM {schema}.dead_letters) d;
