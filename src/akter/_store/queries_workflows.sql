-- Workflows (migration 0007): runs, their journal and their signals.
-- Every time written is the database clock (stmt_ms) plus the runtime's test offset.

-- wf_start --
-- creates a run once: a replayed start (same run id) or a live run holding the same key returns that run instead, with its input hash; nothing is written then
WITH ins AS (
    INSERT INTO {schema}.workflows
        (routing_key, run_id, tenant_id, actor_type, actor_id, workflow, run_key, input,
         input_hash, caller, status, wake_at_ms, deadline_ms, started_at_ms, updated_at_ms,
         traceparent)
    VALUES (%(rk)s, %(run_id)s, %(tenant)s, %(type)s, %(id)s, %(workflow)s, %(key)s,
            %(input)s, %(input_hash)s, %(caller)s, 'runnable', {schema}.stmt_ms(%(off)s),
            {schema}.stmt_ms(%(off)s) + %(timeout_ms)s::bigint, {schema}.stmt_ms(%(off)s),
            {schema}.stmt_ms(%(off)s), %(traceparent)s::text)
    ON CONFLICT DO NOTHING
    RETURNING run_id, input_hash, workflow
)
SELECT run_id, input_hash, workflow, true AS created FROM ins
UNION ALL
SELECT w.run_id, w.input_hash, w.workflow, false
FROM {schema}.workflows w
WHERE w.routing_key = %(rk)s
  AND NOT EXISTS (SELECT 1 FROM ins)
  AND (w.run_id = %(run_id)s
       OR (w.tenant_id = %(tenant)s AND w.actor_type = %(type)s AND w.actor_id = %(id)s
           AND w.workflow = %(workflow)s AND w.run_key = %(key)s
           AND w.status IN ('runnable', 'running', 'suspended', 'diverged')))
ORDER BY 4 DESC
LIMIT 1;

