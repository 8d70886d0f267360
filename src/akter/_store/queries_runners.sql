-- Runners, singleton leases and retention (semantics §7, §8).

-- register_runner --
-- announces this runner with the types it hosts and executes, at one clock reading (a materialised CTE: Citus refuses a volatile function in a modification)
WITH clock AS MATERIALIZED (
    SELECT {schema}.now_ms(%(off)s::bigint) AS now
)
INSERT INTO {schema}.runners
    (runner_id, started_at_ms, heartbeat_at_ms, http_address, actor_types, job_types, version,
     draining, models)
SELECT %(runner_id)s::uuid, clock.now, clock.now, %(http_address)s::text, %(actor_types)s::text[],
       %(job_types)s::text[], %(version)s::text, false, %(models)s::jsonb
FROM clock
ON CONFLICT (runner_id) DO UPDATE
SET heartbeat_at_ms = excluded.heartbeat_at_ms, http_address = excluded.http_address,
    actor_types = excluded.actor_types, job_types = excluded.job_types, draining = false,
    models = excluded.models;

-- heartbeat_runner --
-- keeps this runner live at one clock reading (a materialised CTE); no row means it was pruned and must register again
WITH clock AS MATERIALIZED (
    SELECT {schema}.now_ms(%(off)s::bigint) AS now
)
UPDATE {schema}.runners r
SET heartbeat_at_ms = clock.now, draining = %(draining)s::boolean
FROM clock
WHERE r.runner_id = %(runner_id)s::uuid
RETURNING r.heartbeat_at_ms;

-- unregister_runner --
-- a drained runner leaves the registry
DELETE FROM {schema}.runners WHERE runner_id = %(runner_id)s;

-- live_runners --
-- runners whose heartbeat is younger than the liveness window and not ahead of the clock, at one clock reading (a heartbeat is written at "now": one further ahead than the skew margin predates a backward clock move)
WITH clock AS MATERIALIZED (
    SELECT {schema}.now_ms(%(off)s::bigint) AS now
)
SELECT r.runner_id::text AS runner_id, r.started_at_ms, r.heartbeat_at_ms, r.http_address,
       r.actor_types, r.job_types, r.version, r.draining
FROM {schema}.runners r, clock
WHERE r.heartbeat_at_ms > clock.now - %(live_ms)s::bigint
  AND r.heartbeat_at_ms <= clock.now + %(skew_ms)s::bigint
ORDER BY r.started_at_ms, r.runner_id;

