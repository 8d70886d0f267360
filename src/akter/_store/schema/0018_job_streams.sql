-- 0018_job_streams: append-only output streams of jobs (issue 42, docs/guides/job-streams.md).
--
-- A job's executor appends chunks with call.stream(chunk); the runner batches them and writes one
-- INSERT per flush (stream_append), fenced by the attempt: the statement locks the job row
-- FOR SHARE and inserts only while it is running at that attempt, so a superseded attempt's
-- chunks never land and the next attempt's claim waits for an append in flight. Each item has
-- a per-job sequence number (seq, from 1, no gaps within a job); its column item says what it
-- is ('item', not 'kind': kind names the outbox's row kinds): 'attempt' marks the start of an
-- attempt's segment, 'chunk' holds one chunk (canonical JSON in data), 'closed' the job's outcome
-- (written after its terminal settle). Readers resume after a seq.
--
-- Keyed by routing_key first like every per-actor table: on Citus the table is distributed by
-- routing_key, co-located with actors and the outbox (akter._store.citus.DISTRIBUTED), so the
-- fenced append is a single-shard statement. No foreign key: an append stays one index probe and
-- one insert. Retention (akter._engine.retention) deletes a job's whole stream once its newest
-- item is older than the type's keep_streams.
--
-- One statement, as every migration after 0009 (see 0010).
CREATE TABLE {schema}.job_streams (
    routing_key bigint NOT NULL,
    job_id text NOT NULL,
    seq bigint NOT NULL,
    tenant_id text NOT NULL,
    actor_type text NOT NULL,
    actor_id text NOT NULL,
    attempt integer NOT NULL,
    item text NOT NULL CHECK (item IN ('attempt', 'chunk', 'closed')),
    data text,
    at_ms bigint NOT NULL,
    PRIMARY KEY (routing_key, job_id, seq)
);
