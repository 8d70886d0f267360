-- 0009_v_jobs_citus: v_jobs as Citus can plan it (issue 16). 0006's view found a type's live
-- attempts with a subquery correlated to each row by job type: a join of the outbox with itself
-- on a column other than routing_key, which Citus refuses ("complex joins are only supported
-- when all distributed tables are co-located"). Here the live counts are computed once per
-- type in a materialised CTE (on Citus an intermediate result, joined to every shard), as
-- jobs_overview computes them. Same columns, same statuses, one clock reading per query.
CREATE OR REPLACE VIEW {schema}.v_jobs AS
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
       o.last_error,
       CASE WHEN o.parked_at_ms IS NOT NULL THEN 'parked'
            WHEN o.cancelled_at_ms IS NOT NULL THEN 'cancelled'
            WHEN o.running THEN 'running'
            WHEN o.waiting THEN 'waiting'
            WHEN o.waiting_for = 'rate' THEN 'waiting_rate'
            WHEN o.due_at_ms <= clock.now AND l.concurrency <= coalesce(v.n, 0)
                THEN 'waiting_slot'
            WHEN o.attempts = 0 THEN 'pending'
            ELSE 'backoff' END AS status,
       to_timestamp(o.due_at_ms / 1000.0) AS due_at,
       to_timestamp(o.cancelled_at_ms / 1000.0) AS cancelled_at,
       substr(o.timer_key, 6) AS job_key,
       o.routing_key,
       o.priority
FROM {schema}.outbox o
CROSS JOIN clock
LEFT JOIN {schema}.job_limits l ON l.actor_type = o.actor_type AND l.job = o.command
LEFT JOIN live v ON v.actor_type = o.actor_type AND v.command = o.command
WHERE o.kind = 'job';
