-- 0006_flow_control: job priorities and deployment-wide concurrency caps (issue 17,
-- docs/flow-control.md).
--
-- Priority: each job row carries its priority (0-9, higher first) and a claim rank computed once
-- at enqueue (a row written without one sorts after every ranked row) from its ready time: rank_ms = least(ready - priority * 10^13,
-- ready + max_wait - 9 * 10^13). 10^13 ms (about 300 years) is wider than any gap between two
-- ready times, so without max_wait the rank orders by priority, then enqueue order; with it, a
-- row ranks like a priority-9 row that became ready max_wait after it did, so a steady stream of
-- higher-priority rows cannot starve it. Claims scan due rows by (bucket, rank_ms).
ALTER TABLE {schema}.outbox ADD COLUMN priority smallint NOT NULL DEFAULT 0
    CHECK (priority BETWEEN 0 AND 9);
ALTER TABLE {schema}.outbox ADD COLUMN rank_ms bigint;
UPDATE {schema}.outbox SET rank_ms = ready_at_ms WHERE kind = 'job';
CREATE INDEX outbox_jobs_rank ON {schema}.outbox (bucket, rank_ms)
    WHERE kind = 'job' AND parked_at_ms IS NULL;

-- Deployment-wide concurrency: a job type's live attempts are its running rows whose lease has
-- not ended, counted under the lock of the type's row in job_limits, which serializes the
-- type's claims across runners. A settle clears `running` (the slot is free at its commit); a
-- dead runner's slot comes back when its lease ends. The cap is the declared one, written by
-- every runner that executes the type (the last started wins; the view reads it).
CREATE TABLE {schema}.job_limits (
    actor_type text NOT NULL,
    job text NOT NULL,
    concurrency integer NOT NULL CHECK (concurrency >= 1),
    PRIMARY KEY (actor_type, job)
);
CREATE INDEX outbox_jobs_type_running ON {schema}.outbox (actor_type, command)
    WHERE kind = 'job' AND running;

-- Keyed rate limits: one token bucket per (job type, limit, key), shared by every runner. A
-- bucket holds at most its burst; it refills continuously at the limit's rate (tokens per ms),
-- computed when it is next taken from (tokens and at_ms are the level at that instant). An
-- attempt takes one token from each of its job's limits in one statement; from an empty bucket
-- it books the next token ahead (the level goes below zero), so attempts queue for tokens in
-- claim order instead of polling for them.
CREATE TABLE {schema}.rate_buckets (
    actor_type text NOT NULL,
    job text NOT NULL,
    limit_no smallint NOT NULL,
    key text NOT NULL,
    tokens double precision NOT NULL,
    at_ms bigint NOT NULL,
    PRIMARY KEY (actor_type, job, limit_no, key)
);
-- A claimed row whose token was booked ahead is handed back uncounted, due when its token is,
-- with waiting_for = 'rate' (it holds its tokens) until its next claim, which starts it.
ALTER TABLE {schema}.outbox ADD COLUMN waiting_for text CHECK (waiting_for IN ('rate'));

-- v_jobs gains the priority and the derived states 'waiting_slot' (a due row of a capped type
-- whose live attempts fill its cap) and 'waiting_rate' (deferred for a token).
CREATE OR REPLACE VIEW {schema}.v_jobs AS
SELECT o.intent_id AS job_id, o.tenant_id, o.actor_type, o.actor_id, o.command AS job,
       o.attempts, o.running, o.waiting, o.ambiguous, o.maybe_applied, o.final_failure,
       o.last_error,
       CASE WHEN o.parked_at_ms IS NOT NULL THEN 'parked'
            WHEN o.cancelled_at_ms IS NOT NULL THEN 'cancelled'
            WHEN o.running THEN 'running'
            WHEN o.waiting THEN 'waiting'
            WHEN o.waiting_for = 'rate' THEN 'waiting_rate'
            WHEN o.due_at_ms <= {schema}.now_ms(0) AND EXISTS (
                SELECT 1 FROM {schema}.job_limits l
                WHERE l.actor_type = o.actor_type AND l.job = o.command
                  AND l.concurrency <= (
                      SELECT count(*) FROM {schema}.outbox r
                      WHERE r.kind = 'job' AND r.running AND r.actor_type = o.actor_type
                        AND r.command = o.command AND r.due_at_ms > {schema}.now_ms(0)))
                THEN 'waiting_slot'
            WHEN o.attempts = 0 THEN 'pending'
            ELSE 'backoff' END AS status,
       to_timestamp(o.due_at_ms / 1000.0) AS due_at,
       to_timestamp(o.cancelled_at_ms / 1000.0) AS cancelled_at,
       substr(o.timer_key, 6) AS job_key,
       o.routing_key,
       o.priority
FROM (SELECT * FROM {schema}.outbox) o
WHERE o.kind = 'job';
