-- 0007_workflows: durable sequential code on actors (issue 15, ../shared/spec/workflows.md).
--
-- A run belongs to one actor and is keyed by that actor's routing_key (principle 7). Its steps
-- are a journal (workflow_steps), and the signals sent to it wait in workflow_signals until a
-- wait consumes them.
--
-- One column decides when a run may be claimed: wake_at_ms. A runnable run has it at the time
-- it became runnable; a suspended run at the end of its sleep, wait timeout or run deadline
-- (NULL: only a signal, a job outcome or a cancel wakes it); a running run at its lease end, so
-- a dead runner's run is claimable once that lease has passed. Finished and diverged runs have
-- none. One partial index answers both the claim and an idle relay's "when is the next one due".
CREATE TABLE {schema}.workflows (
    routing_key bigint NOT NULL,
    run_id text NOT NULL,
    tenant_id text NOT NULL,
    actor_type text NOT NULL,
    actor_id text NOT NULL,
    workflow text NOT NULL,
    run_key text,
    input text NOT NULL,
    input_hash text NOT NULL,
    caller text NOT NULL,
    status text NOT NULL CHECK (status IN
        ('runnable', 'running', 'suspended', 'completed', 'failed', 'cancelled', 'diverged')),
    wake_at_ms bigint,
    waiting text,
    cancel_requested boolean NOT NULL DEFAULT false,
    -- Set by a signal, a job outcome or a cancel; cleared by a claim. A run that suspends with
    -- it set becomes runnable at once instead: the wake arrived while it ran.
    pending_wake boolean NOT NULL DEFAULT false,
    deadline_ms bigint,
    lease_owner uuid,
    token bigint NOT NULL DEFAULT 0,
    attempts integer NOT NULL DEFAULT 0,
    result text,
    error text,
    started_at_ms bigint NOT NULL,
    updated_at_ms bigint NOT NULL,
    finished_at_ms bigint,
    -- The W3C traceparent of the span that started the run: every attempt's span links to it.
    traceparent text,
    PRIMARY KEY (routing_key, run_id),
    CHECK (status = 'suspended'
           OR (status IN ('runnable', 'running')) = (wake_at_ms IS NOT NULL))
);
CREATE INDEX workflows_wake ON {schema}.workflows (wake_at_ms) WHERE wake_at_ms IS NOT NULL;
CREATE INDEX workflows_run_id ON {schema}.workflows (run_id);
CREATE INDEX workflows_actor ON {schema}.workflows (routing_key, tenant_id, actor_type, actor_id);
CREATE INDEX workflows_finished ON {schema}.workflows (finished_at_ms)
    WHERE finished_at_ms IS NOT NULL;
-- At most one live run per (actor, workflow, key).
CREATE UNIQUE INDEX workflows_live_key ON {schema}.workflows
    (routing_key, tenant_id, actor_type, actor_id, workflow, run_key)
    WHERE run_key IS NOT NULL AND status IN ('runnable', 'running', 'suspended', 'diverged');

-- The journal. A step is 'pending' while its effect is under way (the command id of a command
-- step, the job id of a job step, the end of a sleep or wait) and 'done' with its outcome.
CREATE TABLE {schema}.workflow_steps (
    routing_key bigint NOT NULL,
    run_id text NOT NULL,
    seq integer NOT NULL CHECK (seq >= 0),
    kind text NOT NULL,
    name text NOT NULL,
    status text NOT NULL CHECK (status IN ('pending', 'done')),
    detail text,
    outcome text,
    started_at_ms bigint NOT NULL,
    recorded_at_ms bigint,
    PRIMARY KEY (routing_key, run_id, seq)
);