-- live_state_paths --
-- the state key paths of live runners' models of one actor type at one state version that were first recorded after this runner's model (the name registry's kind 'state', migration 0014), like live_runners at one clock reading
WITH clock AS MATERIALIZED (
    SELECT {schema}.now_ms(%(off)s::bigint) AS now
)
SELECT r.models -> %(actor_type)s::text -> 'paths' AS paths
FROM {schema}.runners r
CROSS JOIN clock
JOIN {schema}.deployment_names theirs
  ON theirs.actor_type = %(actor_type)s::text AND theirs.kind = 'state'
 AND theirs.name = r.models -> %(actor_type)s::text ->> 'model'
WHERE r.heartbeat_at_ms > clock.now - %(live_ms)s::bigint
  AND r.heartbeat_at_ms <= clock.now + %(skew_ms)s::bigint
  AND r.models -> %(actor_type)s::text -> 'version' = to_jsonb(%(version)s::int)
  AND theirs.recorded_at_ms > (
      SELECT mine.recorded_at_ms FROM {schema}.deployment_names mine
      WHERE mine.actor_type = %(actor_type)s::text AND mine.kind = 'state'
        AND mine.name = %(model)s::text);

-- live_declares_command --
-- whether a live runner's code declares a command of one actor type (recorded at registration, migration 0014), like live_runners at one clock reading
WITH clock AS MATERIALIZED (
    SELECT {schema}.now_ms(%(off)s::bigint) AS now
)
SELECT EXISTS (
    SELECT 1 FROM {schema}.runners r, clock
    WHERE r.heartbeat_at_ms > clock.now - %(live_ms)s::bigint
      AND r.heartbeat_at_ms <= clock.now + %(skew_ms)s::bigint
      AND r.models -> %(actor_type)s::text -> 'commands' @> to_jsonb(ARRAY[%(command)s::text])
) AS declared;

-- live_declares_job --
-- whether a live runner's code declares a job of one actor type (recorded at registration, migration 0014), like live_runners at one clock reading
WITH clock AS MATERIALIZED (
    SELECT {schema}.now_ms(%(off)s::bigint) AS now
)
SELECT EXISTS (
    SELECT 1 FROM {schema}.runners r, clock
    WHERE r.heartbeat_at_ms > clock.now - %(live_ms)s::bigint
      AND r.heartbeat_at_ms <= clock.now + %(skew_ms)s::bigint
      AND r.models -> %(actor_type)s::text -> 'jobs' @> to_jsonb(ARRAY[%(job)s::text])
) AS declared;

-- prune_runners --
-- forgets runners silent for longer than the prune age, or whose heartbeat is further ahead of the clock than the liveness window (written before the clock moved back; a live runner registers again); returns how far ahead
WITH clock AS MATERIALIZED (
    SELECT {schema}.now_ms(%(off)s::bigint) AS now
)
DELETE FROM {schema}.runners r
USING clock
WHERE r.heartbeat_at_ms < clock.now - %(prune_ms)s::bigint
   OR r.heartbeat_at_ms > clock.now + %(live_ms)s::bigint
RETURNING r.runner_id::text AS runner_id, greatest(r.heartbeat_at_ms - clock.now, 0) AS ahead_ms;

-- singleton_lock_timeout --
-- bounds how long this transaction's lease round waits on a lease row (a takeover waiting for the old owner's fenced turns)
SELECT set_config('lock_timeout', %(lock_timeout)s, true);

-- singleton_takeover --
-- the first step of a lease round, at the round's clock reading (now, from clock_now): a lease another runner holds that ended, or ends further ahead of the clock than a lease can (skew_ms: written before the clock moved back), is locked FOR UPDATE, so the takeover waits for the fenced turns (FOR KEY SHARE) of the lease it replaces; returns how far ahead it was
SELECT t.lease_until_ms - %(now)s::bigint AS ahead_ms
FROM {schema}.singletons t
WHERE t.actor_type = %(actor_type)s::text AND t.owner IS DISTINCT FROM %(runner_id)s::uuid
  AND (t.lease_until_ms <= %(now)s::bigint
       OR t.lease_until_ms > %(now)s::bigint + %(skew_ms)s::bigint)
FOR UPDATE OF t;

-- acquire_singleton --
-- after singleton_takeover, in its transaction and at its clock reading (now): takes or refreshes a lease where it ended, ends further ahead of the clock than a lease can, or this runner owns it; writes the singleton actor's routing key (0008)
INSERT INTO {schema}.singletons AS s
    (routing_key, actor_type, owner, lease_until_ms, acquired_at_ms)
VALUES (%(rk)s::bigint, %(actor_type)s::text, %(runner_id)s::uuid,
        %(now)s::bigint + %(lease_ms)s::bigint, %(now)s::bigint)
ON CONFLICT (actor_type) DO UPDATE
SET routing_key = excluded.routing_key, owner = excluded.owner,
    lease_until_ms = excluded.lease_until_ms,
    acquired_at_ms = CASE WHEN s.owner = excluded.owner THEN s.acquired_at_ms
                          ELSE excluded.acquired_at_ms END
WHERE s.lease_until_ms <= excluded.acquired_at_ms OR s.owner = excluded.owner
   OR s.lease_until_ms > excluded.acquired_at_ms + %(skew_ms)s::bigint
