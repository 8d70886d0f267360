-- 0005_name_registry: the names each deployment declared (spec evolution.md E2, orphans).
--
-- Every runtime records, at start, the commands, jobs and event tags its actor types declare
-- (their actor types are already in deployment.placements). The registry is a union: a start
-- only adds names, so a name that a later deployment no longer declares stays, and the
-- $maintenance owner can compare the recorded names with the code instead of scanning the
-- data for distinct names. A name whose rows are all gone may be forgotten by that owner.
-- Names of pending outbox rows and dead letters written before this migration are recorded
-- here once (they are small, pending work); event tags stored before it are not (that would
-- scan every event once): `akter check` finds those.

CREATE TABLE {schema}.deployment_names (
    actor_type text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('command', 'job', 'event')),
    name text NOT NULL,
    recorded_at_ms bigint NOT NULL,
    PRIMARY KEY (actor_type, kind, name)
);

INSERT INTO {schema}.deployment_names (actor_type, kind, name, recorded_at_ms)
SELECT DISTINCT o.target_type, 'command', o.command, {schema}.now_ms(0)
FROM {schema}.outbox o WHERE o.kind = 'intent'
UNION
SELECT DISTINCT o.actor_type, 'job', o.command, {schema}.now_ms(0)
FROM {schema}.outbox o WHERE o.kind = 'job'
UNION
SELECT DISTINCT d.actor_type, 'job', d.job, {schema}.now_ms(0)
FROM {schema}.dead_letters d
ON CONFLICT DO NOTHING;
