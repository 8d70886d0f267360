-- 0021_lean_outbox: the outbox's own autovacuum settings (issue 45, docs/internals/lean-tables.md).
--
-- Every job row dies at least twice (its claim rewrites it, its settle deletes or rewrites it)
-- and every intent at least twice (claim, delete), while the live rows stay few: the table is a
-- queue, and its dead tuples are what a claim's index probe steps over. The server's defaults
-- wait for 50 dead tuples plus 20 % of the live ones and then vacuum with a 2 ms sleep every 200
-- cost units. Here a fixed bound (1,000 dead tuples, whatever the live count) and no sleeps:
-- autovacuum takes the outbox at its next visit of the database (autovacuum_naptime, a server
-- setting) and finishes it at once. The relay's own vacuum (akter._engine.loop.vacuum) does not
-- wait for that visit. No truncation: a vacuum that cuts the table's empty tail pages takes the
-- table's ACCESS EXCLUSIVE lock, which stops every turn that stages a row and every claim while
-- it waits and holds (measured as Timeout:VacuumTruncate waits); the next rows reuse those
-- pages anyway. No fillfactor: a claim, a renewal and a settle each change indexed columns
-- (due_at_ms, running, kind), so none of them can be a HOT update that free space would help.
-- One statement (every migration after 0009); Citus propagates it to the shards.
ALTER TABLE {schema}.outbox SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0,
    vacuum_truncate = false
);