RETURNING owner::text AS owner, lease_until_ms, acquired_at_ms;

-- renew_singletons --
-- the lease round of a runner that holds leases: extends every lease of %(types)s it still owns in one statement (one clock reading, a materialised CTE: Citus refuses a volatile function in a modification); a plain UPDATE takes FOR NO KEY UPDATE, which fenced turns' FOR KEY SHARE does not block; a lease not returned was taken over and gets a full round
WITH clock AS MATERIALIZED (
    SELECT {schema}.now_ms(%(off)s::bigint) AS now
)
UPDATE {schema}.singletons s
SET lease_until_ms = clock.now + %(lease_ms)s::bigint
FROM clock
WHERE s.actor_type = ANY(%(types)s::text[]) AND s.owner = %(runner_id)s::uuid
RETURNING s.actor_type, s.owner::text AS owner, s.lease_until_ms, s.acquired_at_ms;

-- release_singleton --
-- a stopping owner ends its lease at once (one clock reading, a materialised CTE) so a survivor can take over
WITH clock AS MATERIALIZED (
    SELECT {schema}.now_ms(%(off)s::bigint) AS now
)
UPDATE {schema}.singletons s
SET lease_until_ms = clock.now
FROM clock
WHERE s.actor_type = %(actor_type)s::text AND s.owner = %(runner_id)s::uuid;

-- check_singleton_fence --
-- at admission, a loop's fenced command: its lease (owner, epoch) and its end, which the turn compares with its one clock reading; no lock, so a paused turn holds nothing
SELECT lease_until_ms FROM {schema}.singletons
WHERE actor_type = %(actor_type)s AND owner = %(owner)s::uuid
  AND acquired_at_ms = %(epoch)s::bigint;

-- hold_singleton_fence --
-- last before COMMIT in the commit flight: that lease still current at the server's clock as the check runs (not only at the turn's estimate, now: a process frozen mid-flight resumes with a stale one), held FOR KEY SHARE through COMMIT (a takeover's FOR UPDATE waits); else serialization_failure rolls the batch back
SELECT {schema}.fence_check(count(*)) FROM (
    SELECT 1 FROM {schema}.singletons
    WHERE actor_type = %(actor_type)s AND owner = %(owner)s::uuid
      AND acquired_at_ms = %(epoch)s::bigint
      AND lease_until_ms > GREATEST(%(now)s::bigint, {schema}.now_ms(%(off)s::bigint))
    FOR KEY SHARE
) AS fence;

-- hold_fence_clock --
-- last before COMMIT in a fenced commit flight, after hold_singleton_fence: the framework clock read as it runs (on no table, so on Citus by the coordinator, whose clock wrote the lease) is before the end of every held lease as the admission read it; else serialization_failure rolls the batch back
SELECT {schema}.fence_check((%(lease_until)s::bigint > {schema}.now_ms(%(off)s::bigint))::int);

-- prune_receipts --
-- deletes a batch of a type's receipts past expiry + margin whose id no outbox row still carries; no row locks (receipts are never updated; the delete re-checks each row)
WITH doomed AS (
    SELECT r.routing_key, r.tenant_id, r.actor_type, r.actor_id, r.command_id
    FROM {schema}.receipts r
    WHERE r.actor_type = %(type)s AND r.expires_at_ms <= %(cutoff)s::bigint
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.outbox o
          WHERE o.intent_id = r.command_id AND o.tenant_id = r.tenant_id
            AND o.target_type = r.actor_type AND o.target_id = r.actor_id)
    LIMIT %(batch)s
)
DELETE FROM {schema}.receipts r
USING doomed d
WHERE r.routing_key = d.routing_key AND r.tenant_id = d.tenant_id
  AND r.actor_type = d.actor_type AND r.actor_id = d.actor_id AND r.command_id = d.command_id
RETURNING 1;

