-- 0012_workflow_deadline_wakes: a suspended run wakes by its deadline at the latest (issue 38).
--
-- timeout= (default 30 days) bounds every suspension: wf_suspend caps the wake time it writes
-- at the run's deadline, so a run waiting for a signal, a job outcome or a cancel alone wakes
-- at its deadline and is cancelled there. Runs suspended by older code have no wake time (or
-- one past the deadline, a long sleep): they get the same cap here, once.
--
-- One statement (Citus sends it to every shard); no function is called in it.
UPDATE {schema}.workflows
SET wake_at_ms = least(wake_at_ms, deadline_ms)
WHERE status = 'suspended' AND deadline_ms IS NOT NULL
  AND (wake_at_ms IS NULL OR wake_at_ms > deadline_ms);