-- wf_start_in_turn --
-- a turn's commit flight starts its actor's runs (runnable at the commit's clock, passed in), all or none: a keyed start whose key a live run holds (committed before, or by a transaction this one waits for) fails the flight with unique_violation on workflows_live_key, and the turn re-runs its batch once knowing the actor's live keyed runs (wf_live_keys), so its start returns the live run's id
INSERT INTO {schema}.workflows
    (routing_key, run_id, tenant_id, actor_type, actor_id, workflow, run_key, input,
     input_hash, caller, status, wake_at_ms, deadline_ms, started_at_ms, updated_at_ms,
     traceparent)
SELECT %(rk)s, r.run_id, %(tenant)s, %(type)s, %(id)s, r.workflow, r.run_key, r.input,
       r.input_hash, r.caller, 'runnable', %(commit)s::bigint,
       %(commit)s::bigint + r.timeout_ms, %(commit)s::bigint, %(commit)s::bigint,
       %(traceparent)s::text
FROM unnest(%(run_ids)s::text[], %(workflows)s::text[], %(keys)s::text[],
            %(inputs)s::text[], %(input_hashes)s::text[], %(callers)s::text[],
            %(timeouts)s::bigint[])
    AS r(run_id, workflow, run_key, input, input_hash, caller, timeout_ms);

-- wf_live_keys --
-- the live keyed runs of one actor, each (workflow, key) with the run holding it; sent only in the admission flight of a turn re-run after its start met a live key (wf_start_in_turn), after the row lock
SELECT w.workflow, w.run_key, w.run_id
FROM {schema}.workflows w
WHERE w.routing_key = %(rk)s AND w.tenant_id = %(tenant)s AND w.actor_type = %(type)s
  AND w.actor_id = %(id)s AND w.run_key IS NOT NULL
  AND w.status IN ('runnable', 'running', 'suspended', 'diverged');

-- wf_claim --
-- leases runnable runs of hosted types whose wake time has come (a suspended run's timer or deadline, a dead runner's lease end), SKIP LOCKED; each claim bumps the run's token, which guards every later write of this attempt
UPDATE {schema}.workflows w
SET status = 'running', lease_owner = %(runner)s::uuid, token = w.token + 1,
    attempts = w.attempts + 1, pending_wake = false, waiting = NULL,
    wake_at_ms = c.now + %(lease_ms)s::bigint, updated_at_ms = c.now
FROM (
    SELECT x.routing_key, x.run_id, {schema}.stmt_ms(%(off)s) AS now
    FROM {schema}.workflows x
    WHERE x.wake_at_ms <= {schema}.stmt_ms(%(off)s) AND x.actor_type = ANY(%(types)s::text[])
    ORDER BY x.wake_at_ms
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) c
WHERE w.routing_key = c.routing_key AND w.run_id = c.run_id
RETURNING w.routing_key, w.run_id, w.tenant_id, w.actor_type, w.actor_id, w.workflow,
          w.input, w.caller, w.token, w.attempts, w.cancel_requested, w.deadline_ms,
          w.traceparent, c.now;

-- citus_wf_claim_scan --
-- Citus: wf_claim's candidate scan, without locks (Citus has no multi-shard SKIP LOCKED): runs of hosted types whose wake time has come, oldest first
SELECT x.routing_key, x.run_id
FROM {schema}.workflows x
WHERE x.wake_at_ms <= %(now)s::bigint AND x.actor_type = ANY(%(types)s::text[])
ORDER BY x.wake_at_ms
LIMIT %(limit)s;

-- citus_wf_claim --
-- Citus: claims one scanned run in its own shard, skipping it when another claimer holds it or it is no longer due
UPDATE {schema}.workflows w
SET status = 'running', lease_owner = %(runner)s::uuid, token = w.token + 1,
    attempts = w.attempts + 1, pending_wake = false, waiting = NULL,
    wake_at_ms = %(now)s::bigint + %(lease_ms)s::bigint, updated_at_ms = %(now)s::bigint
FROM (
    SELECT x.routing_key, x.run_id
    FROM {schema}.workflows x
    WHERE x.routing_key = %(rk)s AND x.run_id = %(run_id)s AND x.wake_at_ms <= %(now)s::bigint
    FOR UPDATE SKIP LOCKED
) c
WHERE w.routing_key = %(rk)s AND w.routing_key = c.routing_key AND w.run_id = c.run_id
RETURNING w.routing_key, w.run_id, w.tenant_id, w.actor_type, w.actor_id, w.workflow,
          w.input, w.caller, w.token, w.attempts, w.cancel_requested, w.deadline_ms,
          w.traceparent, %(now)s::bigint AS now;

-- wf_journal --
-- one run's journal in seq order, then its unconsumed signals in arrival order (one query per resumption)
SELECT 'step' AS what, s.seq, s.kind, s.name, s.status, s.detail, s.outcome,
       NULL::bigint AS signal_seq
FROM {schema}.workflow_steps s
WHERE s.routing_key = %(rk)s AND s.run_id = %(run_id)s
UNION ALL
SELECT 'signal', NULL, 'signal', g.name, 'pending', g.signal_id, g.payload, g.signal_seq
FROM {schema}.workflow_signals g
WHERE g.routing_key = %(rk)s AND g.run_id = %(run_id)s AND g.consumed_seq IS NULL
ORDER BY 1 DESC, 2, 8;

-- wf_record --
-- writes step records (new, pending to done, or a suspension's pending record replaced by a cancel) and marks consumed signals, only while this attempt's token holds the run (its row locked, so a claimer skips it); renews the lease; no row back means the lease was lost and nothing was written
WITH run AS (
    UPDATE {schema}.workflows w
    SET wake_at_ms = {schema}.stmt_ms(%(off)s) + %(lease_ms)s::bigint,
        updated_at_ms = {schema}.stmt_ms(%(off)s)
    WHERE w.routing_key = %(rk)s AND w.run_id = %(run_id)s AND w.token = %(token)s
      AND w.status = 'running'
    RETURNING w.run_id
), steps AS (
    INSERT INTO {schema}.workflow_steps
        (routing_key, run_id, seq, kind, name, status, detail, outcome, started_at_ms,
         recorded_at_ms)
    SELECT %(rk)s, %(run_id)s, s.seq, s.kind, s.name, s.status, s.detail, s.outcome,
           {schema}.stmt_ms(%(off)s),
           CASE WHEN s.status = 'done' THEN {schema}.stmt_ms(%(off)s) END
    FROM unnest(%(seqs)s::int[], %(kinds)s::text[], %(names)s::text[], %(statuses)s::text[],
                %(details)s::text[], %(outcomes)s::text[])
        AS s(seq, kind, name, status, detail, outcome)
    WHERE EXISTS (SELECT 1 FROM run)
    ON CONFLICT (routing_key, run_id, seq) DO UPDATE
        SET kind = excluded.kind, name = excluded.name,
            status = excluded.status, outcome = excluded.outcome,
            detail = coalesce(excluded.detail, workflow_steps.detail),
            recorded_at_ms = excluded.recorded_at_ms
    RETURNING seq
), consumed AS (
    UPDATE {schema}.workflow_signals g
    SET consumed_seq = c.seq
    FROM unnest(%(signal_ids)s::text[], %(signal_seqs)s::int[]) AS c(signal_id, seq)
    WHERE g.routing_key = %(rk)s AND g.run_id = %(run_id)s AND g.signal_id = c.signal_id
      AND EXISTS (SELECT 1 FROM run)
    RETURNING g.signal_id
)
SELECT (SELECT count(*) FROM run) AS held, (SELECT count(*) FROM steps) AS steps,
       (SELECT count(*) FROM consumed) AS consumed;

-- wf_step_receipt --
-- whether a pending command step's recorded command id has a receipt at its recorded target (a resumed run whose code now calls elsewhere looks, and sends nothing)
SELECT r.command, r.payload_hash
FROM {schema}.receipts r
WHERE r.routing_key = %(rk)s AND r.tenant_id = %(tenant)s AND r.actor_type = %(type)s
  AND r.actor_id = %(id)s AND r.command_id = %(command_id)s;

-- wf_renew --
-- extends this attempt's lease while its token holds the run; no row back means it was lost
UPDATE {schema}.workflows
SET wake_at_ms = {schema}.stmt_ms(%(off)s) + %(lease_ms)s::bigint
WHERE routing_key = %(rk)s AND run_id = %(run_id)s AND token = %(token)s AND status = 'running'
RETURNING run_id;

-- wf_suspend --
-- hands the run back until its wake time, capped at the run's deadline until the cancel has reached the code (by_deadline: a wait for a signal, a job outcome or a cancel alone wakes at the deadline, so timeout= bounds every suspension; a compensation after it may wait past it); a wake that arrived while it ran makes it runnable at once instead; the clock read once in a materialised CTE (Citus)
WITH clock AS MATERIALIZED (SELECT {schema}.stmt_ms(%(off)s) AS now)
UPDATE {schema}.workflows
SET status = CASE WHEN pending_wake THEN 'runnable' ELSE 'suspended' END,
    -- least() ignores a NULL: no wake time of its own wakes at the deadline
    wake_at_ms = CASE WHEN pending_wake THEN clock.now
                      WHEN %(by_deadline)s::boolean THEN least(%(wake_at)s::bigint, deadline_ms)
                      ELSE %(wake_at)s::bigint END,
    waiting = %(waiting)s, lease_owner = NULL, updated_at_ms = clock.now
FROM clock
WHERE routing_key = %(rk)s AND run_id = %(run_id)s AND token = %(token)s AND status = 'running'
RETURNING status;

-- wf_release --
-- hands the run back after an outage or a failed write, runnable again after the backoff
UPDATE {schema}.workflows
SET status = 'runnable', wake_at_ms = {schema}.stmt_ms(%(off)s) + %(delay_ms)s::bigint,
    waiting = %(waiting)s, lease_owner = NULL, updated_at_ms = {schema}.stmt_ms(%(off)s)
WHERE routing_key = %(rk)s AND run_id = %(run_id)s AND token = %(token)s AND status = 'running'
RETURNING status;

-- wf_finish --
-- ends the run (completed, failed, cancelled or diverged) with its result or error, only while this attempt's token holds it; the clock read once in a materialised CTE (Citus)
WITH clock AS MATERIALIZED (SELECT {schema}.stmt_ms(%(off)s) AS now)
UPDATE {schema}.workflows
SET status = %(status)s, result = %(result)s, error = %(error)s, wake_at_ms = NULL,
    waiting = NULL, lease_owner = NULL, updated_at_ms = clock.now,
    finished_at_ms = CASE WHEN %(status)s = 'diverged' THEN NULL ELSE clock.now END
FROM clock
WHERE routing_key = %(rk)s AND run_id = %(run_id)s AND token = %(token)s AND status = 'running'
RETURNING status, clock.now AS now;

-- wf_locate --
-- finds a run by id alone (run ids are unique across actors), or the live run a deduplicated keyed start's id names: its whole row (wf_get's columns and its routing key)
SELECT w.routing_key, w.run_id, w.tenant_id, w.actor_type, w.actor_id, w.workflow, w.run_key,
       w.input, w.status, w.waiting, w.wake_at_ms, w.cancel_requested, w.deadline_ms, w.attempts,
       w.result, w.error, w.started_at_ms, w.updated_at_ms, w.finished_at_ms,
       w.lease_owner::text AS lease_owner
FROM {schema}.workflows w
WHERE w.run_id = %(run_id)s
UNION ALL
SELECT w.routing_key, w.run_id, w.tenant_id, w.actor_type, w.actor_id, w.workflow, w.run_key,
       w.input, w.status, w.waiting, w.wake_at_ms, w.cancel_requested, w.deadline_ms, w.attempts,
       w.result, w.error, w.started_at_ms, w.updated_at_ms, w.finished_at_ms,
       w.lease_owner::text AS lease_owner
FROM {schema}.workflow_aliases a
JOIN {schema}.workflows w ON w.routing_key = a.routing_key AND w.run_id = a.target_run_id
WHERE a.run_id = %(run_id)s
LIMIT 1;

-- wf_alias --
-- a deduplicated keyed start's run id names the live run it found (once): a $workflow.start intent staged by older code, whose turn already answered with the intent's id
INSERT INTO {schema}.workflow_aliases (routing_key, run_id, target_run_id)
VALUES (%(rk)s, %(run_id)s, %(target)s)
ON CONFLICT DO NOTHING;

-- wf_get --
-- one run's row
SELECT run_id, tenant_id, actor_type, actor_id, workflow, run_key, input, status, waiting,
       wake_at_ms, cancel_requested, deadline_ms, attempts, result, error, started_at_ms,
       updated_at_ms, finished_at_ms, lease_owner::text AS lease_owner
FROM {schema}.workflows
WHERE routing_key = %(rk)s AND run_id = %(run_id)s;

-- wf_steps --
-- one run's journal in seq order
SELECT seq, kind, name, status, detail, outcome, started_at_ms, recorded_at_ms
FROM {schema}.workflow_steps
WHERE routing_key = %(rk)s AND run_id = %(run_id)s AND seq > %(after)s
ORDER BY seq;

-- wf_signals --
-- one run's signals in arrival order, consumed or not
SELECT signal_id, name, payload, sent_at_ms, consumed_seq
FROM {schema}.workflow_signals
WHERE routing_key = %(rk)s AND run_id = %(run_id)s
ORDER BY signal_seq;

-- wf_signal --
-- keeps a signal for a live run (once per signal id) and wakes the run; a finished run takes none, but a signal id it already kept answers as kept (a retried send); the clock read once in a materialised CTE (Citus)
WITH clock AS MATERIALIZED (SELECT {schema}.stmt_ms(%(off)s) AS now), run AS (
    UPDATE {schema}.workflows
    SET pending_wake = true,
        status = CASE WHEN status = 'suspended' THEN 'runnable' ELSE status END,
        wake_at_ms = CASE WHEN status = 'suspended' THEN clock.now ELSE wake_at_ms END
    FROM clock
    WHERE routing_key = %(rk)s AND run_id = %(run_id)s
      AND status IN ('runnable', 'running', 'suspended', 'diverged')
    RETURNING run_id
), sig AS (
    INSERT INTO {schema}.workflow_signals
        (routing_key, run_id, signal_id, name, payload, sent_at_ms)
    SELECT %(rk)s, %(run_id)s, %(signal_id)s, %(name)s, %(payload)s, clock.now
    FROM clock
    WHERE EXISTS (SELECT 1 FROM run)
    ON CONFLICT DO NOTHING
    RETURNING signal_id
)
SELECT (SELECT count(*) FROM run) AS live, (SELECT count(*) FROM sig) AS kept,
       EXISTS (SELECT 1 FROM {schema}.workflow_signals g
               WHERE g.routing_key = %(rk)s AND g.run_id = %(run_id)s
                 AND g.signal_id = %(signal_id)s) AS known;

-- wf_cancel --
-- asks a live run to cancel: its next durable await raises WorkflowCancelled (a suspended run wakes now); returns the run's status, none when there is no such run; the clock read once in a materialised CTE (Citus allows no function in a modification's CASE)
WITH clock AS MATERIALIZED (SELECT {schema}.stmt_ms(%(off)s) AS now)
UPDATE {schema}.workflows
SET cancel_requested = cancel_requested OR status <> 'diverged', pending_wake = true,
    status = CASE WHEN status = 'suspended' THEN 'runnable' ELSE status END,
    wake_at_ms = CASE WHEN status = 'suspended' THEN clock.now ELSE wake_at_ms END,
    updated_at_ms = clock.now