-- Signals in arrival order (signal_seq); a wait consumes the oldest unconsumed one of its name.
CREATE TABLE {schema}.workflow_signals (
    routing_key bigint NOT NULL,
    run_id text NOT NULL,
    signal_id text NOT NULL,
    signal_seq bigint GENERATED ALWAYS AS IDENTITY,
    name text NOT NULL,
    payload text NOT NULL,
    sent_at_ms bigint NOT NULL,
    consumed_seq integer,
    PRIMARY KEY (routing_key, run_id, signal_id)
);

-- A keyed start that found a live run of its key started nothing: its run id (already handed
-- to the turn that staged it) names the live run from then on.
CREATE TABLE {schema}.workflow_aliases (
    routing_key bigint NOT NULL,
    run_id text NOT NULL,
    target_run_id text NOT NULL,
    PRIMARY KEY (routing_key, run_id)
);
CREATE INDEX workflow_aliases_run_id ON {schema}.workflow_aliases (run_id);
-- The samplers' count of live runs by type (akter.workflows.running and .suspended) reads only
-- the runs that hold a lease or wait, never the finished ones retention keeps.
CREATE INDEX workflows_live ON {schema}.workflows (actor_type, status)
    WHERE status IN ('running', 'suspended');

-- Inspection views (W4), read-only like those of 0002_inspection_views.sql: times as
-- timestamptz (the tables keep them in ms), the error's type and message, the journal's counts,
-- and for a suspended run what it waits for (waiting) and until when (wake_at: the end of its
-- sleep, wait timeout or deadline; NULL while only a signal, a job outcome or a cancel wakes
-- it). A running run's lease end is lease_until. Stored JSON (input, result, error, outcomes)
-- is shown as jsonb.
CREATE VIEW {schema}.v_workflows AS
SELECT w.run_id, w.tenant_id, w.actor_type, w.actor_id, w.workflow, w.run_key, w.status,
       w.waiting,
       CASE WHEN w.status = 'suspended' THEN to_timestamp(w.wake_at_ms / 1000.0) END
           AS wake_at,
       CASE WHEN w.status = 'running' THEN to_timestamp(w.wake_at_ms / 1000.0) END
           AS lease_until,
       to_timestamp(w.deadline_ms / 1000.0) AS deadline_at,
       w.cancel_requested, w.attempts,
       w.error::jsonb ->> 'type' AS error_type,
       w.error::jsonb ->> 'message' AS error_message,
       (SELECT count(*) FROM {schema}.workflow_steps s
        WHERE s.routing_key = w.routing_key AND s.run_id = w.run_id) AS steps,
       (SELECT count(*) FROM {schema}.workflow_steps s
        WHERE s.routing_key = w.routing_key AND s.run_id = w.run_id
          AND s.status = 'pending') AS pending_steps,
       (SELECT count(*) FROM {schema}.workflow_signals g
        WHERE g.routing_key = w.routing_key AND g.run_id = w.run_id
          AND g.consumed_seq IS NULL) AS pending_signals,
       to_timestamp(w.started_at_ms / 1000.0) AS started_at,
       to_timestamp(w.updated_at_ms / 1000.0) AS updated_at,
       to_timestamp(w.finished_at_ms / 1000.0) AS finished_at,
       w.result::jsonb AS result, w.error::jsonb AS error, w.input::jsonb AS input,
       w.routing_key
FROM (SELECT * FROM {schema}.workflows) w;

CREATE VIEW {schema}.v_workflow_steps AS
SELECT s.run_id, w.tenant_id, w.actor_type, w.actor_id, w.workflow, s.seq, s.kind, s.name,
       s.status, s.detail, s.outcome::jsonb AS outcome,
       to_timestamp(s.started_at_ms / 1000.0) AS started_at,
       to_timestamp(s.recorded_at_ms / 1000.0) AS recorded_at,
       s.recorded_at_ms - s.started_at_ms AS duration_ms,
       s.routing_key
FROM (SELECT * FROM {schema}.workflow_steps) s
JOIN {schema}.workflows w ON w.routing_key = s.routing_key AND w.run_id = s.run_id;
