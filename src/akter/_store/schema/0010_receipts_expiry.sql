-- 0010_receipts_expiry: the receipts' expiry index no longer leads with actor_type (issue 13).
--
-- A turn's receipt probe (admission_read) looks a command id up by the receipts' whole key,
-- which includes actor_type. 0001's expiry index, (actor_type, expires_at_ms), matched that
-- equality too: while the table's statistics were young (never analyzed, or analyzed with a
-- handful of rows) the planner rated both indexes at one row and could take the expiry index,
-- which reads every receipt of the type on every turn. A plan made then is kept for as long as
-- the statement stays prepared on its connection (until an ANALYZE of the table invalidates it),
-- and turns keep generic plans. On expires_at_ms alone the index matches nothing the probe
-- compares, so the key is the probe's only index, whatever the statistics say.
--
-- The pruning statements (prune_receipts, citus_prune_receipts) read it as a range of expired
-- rows, filtered by type. Building it holds off writes to the receipts (turns) while it runs:
-- one pass over the table, about a second per million receipts.
--
-- One statement: on a distributed schema Citus sends a DDL command's query string on to the
-- workers, and a string of two commands fails there ("cannot insert multiple commands into a
-- prepared statement"). Inside a DO block each EXECUTE is a query string of its own.
DO $$
BEGIN
    EXECUTE 'DROP INDEX {schema}.receipts_expiry';
    EXECUTE 'CREATE INDEX receipts_expiry ON {schema}.receipts (expires_at_ms)';
END
$$;
