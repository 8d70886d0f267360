-- 0011_admission_receipts: a warm turn's receipt probe rides in its lock statement (issue 13).
--
-- A turn's first flight locked the actor row (lock_actor) and then probed the batch's receipts
-- (admission_read), a statement of its own: under READ COMMITTED a statement reads in a
-- snapshot taken when it starts, and the lock statement's snapshot is taken before any wait for
-- the lock, so a probe in it would miss a receipt that the lock's previous holder committed.
-- A VOLATILE function takes a fresh snapshot for each query it runs: called in lock_admit's
-- outer query, over the locked row, it probes after the lock is granted, and one statement
-- does what two did (tests/integration/test_cluster.py, the turn that waited for the lock).
--
-- PL/pgSQL, not SQL: a SQL function that is not inlined plans its body again on every execution
-- of the calling statement, where PL/pgSQL keeps its plan for the session. The probe is
-- admission_read's (one full-key lookup per command id; NULL when none is stored), which Citus
-- turns still send on their own.
--
-- One statement, as every migration after 0009 (a DO block; see 0010).
DO $$
BEGIN
    EXECUTE $function$
CREATE FUNCTION {schema}.admission_receipts(p_rk bigint, p_tenant text, p_type text,
                                            p_id text, p_command_ids text[])
    RETURNS jsonb LANGUAGE plpgsql VOLATILE AS $body$
BEGIN
    RETURN (SELECT jsonb_agg(jsonb_build_object(
                       'command_id', r.command_id, 'command', r.command,
                       'payload_hash', r.payload_hash, 'caller_key', r.caller_key,
                       'outcome', r.outcome, 'expires_at_ms', r.expires_at_ms))
            FROM unnest(p_command_ids) AS c(command_id)
            CROSS JOIN LATERAL (
                SELECT * FROM {schema}.receipts r
                WHERE r.routing_key = p_rk AND r.tenant_id = p_tenant
                  AND r.actor_type = p_type AND r.actor_id = p_id
                  AND r.command_id = c.command_id
                LIMIT 1
            ) r);
END
$body$
$function$;
END
$$;
