-- 0019_turn_guard: a warm turn's one flight checks, under the row lock, what its handlers assumed
-- (issue 45, docs/internals/one-flight-turn.md).
--
-- A warm turn runs its handlers on the cached state, with the runner's estimate of the clock,
-- before it touches the database; then it sends BEGIN, turn_guard, the batch's writes and COMMIT
-- in one pipelined flight. turn_guard sets the turn's transaction-local settings (turn_settings),
-- locks the actor row FOR UPDATE and raises one SQLSTATE of class AK per failed check, which
-- aborts the rest of the flight: nothing of it commits, and the runner runs the batch again as a
-- two-flight turn.
--   AK001 the locked row's version is not the cached one (or the row is gone)
--   AK002 a command id of the batch already has a receipt (a retry of a committed call)
--   AK003 a command id's expiry is not after the database clock
--   AK004 the database clock is below the handlers' now, or above it by more than the bound
-- PL/pgSQL and VOLATILE: each query of the body reads in a snapshot taken when it starts, so the
-- receipt probe (admission_receipts, 0011's, called only when an id may have a receipt), after
-- the lock, sees what the lock's previous holder committed.
-- Returns the clock it checked (the runner's estimate follows it).
--
-- One statement, as every migration after 0009 (a DO block; see 0010).
DO $$
BEGIN
    EXECUTE $function$
CREATE FUNCTION {schema}.turn_guard(p_rk bigint, p_tenant text, p_type text, p_id text,
                                    p_version bigint, p_command_ids text[], p_expires bigint[],
                                    p_now bigint, p_bound bigint, p_off bigint,
                                    p_lock_timeout text, p_statement_timeout text,
                                    p_bound_setting text, p_bound_value text,
                                    p_plan_cache_mode text)
    RETURNS bigint LANGUAGE plpgsql VOLATILE AS $body$
DECLARE
    v_version bigint;
    v_clock bigint;
BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout, true),
            set_config('statement_timeout', p_statement_timeout, true),
            set_config(p_bound_setting, p_bound_value, true),
            set_config('plan_cache_mode',
                       coalesce(p_plan_cache_mode, current_setting('plan_cache_mode')), true);
    SELECT a.version INTO v_version
    FROM {schema}.actors a
    WHERE a.routing_key = p_rk AND a.tenant_id = p_tenant AND a.actor_type = p_type
      AND a.actor_id = p_id
    FOR UPDATE OF a;
    IF v_version IS DISTINCT FROM p_version THEN
        RAISE EXCEPTION 'stale activation: version % locked, % cached', v_version, p_version
            USING ERRCODE = 'AK001';
    END IF;
    -- The admission's own probe (0011), so both paths read receipts alike.
    IF cardinality(p_command_ids) > 0
       AND {schema}.admission_receipts(p_rk, p_tenant, p_type, p_id, p_command_ids) IS NOT NULL
    THEN
        RAISE EXCEPTION 'a command id of the batch has a receipt' USING ERRCODE = 'AK002';
    END IF;
    v_clock := {schema}.now_ms(p_off);
    IF EXISTS (SELECT 1 FROM unnest(p_expires) AS e(ms) WHERE e.ms <= v_clock) THEN
        RAISE EXCEPTION 'a command id of the batch has expired' USING ERRCODE = 'AK003';
    END IF;
    IF v_clock < p_now OR v_clock > p_now + p_bound THEN
        RAISE EXCEPTION 'clock % outside [%, % + %]', v_clock, p_now, p_now, p_bound
            USING ERRCODE = 'AK004';
    END IF;
    RETURN v_clock;
END
$body$
$function$;
END
$$;