FROM clock
WHERE routing_key = %(rk)s AND run_id = %(run_id)s
  AND status IN ('runnable', 'running', 'suspended')
RETURNING status;

-- wf_abandon_diverged --
-- an operator cancels a diverged run: it ends as cancelled without running again
UPDATE {schema}.workflows
SET status = 'cancelled', error = %(error)s, wake_at_ms = NULL, waiting = NULL,
    cancel_requested = true, finished_at_ms = {schema}.stmt_ms(%(off)s),
    updated_at_ms = {schema}.stmt_ms(%(off)s)
WHERE routing_key = %(rk)s AND run_id = %(run_id)s AND status = 'diverged'
RETURNING status;

-- wf_retry --
-- an operator retries a diverged run after a fix: runnable now, its journal kept
UPDATE {schema}.workflows
SET status = 'runnable', wake_at_ms = {schema}.stmt_ms(%(off)s), error = NULL,
    updated_at_ms = {schema}.stmt_ms(%(off)s)
WHERE routing_key = %(rk)s AND run_id = %(run_id)s AND status = 'diverged'
RETURNING status;

-- wf_job_outcome --
-- a job step's outcome (delivered from the job's settle): records it once on the pending job step and wakes the run, or on the cancel record that took the step's place when the run was cancelled there (the run is not woken); a repeat changes nothing; answers whether it was recorded and whether the step already holds this outcome; the clock read once in a materialised CTE (Citus)
WITH clock AS MATERIALIZED (SELECT {schema}.stmt_ms(%(off)s) AS now), step AS (
    UPDATE {schema}.workflow_steps s
    SET status = 'done', outcome = %(outcome)s,
        recorded_at_ms = CASE WHEN s.kind = 'job' THEN clock.now ELSE s.recorded_at_ms END
    FROM clock
    WHERE s.routing_key = %(rk)s AND s.run_id = %(run_id)s AND s.seq = %(seq)s
      AND ((s.kind = 'job' AND s.status = 'pending')
           OR (s.kind = 'cancel' AND s.outcome IS NULL AND s.detail LIKE '%%"job_id"%%'))
    RETURNING s.seq, s.kind
), run AS (
    UPDATE {schema}.workflows
    SET pending_wake = true,
        status = CASE WHEN status = 'suspended' THEN 'runnable' ELSE status END,
        wake_at_ms = CASE WHEN status = 'suspended' THEN clock.now ELSE wake_at_ms END
    FROM clock
    WHERE routing_key = %(rk)s AND run_id = %(run_id)s
      AND EXISTS (SELECT 1 FROM step WHERE step.kind = 'job')
    RETURNING status
)
SELECT (SELECT count(*) FROM step) AS recorded, (SELECT count(*) FROM run) AS woke,
       EXISTS (SELECT 1 FROM {schema}.workflow_steps k
               WHERE k.routing_key = %(rk)s AND k.run_id = %(run_id)s AND k.seq = %(seq)s
                 AND k.outcome = %(outcome)s) AS known;

