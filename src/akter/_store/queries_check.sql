-- Statements of `akter check` (spec evolution.md E5): read-only scans of the durable rows.
--
-- Every statement runs in a READ ONLY transaction under a transaction-local statement_timeout
-- (akter._store.gateway.check). The scans page through each table by its primary key (keyset
-- pagination, a bounded LIMIT per page), so no statement holds a snapshot over a whole table
-- and each one is bounded by the timeout. The first page starts below every real key: a
-- routing key of -2^63 with empty text columns (no actor type, job id or intent id is empty).

-- check_statement_timeout --
-- bounds every read of a check transaction: a transaction-local statement_timeout (milliseconds, as text)
SELECT set_config('statement_timeout', %(timeout)s, true);

-- check_schema_state --
-- whether the schema and its migration ledger exist (read from the catalogue, never created)
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %(schema)s) AS has_schema,
       EXISTS (SELECT 1 FROM pg_catalog.pg_tables
               WHERE schemaname = %(schema)s AND tablename = 'migrations') AS has_ledger;

-- check_actors_page --
-- one page of actor rows after a primary-key cursor, in key order, with the state only when asked
SELECT a.routing_key, a.tenant_id, a.actor_type, a.actor_id, a.state_version,
       CASE WHEN %(with_state)s::boolean THEN a.state END AS state
FROM {schema}.actors a
WHERE (a.routing_key, a.tenant_id, a.actor_type, a.actor_id)
      > (%(rk)s::bigint, %(tenant)s::text, %(type)s::text, %(id)s::text)
ORDER BY a.routing_key, a.tenant_id, a.actor_type, a.actor_id
LIMIT %(limit)s;

-- check_sample_states --
-- the first actor rows of one type in key order, with their states (a sample of at most limit)
SELECT a.routing_key, a.tenant_id, a.actor_type, a.actor_id, a.state_version, a.state
FROM {schema}.actors a
WHERE a.actor_type = %(type)s
ORDER BY a.routing_key, a.tenant_id, a.actor_type, a.actor_id
LIMIT %(limit)s;

-- check_outbox_page --
-- one page of outbox rows after a primary-key cursor, in key order, with payloads and parking
SELECT o.routing_key, o.intent_id, o.kind, o.tenant_id, o.actor_type, o.actor_id,
       o.target_type, o.target_id, o.command, o.payload, o.payload_version, o.timer_key,
       o.running, o.due_at_ms, o.parked_at_ms, o.last_error
FROM {schema}.outbox o
WHERE (o.routing_key, o.intent_id) > (%(rk)s::bigint, %(id)s::text)
ORDER BY o.routing_key, o.intent_id
LIMIT %(limit)s;

-- check_dead_letters_page --
-- one page of dead letters after a primary-key cursor, in key order, with payloads
SELECT d.routing_key, d.job_id, d.tenant_id, d.actor_type, d.actor_id, d.job, d.payload,
       d.payload_version, d.cause
FROM {schema}.dead_letters d
WHERE (d.routing_key, d.job_id) > (%(rk)s::bigint, %(id)s::text)
ORDER BY d.routing_key, d.job_id
LIMIT %(limit)s;

-- check_workflows_page --
-- one page of unfinished workflow runs after a primary-key cursor, in key order, with their inputs
SELECT w.routing_key, w.run_id, w.actor_type, w.actor_id, w.workflow, w.input, w.status
FROM {schema}.workflows w
WHERE (w.routing_key, w.run_id) > (%(rk)s::bigint, %(id)s::text)
  AND w.status IN ('runnable', 'running', 'suspended', 'diverged')
ORDER BY w.routing_key, w.run_id
LIMIT %(limit)s;

-- check_events_page --
-- one page of event keys, tags and payload versions after a primary-key cursor, in key order
SELECT e.routing_key, e.tenant_id, e.actor_type, e.actor_id, e.seq, e.tag, e.payload_version
FROM {schema}.events e
WHERE (e.routing_key, e.tenant_id, e.actor_type, e.actor_id, e.seq)
      > (%(rk)s::bigint, %(tenant)s::text, %(type)s::text, %(id)s::text, %(seq)s::bigint)
ORDER BY e.routing_key, e.tenant_id, e.actor_type, e.actor_id, e.seq
LIMIT %(limit)s;

-- check_live_job_types --
-- the job types ("Type.job") of runners whose heartbeat is live and not ahead of the clock (like live_runners)
SELECT DISTINCT unnest(r.job_types) AS job_type
FROM {schema}.runners r
WHERE r.heartbeat_at_ms > {schema}.now_ms(%(off)s::bigint) - %(live_ms)s::bigint
  AND r.heartbeat_at_ms <= {schema}.now_ms(%(off)s::bigint) + %(skew_ms)s::bigint;

-- check_table_estimates --
-- the planner's row estimates of the scanned tables (pg_class.reltuples, -1 before the first ANALYZE), as progress totals
SELECT c.relname, c.reltuples::bigint AS estimate
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relname IN ('actors', 'outbox', 'dead_letters', 'events');
