-- Subscriptions (migration 0016, the subscriptions spec): the source's feed rows written in its
-- commit flight, the subscriber's follows and applied cursors written in its turn, and the
-- subscription lane's claims and settles. Feeds and follows live in the source's shard,
-- cursors in the subscriber's.

-- sub_feeds_bump_routed --
-- a source's commit: one upsert per routed subscription its batch's events match, with the newest cursor; a new feed starts at its floor (S7, S8)
INSERT INTO {schema}.subscription_feeds
    (routing_key, tenant_id, actor_type, actor_id, subscription, head, done, due_at_ms,
     updated_at_ms)
SELECT %(rk)s, %(tenant)s, %(type)s, %(id)s, s.name, s.head, s.floor, %(now)s, %(now)s
FROM unnest(%(names)s::text[], %(heads)s::bigint[], %(floors)s::bigint[]) AS s(name, head, floor)
ON CONFLICT (routing_key, tenant_id, actor_type, actor_id, subscription)
DO UPDATE SET head = greatest(subscription_feeds.head, excluded.head),
              updated_at_ms = excluded.updated_at_ms;

-- sub_feeds_bump_dynamic --
-- a source's commit: moves the head of the dynamic feeds that exist (some actor follows it); writes nothing when none does (S7)
UPDATE {schema}.subscription_feeds AS f
SET head = greatest(f.head, s.head), updated_at_ms = %(now)s
FROM unnest(%(names)s::text[], %(heads)s::bigint[]) AS s(name, head)
WHERE f.routing_key = %(rk)s AND f.tenant_id = %(tenant)s AND f.actor_type = %(type)s
  AND f.actor_id = %(id)s AND f.subscription = s.name;

-- sub_follow --
-- a subscriber's turn: follows a source from a cursor, or from the source's newest event ("now", read in the source's shard, in a CTE: Citus takes no subquery in an INSERT's VALUES); subscribing again restarts
WITH source AS MATERIALIZED (
    SELECT coalesce(max(a.event_seq), 0) AS seq FROM {schema}.actors a
    WHERE a.routing_key = %(rk)s AND a.tenant_id = %(tenant)s AND a.actor_type = %(type)s
      AND a.actor_id = %(id)s
)
INSERT INTO {schema}.subscription_follows
    (routing_key, tenant_id, actor_type, actor_id, subscription, subscriber_id, start_after)
SELECT %(rk)s, %(tenant)s, %(type)s, %(id)s, %(subscription)s, %(subscriber)s,
       coalesce(%(after)s::bigint, source.seq)
FROM source
ON CONFLICT (routing_key, tenant_id, actor_type, actor_id, subscription, subscriber_id)
DO UPDATE SET start_after = excluded.start_after
RETURNING start_after;

-- sub_feed_open --
-- a subscriber's turn: makes sure the source's dynamic feed exists and reaches back to the new follower's start (the source's newest event read as sub_follow reads it); a round running on the feed is marked rewound, so that its settle keeps that start (S2)
WITH source AS MATERIALIZED (
    SELECT coalesce(max(a.event_seq), 0) AS seq FROM {schema}.actors a
    WHERE a.routing_key = %(rk)s AND a.tenant_id = %(tenant)s AND a.actor_type = %(type)s
      AND a.actor_id = %(id)s
)
INSERT INTO {schema}.subscription_feeds
    (routing_key, tenant_id, actor_type, actor_id, subscription, head, done, due_at_ms,
     updated_at_ms)
SELECT %(rk)s, %(tenant)s, %(type)s, %(id)s, %(subscription)s, source.seq,
       coalesce(%(after)s::bigint, source.seq), %(now)s, %(now)s
FROM source
ON CONFLICT (routing_key, tenant_id, actor_type, actor_id, subscription)
DO UPDATE SET done = least(subscription_feeds.done, excluded.done),
              head = greatest(subscription_feeds.head, excluded.head),
              rewound = subscription_feeds.rewound
                        OR subscription_feeds.claim_token IS NOT NULL,
              updated_at_ms = excluded.updated_at_ms;

-- sub_unfollow --
-- a subscriber's turn: stops following a source
DELETE FROM {schema}.subscription_follows
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s AND subscription = %(subscription)s AND subscriber_id = %(subscriber)s;

-- sub_cursor_reset --
-- a subscriber's turn that subscribes or unsubscribes forgets its applied cursor of that source (a new follow starts at its own start)
DELETE FROM {schema}.subscription_cursors
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s AND subscription = %(subscription)s AND source_type = %(source_type)s
  AND source_id = %(source_id)s;

-- sub_cursor_advance --
-- a delivery's turn: records the applied cursor with the handler's effects; a cursor at or below the stored one fails the flight (division by zero: nothing of the turn commits, S1)
INSERT INTO {schema}.subscription_cursors
    (routing_key, tenant_id, actor_type, actor_id, subscription, source_type, source_id,
     applied, updated_at_ms)
SELECT %(rk)s, %(tenant)s, %(type)s, %(id)s, d.subscription, d.source_type, d.source_id,
       d.cursor, %(now)s
FROM unnest(%(subscriptions)s::text[], %(source_types)s::text[], %(source_ids)s::text[],
            %(cursors)s::bigint[]) AS d(subscription, source_type, source_id, cursor)