-- wf_lock_job_step --
-- a cancel reaching a pending job step first locks that step's record (before the run's row, in wf_job_outcome's order): a job outcome recorded meanwhile is answered instead of being replaced
SELECT kind, status, outcome
FROM {schema}.workflow_steps
WHERE routing_key = %(rk)s AND run_id = %(run_id)s AND seq = %(seq)s
FOR UPDATE;

-- wf_cancel_job_unstarted --
-- a run cancelled at a job step deletes its job when it never ran and never reported (semantics §5.8.1, as a turn's cancel_job): it never runs; returns its payload
DELETE FROM {schema}.outbox
WHERE routing_key = %(rk)s AND intent_id = %(job_id)s AND kind = 'job' AND attempts = 0
  AND NOT running
RETURNING payload;

-- wf_cancel_job_started --
-- otherwise marks the job cancelled (semantics §5.8.2): a running attempt is interrupted, and the job is settled once, its cancellation report routed to the run's step
UPDATE {schema}.outbox
SET cancelled_at_ms = %(now)s::bigint, timer_key = NULL, waiting = false,
    due_at_ms = CASE WHEN running THEN due_at_ms ELSE least(due_at_ms, %(now)s::bigint) END
WHERE routing_key = %(rk)s AND intent_id = %(job_id)s AND kind = 'job'
  AND cancelled_at_ms IS NULL
RETURNING running;

-- wf_list --
-- runs for operators, newest first, optionally of one status, actor type, workflow and tenant
SELECT run_id, tenant_id, actor_type, actor_id, workflow, run_key, status, waiting, wake_at_ms,
       deadline_ms, cancel_requested, attempts, started_at_ms, updated_at_ms, finished_at_ms,
       error
FROM {schema}.workflows
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(type)s::text IS NULL OR actor_type = %(type)s)
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s)
  AND (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s)
