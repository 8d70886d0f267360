-- 0014_runner_models: which models run, and which is newer (issue 38, evolution E4).
--
-- A rolling deploy that adds a defaulted field to a state model keeps the state version
-- (evolution EVO-01), so an older runner reading a row the newer code wrote finds a key its model
-- would drop on the next write: the loss guard's case, where a field removed without a migration
-- lands too. Two records tell them apart (akter._engine.declared):
--
-- - the name registry gets the kind 'state': a model's fingerprint (its state version and a hash
--   of its declared key paths), recorded once, when a runner with that model first starts; the
--   earlier record is the older model;
-- - each runner records at registration, per hosted actor type, its state version, fingerprint,
--   declared key paths and commands ({"Type": {"version": 0, "model": "v0:…",
--   "paths": ["n", "note"], "commands": ["add"]}}).
--
-- An older runner answers such a row with StateTooNew (retryable) while a live runner with a
-- newer model at the row's version declares every key it would drop, and keeps the loss guard's
-- Defect otherwise. Likewise a relay claiming an intent to a command its code does not declare
-- leaves it due while a live runner declares the command (a deploy that added it), and parks it
-- otherwise. Runners of older code register without it: the default says nothing.
--
-- One statement, as every migration after 0009 (a DO block; see 0010).
DO $$
BEGIN
    EXECUTE 'ALTER TABLE {schema}.runners ADD COLUMN models jsonb NOT NULL DEFAULT ''{}''::jsonb';
    EXECUTE 'ALTER TABLE {schema}.deployment_names DROP CONSTRAINT deployment_names_kind_check';
    EXECUTE 'ALTER TABLE {schema}.deployment_names ADD CONSTRAINT deployment_names_kind_check CHECK (kind IN (''command'', ''job'', ''event'', ''state''))';
END
$$;