-- prune_events --
-- deletes a batch of a type's events: per actor only the prefix up to the newest expired seq, less what an unparked subscription feed has not delivered unless emitted before the hold's cutoff (the subscriptions spec S5); no row locks (events are never updated; the delete re-checks each row)
WITH doomed AS (
    SELECT e.routing_key, e.tenant_id, e.actor_type, e.actor_id, e.seq
    FROM {schema}.events e
    WHERE (e.actor_type = %(type)s AND e.emitted_at_ms <= %(cutoff)s::bigint
           OR (e.actor_type = %(type)s AND e.seq < (
                  SELECT max(x.seq) FROM {schema}.events x
                  WHERE x.routing_key = e.routing_key AND x.tenant_id = e.tenant_id
                    AND x.actor_type = e.actor_type AND x.actor_id = e.actor_id
                    AND x.emitted_at_ms <= %(cutoff)s::bigint)))
      AND (e.emitted_at_ms <= %(held)s::bigint OR NOT EXISTS (
              SELECT 1 FROM {schema}.subscription_feeds f
              WHERE f.routing_key = e.routing_key AND f.tenant_id = e.tenant_id
                AND f.actor_type = e.actor_type AND f.actor_id = e.actor_id
                AND f.done < e.seq AND f.parked IS NULL))
    LIMIT %(batch)s
)
DELETE FROM {schema}.events e
USING doomed d
WHERE e.routing_key = d.routing_key AND e.tenant_id = d.tenant_id
  AND e.actor_type = d.actor_type AND e.actor_id = d.actor_id AND e.seq = d.seq
RETURNING 1;

-- sample_outbox --
-- sampled gauges (maintenance owner): per kind, outbox rows, age of the oldest due row (claimed and parked rows are not due), rows with attempts >= stuck and parked rows, in the one scan
WITH clock AS MATERIALIZED (
    SELECT {schema}.stmt_ms(%(off)s::bigint) AS now
)
SELECT k.kind,
       count(o.kind) AS outbox_rows,
       coalesce(clock.now - min(o.due_at_ms)
                                FILTER (WHERE o.due_at_ms <= clock.now AND o.parked_at_ms IS NULL),
                0) AS lag_ms,
       count(o.kind) FILTER (WHERE o.attempts >= %(stuck)s::integer) AS stuck_rows,
       count(o.kind) FILTER (WHERE o.parked_at_ms IS NOT NULL) AS parked
FROM (VALUES ('intent'), ('job')) AS k(kind)
CROSS JOIN clock
LEFT JOIN {schema}.outbox o ON o.kind = k.kind
GROUP BY k.kind, clock.now
ORDER BY k.kind;

-- sample_running_jobs --
-- sampled gauge (maintenance owner): job attempts running under a live lease, per actor type and job
SELECT o.actor_type, o.command AS job, count(*) AS running
FROM {schema}.outbox o
WHERE o.kind = 'job' AND o.running AND o.due_at_ms > {schema}.stmt_ms(%(off)s::bigint)
GROUP BY o.actor_type, o.command
ORDER BY o.actor_type, o.command;

-- clock_skew_probe --
-- the clock, and how far the newest heartbeat, singleton lease end and job attempt lease end lie ahead of it (small tables and the running-jobs index, across actors; a backward clock move leaves them ahead)
WITH clock AS MATERIALIZED (
    SELECT {schema}.now_ms(%(off)s::bigint) AS now
)
SELECT clock.now,
       (SELECT max(r.heartbeat_at_ms) FROM {schema}.runners r) - clock.now AS heartbeat_ahead_ms,
       (SELECT max(s.lease_until_ms) FROM {schema}.singletons s) - clock.now AS lease_ahead_ms,
       (SELECT max(o.due_at_ms) FROM {schema}.outbox o WHERE o.kind = 'job' AND o.running)
           - clock.now AS job_lease_ahead_ms
FROM clock;
