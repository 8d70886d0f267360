-- The table that bench/sql/claim_delete.sql drains: shaped like akter's outbox (the columns an
-- intent row fills, its primary key, a due index and the intent-id index). Run with search_path
-- set to a throwaway schema (bench/relay.py does this). Fill it with relay_claim_fill.sql.
DROP TABLE IF EXISTS outbox_q;
CREATE TABLE outbox_q (
    routing_key bigint NOT NULL,
    intent_id text NOT NULL,
    bucket smallint NOT NULL CHECK (bucket = (routing_key >> 56)),
    kind text NOT NULL CHECK (kind IN ('intent', 'job')),
    tenant_id text NOT NULL,
    actor_type text NOT NULL,
    actor_id text NOT NULL,
    target_type text NOT NULL,
    target_id text NOT NULL,
    command text NOT NULL,
    payload text NOT NULL,
    payload_version integer NOT NULL DEFAULT 0,
    caller text NOT NULL,
    due_at_ms bigint NOT NULL,
    scheduled_at_ms bigint NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    timer_key text,
    PRIMARY KEY (routing_key, intent_id)
);
-- The due index. akter's is (bucket, kind, due_at_ms) and its claim probes each bucket; a single
-- global queue needs no bucket, so this one leads with kind.
CREATE INDEX outbox_q_due ON outbox_q (kind, due_at_ms);
CREATE INDEX outbox_q_intent_id ON outbox_q (intent_id);
