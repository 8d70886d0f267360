-- 0003_outbox_trace: the W3C traceparent of the span that staged each outbox row (issue 14).
-- Delivery spans and job attempts continue that trace; a job's route stores its attempt's.
-- Nullable: rows staged with no tracer configured, and rows written before this migration,
-- hold NULL and deliver as before (their spans start new traces).

ALTER TABLE {schema}.outbox ADD COLUMN traceparent text;