ON CONFLICT (routing_key, tenant_id, actor_type, actor_id, subscription, source_type, source_id)
DO UPDATE SET applied = CASE
                  WHEN subscription_cursors.applied < excluded.applied THEN excluded.applied
                  ELSE subscription_cursors.applied
                       / (subscription_cursors.applied - subscription_cursors.applied) END,
              updated_at_ms = excluded.updated_at_ms;

-- sub_cursor_read --
-- the lane's dedup probe: a subscriber's applied cursor of one source (none: nothing applied)
SELECT applied FROM {schema}.subscription_cursors
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s AND subscription = %(subscription)s AND source_type = %(source_type)s
  AND source_id = %(source_id)s;

-- sub_cursor_holders --
-- a routed retention gap: the subscribers that applied events of this source (they get the gap; read-only)
SELECT actor_id, applied FROM {schema}.subscription_cursors
WHERE tenant_id = %(tenant)s AND actor_type = %(type)s AND subscription = %(subscription)s
  AND source_type = %(source_type)s AND source_id = %(source_id)s;

-- sub_follows_read --
-- the lane: a dynamic feed's followers and their starts, in the feed's shard
SELECT subscriber_id, start_after FROM {schema}.subscription_follows
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s AND subscription = %(subscription)s
ORDER BY subscriber_id;

-- sub_feeds_scan --
-- the lane's candidate scan of feeds with work of the subscriber types it hosts, read without locks; each is then claimed by a keyed statement
SELECT routing_key, tenant_id, actor_type, actor_id, subscription
FROM {schema}.subscription_feeds
WHERE head > done AND parked IS NULL
  AND due_at_ms <= {schema}.stmt_ms(%(off)s::bigint)
  AND claimed_until_ms <= {schema}.stmt_ms(%(off)s::bigint)
  AND split_part(subscription, '.', 1) = ANY(%(types)s::text[])
ORDER BY due_at_ms
LIMIT %(limit)s;

-- sub_feed_claim --
-- claims one feed under a token until its lease ends, unless another runner holds it; the round reads the followers after this, so an earlier follow's rewind is served (S2)
UPDATE {schema}.subscription_feeds
SET claim_token = %(token)s, claimed_until_ms = {schema}.stmt_ms(%(off)s::bigint) + %(lease)s,
    rewound = false
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s AND subscription = %(subscription)s AND parked IS NULL
  AND head > done AND claimed_until_ms <= {schema}.stmt_ms(%(off)s::bigint)
RETURNING head, done, attempts;

-- sub_feed_settle --
-- the claim's holder records what it delivered, and backs off (wait > 0, attempts counted) or not; a lost claim writes nothing; a feed a follow rewound during the round keeps its done (S2)
UPDATE {schema}.subscription_feeds
SET done = CASE WHEN rewound THEN done ELSE greatest(done, %(done)s::bigint) END,
    rewound = false, claim_token = NULL, claimed_until_ms = 0,
    attempts = CASE WHEN %(wait)s::bigint > 0 THEN attempts + 1 ELSE 0 END,
    last_error = %(error)s,
    due_at_ms = {schema}.stmt_ms(%(off)s::bigint) + %(wait)s::bigint
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s AND subscription = %(subscription)s AND claim_token = %(token)s;

-- sub_feed_park --
-- the claim's holder parks a feed the code cannot deliver (an undeclared subscription, a tenant mismatch), with the reason (S6)
UPDATE {schema}.subscription_feeds
SET parked = %(reason)s, claim_token = NULL, claimed_until_ms = 0
WHERE routing_key = %(rk)s AND tenant_id = %(tenant)s AND actor_type = %(type)s
  AND actor_id = %(id)s AND subscription = %(subscription)s AND claim_token = %(token)s;

-- sub_record --
-- records a declared subscription the first time a runner starts with it; returns it only then (S8's backfill runs once)
INSERT INTO {schema}.subscriptions (name, source_type, shape, start, recorded_at_ms)
VALUES (%(name)s, %(source_type)s, %(shape)s, %(start)s, {schema}.stmt_ms(%(off)s::bigint))
ON CONFLICT (name) DO NOTHING
RETURNING name;

-- sub_backfill --
-- a routed subscription declared start="start", recorded now: a feed from the start for every source of its type with events (S8)
INSERT INTO {schema}.subscription_feeds
    (routing_key, tenant_id, actor_type, actor_id, subscription, head, done, due_at_ms,
     updated_at_ms)
SELECT a.routing_key, a.tenant_id, a.actor_type, a.actor_id, %(name)s, a.event_seq, 0,
       %(now)s, %(now)s
FROM {schema}.actors a
WHERE a.actor_type = %(source_type)s AND a.event_seq > 0
ON CONFLICT (routing_key, tenant_id, actor_type, actor_id, subscription) DO NOTHING;

-- sub_recorded --
-- every recorded subscription (akter check compares them with the code's; read-only)
SELECT name, source_type, shape, start FROM {schema}.subscriptions ORDER BY name;

-- sub_overview --
-- per subscription: its feeds with work, parked feeds and the oldest unapplied head's age (the console, check and the lag gauge; read-only)
SELECT subscription,
       count(*) FILTER (WHERE head > done AND parked IS NULL) AS pending,
       count(*) FILTER (WHERE parked IS NOT NULL) AS parked,
       coalesce({schema}.stmt_ms(%(off)s::bigint)
                - min(updated_at_ms) FILTER (WHERE head > done AND parked IS NULL), 0) AS lag_ms
FROM {schema}.subscription_feeds
GROUP BY subscription
ORDER BY subscription;
