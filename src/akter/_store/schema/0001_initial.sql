-- 0001_initial: the durable rows of semantics §1.8.
-- Every per-actor table leads its primary key with routing_key (design principle 7).

CREATE FUNCTION {schema}.now_ms(off bigint) RETURNS bigint
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + off $$;

CREATE FUNCTION {schema}.stmt_ms(off bigint) RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint + off $$;

CREATE TABLE {schema}.deployment (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    schema_version integer NOT NULL,
    retry_window_ms bigint NOT NULL,
    deployment_id uuid NOT NULL,
    placements jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at_ms bigint NOT NULL
);

CREATE TABLE {schema}.actors (
    routing_key bigint NOT NULL,
    tenant_id text NOT NULL,
    actor_type text NOT NULL,
    actor_id text NOT NULL,
    version bigint NOT NULL DEFAULT 0,
    created boolean NOT NULL DEFAULT false,
    event_seq bigint NOT NULL DEFAULT 0,
    state jsonb NOT NULL,
    state_version integer NOT NULL DEFAULT 0,
    updated_at_ms bigint NOT NULL,
    PRIMARY KEY (routing_key, tenant_id, actor_type, actor_id)
) WITH (fillfactor = 80);

CREATE TABLE {schema}.receipts (
    routing_key bigint NOT NULL,
    tenant_id text NOT NULL,
    actor_type text NOT NULL,
    actor_id text NOT NULL,
    command_id text NOT NULL,
    command text NOT NULL,
    payload_hash text NOT NULL CHECK (length(payload_hash) = 64),
    caller_key text NOT NULL,
    outcome jsonb NOT NULL,
    expires_at_ms bigint NOT NULL,
    PRIMARY KEY (routing_key, tenant_id, actor_type, actor_id, command_id),
    FOREIGN KEY (routing_key, tenant_id, actor_type, actor_id)
        REFERENCES {schema}.actors (routing_key, tenant_id, actor_type, actor_id)
);
CREATE INDEX receipts_expiry ON {schema}.receipts (actor_type, expires_at_ms);

CREATE TABLE {schema}.events (
    routing_key bigint NOT NULL,
    tenant_id text NOT NULL,
    actor_type text NOT NULL,
    actor_id text NOT NULL,
    seq bigint NOT NULL CHECK (seq > 0),
    tag text NOT NULL,
    payload jsonb NOT NULL,
    payload_version integer NOT NULL DEFAULT 0,
    command_id text NOT NULL,
    emitted_at_ms bigint NOT NULL,
    PRIMARY KEY (routing_key, tenant_id, actor_type, actor_id, seq),
    FOREIGN KEY (routing_key, tenant_id, actor_type, actor_id)
        REFERENCES {schema}.actors (routing_key, tenant_id, actor_type, actor_id)
);
CREATE INDEX events_emitted ON {schema}.events (actor_type, emitted_at_ms);

CREATE TABLE {schema}.outbox (
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
    ready_at_ms bigint,
    attempts integer NOT NULL DEFAULT 0,
    last_error text,
    ambiguous boolean NOT NULL DEFAULT false,
    maybe_applied boolean NOT NULL DEFAULT false,
    running boolean NOT NULL DEFAULT false,
    waiting boolean NOT NULL DEFAULT false,
    final_failure boolean NOT NULL DEFAULT false,
    cancelled_at_ms bigint,
    timer_key text,
    PRIMARY KEY (routing_key, intent_id),
    CHECK (kind = 'intent' OR ready_at_ms IS NOT NULL)
);
CREATE INDEX outbox_due ON {schema}.outbox (bucket, kind, due_at_ms);
CREATE UNIQUE INDEX outbox_timer_key ON {schema}.outbox
    (routing_key, tenant_id, actor_type, actor_id, timer_key) WHERE timer_key IS NOT NULL;
CREATE INDEX outbox_intent_id ON {schema}.outbox (intent_id);
CREATE INDEX outbox_jobs_running ON {schema}.outbox
    (routing_key, tenant_id, actor_type, actor_id, command) WHERE kind = 'job' AND running;
CREATE INDEX outbox_jobs_ready ON {schema}.outbox
    (routing_key, tenant_id, actor_type, actor_id, command, ready_at_ms, intent_id)
    WHERE kind = 'job' AND NOT running;

CREATE TABLE {schema}.dead_letters (
    routing_key bigint NOT NULL,
    job_id text NOT NULL,
    tenant_id text NOT NULL,
    actor_type text NOT NULL,
    actor_id text NOT NULL,
    job text NOT NULL,
    payload text NOT NULL,
    payload_version integer NOT NULL DEFAULT 0,
    attempts integer NOT NULL,
    cause text NOT NULL,
    ambiguous boolean NOT NULL,
    dead_at_ms bigint NOT NULL,
    PRIMARY KEY (routing_key, job_id),
    FOREIGN KEY (routing_key, tenant_id, actor_type, actor_id)
        REFERENCES {schema}.actors (routing_key, tenant_id, actor_type, actor_id)
);

CREATE TABLE {schema}.runners (
    runner_id uuid PRIMARY KEY,
    started_at_ms bigint NOT NULL,
    heartbeat_at_ms bigint NOT NULL,
    http_address text,
    actor_types text[] NOT NULL DEFAULT '{}',
    job_types text[] NOT NULL DEFAULT '{}',
    version text NOT NULL,
    draining boolean NOT NULL DEFAULT false
);

CREATE TABLE {schema}.singletons (
    actor_type text PRIMARY KEY,
    owner uuid,
    lease_until_ms bigint NOT NULL DEFAULT 0,
    acquired_at_ms bigint
);

-- The commit flight's fence guard: raises serialization_failure (retryable) unless exactly one
-- actor row was updated under the locked version.
CREATE FUNCTION {schema}.fence_check(updated bigint) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF updated <> 1 THEN
        RAISE EXCEPTION 'akter fence: the actor row changed under a held lock'
            USING ERRCODE = '40001';
    END IF;
    RETURN updated;
END $$;
