-- Citus variants of the evolution statements (docs/citus.md): the operators' parked
-- rows, the maintenance owner's parking of undeclared jobs, and the orphan counts. Citus has no
-- row lock in a statement that spans shards and cannot push down a join of unnest() with
-- correlated subqueries on distributed tables, so on Citus these are an unlocked scan followed
-- by keyed single-shard statements, or one uncorrelated count per name. The gateways pick them
-- when Store.strategy is "citus" (akter._store.citus.PLAIN_ONLY). Same block format as
-- queries.sql; loaded into the same catalogue.

-- citus_parked_scan --
-- Citus, step 1 of an operator's retry or discard: the parked rows named (by id, or every parked row matching the filters), read without locks across shards, in lock order
SELECT o.routing_key, o.intent_id
FROM {schema}.outbox o
WHERE o.parked_at_ms IS NOT NULL
  AND (%(ids)s::text[] IS NULL OR o.intent_id = ANY(%(ids)s::text[]))
  AND (%(type)s::text IS NULL
       OR (CASE WHEN o.kind = 'job' THEN o.actor_type ELSE o.target_type END) = %(type)s::text)
  AND (%(command)s::text IS NULL OR o.command = %(command)s::text)
ORDER BY o.routing_key, o.intent_id;

-- citus_parked_lock --
-- Citus, step 2: locks one scanned row in its own shard for the retry or discard in this transaction, only while it is still parked (kind, type and command never change)
SELECT o.routing_key, o.intent_id
FROM {schema}.outbox o
WHERE o.routing_key = %(rk)s::bigint AND o.intent_id = %(intent_id)s::text
  AND o.parked_at_ms IS NOT NULL
FOR UPDATE OF o;

-- citus_park_undeclared_scan --
-- Citus, step 1 of parking an undeclared job: a batch of one (actor type, job)'s unparked rows without a live attempt at the sweep's clock reading (now, from clock_now), read without locks
SELECT o.routing_key, o.intent_id
FROM {schema}.outbox o
WHERE o.kind = 'job' AND o.parked_at_ms IS NULL AND o.actor_type = %(type)s::text
  AND o.command = %(job)s::text
  AND NOT (o.running AND o.due_at_ms > %(now)s::bigint)
LIMIT %(batch)s;

-- citus_park_undeclared_job --
-- Citus, step 2: parks one such row in its own shard, SKIP LOCKED, only while still unparked and without a live attempt; every other column kept
WITH doomed AS (
    SELECT o.routing_key, o.intent_id
    FROM {schema}.outbox o
    WHERE o.routing_key = %(rk)s::bigint AND o.intent_id = %(intent_id)s::text
      AND o.kind = 'job' AND o.parked_at_ms IS NULL AND o.actor_type = %(type)s::text
      AND o.command = %(job)s::text
      AND NOT (o.running AND o.due_at_ms > %(now)s::bigint)
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE {schema}.outbox o
SET parked_at_ms = %(now)s::bigint, last_error = %(error)s
FROM doomed d
WHERE o.routing_key = %(rk)s::bigint AND o.intent_id = d.intent_id
RETURNING o.intent_id;

-- citus_names_count_type --
-- Citus, one actor type (names_count_types per name): its actors, pending intents to it and job rows of it, dead letters and events (each count capped, uncorrelated)
SELECT %(type)s::text AS actor_type,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.actors a
                              WHERE a.actor_type = %(type)s::text LIMIT %(cap)s) c) AS actors,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.outbox o
                              WHERE (o.kind = 'intent' AND o.target_type = %(type)s::text)
                                 OR (o.kind = 'job' AND o.actor_type = %(type)s::text)
                              LIMIT %(cap)s) c) AS outbox,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.dead_letters d
                              WHERE d.actor_type = %(type)s::text
                              LIMIT %(cap)s) c) AS dead_letters,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.events e
                              WHERE e.actor_type = %(type)s::text LIMIT %(cap)s) c) AS events;

-- citus_names_count_command --
-- Citus, one (type, command) (names_count_commands per name): pending intents, timers and ticks to it, parked ones included (capped, uncorrelated)
SELECT %(type)s::text AS actor_type, %(name)s::text AS name,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.outbox o
                              WHERE o.kind = 'intent' AND o.target_type = %(type)s::text
                                AND o.command = %(name)s::text LIMIT %(cap)s) c) AS outbox;

-- citus_names_count_job --
-- Citus, one (type, job) (names_count_jobs per name): pending job rows, parked ones included, and dead letters (each count capped, uncorrelated)
SELECT %(type)s::text AS actor_type, %(name)s::text AS name,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.outbox o
                              WHERE o.kind = 'job' AND o.actor_type = %(type)s::text
                                AND o.command = %(name)s::text LIMIT %(cap)s) c) AS outbox,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.dead_letters d
                              WHERE d.actor_type = %(type)s::text AND d.job = %(name)s::text
                              LIMIT %(cap)s) c) AS dead_letters;

-- citus_names_count_event --
-- Citus, one (type, tag) (names_count_events per name): retained events stored under the tag (capped, uncorrelated)
SELECT %(type)s::text AS actor_type, %(name)s::text AS name,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.events e
                              WHERE e.actor_type = %(type)s::text AND e.tag = %(name)s::text
                              LIMIT %(cap)s) c) AS events;
