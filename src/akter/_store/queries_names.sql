-- The deployment's registry of declared names and the orphan check (spec evolution.md E2).
-- The counts are cross-actor by design and bounded by %(cap)s rows per count; they run only for
-- recorded names that the code no longer claims (see akter._engine.orphans).

-- names_record --
-- adds the names a starting runtime declares; a recorded name is never changed or removed here
WITH clock AS MATERIALIZED (SELECT {schema}.now_ms(0) AS now)
INSERT INTO {schema}.deployment_names (actor_type, kind, name, recorded_at_ms)
SELECT n.actor_type, n.kind, n.name, clock.now
FROM unnest(%(types)s::text[], %(kinds)s::text[], %(names)s::text[]) AS n(actor_type, kind, name)
CROSS JOIN clock
ON CONFLICT DO NOTHING;

-- names_recorded --
-- every recorded actor type (the deployment's placements) and declared name, in a stable order
SELECT p.key AS actor_type, 'actor_type' AS kind, p.key AS name
FROM {schema}.deployment d CROSS JOIN LATERAL jsonb_object_keys(d.placements) AS p(key)
UNION ALL
SELECT n.actor_type, n.kind, n.name FROM {schema}.deployment_names n
ORDER BY 1, 2, 3;

-- names_count_types --
-- per actor type: its actors, pending intents to it and job rows of it, dead letters and events (each count capped)
SELECT n.actor_type,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.actors a
                              WHERE a.actor_type = n.actor_type LIMIT %(cap)s) c) AS actors,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.outbox o
                              WHERE (o.kind = 'intent' AND o.target_type = n.actor_type)
                                 OR (o.kind = 'job' AND o.actor_type = n.actor_type)
                              LIMIT %(cap)s) c) AS outbox,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.dead_letters d
                              WHERE d.actor_type = n.actor_type LIMIT %(cap)s) c) AS dead_letters,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.events e
                              WHERE e.actor_type = n.actor_type LIMIT %(cap)s) c) AS events
FROM unnest(%(types)s::text[]) AS n(actor_type);

-- names_count_commands --
-- per (type, command): pending intents, timers and ticks to it, parked ones included (capped)
SELECT n.actor_type, n.name,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.outbox o
                              WHERE o.kind = 'intent' AND o.target_type = n.actor_type
                                AND o.command = n.name LIMIT %(cap)s) c) AS outbox
FROM unnest(%(types)s::text[], %(names)s::text[]) AS n(actor_type, name);

-- names_count_jobs --
-- per (type, job): pending job rows, parked ones included, and dead letters (each count capped)
SELECT n.actor_type, n.name,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.outbox o
                              WHERE o.kind = 'job' AND o.actor_type = n.actor_type
                                AND o.command = n.name LIMIT %(cap)s) c) AS outbox,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.dead_letters d
                              WHERE d.actor_type = n.actor_type AND d.job = n.name
                              LIMIT %(cap)s) c) AS dead_letters
FROM unnest(%(types)s::text[], %(names)s::text[]) AS n(actor_type, name);

-- names_count_events --
-- per (type, tag): retained events stored under the tag (capped; the type's index bounds the scan)
SELECT n.actor_type, n.name,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.events e
                              WHERE e.actor_type = n.actor_type AND e.tag = n.name
                              LIMIT %(cap)s) c) AS events
FROM unnest(%(types)s::text[], %(names)s::text[]) AS n(actor_type, name);

-- names_forget --
-- forgets recorded (type, kind, name) entries the maintenance owner found without rows
DELETE FROM {schema}.deployment_names n
USING unnest(%(types)s::text[], %(kinds)s::text[], %(names)s::text[]) AS f(actor_type, kind, name)
WHERE n.actor_type = f.actor_type AND n.kind = f.kind AND n.name = f.name;
