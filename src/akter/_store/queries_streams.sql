-- Job output streams (docs/guides/job-streams.md, migration 0018): fenced appends, the close,
-- reads after a cursor and retention. Same block format as queries.sql; loaded into the same
-- catalogue. Every statement names one job by its routing key, except the retention sweep.

-- stream_append --
-- appends one attempt's batch after the job's last seq, only while the job row runs at that attempt (locked FOR SHARE: a superseded attempt appends nothing, the next claim waits for an append in flight), only after the seq the writer expects (or, expecting none, while this attempt has no marker: a retried append whose first try committed writes nothing twice), and with if_begun only when the job already has items; one row: whether the fence held, the last seq before, whether this attempt has its marker, the items written
WITH fence AS (
    SELECT o.routing_key
    FROM {schema}.outbox o
    WHERE o.routing_key = %(rk)s AND o.intent_id = %(job_id)s AND o.kind = 'job'
      AND o.attempts = %(attempt)s::int AND o.running
    FOR SHARE
), last AS (
    -- the newest item by the primary key (one index entry), and only for a writer's first
    -- append whether its marker is there (a later one knows its seq)
    SELECT coalesce((SELECT s.seq FROM {schema}.job_streams s
                     WHERE s.routing_key = %(rk)s AND s.job_id = %(job_id)s
                     ORDER BY s.seq DESC LIMIT 1), 0) AS seq,
           CASE WHEN %(expect)s::bigint IS NULL
                THEN EXISTS (SELECT 1 FROM {schema}.job_streams m
                             WHERE m.routing_key = %(rk)s AND m.job_id = %(job_id)s
                               AND m.attempt = %(attempt)s::int AND m.item = 'attempt')
                ELSE true END AS marked
), ins AS (
    INSERT INTO {schema}.job_streams
        (routing_key, job_id, seq, tenant_id, actor_type, actor_id, attempt, item, data, at_ms)
    SELECT %(rk)s, %(job_id)s, last.seq + i.n, %(tenant)s, %(type)s, %(id)s, %(attempt)s::int,
           i.item, i.data, {schema}.stmt_ms(%(off)s::bigint)
    FROM fence, last,
         unnest(%(kinds)s::text[], %(data)s::text[]) WITH ORDINALITY AS i(item, data, n)
    WHERE (NOT %(if_begun)s::bool OR last.seq > 0)
      AND CASE WHEN %(expect)s::bigint IS NULL THEN NOT last.marked
               ELSE last.seq = %(expect)s::bigint END
    RETURNING seq
)
SELECT EXISTS (SELECT 1 FROM fence) AS held, last.seq AS last_seq, last.marked,
       (SELECT count(*) FROM ins) AS written
FROM last;

-- stream_close --
-- after the job's terminal settle, closes its stream with the outcome, only when it has items and no close yet; not fenced (the job row is gone)
WITH last AS (
    -- the newest item by the primary key: a close is always the last item
    SELECT s.seq, s.item = 'closed' AS closed
    FROM {schema}.job_streams s
    WHERE s.routing_key = %(rk)s AND s.job_id = %(job_id)s
    ORDER BY s.seq DESC
    LIMIT 1
)
INSERT INTO {schema}.job_streams
    (routing_key, job_id, seq, tenant_id, actor_type, actor_id, attempt, item, data, at_ms)
SELECT %(rk)s, %(job_id)s, last.seq + 1, %(tenant)s, %(type)s, %(id)s, %(attempt)s::int,
       'closed', %(outcome)s, {schema}.stmt_ms(%(off)s::bigint)
FROM last
WHERE NOT last.closed
ON CONFLICT DO NOTHING
RETURNING seq;

-- stream_read --
-- one actor's job's items after a cursor, in seq order, at most limit; read only
SELECT s.seq, s.attempt, s.item, s.data
FROM {schema}.job_streams s
WHERE s.routing_key = %(rk)s AND s.job_id = %(job_id)s AND s.tenant_id = %(tenant)s
  AND s.actor_type = %(type)s AND s.actor_id = %(id)s AND s.seq > %(after)s::bigint
ORDER BY s.seq
LIMIT %(limit)s;

-- stream_last --
-- one actor's job's newest item (one primary key entry); read only
SELECT s.seq, s.attempt, s.item, s.data
FROM {schema}.job_streams s
WHERE s.routing_key = %(rk)s AND s.job_id = %(job_id)s AND s.tenant_id = %(tenant)s
  AND s.actor_type = %(type)s AND s.actor_id = %(id)s
ORDER BY s.seq DESC
LIMIT 1;

-- stream_prune --
-- retention deletes the whole streams of a batch of one type's jobs whose newest item is older than the cutoff; returns the deleted rows' jobs
WITH doomed AS MATERIALIZED (
    SELECT s.routing_key, s.job_id
    FROM {schema}.job_streams s
    WHERE s.actor_type = %(type)s::text
    GROUP BY s.routing_key, s.job_id
    HAVING max(s.at_ms) <= %(cutoff)s::bigint
    LIMIT %(batch)s
)
DELETE FROM {schema}.job_streams s
USING doomed d
WHERE s.routing_key = d.routing_key AND s.job_id = d.job_id
RETURNING s.routing_key, s.job_id;