ORDER BY started_at_ms DESC, run_id
LIMIT %(limit)s;

-- wf_actor_runs --
-- one actor's runs for operators (the console), newest first, keyed
SELECT run_id, tenant_id, actor_type, actor_id, workflow, run_key, status, waiting, wake_at_ms,
       deadline_ms, cancel_requested, attempts, started_at_ms, updated_at_ms, finished_at_ms,
       error
FROM {schema}.workflows
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s
ORDER BY started_at_ms DESC, run_id
LIMIT %(limit)s;

-- sample_workflows --
-- sampled gauges (maintenance owner): live runs per actor type across actors, running under a live lease and suspended (the workflows_live index)
SELECT actor_type,
       count(*) FILTER (WHERE status = 'running'
                          AND wake_at_ms > {schema}.stmt_ms(%(off)s)) AS running,
       count(*) FILTER (WHERE status = 'suspended') AS suspended
FROM {schema}.workflows
WHERE status IN ('running', 'suspended')
GROUP BY actor_type
ORDER BY actor_type;

-- wf_prune --
-- retention: finished runs older than their type's keep_workflows, with their journal and signals, a bounded batch per call
WITH gone AS (
    DELETE FROM {schema}.workflows w
    USING (
        SELECT x.routing_key, x.run_id
        FROM {schema}.workflows x
        WHERE x.finished_at_ms < {schema}.stmt_ms(%(off)s) - %(keep_ms)s::bigint
          AND x.actor_type = %(type)s
        LIMIT %(limit)s
    ) c
    WHERE w.routing_key = c.routing_key AND w.run_id = c.run_id
    RETURNING w.routing_key, w.run_id
), steps AS (
    DELETE FROM {schema}.workflow_steps s
    USING gone
    WHERE s.routing_key = gone.routing_key AND s.run_id = gone.run_id
), sigs AS (
    DELETE FROM {schema}.workflow_signals g
    USING gone
    WHERE g.routing_key = gone.routing_key AND g.run_id = gone.run_id
), aliases AS (
    DELETE FROM {schema}.workflow_aliases a
    USING gone
    WHERE a.routing_key = gone.routing_key AND a.target_run_id = gone.run_id
)
SELECT count(*) AS pruned FROM gone;
