-- 0016_subscriptions: actors react to other actors' events (issue 40, the subscriptions spec).
--
-- subscription_feeds, in the source's shard: one row per (source actor, subscription), upserted
-- by the source's commit flight with the newest cursor (head) of the batch's matching events
-- (S7: at most one row per source and subscription per batch; nothing when none follows), and
-- advanced by the subscription lane (done: every event up to it delivered), with its claim,
-- backoff and parking. The claim index holds only rows with work.
-- subscription_follows, in the source's shard: the dynamic subscribers of a source, with the
-- cursor each starts after (the lane reads a feed's followers in the feed's shard).
-- subscription_cursors, in the subscriber's shard: the applied cursor per (subscriber,
-- subscription, source), written in the subscriber's delivery turn (S1's deduplication).
-- subscriptions: the declared subscriptions, recorded when a runner first starts with one (a
-- reference table on Citus): start="start" backfills feeds once (S8), akter check compares.
--
-- One statement, as every migration after 0009 (a DO block; see 0010), its
-- commands dollar-quoted so that the catalogue's static checks read the tables.
DO $migration$
BEGIN
    EXECUTE $ddl$CREATE TABLE {schema}.subscription_feeds (
        routing_key bigint NOT NULL,
        tenant_id text NOT NULL,
        actor_type text NOT NULL,
        actor_id text NOT NULL,
        subscription text NOT NULL,
        head bigint NOT NULL,
        done bigint NOT NULL,
        due_at_ms bigint NOT NULL,
        claim_token text,
        claimed_until_ms bigint NOT NULL DEFAULT 0,
        attempts integer NOT NULL DEFAULT 0,
        last_error text,
        parked text,
        updated_at_ms bigint NOT NULL,
        PRIMARY KEY (routing_key, tenant_id, actor_type, actor_id, subscription)
    )$ddl$;
    EXECUTE $ddl$CREATE INDEX subscription_feeds_due ON {schema}.subscription_feeds (due_at_ms)
        WHERE head > done AND parked IS NULL$ddl$;
    EXECUTE $ddl$CREATE TABLE {schema}.subscription_follows (
        routing_key bigint NOT NULL,
        tenant_id text NOT NULL,
        actor_type text NOT NULL,
        actor_id text NOT NULL,
        subscription text NOT NULL,
        subscriber_id text NOT NULL,
        start_after bigint NOT NULL,
        PRIMARY KEY (routing_key, tenant_id, actor_type, actor_id, subscription, subscriber_id)
    )$ddl$;
    EXECUTE $ddl$CREATE TABLE {schema}.subscription_cursors (
        routing_key bigint NOT NULL,
        tenant_id text NOT NULL,
        actor_type text NOT NULL,
        actor_id text NOT NULL,
        subscription text NOT NULL,
        source_type text NOT NULL,
        source_id text NOT NULL,
        applied bigint NOT NULL,
        updated_at_ms bigint NOT NULL,
        PRIMARY KEY (routing_key, tenant_id, actor_type, actor_id, subscription, source_type,
                     source_id)
    )$ddl$;
    EXECUTE $ddl$CREATE TABLE {schema}.subscriptions (
        name text PRIMARY KEY,
        source_type text NOT NULL,
        shape text NOT NULL CHECK (shape IN ('routed', 'dynamic')),
        start text NOT NULL,
        recorded_at_ms bigint NOT NULL
    )$ddl$;
END
$migration$;
