-- 0004_evolution: parked outbox rows and the operator audit (spec evolution.md E3).
--
-- A row the code cannot deliver (unknown target type, command or job, or a payload that fails
-- validation after its migrations) is parked: it keeps every column, gets parked_at_ms and a
-- last_error naming the cause, and no claim takes it until an operator retries it. The runtime
-- never deletes a parked row; an operator's discard writes one operator_audit row per row,
-- holding the whole row as JSON. The audit is never pruned.

ALTER TABLE {schema}.outbox ADD COLUMN parked_at_ms bigint;

-- Claims scan due rows in (bucket, kind, due_at_ms) order; parked rows leave that index so a
-- pile of them never slows a claim.
DROP INDEX {schema}.outbox_due;
CREATE INDEX outbox_due ON {schema}.outbox (bucket, kind, due_at_ms) WHERE parked_at_ms IS NULL;
CREATE INDEX outbox_parked ON {schema}.outbox (kind, parked_at_ms) WHERE parked_at_ms IS NOT NULL;

CREATE TABLE {schema}.operator_audit (
    audit_id text NOT NULL,
    routing_key bigint NOT NULL,
    at_ms bigint NOT NULL,
    operator text NOT NULL,
    action text NOT NULL CHECK (action IN ('discard')),
    kind text NOT NULL,
    tenant_id text NOT NULL,
    actor_type text NOT NULL,
    actor_id text NOT NULL,
    command text NOT NULL,
    row_json jsonb NOT NULL,
    reason text NOT NULL,
    PRIMARY KEY (routing_key, audit_id)
);
CREATE INDEX operator_audit_at ON {schema}.operator_audit (at_ms);

CREATE VIEW {schema}.v_operator_audit AS
SELECT a.audit_id, to_timestamp(a.at_ms / 1000.0) AS at, a.operator, a.action, a.kind,
       a.tenant_id, a.actor_type, a.actor_id, a.command, a.reason, a.row_json, a.at_ms,
       a.routing_key
FROM (SELECT * FROM {schema}.operator_audit) a;

-- The inspection views show the parked state: v_outbox gains parked_at (appended, so the view
-- keeps its columns), and a parked job's status is 'parked'.
CREATE OR REPLACE VIEW {schema}.v_outbox AS
SELECT o.intent_id, o.kind, o.tenant_id, o.actor_type AS sender_type, o.actor_id AS sender_id,
       o.target_type, o.target_id, o.command, o.attempts, o.last_error, o.timer_key,
       to_timestamp(o.due_at_ms / 1000.0) AS due_at,
       to_timestamp(o.scheduled_at_ms / 1000.0) AS scheduled_at,
       CASE WHEN o.timer_key LIKE '$cron:%' THEN 'tick'
            WHEN o.kind = 'job' THEN 'job'
            WHEN o.timer_key IS NOT NULL OR o.due_at_ms > o.scheduled_at_ms THEN 'timer'
            ELSE 'intent' END AS role,
       o.routing_key, o.due_at_ms,
       to_timestamp(o.parked_at_ms / 1000.0) AS parked_at
FROM (SELECT * FROM {schema}.outbox) o;

CREATE OR REPLACE VIEW {schema}.v_jobs AS
SELECT o.intent_id AS job_id, o.tenant_id, o.actor_type, o.actor_id, o.command AS job,
       o.attempts, o.running, o.waiting, o.ambiguous, o.maybe_applied, o.final_failure,
       o.last_error,
       CASE WHEN o.parked_at_ms IS NOT NULL THEN 'parked'
            WHEN o.cancelled_at_ms IS NOT NULL THEN 'cancelled'
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
